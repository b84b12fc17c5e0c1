//! `routes[N].rate_limit` and `[rate_limit_store]`.

use std::path::Path;
use std::time::Duration;

use http::HeaderName;

use crate::config::refused_name;

use super::super::ratelimit::{
    MissingKey, OnStoreError, Rate, RateLimitConfig, RateLimitKey, RateLimitStoreConfig, RawRateLimit,
    RawRateLimitStore, StoreCa, StoreKind,
};
use super::{Problem, positive_duration};

/// The default `[rate_limit_store] timeout`: a decision that takes longer
/// costs more than the limit saves.
const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_millis(50);

/// The default `max_keys`: a key's bucket in a moka cache is a few hundred
/// bytes, so this bounds a route's local buckets to some tens of MiB.
pub const DEFAULT_MAX_KEYS: usize = 100_000;

/// A route's `rate_limit`; `key` is `routes[N].rate_limit`.
pub(super) fn rate_limit(
    raw: &RawRateLimit,
    key: &str,
    store: Option<&RateLimitStoreConfig>,
) -> Result<RateLimitConfig, Problem> {
    let k = |sub: &str| format!("{key}.{sub}");
    let rate_text = raw.rate.as_deref().ok_or_else(|| (k("rate"), "missing (e.g. \"100/s\")".to_owned()))?;
    let rate = parse_rate(rate_text).map_err(|m| (k("rate"), m))?;
    let burst = raw.burst.unwrap_or(rate.count);
    if burst == 0 {
        return Err((k("burst"), "must be at least 1".into()));
    }
    let most = max_burst(rate);
    if burst > most {
        return Err((
            k("burst"),
            format!("{burst} at {rate_text:?} takes longer than 100 years to refill; at most {most} at this rate"),
        ));
    }
    let limit_key = match raw.key.as_deref().unwrap_or("client") {
        "client" => RateLimitKey::Client,
        "route" => RateLimitKey::Route,
        other => match other.strip_prefix("header:") {
            Some(name) => {
                let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| {
                    (k("key"), format!("\"header:{}\": invalid header name", refused_name(name.trim())))
                })?;
                let missing = match raw.missing_key.as_deref() {
                    None | Some("share") => MissingKey::Share,
                    Some("refuse") => MissingKey::Refuse,
                    Some(m) => return Err((k("missing_key"), format!("{m:?}: use \"share\" or \"refuse\""))),
                };
                RateLimitKey::Header { name, missing }
            }
            None => {
                return Err((k("key"), format!("{other:?}: use \"client\", \"route\" or \"header:NAME\"")));
            }
        },
    };
    if raw.missing_key.is_some() && !matches!(limit_key, RateLimitKey::Header { .. }) {
        return Err((k("missing_key"), "only applies to a \"header:NAME\" key".into()));
    }
    let store_kind = match raw.shared.as_deref() {
        None | Some("local") => StoreKind::Local,
        Some("redis") if store.is_none() => {
            return Err((k("shared"), "\"redis\" needs a [rate_limit_store] section with its url".into()));
        }
        Some("redis") => StoreKind::Redis,
        Some(other) => return Err((k("shared"), format!("{other:?}: use \"redis\" or \"local\""))),
    };
    let max_keys = raw.max_keys.unwrap_or(DEFAULT_MAX_KEYS);
    if max_keys == 0 {
        return Err((k("max_keys"), "must be at least 1".into()));
    }
    Ok(RateLimitConfig {
        rate,
        burst,
        key: limit_key,
        headers: raw.headers.unwrap_or(false),
        store: store_kind,
        max_keys,
    })
}

/// `[rate_limit_store]`. `env` reads an environment variable (the password);
/// `ca_file` is taken from `base_dir`, the config's folder.
pub(super) fn store(
    raw: &RawRateLimitStore,
    env: impl Fn(&str) -> Option<String>,
    base_dir: &Path,
) -> Result<RateLimitStoreConfig, Problem> {
    let k = |sub: &str| format!("rate_limit_store.{sub}");
    let url = raw.url.clone().ok_or_else(|| (k("url"), "missing (e.g. \"redis://127.0.0.1:6379\")".to_owned()))?;
    let parsed: http::Uri =
        url.parse().map_err(|_| (k("url"), "not a URL (e.g. \"redis://127.0.0.1:6379\")".into()))?;
    if !matches!(parsed.scheme_str(), Some("redis" | "rediss")) || parsed.host().is_none() {
        return Err((k("url"), "use redis://HOST:PORT or rediss://HOST:PORT".into()));
    }
    // What the Redis client refuses (a port past 65535, a path that is not
    // a database number, a fragment) would otherwise be found only at start,
    // leaving the shared routes to local buckets whatever `on_error` says.
    // Its messages never quote the URL, which may hold a password.
    if url.contains('#') {
        // The client takes it whole, and it would show in `/-/config`.
        return Err((k("url"), "a fragment (#...) is not part of a Redis URL".into()));
    }
    redis::IntoConnectionInfo::into_connection_info(url.as_str())
        .map_err(|e| (k("url"), format!("the Redis client refuses it: {e}")))?;
    let password = match &raw.password_env {
        None => None,
        Some(var) => Some(env(var).ok_or_else(|| (k("password_env"), "the variable it names is not set (its name is not repeated here: a password pasted in its place would be)".to_owned()))?),
    };
    let timeout = match raw.timeout.as_deref() {
        Some(t) => positive_duration(&k("timeout"), t)?,
        None => DEFAULT_STORE_TIMEOUT,
    };
    let on_error = match raw.on_error.as_deref() {
        None | Some("local") => OnStoreError::Local,
        Some("allow") => OnStoreError::Allow,
        Some("deny") => OnStoreError::Deny,
        Some(other) => return Err((k("on_error"), format!("{other:?}: use \"local\", \"allow\" or \"deny\""))),
    };
    let ca_file = match &raw.ca_file {
        None => None,
        Some(_) if parsed.scheme_str() != Some("rediss") => {
            return Err((k("ca_file"), "only applies to a rediss:// url".into()));
        }
        Some(file) => {
            let path = base_dir.join(file);
            let pem = crate::tls::load_ca_pem(&path).map_err(|m| (k("ca_file"), m))?;
            Some(StoreCa { path, pem })
        }
    };
    Ok(RateLimitStoreConfig { url, password, timeout, on_error, ca_file })
}

