//! JWT bearer tokens end to end: tokens signed in the test with fixed keys
//! (RSA, EC P-256, Ed25519; `tests/fixtures/jwt/`), valid ones forwarded with
//! their claims as headers, and every refusal RFC 8725 asks for answered
//! 401 with `WWW-Authenticate: Bearer error="invalid_token"` while the
//! recording upstream sees nothing of it.

mod auth_common;
mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use auth_common::*;
use base64::Engine;
use common::*;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

const INVALID: &str = "Bearer error=\"invalid_token\"";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jwt").join(name)
}

fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

/// Claims that pass, with `changes` merged in (`null` removes one).
fn claims(changes: Value) -> Value {
    let mut c = json!({"sub": "ann", "iss": "https://id.test", "aud": "api", "exp": now() + 300, "groups": ["a", "b"]});
    for (k, v) in changes.as_object().unwrap() {
        if v.is_null() {
            c.as_object_mut().unwrap().remove(k);
        } else {
            c[k] = v.clone();
        }
    }
    c
}

/// A token signed with the fixture key `key` (`rsa`, `rsa2`, `ec`, `ed`).
fn token(alg: Algorithm, kid: Option<&str>, key: &str, claims: &Value) -> String {
    let pem = std::fs::read(fixture(&format!("{key}.pem"))).unwrap();
    let key = match alg {
        Algorithm::ES256 => EncodingKey::from_ec_pem(&pem),
        Algorithm::EdDSA => EncodingKey::from_ed_pem(&pem),
        _ => EncodingKey::from_rsa_pem(&pem),
    }
    .unwrap();
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, claims, &key).unwrap()
}

fn b64(v: &Value) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
}

/// A gateway with route `name` (from Authorization) and `name_cookie` (from
/// the `session` cookie), the JWKS copied to `dir` so a test may rotate it.
async fn gateway(dir: &Path, up: std::net::SocketAddr, name: &str) -> TestGateway {
    std::fs::copy(fixture("jwks.json"), dir.join("jwks.json")).unwrap();
    let jwt = "jwks_file = \"jwks.json\", algorithms = [\"RS256\", \"ES256\", \"EdDSA\"], issuer = \"https://id.test\", \
               audiences = [\"api\", \"other\"], leeway = \"5s\"";
    let toml = format!(
        "{}{}",
        route(
            up,
            name,
            &format!(
                "auth = {{ jwt = {{ {jwt}, forward_claims = {{ \"x-user\" = \"sub\", \"x-groups\" = \"groups\" }} }} }}"
            )
        ),
        route(up, &format!("{name}_cookie"), &format!("auth = {{ jwt = {{ {jwt}, from = \"cookie:session\" }} }}")),
    );
    let file = dir.join("gateway.toml");
    std::fs::write(&file, toml).unwrap();
    let mut c = gateway::config::load(&gateway::config::Source::File(file)).unwrap();
    c.server.listen = "127.0.0.1:0".parse().unwrap();
    TestGateway::start(c).await
}

async fn bearer(gw: &TestGateway, path: &str, token: &str) -> (u16, Option<String>) {
    let (parts, _) = get_with(&gw.url(path), &[("authorization", &format!("Bearer {token}"))]).await;
    (parts.status.as_u16(), header(&parts, "www-authenticate").map(str::to_owned))
}

#[tokio::test]
async fn valid_tokens_of_each_key_type_pass_with_their_claims_forwarded() {
    let dir = tempfile::tempdir().unwrap();
    let (up, seen) = recording().await;
    let gw = gateway(dir.path(), up.addr, "jwt").await;
    let good = claims(json!({}));
    for (alg, kid, key) in
        [(Algorithm::RS256, "rsa1", "rsa"), (Algorithm::ES256, "ec1", "ec"), (Algorithm::EdDSA, "ed1", "ed")]
    {
        let t = token(alg, Some(kid), key, &good);
        // The client's own copies of the claim headers, in both spellings.
        let headers =
            [("authorization", format!("Bearer {t}")), ("x-user", "mallory".into()), ("x_user", "eve".into())];
        // Naming the claim headers in Connection must not strip the token's.
        let headers = [headers.as_slice(), &[("connection", "x-user, x-groups".into())]].concat();
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (parts, _) = get_with(&gw.url("/jwt"), &headers).await;
        assert_eq!(parts.status, 200, "{alg:?}");
    }
    // Within the leeway; an audience list in the token with one of ours.
    let late = token(Algorithm::RS256, Some("rsa1"), "rsa", &claims(json!({"exp": now() - 2, "aud": ["x", "other"]})));
    assert_eq!(bearer(&gw, "/jwt", &late).await.0, 200);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 4);
    for h in seen.iter() {
        assert_eq!(h.get_all("x-user").iter().collect::<Vec<_>>(), ["ann"]);
        assert!(h.get("x_user").is_none());
        assert_eq!(h.get("x-groups").unwrap(), "a, b");
        assert!(h.get("authorization").is_none(), "the consumed token is not forwarded");
    }
}

