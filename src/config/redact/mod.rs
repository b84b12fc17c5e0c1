//! Secrets taken out of the effective configuration before the admin
//! listener shows it (`/-/config`): a value under a key that names a
//! secret (a password, token, credential, key, or a header such as
//! `Authorization` set by a route's rules), a value that is a credential
//! whatever its key (a JWT, `Bearer ...`), the password of a URL's
//! user-info, and query parameters that name one. Over-redacting is the
//! safe side, but for the few keys of the gateway's own whose names only
//! look secret (a rate limit's `key`, `password_env`, key file paths).

use serde_json::Value;

mod url;
pub use url::redact_url;

/// What a redacted value reads as.
pub const REDACTED: &str = "<redacted>";

/// Parts of key names (compared lowercased, `-` as `_`) whose values are
/// secrets: `X-Pwd`, `passphrase`, `X-Auth-User`, `OAuth-Token`,
/// `X-Access-Key`, `Ocp-Apim-Subscription-Key`, `?pass=`, `;jsessionid=`,
/// `PHPSESSID`.
/// Broad on purpose: a name that only looks secret costs a hidden value, a
/// secret shown costs the secret.
const SECRET_KEYS: [&str; 10] =
    ["pass", "pwd", "secret", "token", "credential", "auth", "cookie", "key", "session", "sessid"];

/// Whole words of key names (split at `-` and `_`) that name a secret: a
/// `sig` query parameter, a `code` (OAuth's), a session's `sid`.
const SECRET_WORDS: [&str; 4] = ["sig", "signature", "code", "sid"];

/// Schemes of `Authorization`-like values, whatever the key they are under.
const AUTH_SCHEMES: [&str; 4] = ["bearer ", "basic ", "token ", "digest "];

/// Whether a key (or a header) name names a secret; a rate limit keyed on
/// such a header keeps only digests of its values.
pub fn names_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase().replace('-', "_");
    SECRET_KEYS.iter().any(|s| key.contains(s)) || key.split('_').any(|w| SECRET_WORDS.contains(&w))
}

/// The gateway's own keys whose names look like a secret's but whose
/// values never are one, by the keys above them: a rate limit's `key` (what
/// it counts by: `client`, `header:NAME`), the name of the variable that
/// holds Redis's password, and the paths of key and htpasswd files.
fn not_secret(path: &[String], key: &str) -> bool {
    let path: Vec<&str> = path.iter().map(String::as_str).collect();
    match key {
        "key" => path.ends_with(&["rate_limit"]) || path == ["server", "tls"],
        "max_keys" | "missing_key" => path.ends_with(&["rate_limit"]),
        "cache_tokens" => path.ends_with(&["auth", "jwt"]),
        "forward_credentials" => path.len() == 1 && path[0] == "routes",
        // The name of a split's sticky cookie, never a cookie's value.
        "cookie" => path == ["routes", "sticky"],
        "password_env" => path == ["rate_limit_store"],
        "tls_client_key" => path.len() == 2 && path[0] == "upstreams",
        "htpasswd" => path.ends_with(&["auth", "basic"]),
        _ => false,
    }
}

/// The gateway's own tables under keys that look secret, looked into
/// rather than redacted whole: a route's `auth` (its settings), and an
/// upstream named so (`[upstreams.auth-svc]`). Any other table under such
/// a key, a route's `headers` or `query` condition `{ regex = "..." }`
/// under `authorization` or `access_token`, holds what the key names.
fn own_table(path: &[String], key: &str) -> bool {
    match path {
        [top] => top == "upstreams" || (top == "routes" && key == "auth"),
        _ => false,
    }
}

/// `value` with its secrets replaced by [`REDACTED`]. A secret-named key
/// over one of the gateway's own tables is looked into (`auth = { ... }`
/// shows its settings), over any other table has every value in it
/// redacted (`{ regex = "<redacted>" }`), over anything else is redacted.
pub fn redacted(value: Value) -> Value {
    redacted_under(value, &mut Vec::new())
}