/// The longest a full bucket may take to refill (`burst` intervals): a
/// bound far past any use that keeps the buckets' nanoseconds within u64
/// and Redis's microseconds exact in the script's doubles.
const MAX_REFILL: Duration = Duration::from_secs(100 * 365 * 86_400);

/// The largest `burst` at `rate` within [`MAX_REFILL`].
fn max_burst(rate: Rate) -> u32 {
    let most = MAX_REFILL.as_nanos() / rate.interval().as_nanos().max(1);
    u32::try_from(most).unwrap_or(u32::MAX)
}

/// `N/UNIT`: `s`, `m`, `h`, `d`, or a whole number of seconds such as `10s`.
fn parse_rate(text: &str) -> Result<Rate, String> {
    let usage = || format!("{text:?}: use COUNT/PERIOD, e.g. \"100/s\", \"600/m\", \"10/5s\"");
    let (count, unit) = text.trim().split_once('/').ok_or_else(usage)?;
    let count: u32 = count.trim().parse().map_err(|_| usage())?;
    if count == 0 {
        return Err(format!("{text:?}: the count must be at least 1"));
    }
    let period = match unit.trim() {
        "s" => Duration::from_secs(1),
        "m" => Duration::from_secs(60),
        "h" => Duration::from_secs(3600),
        "d" => Duration::from_secs(86_400),
        other => humantime::parse_duration(other).map_err(|_| usage())?,
    };
    // The RateLimit-Policy header counts its window in whole seconds.
    if period.is_zero() || period.subsec_nanos() != 0 || period > Duration::from_secs(86_400) {
        return Err(format!("{text:?}: the period must be whole seconds, from 1s to a day"));
    }
    if (period / count).is_zero() {
        return Err(format!("{text:?}: more than one request per nanosecond"));
    }
    Ok(Rate { count, period })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(rate: &str, key: Option<&str>) -> RawRateLimit {
        RawRateLimit {
            rate: Some(rate.into()),
            burst: None,
            key: key.map(str::to_owned),
            missing_key: None,
            headers: None,
            shared: None,
            max_keys: None,
        }
    }

    #[test]
    fn rates() {
        let cases: [(&str, Option<(u32, u64)>); 10] = [
            ("100/s", Some((100, 1))),
            ("600/m", Some((600, 60))),
            ("5/h", Some((5, 3600))),
            ("10/5s", Some((10, 5))),
            (" 7 / 2m ", Some((7, 120))),
            ("0/s", None),
            ("100", None),
            ("x/s", None),
            ("10/500ms", None),
            ("10/2d", None),
        ];
        for (text, want) in cases {
            let got = parse_rate(text).ok().map(|r| (r.count, r.period.as_secs()));
            assert_eq!(got, want, "{text}");
        }
    }

    #[test]
    fn keys_and_their_errors() {
        let key = "routes[0].rate_limit";
        let ok = rate_limit(&raw("10/s", Some("header:X-Api-Key")), key, None).unwrap();
        assert_eq!(
            ok.key,
            RateLimitKey::Header { name: HeaderName::from_static("x-api-key"), missing: MissingKey::Share }
        );
        assert_eq!((ok.burst, ok.store, ok.headers), (10, StoreKind::Local, false), "burst defaults to the count");
        assert_eq!(rate_limit(&raw("10/s", None), key, None).unwrap().key, RateLimitKey::Client);
        let refused = |r: RawRateLimit, want: &str| {
            let (k, m) = rate_limit(&r, key, None).expect_err(want);
            assert_eq!(k, format!("{key}.{want}"), "{m}");
        };
        refused(raw("10/s", Some("ip")), "key");
        refused(raw("10/s", Some("header:bad name")), "key");
        refused(raw("ten/s", None), "rate");
        refused(RawRateLimit { burst: Some(0), ..raw("10/s", None) }, "burst");
        refused(RawRateLimit { burst: Some(36_501), ..raw("1/d", None) }, "burst");
        refused(RawRateLimit { burst: Some(213_510), ..raw("1/d", None) }, "burst");
        refused(RawRateLimit { burst: Some(u32::MAX), ..raw("1/h", None) }, "burst");
        let most = rate_limit(&RawRateLimit { burst: Some(36_500), ..raw("1/d", None) }, key, None).unwrap();
        assert_eq!(most.burst, 36_500, "a century of days is the bound");
        assert!(rate_limit(&RawRateLimit { burst: Some(u32::MAX), ..raw("1000/s", None) }, key, None).is_ok());
        refused(RawRateLimit { missing_key: Some("refuse".into()), ..raw("10/s", None) }, "missing_key");
        refused(RawRateLimit { missing_key: Some("drop".into()), ..raw("1/s", Some("header:a")) }, "missing_key");
        refused(RawRateLimit { shared: Some("redis".into()), ..raw("10/s", None) }, "shared");
        refused(RawRateLimit { shared: Some("memcached".into()), ..raw("10/s", None) }, "shared");
        refused(RawRateLimit { rate: None, ..raw("10/s", None) }, "rate");
        refused(RawRateLimit { max_keys: Some(0), ..raw("10/s", None) }, "max_keys");
    }

    #[test]
    fn stores() {
        let raw = |url: &str| RawRateLimitStore {
            url: Some(url.into()),
            password_env: None,
            timeout: None,
            on_error: None,
            ca_file: None,
        };
        let none = |_: &str| None;
        let store = |r: &RawRateLimitStore, env: &dyn Fn(&str) -> Option<String>| store(r, env, Path::new("."));
        let s = store(&raw("redis://127.0.0.1:6379"), &none).unwrap();
        assert_eq!((s.timeout, s.on_error, s.password), (DEFAULT_STORE_TIMEOUT, OnStoreError::Local, None));
        assert!(store(&raw("rediss://cache.example:6380"), &none).is_ok());
        assert!(store(&raw("redis://cache.example:6380/2"), &none).is_ok(), "a database number");
        let key_of = |r: RawRateLimitStore| store(&r, &none).unwrap_err().0;
        assert_eq!(key_of(raw("http://127.0.0.1")), "rate_limit_store.url");
        for refused in
            ["redis://127.0.0.1:99999", "redis://127.0.0.1:6379/keys", "rediss://h:6380#x", "redis://0.0.0.0"]
        {
            assert_eq!(key_of(raw(refused)), "rate_limit_store.url", "{refused}");
        }
        assert_eq!(key_of(RawRateLimitStore { url: None, ..raw("") }), "rate_limit_store.url");
        assert_eq!(
            key_of(RawRateLimitStore { timeout: Some("0s".into()), ..raw("redis://h") }),
            "rate_limit_store.timeout"
        );
        assert_eq!(
            key_of(RawRateLimitStore { on_error: Some("retry".into()), ..raw("redis://h") }),
            "rate_limit_store.on_error"
        );
        let with_env = RawRateLimitStore { password_env: Some("RL_PW".into()), ..raw("redis://h") };
        assert_eq!(key_of(RawRateLimitStore { ..with_env }), "rate_limit_store.password_env");
        // A password pasted where its variable's name goes is not repeated.
        let pasted = RawRateLimitStore { password_env: Some("hunter2".into()), ..raw("redis://h") };
        let (_, why) = store(&pasted, &none).unwrap_err();
        assert!(!why.contains("hunter2"), "{why}");
        let with_env = RawRateLimitStore { password_env: Some("RL_PW".into()), ..raw("redis://h") };
        let s = store(&with_env, &|v| (v == "RL_PW").then(|| "secret".to_owned())).unwrap();
        assert_eq!(s.password.as_deref(), Some("secret"));
    }

    #[test]
    fn a_ca_file_must_be_a_readable_ca_and_only_with_rediss() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("junk.pem"), "not a certificate").unwrap();
        let raw = |url: &str, ca: &str| RawRateLimitStore {
            url: Some(url.into()),
            password_env: None,
            timeout: None,
            on_error: None,
            ca_file: Some(ca.into()),
        };
        let refused = |r: RawRateLimitStore, why: &str| {
            let (key, message) = store(&r, |_| None, dir.path()).expect_err(why);
            assert_eq!(key, "rate_limit_store.ca_file", "{why}: {message}");
            message
        };
        refused(raw("redis://127.0.0.1:6379", "junk.pem"), "redis:// has no TLS");
        let missing = refused(raw("rediss://127.0.0.1:6379", "absent.pem"), "a missing file");
        assert!(missing.contains(&dir.path().join("absent.pem").display().to_string()), "{missing}");
        refused(raw("rediss://127.0.0.1:6379", "junk.pem"), "a file without a certificate");
        refused(raw("rediss://127.0.0.1:6379", "."), "a folder");
    }
}