#[tokio::test]
async fn every_refusal_is_401_invalid_token_and_never_reaches_the_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let (up, seen) = recording().await;
    let gw = gateway(dir.path(), up.addr, "jwt_refused").await;
    let rs = |c: Value| token(Algorithm::RS256, Some("rsa1"), "rsa", &c);
    let good = claims(json!({}));
    let public = std::fs::read(fixture("rsa.pub.pem")).unwrap();
    let mut hs = Header::new(Algorithm::HS256);
    hs.kid = Some("rsa1".into());
    let hmac_with_public_key = jsonwebtoken::encode(&hs, &good, &EncodingKey::from_secret(&public).unwrap()).unwrap();
    let none = format!("{}.{}.", b64(&json!({"alg": "none", "typ": "JWT", "kid": "rsa1"})), b64(&good));
    let mut tampered = rs(good.clone());
    let sig_start = tampered.rfind('.').unwrap() + 1;
    let flipped = if tampered.as_bytes()[sig_start] == b'A' { "B" } else { "A" };
    tampered.replace_range(sig_start..sig_start + 1, flipped);
    let cases = [
        ("expired", rs(claims(json!({"exp": now() - 60})))),
        ("not yet valid", rs(claims(json!({"nbf": now() + 60})))),
        ("no exp", rs(claims(json!({"exp": null})))),
        ("wrong issuer", rs(claims(json!({"iss": "https://evil.test"})))),
        ("no issuer", rs(claims(json!({"iss": null})))),
        ("an array issuer holding the issuer", rs(claims(json!({"iss": ["https://id.test", "https://evil.test"]})))),
        ("an array issuer of the issuer alone", rs(claims(json!({"iss": ["https://id.test"]})))),
        ("wrong audience", rs(claims(json!({"aud": "elsewhere"})))),
        ("alg none", none),
        ("HS256 signed with the public key", hmac_with_public_key),
        ("an algorithm not listed", token(Algorithm::RS384, Some("rsa1"), "rsa", &good)),
        ("no kid", token(Algorithm::RS256, None, "rsa", &good)),
        ("unknown kid", token(Algorithm::RS256, Some("rsa2"), "rsa2", &good)),
        ("an EC token naming the RSA key", token(Algorithm::ES256, Some("rsa1"), "ec", &good)),
        ("a token signed by another key", token(Algorithm::RS256, Some("rsa1"), "rsa2", &good)),
        ("a bad signature", tampered),
        ("not a JWT", "abc".to_owned()),
    ];
    for (what, t) in &cases {
        assert_eq!(bearer(&gw, "/jwt_refused", t).await, (401, Some(INVALID.to_owned())), "{what}");
    }
    // No token: a challenge without an error code (RFC 6750 §3.1).
    let (parts, body) = get(&gw.url("/jwt_refused")).await;
    assert_eq!((parts.status.as_u16(), header(&parts, "www-authenticate")), (401, Some("Bearer")));
    assert_eq!(&body[..], b"unauthorized\n");
    assert!(seen.lock().unwrap().is_empty(), "no refused request reached the upstream");
    let text = metrics_text(gw.addr).await;
    let denied =
        sample(&text, "gateway_auth_total", &[("route", "jwt_refused"), ("kind", "jwt"), ("result", "denied")]);
    assert_eq!(denied, Some(cases.len() as f64 + 1.0));
}