/// Every value in `value` redacted, its tables' keys and `null`s kept.
fn redacted_all(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(map.into_iter().map(|(k, v)| (k, redacted_all(v))).collect()),
        Value::Array(items) => Value::Array(items.into_iter().map(redacted_all).collect()),
        Value::Null => Value::Null,
        _ => Value::from(REDACTED),
    }
}

/// [`redacted`] for the value under `path` (the keys above it; arrays add
/// none).
fn redacted_under(value: Value, path: &mut Vec<String>) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| {
                    let secret = names_secret(&k) && !v.is_null() && !not_secret(path, &k);
                    let v = if secret && v.is_object() && !own_table(path, &k) {
                        redacted_all(v)
                    } else if secret && !v.is_object() {
                        Value::from(REDACTED)
                    } else {
                        path.push(k.clone());
                        let v = redacted_under(v, path);
                        path.pop();
                        v
                    };
                    (k, v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(|v| redacted_under(v, path)).collect()),
        Value::String(s) => Value::String(redact_text(&s)),
        other => other,
    }
}

/// A text under a key that does not name a secret: redacted whole when it
/// is a credential itself (a JWT, `Bearer ...`), else as [`redact_url`].
pub(super) fn redact_text(s: &str) -> String {
    let credential = looks_like_jwt(s)
        || AUTH_SCHEMES.iter().any(|p| s.len() > p.len() && s.as_bytes()[..p.len()].eq_ignore_ascii_case(p.as_bytes()));
    if credential { REDACTED.to_owned() } else { redact_url(s) }
}

/// A route condition's text (a value to equal, or a pattern) on the
/// header or query parameter `name` as `gateway check` says it: redacted
/// where `/-/config` redacts it (under a name that names a secret, or a
/// credential under any name), else quoted, a URL's secrets redacted.
pub fn redact_condition(name: &str, text: &str) -> String {
    match redact_text(text) {
        t if names_secret(name) || t == REDACTED => REDACTED.to_owned(),
        t => format!("{t:?}"),
    }
}

/// A header name the configuration refused, as an error and its key say
/// it: up to its first byte a name cannot hold, as what follows may be a
/// value pasted after the name (`X-Api-Key abc123`).
pub fn refused_name(name: &str) -> String {
    let valid = name.bytes().take_while(|&b| crate::headers::via::is_tchar(b)).count();
    match valid == name.len() {
        true => name.to_owned(),
        false => format!("{}…", &name[..valid]),
    }
}

/// A header value the configuration refused, as an error says it:
/// redacted where `/-/config` would redact it (a token pasted with its
/// line's end), else quoted; with where its first byte a value cannot hold
/// is.
pub fn refused_value(name: &str, value: &str) -> String {
    // Judged without what ends a pasted line (a JWT followed by `\n`).
    let trimmed = value.trim_matches(|c: char| c.is_ascii_control() || c == ' ');
    let shown = match redact_condition(name, trimmed) {
        r if r == REDACTED => r,
        _ => redact_condition(name, value),
    };
    match value.bytes().position(|b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        Some(at) => format!("{shown} (a control character at byte {})", at + 1),
        None => shown,
    }
}