#[tokio::test]
async fn a_token_in_a_cookie_and_a_rotated_key_set_after_reload() {
    let dir = tempfile::tempdir().unwrap();
    let (up, seen) = recording().await;
    let gw = gateway(dir.path(), up.addr, "jwt_rotate").await;
    let good = claims(json!({}));
    let t = token(Algorithm::EdDSA, Some("ed1"), "ed", &good);
    let cookie = format!("theme=dark; session={t}");
    let (parts, _) = get_with(&gw.url("/jwt_rotate_cookie"), &[("cookie", &cookie)]).await;
    assert_eq!(parts.status, 200);
    let (parts, _) = get_with(&gw.url("/jwt_rotate_cookie"), &[("authorization", &format!("Bearer {t}"))]).await;
    assert_eq!(parts.status, 401, "that route reads the cookie only");
    // A second copy (of the cookie, or of Authorization) is refused: the
    // upstream could read the copy that was not checked.
    let forged = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJhZG1pbiJ9.";
    let two = format!("session={t}; session={forged}");
    assert_eq!(get_with(&gw.url("/jwt_rotate_cookie"), &[("cookie", &two)]).await.0.status, 401, "two cookies");
    let two = [("authorization", format!("Bearer {t}")), ("authorization", format!("Bearer {forged}"))];
    let two: Vec<(&str, &str)> = two.iter().map(|(k, v)| (*k, v.as_str())).collect();
    assert_eq!(get_with(&gw.url("/jwt_rotate"), &two).await.0.status, 401, "two Authorization headers");
    // A key the set does not have yet; then the rotated set is reloaded.
    let rotated = token(Algorithm::RS256, Some("rsa2"), "rsa2", &good);
    assert_eq!(bearer(&gw, "/jwt_rotate", &rotated).await.0, 401);
    std::fs::copy(fixture("jwks-rotated.json"), dir.path().join("jwks.json")).unwrap();
    gw.app.reload().expect("reload");
    assert_eq!(bearer(&gw, "/jwt_rotate", &rotated).await.0, 200);
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[test]
fn symmetric_algorithms_and_keys_are_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("oct.json"), r#"{"keys":[{"kty":"oct","kid":"s","k":"c2VjcmV0"}]}"#).unwrap();
    std::fs::write(
        dir.path().join("nokid.json"),
        r#"{"keys":[{"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}"#,
    )
    .unwrap();
    std::fs::copy(fixture("jwks.json"), dir.path().join("jwks.json")).unwrap();
    let all: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture("jwks.json")).unwrap()).unwrap();
    let rsa_only: Vec<_> = all["keys"].as_array().unwrap().iter().filter(|k| k["alg"] == "RS256").cloned().collect();
    std::fs::write(dir.path().join("rsa-only.json"), serde_json::json!({ "keys": rsa_only }).to_string()).unwrap();
    // A JWKS with keys of other algorithms too is fine: those are not used.
    let toml = "[[routes]]\nname = 'r'\nprefix = '/r'\nrespond = { status = 200 }\n\
                auth = { jwt = { jwks_file = 'jwks.json', algorithms = ['ES256'] } }\n";
    gateway::config::load(&gateway::config::Source::Inline { text: toml.into(), base_dir: dir.path().into() })
        .expect("the EC key serves ES256; the RS256 one is left out");
    let cases = [
        ("jwks_file = 'jwks.json', algorithms = ['HS256']", "HMAC"),
        ("jwks_file = 'oct.json', algorithms = ['RS256']", "symmetric"),
        ("jwks_file = 'nokid.json', algorithms = ['EdDSA']", "no \"kid\""),
        ("jwks_file = 'rsa-only.json', algorithms = ['ES256']", "no key of the listed algorithms"),
        ("jwks_file = 'jwks.json'", "routes[0].auth.jwt.algorithms: missing"),
        ("jwks_url = 'ftp://id.test/jwks', algorithms = ['RS256']", "use an https://"),
        ("jwks_file = 'jwks.json', jwks_url = 'https://id.test/jwks', algorithms = ['RS256']", "exactly one of"),
        ("jwks_file = 'jwks.json', algorithms = ['RS256'], from = 'header'", "cookie:NAME"),
    ];
    for (jwt, says) in cases {
        let toml = format!(
            "[[routes]]\nname = 'r'\nprefix = '/r'\nrespond = {{ status = 200 }}\nauth = {{ jwt = {{ {jwt} }} }}\n"
        );
        let e = gateway::config::load(&gateway::config::Source::Inline { text: toml, base_dir: dir.path().into() })
            .expect_err(jwt);
        assert!(e.to_string().contains(says), "{jwt}: {e}");
    }
}

/// A key server whose answer (status, JWKS) the test changes, counting fetches.
async fn key_server(jwks: &str) -> (TestUpstream, Arc<Mutex<(u16, String)>>, Arc<AtomicUsize>) {
    let state = Arc::new(Mutex::new((200, std::fs::read_to_string(fixture(jwks)).unwrap())));
    let fetches = Arc::new(AtomicUsize::new(0));
    let (s, f) = (state.clone(), fetches.clone());
    let up = TestUpstream::start(move |_req: http::Request<hyper::body::Incoming>| {
        let (status, body) = s.lock().unwrap().clone();
        f.fetch_add(1, Ordering::SeqCst);
        async move {
            http::Response::builder()
                .status(status)
                .header("cache-control", "public, max-age=600")
                .body(full(body))
                .unwrap()
        }
    })
    .await;
    (up, state, fetches)
}

async fn url_gateway(up: std::net::SocketAddr, keys: std::net::SocketAddr, name: &str) -> TestGateway {
    let jwt = format!("jwks_url = \"http://{keys}/jwks.json\", algorithms = [\"RS256\", \"ES256\", \"EdDSA\"]");
    TestGateway::from_toml(&route(up, name, &format!("auth = {{ jwt = {{ {jwt} }} }}"))).await
}

/// Waits for the gateway's first fetch: the token passes.
async fn until_passes(gw: &TestGateway, path: &str, token: &str) {
    for _ in 0..100 {
        if bearer(gw, path, token).await.0 == 200 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("{path}: the token never passed");
}

#[tokio::test]
async fn a_jwks_url_is_fetched_at_start_and_again_once_for_an_unknown_kid() {
    let (up, _seen) = recording().await;
    let (keys, state, fetches) = key_server("jwks.json").await;
    let gw = url_gateway(up.addr, keys.addr, "jwt_url").await;
    let good = claims(json!({}));
    until_passes(&gw, "/jwt_url", &token(Algorithm::ES256, Some("ec1"), "ec", &good)).await;
    assert_eq!(fetches.load(Ordering::SeqCst), 1, "fetched once at start (max-age 600)");
    // The key server rotates; a token of the new key makes one fetch.
    state.lock().unwrap().1 = std::fs::read_to_string(fixture("jwks-rotated.json")).unwrap();
    let rotated = token(Algorithm::RS256, Some("rsa2"), "rsa2", &good);
    assert_eq!(bearer(&gw, "/jwt_url", &rotated).await.0, 200);
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    // Made-up kids do not make the gateway fetch again within MIN_REFETCH.
    for kid in ["nope-1", "nope-2", "nope-3"] {
        let t = token(Algorithm::RS256, Some(kid), "rsa", &good);
        assert_eq!(bearer(&gw, "/jwt_url", &t).await, (401, Some(INVALID.to_owned())), "{kid}");
    }
    assert_eq!(fetches.load(Ordering::SeqCst), 2, "refetches are rate-limited");
}

#[tokio::test]
async fn a_failed_jwks_fetch_keeps_the_last_good_keys_and_no_keys_is_503() {
    let (up, _seen) = recording().await;
    let (keys, state, fetches) = key_server("jwks.json").await;
    let gw = url_gateway(up.addr, keys.addr, "jwt_url_fail").await;
    let good = claims(json!({}));
    let rsa1 = token(Algorithm::RS256, Some("rsa1"), "rsa", &good);
    until_passes(&gw, "/jwt_url_fail", &rsa1).await;
    state.lock().unwrap().0 = 500;
    let unknown = token(Algorithm::RS256, Some("rsa2"), "rsa2", &good);
    assert_eq!(bearer(&gw, "/jwt_url_fail", &unknown).await.0, 401);
    assert_eq!(fetches.load(Ordering::SeqCst), 2, "the refetch was made, and failed");
    assert_eq!(bearer(&gw, "/jwt_url_fail", &rsa1).await.0, 200, "the last good keys are kept");
    let text = metrics_text(gw.addr).await;
    assert!(sample(&text, "gateway_auth_jwks_refresh_total", &[("result", "error")]).unwrap_or(0.0) >= 1.0);
    // A key server that is not there: no keys, 503 (fail closed).
    let gw = url_gateway(up.addr, refused_addr().await, "jwt_url_none").await;
    let (status, _) = bearer(&gw, "/jwt_url_none", &rsa1).await;
    assert_eq!(status, 503);
}

#[tokio::test]
async fn a_rebuild_after_a_discovery_change_keeps_the_keys() {
    let (up, _seen) = recording().await;
    let (keys, state, fetches) = key_server("jwks.json").await;
    let gw = url_gateway(up.addr, keys.addr, "jwt_url_kept").await;
    let rsa1 = token(Algorithm::RS256, Some("rsa1"), "rsa", &claims(json!({})));
    until_passes(&gw, "/jwt_url_kept", &rsa1).await;
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
    // The key server goes down; then an upstream's addresses change (the
    // table is built again from the same configuration).
    state.lock().unwrap().0 = 500;
    gw.app.rediscovered();
    assert_eq!(bearer(&gw, "/jwt_url_kept", &rsa1).await.0, 200, "the keys went on, no 503");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(fetches.load(Ordering::SeqCst), 1, "and were not fetched again");
}

#[tokio::test]
async fn a_fetched_set_is_used_for_its_good_keys_and_refresh_caps_its_max_age() {
    let (up, _seen) = recording().await;
    let (keys, state, fetches) = key_server("jwks.json").await;
    // What key servers publish beside signing keys: an encryption key, a
    // key type this verifier does not know, a malformed key, a symmetric one.
    let mut set: Value = serde_json::from_str(&state.lock().unwrap().1).unwrap();
    let mut enc = set["keys"].as_array().unwrap().iter().find(|k| k["kid"] == "rsa1").unwrap().clone();
    enc["kid"] = json!("enc1");
    enc["use"] = json!("enc");
    let extra = [
        enc,
        json!({"kty": "future-kty", "kid": "new1"}),
        json!({"kty": "EC", "kid": "bad1", "crv": "P-256", "x": "!!", "y": "!!"}),
        json!({"kty": "oct", "kid": "sym1", "k": "c2VjcmV0"}),
    ];
    set["keys"].as_array_mut().unwrap().extend(extra);
    state.lock().unwrap().1 = set.to_string();
    let jwt =
        format!("jwks_url = \"http://{}/jwks.json\", refresh = \"1s\", algorithms = [\"RS256\", \"ES256\"]", keys.addr);
    let gw = TestGateway::from_toml(&route(up.addr, "jwt_mixed", &format!("auth = {{ jwt = {{ {jwt} }} }}"))).await;
    let good = claims(json!({}));
    until_passes(&gw, "/jwt_mixed", &token(Algorithm::ES256, Some("ec1"), "ec", &good)).await;
    assert_eq!(bearer(&gw, "/jwt_mixed", &token(Algorithm::RS256, Some("rsa1"), "rsa", &good)).await.0, 200);
    // The encryption key is not one to verify with, even with a good signature.
    assert_eq!(bearer(&gw, "/jwt_mixed", &token(Algorithm::RS256, Some("enc1"), "rsa", &good)).await.0, 401);
    // The key server says max-age=600; refresh = 1s is the longest the keys go unchecked.
    let before = fetches.load(Ordering::SeqCst);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while fetches.load(Ordering::SeqCst) < before + 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(fetches.load(Ordering::SeqCst) >= before + 2, "fetched again at refresh, not after max-age");
}

#[tokio::test]
async fn bad_tokens_are_rate_limited_before_they_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture("jwks.json"), dir.path().join("jwks.json")).unwrap();
    let (up, seen) = recording().await;
    let limited = "auth = { jwt = { jwks_file = \"jwks.json\", algorithms = [\"RS256\"], issuer = \"https://id.test\", \
                   audiences = [\"api\"] } }\nrate_limit = { rate = \"1/m\", burst = 2 }";
    let gw = TestGateway::start(config(&route(up.addr, "jwt_limited", limited), dir.path())).await;
    let forged = token(Algorithm::RS256, Some("rsa1"), "rsa2", &claims(json!({})));
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(bearer(&gw, "/jwt_limited", &forged).await.0);
    }
    assert_eq!(statuses, [401, 401, 429, 429], "401 for the burst's tokens, then 429");
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_limit_keyed_by_a_forwarded_claim_counts_the_tokens_user_not_the_clients_header() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture("jwks.json"), dir.path().join("jwks.json")).unwrap();
    let (up, seen) = recording().await;
    let per_user = "auth = { jwt = { jwks_file = \"jwks.json\", algorithms = [\"RS256\"], issuer = \"https://id.test\", \
                    audiences = [\"api\"], forward_claims = { \"x-user\" = \"sub\" } } }\n\
                    rate_limit = { rate = \"1/m\", burst = 2, key = \"header:x-user\" }";
    let gw = TestGateway::start(config(&route(up.addr, "jwt_per_user", per_user), dir.path())).await;
    let ann = token(Algorithm::RS256, Some("rsa1"), "rsa", &claims(json!({})));
    let mut statuses = Vec::new();
    for i in 0..4 {
        // A new x-user of the client's own each time: were the limit decided
        // before the token's claim replaced it, each would be a fresh bucket.
        let (authz, own) = (format!("Bearer {ann}"), format!("mallory-{i}"));
        let (parts, _) = get_with(&gw.url("/jwt_per_user"), &[("authorization", &authz), ("x-user", &own)]).await;
        statuses.push(parts.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 429, 429], "the token's user has one bucket");
    assert_eq!(seen.lock().unwrap().len(), 2);
}