/// Whether `s` is a JSON Web Token (JWS or JWE compact form: 3 or 5
/// base64url parts, the first a JSON object's, `{"` being `eyJ`), a bearer
/// credential under whatever name (`X-JWT-Assertion`).
fn looks_like_jwt(s: &str) -> bool {
    use base64::Engine;
    let parts = s.split('.').count();
    let header = s.split('.').next().unwrap_or("");
    s.starts_with("eyJ")
        && (parts == 3 || parts == 5)
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(header)
            .is_ok_and(|h| serde_json::from_slice::<serde_json::Map<String, Value>>(&h).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn texts_of_any_script_are_redacted_without_a_panic() {
        for text in ["Добро пожаловать", "ようこそ", "Καλώς ήρθατε", "tokené", "bearer"]
        {
            assert_eq!(redact_text(text), text);
        }
        assert_eq!(redact_text("Bearer ключ"), REDACTED);
    }

    #[test]
    fn urls() {
        let cases = [
            ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
            ("redis://:hunter2@127.0.0.1:6379/0", "redis://:<redacted>@127.0.0.1:6379/0"),
            ("/app;jsessionid=ABC123/x", "/app;jsessionid=<redacted>/x"),
            ("/app;JSESSIONID=ABC;v=2/x?q=1", "/app;JSESSIONID=<redacted>;v=2/x?q=1"),
            ("http://h/a;v=1;tok%65n=t/b", "http://h/a;v=1;tok%65n=<redacted>/b"),
            ("/a;b/c", "/a;b/c"),
            ("/x?PHPSESSID=abc&sid=1&side=2", "/x?PHPSESSID=<redacted>&sid=<redacted>&side=2"),
            ("/x;phpsessid=abc/y", "/x;phpsessid=<redacted>/y"),
            ("rediss://user:hunter2@h", "rediss://user:<redacted>@h"),
            ("https://tok3n@h/x", "https://<redacted>@h/x"),
            ("https://h/jwks?token=abc&x=1#f", "https://h/jwks?token=<redacted>&x=1#f"),
            ("https://h/p?api-key=abc", "https://h/p?api-key=<redacted>"),
            ("https://h/a@b", "https://h/a@b"),
            // Not URLs a parser takes: the password's raw `/`, `?`, `#`.
            ("https://user:pa/ss@h/x", "https://user:<redacted>@h/x"),
            ("https://u:p?w#x@h", "https://u:<redacted>@h"),
            ("redis://:pa/s?s#w@h:6379/0", "redis://:<redacted>@h:6379/0"),
            ("https://u:p/w@[::1]:1/x", "https://u:<redacted>@[::1]:1/x"),
            ("https://[::1]:8/a@b", "https://[::1]:8/a@b"),
            ("not a url: a@b", "not a url: a@b"),
            ("ops@example.com", "ops@example.com"),
            // Malformed URLs, paths without their `/`, fragments, encoded
            // names and `;` separators.
            ("http:/user:pw1@h:80", "http:/user:<redacted>@h:80"),
            ("user:pw2@h:80/x", "user:<redacted>@h:80/x"),
            ("x?token=t1", "x?token=<redacted>"),
            ("/x#access_token=t2&a=1", "/x#access_token=<redacted>&a=1"),
            ("https://h/x?a=1#access_token=t3", "https://h/x?a=1#access_token=<redacted>"),
            ("/p?tok%65n=t4&p%61ss=t5&q", "/p?tok%65n=<redacted>&p%61ss=<redacted>&q"),
            ("/p?a=1;token=t6&&b=2=3", "/p?a=1;token=<redacted>&&b=2=3"),
            ("/some/path", "/some/path"),
            ("/health?key=abc&v=1", "/health?key=<redacted>&v=1"),
            ("/health?pass=abc&pwd=d&v=1", "/health?pass=<redacted>&pwd=<redacted>&v=1"),
            ("https://h/x?access_token=t&passphrase=p", "https://h/x?access_token=<redacted>&passphrase=<redacted>"),
            (
                "https://h/x?sig=abc&se=2030&X-Amz-Signature=f",
                "https://h/x?sig=<redacted>&se=2030&X-Amz-Signature=<redacted>",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(redact_url(input), want, "{input}");
        }
    }

    #[test]
    fn the_gateways_own_keys_that_only_look_secret_are_shown() {
        let got = redacted(json!({
            "server": {"tls": {"cert": "s.pem", "key": "s.key"}},
            "upstreams": {"a": {"tls_client_key": "c.key", "headers": {"tls_client_key": "v"}}},
            "rate_limit_store": {"password_env": "REDIS_PW"},
            "routes": [
                {"rate_limit": {"key": "header:x-api-key"}, "auth": {"basic": {"htpasswd": "users"}}},
                {"headers": {"request": {"set": {"key": "v", "htpasswd": "v", "password_env": "v"}}}},
            ],
            "key": "v",
        }));
        assert_eq!(
            got,
            json!({
                "server": {"tls": {"cert": "s.pem", "key": "s.key"}},
                "upstreams": {"a": {"tls_client_key": "c.key", "headers": {"tls_client_key": "<redacted>"}}},
                "rate_limit_store": {"password_env": "REDIS_PW"},
                "routes": [
                    {"rate_limit": {"key": "header:x-api-key"}, "auth": {"basic": {"htpasswd": "users"}}},
                    {"headers": {"request": {"set": {"key": "<redacted>", "htpasswd": "<redacted>", "password_env": "<redacted>"}}}},
                ],
                "key": "<redacted>",
            })
        );
    }

    #[test]
    fn names_that_look_secret_and_jwts_anywhere() {
        let jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhbm4ifQ.c2ln";
        let got = redacted(json!({
            "routes": [{
                "rate_limit": {"key": "header:x-k", "max_keys": 10, "missing_key": "refuse"},
                "forward_credentials": true,
                "sticky": {"cookie": "gw_v", "set": true},
                "auth": {"jwt": {"cache_tokens": 10, "jwks_url": "https://h/k?pass=p"}},
                "headers": {"request": {"set": {
                    "X-JWT-Assertion": jwt, "X-Anything": jwt, "X-Pwd": "p", "X-Passphrase": "p",
                    "X-OAuth-Token": "t", "X-Authenticated-User": "u", "X-Secret-Id": "s", "X-Monkey": "m",
                    "X-Version": "eyJ.not.a.jwt!", "X-Host": "eyJ-like.example.com", "X-Plain": "v",
                }}},
            }],
        }));
        let set = &got["routes"][0]["headers"]["request"]["set"];
        for name in [
            "X-JWT-Assertion",
            "X-Anything",
            "X-Pwd",
            "X-Passphrase",
            "X-OAuth-Token",
            "X-Authenticated-User",
            "X-Secret-Id",
            "X-Monkey",
        ] {
            assert_eq!(set[name], REDACTED, "{name}: {got}");
        }
        for (name, value) in [("X-Version", "eyJ.not.a.jwt!"), ("X-Host", "eyJ-like.example.com"), ("X-Plain", "v")] {
            assert_eq!(set[name], value, "{name}: {got}");
        }
        let route = &got["routes"][0];
        assert_eq!(route["rate_limit"], json!({"key": "header:x-k", "max_keys": 10, "missing_key": "refuse"}));
        assert_eq!(route["forward_credentials"], true);
        assert_eq!(route["sticky"], json!({"cookie": "gw_v", "set": true}));
        assert_eq!(route["auth"], json!({"jwt": {"cache_tokens": 10, "jwks_url": "https://h/k?pass=<redacted>"}}));
        let jwe = "eyJhbGciOiJSU0EtT0FFUCJ9.a2V5..aXY.dGFn";
        assert!(looks_like_jwt(jwt) && looks_like_jwt(jwe));
        assert!(!looks_like_jwt("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhbm4ifQ") && !looks_like_jwt("abc.def.ghi"));
    }

    #[test]
    fn conditions_under_secret_names_are_redacted_in_every_form() {
        // (a route's `headers` or `query` condition, how /-/config shows it)
        let cases = [
            (
                json!({"headers": {"x-api-key": {"regex": "k3y-SECRET"}}}),
                json!({"headers": {"x-api-key": {"regex": REDACTED}}}),
            ),
            (
                json!({"headers": {"authorization": {"regex": "(Bearer|Basic) SECRET"}}}),
                json!({"headers": {"authorization": {"regex": REDACTED}}}),
            ),
            (
                json!({"query": {"access_token": {"regex": "t[0-9]+"}}}),
                json!({"query": {"access_token": {"regex": REDACTED}}}),
            ),
            (json!({"headers": {"x-api-key": "SECRET"}}), json!({"headers": {"x-api-key": REDACTED}})),
            (json!({"query": {"access_token": true}}), json!({"query": {"access_token": REDACTED}})),
            // Not secret-named: shown, a pattern as any other text.
            (
                json!({"headers": {"x-canary": {"regex": "v[0-9]+"}}}),
                json!({"headers": {"x-canary": {"regex": "v[0-9]+"}}}),
            ),
            (json!({"query": {"v": "2"}}), json!({"query": {"v": "2"}})),
            // The gateway's own tables under secret-looking keys: looked into.
            (json!({"auth": {"jwt": {"issuer": "i"}}}), json!({"auth": {"jwt": {"issuer": "i"}}})),
        ];
        for (route, want) in cases {
            assert_eq!(redacted(json!({"routes": [route.clone()]})), json!({"routes": [want]}), "{route}");
        }
        let upstream = json!({"upstreams": {"auth-svc": {"url": "http://h:1"}, "token": {"url": "http://u:p@h"}}});
        let want = json!({"upstreams": {"auth-svc": {"url": "http://h:1"}, "token": {"url": "http://u:<redacted>@h"}}});
        assert_eq!(redacted(upstream), want, "an upstream named so is looked into");
    }

    #[test]
    fn check_describes_conditions_as_config_shows_them() {
        use crate::router::{Conditions, Want};
        let on_header = |n: &str, w| Conditions { headers: vec![(n.parse().unwrap(), w)], query: vec![] };
        let on_query = |n: &str, w| Conditions { headers: vec![], query: vec![(n.to_owned(), w)] };
        let (equals, pattern) = (|v: &str| Want::Equals(v.into()), |p: &str| Want::pattern(p).unwrap());
        let cases = [
            (on_header("x-canary", equals("1")), "header x-canary=\"1\""),
            (on_header("x-v", pattern("v[0-9]+")), "header x-v ~ \"v[0-9]+\""),
            (on_header("authorization", equals("Bearer S3")), "header authorization=<redacted>"),
            (on_header("x-api-key", equals("S3")), "header x-api-key=<redacted>"),
            (on_header("x-api-key", pattern("k3y-S3")), "header x-api-key ~ <redacted>"),
            (on_header("authorization", pattern("(Bearer|Basic) S3")), "header authorization ~ <redacted>"),
            (on_header("x-session-token", Want::Present), "header x-session-token present"),
            (on_query("access_token", equals("S3")), "query access_token=<redacted>"),
            (on_query("sig", pattern("[a-f0-9]+")), "query sig ~ <redacted>"),
            (on_query("code", Want::Absent), "query code absent"),
            // A credential under any name, a URL's password: as /-/config.
            (on_header("x-forward", equals("Bearer S3")), "header x-forward=<redacted>"),
            (on_query("next", equals("https://u:S3@h/")), "query next=\"https://u:<redacted>@h/\""),
        ];
        for (c, want) in cases {
            assert_eq!(c.describe(redact_condition), want);
        }
    }

    #[test]
    fn keys() {
        let got = redacted(json!({
            "upstreams": {"a": {"url": "http://u:p@h", "endpoints": ["http://x:y@e"]}},
            "rate_limit_store": {"url": "redis://:pw@h", "timeout": "50ms"},
            "routes": [{"name": "r", "headers": {"request": {"set": {"Authorization": "Bearer x", "X-Api-Key": "k", "X-Other": "v", "X-Auth": "s", "Ocp-Apim-Subscription-Key": "s", "X-Forward-To": "Bearer t"}}}, "auth": {"jwt": {"jwks_url": "https://h/k"}, "basic": {"htpasswd": "users"}}}],
            "client_secret": null,
        }));
        assert_eq!(
            got,
            json!({
                "upstreams": {"a": {"url": "http://u:<redacted>@h", "endpoints": ["http://x:<redacted>@e"]}},
                "rate_limit_store": {"url": "redis://:<redacted>@h", "timeout": "50ms"},
                "routes": [{"name": "r", "headers": {"request": {"set": {"Authorization": "<redacted>", "X-Api-Key": "<redacted>", "X-Other": "v", "X-Auth": "<redacted>", "Ocp-Apim-Subscription-Key": "<redacted>", "X-Forward-To": "<redacted>"}}}, "auth": {"jwt": {"jwks_url": "https://h/k"}, "basic": {"htpasswd": "users"}}}],
                "client_secret": null,
            })
        );
    }
}