/// Tokens a route verified are remembered (`cache_tokens`, on by default);
/// a remembered one is still refused once its `exp` is past.
#[tokio::test]
async fn a_remembered_token_still_expires() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture("jwks.json"), dir.path().join("jwks.json")).unwrap();
    let (up, seen) = recording().await;
    let jwt = "auth = { jwt = { jwks_file = \"jwks.json\", algorithms = [\"ES256\"], leeway = \"0s\" } }";
    let gw = TestGateway::start(config(&route(up.addr, "jwt_expiring", jwt), dir.path())).await;
    let exp = now() + 2;
    let t = token(Algorithm::ES256, Some("ec1"), "ec", &claims(json!({"exp": exp})));
    assert_eq!(bearer(&gw, "/jwt_expiring", &t).await.0, 200, "verified");
    assert_eq!(bearer(&gw, "/jwt_expiring", &t).await.0, 200, "remembered");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while now() <= exp && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(bearer(&gw, "/jwt_expiring", &t).await, (401, Some(INVALID.to_owned())), "past its exp");
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn a_remembered_token_has_its_claims_forwarded_each_time() {
    let dir = tempfile::tempdir().unwrap();
    let (up, seen) = recording().await;
    let gw = gateway(dir.path(), up.addr, "jwt_again").await;
    let t = token(Algorithm::ES256, Some("ec1"), "ec", &claims(json!({})));
    for _ in 0..3 {
        let headers = [("authorization", format!("Bearer {t}")), ("x-user", "mallory".into())];
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(get_with(&gw.url("/jwt_again"), &headers).await.0.status, 200);
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3);
    for h in seen.iter() {
        assert_eq!(h.get_all("x-user").iter().collect::<Vec<_>>(), ["ann"]);
        assert_eq!(h.get("x-groups").unwrap(), "a, b");
    }
}

#[tokio::test]
async fn a_remembered_token_of_a_key_dropped_from_the_jwks_url_is_refused() {
    let (up, _seen) = recording().await;
    let (keys, state, fetches) = key_server("jwks.json").await;
    let jwt =
        format!("jwks_url = \"http://{}/jwks.json\", refresh = \"1s\", algorithms = [\"RS256\", \"ES256\"]", keys.addr);
    let gw = TestGateway::from_toml(&route(up.addr, "jwt_revoked", &format!("auth = {{ jwt = {{ {jwt} }} }}"))).await;
    let good = claims(json!({}));
    let (ec1, rsa1) =
        (token(Algorithm::ES256, Some("ec1"), "ec", &good), token(Algorithm::RS256, Some("rsa1"), "rsa", &good));
    until_passes(&gw, "/jwt_revoked", &ec1).await;
    assert_eq!(bearer(&gw, "/jwt_revoked", &ec1).await.0, 200, "remembered");
    // The key server drops ec1: after the next refresh (1 s) its tokens fail.
    let mut set: Value = serde_json::from_str(&state.lock().unwrap().1).unwrap();
    set["keys"].as_array_mut().unwrap().retain(|k| k["kid"] != "ec1");
    state.lock().unwrap().1 = set.to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut answer = bearer(&gw, "/jwt_revoked", &ec1).await;
    while answer.0 == 200 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        answer = bearer(&gw, "/jwt_revoked", &ec1).await;
    }
    assert_eq!(answer, (401, Some(INVALID.to_owned())), "its key is gone");
    assert!(fetches.load(Ordering::SeqCst) >= 2, "fetched again");
    assert_eq!(bearer(&gw, "/jwt_revoked", &rsa1).await.0, 200, "the other keys go on");
}
