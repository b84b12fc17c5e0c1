//! Access control against a hostile client, end to end: what the client
//! may not slip past a route's `auth` (request trailers naming the headers
//! auth sets, a second token cookie spelled with spaces, HTTP/2 cookie
//! crumbs split before the auth service), on real sockets, with a
//! raw-socket upstream that records every byte it is sent.

mod auth_common;
mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use auth_common::*;
use common::*;
use http::{HeaderMap, Request, Response};
use hyper::body::Incoming;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jwt").join(name)
}

/// A valid RS256 token (fixture key `rsa1`) for `sub`.
fn token(sub: &str) -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    let key = EncodingKey::from_rsa_pem(&std::fs::read(fixture("rsa.pem")).unwrap()).unwrap();
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some("rsa1".into());
    jsonwebtoken::encode(&header, &json!({"sub": sub, "exp": now + 300}), &key).unwrap()
}

/// The JWT keys of a route reading the fixture JWKS.
fn jwt(extra: &str) -> String {
    let jwks = fixture("jwks.json");
    format!("auth = {{ jwt = {{ jwks_file = {:?}, algorithms = [\"RS256\"]{extra} }} }}", jwks.display().to_string())
}

/// An upstream that records the bytes of every request (chunked ones to
/// their trailer section's end) and answers each `200 ok`.
async fn recording_bytes() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let addr = raw_upstream(move |mut stream| {
        let s = s.clone();
        async move {
            let mut got = Vec::new();
            let mut buf = [0u8; 8192];
            while let Ok(n) = stream.read(&mut buf).await {
                if n == 0 {
                    return;
                }
                got.extend_from_slice(&buf[..n]);
                while let Some(end) = request_end(&got) {
                    s.lock().unwrap().push(String::from_utf8_lossy(&got[..end]).into_owned());
                    got.drain(..end);
                    let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    if stream.write_all(ok).await.is_err() {
                        return;
                    }
                }
            }
        }
    })
    .await;
    (addr, seen)
}

/// Where the first request in `got` ends: its head, or (chunked) its last
/// chunk and trailer section. The tests send small bodies in one piece.
fn request_end(got: &[u8]) -> Option<usize> {
    let find = |from: usize, what: &[u8]| got[from..].windows(what.len()).position(|w| w == what).map(|p| from + p);
    let head_end = find(0, b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&got[..head_end]).to_ascii_lowercase();
    if !head.contains("transfer-encoding: chunked") {
        return Some(head_end);
    }
    let last = find(head_end - 2, b"\r\n0\r\n")? + 2;
    Some(find(last + 1, b"\r\n\r\n")? + 4)
}

/// An auth service that lets every request through as `ann`.
async fn allowing_auth_service() -> (TestUpstream, Arc<Mutex<Vec<HeaderMap>>>) {
    let asked = Arc::new(Mutex::new(Vec::new()));
    let a = asked.clone();
    let up = TestUpstream::start(move |req: Request<Incoming>| {
        a.lock().unwrap().push(req.headers().clone());
        async move { Response::builder().header("x-user", "ann").body(full("")).unwrap() }
    })
    .await;
    (up, asked)
}

/// The trailer section of a recorded chunked request, lower-cased.
fn trailer_section(request: &str) -> String {
    let after_last_chunk = request.rsplit_once("\r\n0\r\n").map_or("", |(_, t)| t);
    after_last_chunk.to_ascii_lowercase()
}

/// Request trailers naming what a route's auth sets (`X-User` from a JWT
/// claim or the auth service, in any spelling of `-` and `_`) or decides on
/// (the token's cookie, the headers sent to the auth service) never reach
/// the upstream: one that merges trailers into headers would read the
/// client's `admin` beside the gateway's `ann`.
#[tokio::test]
async fn request_trailers_cannot_carry_what_auth_sets_or_checks() {
    let (up, seen) = recording_bytes().await;
    let (auth, _) = allowing_auth_service().await;
    let toml = format!(
        "{}{}{}",
        route(up, "claims", &jwt(", forward_claims = { \"x-user\" = \"sub\" }")),
        route(up, "cookie", &jwt(", from = \"cookie:session\""),),
        route(
            up,
            "fwd",
            &format!(
                "auth = {{ forward = {{ url = \"http://{}/v\", request_headers = [\"cookie\", \"x-api-key\"], \
                 response_headers = [\"x-user\"] }} }}",
                auth.addr
            )
        ),
    );
    let gw = TestGateway::from_toml(&toml).await;
    let t = token("ann");
    let cases = [
        ("/claims", format!("Authorization: Bearer {t}\r\n")),
        ("/cookie", format!("Cookie: session={t}\r\n")),
        ("/fwd", "Cookie: session=s\r\nX-Api-Key: k\r\n".to_owned()),
    ];
    for (path, credentials) in &cases {
        let request = format!(
            "POST {path}/x HTTP/1.1\r\nHost: x\r\n{credentials}Transfer-Encoding: chunked\r\n\
             Trailer: X-User, x_user, X_USER, cookie, x-api-key, X-Real-IP, x_forwarded_ssl, x-checksum\r\nConnection: close\r\n\r\n\
             4\r\nbody\r\n0\r\nX-User: admin\r\nx_user: root\r\nX_USER: root\r\nCookie: session=FORGED\r\n\
             X-Api-Key: forged\r\nX-Real-IP: 6.6.6.6\r\nx_forwarded_ssl: on\r\nx-checksum: ok\r\n\r\n"
        );
        let r = raw(gw.addr, request.as_bytes(), Duration::from_secs(3)).await;
        assert_eq!(r.status(), 200, "{path}: {}", r.text);
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), cases.len());
    // What each route's auth sets or decides on.
    let guarded: [&[&str]; 3] = [&["x-user", "x_user"], &["cookie"], &["x-user", "x_user", "cookie", "x-api-key"]];
    for (request, names) in seen.iter().zip(guarded) {
        let trailers = trailer_section(request);
        assert!(trailers.contains("x-checksum: ok\r\n"), "the client's own trailer passes: {request:?}");
        // And on every route what only a proxy in front may say.
        for name in names.iter().chain(&["x-real-ip", "x_forwarded_ssl"]) {
            assert!(!trailers.contains(&format!("{name}:")), "{name} in the trailers: {request:?}");
        }
    }
    assert!(seen[0].to_ascii_lowercase().contains("\r\nx-user: ann\r\n"), "{:?}", seen[0]);
    assert!(seen[2].to_ascii_lowercase().contains("\r\nx-user: ann\r\n"), "{:?}", seen[2]);
}

/// A hash whose cost is past the documented bounds (bcrypt above 17,
/// SHA-crypt above 10,000,000 rounds, Argon2 above 2 GiB) is refused when
/// the file is read, naming its line: one wrong password for it would hold
/// a verification slot for hours. On a reload, nothing changes.
#[tokio::test]
async fn a_hash_cost_past_the_bound_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    htpasswd(dir.path(), 4);
    let (up, _) = recording().await;
    let toml = route(up.addr, "cost", "auth = { basic = { htpasswd = \"users.htpasswd\" } }");
    let gw = TestGateway::from_file(dir.path(), &toml).await;
    let ann = basic("ann", "pw-ann");
    assert_eq!(get_with(&gw.url("/cost"), &[("authorization", &ann)]).await.0.status, 200);
    // The form is right; only the cost is too high (a real one would take
    // years to make).
    let cheap = bcrypt::hash("pw-bob", 4).unwrap();
    let sha = "$saltsalt$/QtqGX.Gg1a/Ed93hhLT9xhrpTBSKuTyRmAfMCBy.eoFSRCO7qhDlS5ggAPqhWfBw4RlbuCWKAQZMovlc5eE01";
    let argon = "$argon2id$v=19$m=4194304,t=1,p=1$c2FsdHNhbHQ$L0Z9S3cvszSYv7jVqfIbTg";
    for (entry, says) in [
        (cheap.replacen("$04$", "$31$", 1), "bcrypt cost 31 is refused: at most 17"),
        (cheap.replacen("$04$", "$18$", 1), "bcrypt cost 18 is refused"),
        (format!("$6$rounds=999999999{sha}"), "SHA-crypt rounds=999999999 is refused"),
        (argon.to_owned(), "Argon2 m=4194304,t=1 is refused"),
    ] {
        std::fs::write(dir.path().join("users.htpasswd"), format!("# users\nbob:{entry}\n")).unwrap();
        let e = gw.app.reload().expect_err(&entry);
        assert!(e.to_string().contains("users.htpasswd:2"), "names the line: {e}");
        assert!(e.to_string().contains(says), "{e}");
        assert_eq!(get_with(&gw.url("/cost"), &[("authorization", &ann)]).await.0.status, 200, "{entry}");
    }
    // At the bound, accepted.
    std::fs::write(dir.path().join("users.htpasswd"), format!("bob:{}\n", cheap.replacen("$04$", "$17$", 1))).unwrap();
    gw.app.reload().expect("cost 17 is accepted");
}

/// The fixture JWKS with the RSA key's JSON changed by `change`.
fn jwks_with(change: impl Fn(&mut serde_json::Value)) -> String {
    let mut set: serde_json::Value = serde_json::from_slice(&std::fs::read(fixture("jwks.json")).unwrap()).unwrap();
    change(&mut set["keys"][0]);
    set.to_string()
}

/// A `jwks_file` key meant for encryption (`"use": "enc"`, or a `key_ops`
/// without `verify`) refuses the file at load, as `docs/access.md` says:
/// before, a token signed with the encryption key passed. On a reload the
/// running keys stay.
#[tokio::test]
async fn a_jwks_file_with_an_encryption_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (up, _) = recording().await;
    std::fs::write(dir.path().join("jwks.json"), jwks_with(|_| {})).unwrap();
    let toml = route(up.addr, "enc", "auth = { jwt = { jwks_file = \"jwks.json\", algorithms = [\"RS256\"] } }");
    let gw = TestGateway::from_file(dir.path(), &toml).await;
    let bearer = format!("Bearer {}", token("ann"));
    assert_eq!(get_with(&gw.url("/enc"), &[("authorization", &bearer)]).await.0.status, 200);
    type Change<'a> = &'a dyn Fn(&mut serde_json::Value);
    let cases: [(Change, &str); 3] = [
        (&|k| k["use"] = "enc".into(), "keys[0]: an encryption key (\"use\": \"enc\") is refused"),
        (
            &|k| {
                k.as_object_mut().unwrap().remove("use");
                k["key_ops"] = json!(["encrypt", "wrapKey"]);
            },
            "keys[0]: a key whose \"key_ops\" lacks \"verify\" is refused",
        ),
        (
            &|k| {
                k.as_object_mut().unwrap().remove("use");
                k["key_ops"] = json!(["verify"]);
            },
            "",
        ),
    ];
    for (change, says) in cases {
        let text = jwks_with(change);
        std::fs::write(dir.path().join("jwks.json"), &text).unwrap();
        let loaded = gateway::config::load(&gateway::config::Source::File(dir.path().join("gateway.toml")));
        let reloaded = gw.app.reload();
        if says.is_empty() {
            loaded.expect(&text);
            reloaded.expect(&text);
        } else {
            let e = loaded.err().unwrap_or_else(|| panic!("loaded: {text}")).to_string();
            assert!(e.contains("routes[0].auth.jwt.jwks_file") && e.contains(says), "{e}");
            assert!(reloaded.err().unwrap_or_else(|| panic!("reloaded: {text}")).to_string().contains(says));
        }
        assert_eq!(get_with(&gw.url("/enc"), &[("authorization", &bearer)]).await.0.status, 200, "{text}");
    }
}

/// A key server answering the fixture JWKS, or `500` once `down` is set.
async fn key_server() -> (TestUpstream, Arc<std::sync::atomic::AtomicBool>) {
    let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d = down.clone();
    let jwks = std::fs::read_to_string(fixture("jwks.json")).unwrap();
    let up = TestUpstream::start(move |_req: Request<Incoming>| {
        let status = if d.load(std::sync::atomic::Ordering::SeqCst) { 500 } else { 200 };
        let body = jwks.clone();
        async move { Response::builder().status(status).body(full(body)).unwrap() }
    })
    .await;
    (up, down)
}

/// A reload that changes a `jwks_url` route (or any other part of the
/// configuration) but not its URL keeps the route's last good keys: before,
/// every request was 503 until a new fetch succeeded, for good while the
/// key server was down. Another URL starts without keys.
#[tokio::test]
async fn a_reload_keeps_a_jwks_url_routes_keys_while_the_url_is_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let (up, _) = recording().await;
    let (keys, down) = key_server().await;
    let toml = |algorithms: &str, leeway: &str, url: &str| {
        route(
            up.addr,
            "kept",
            &format!(
                "auth = {{ jwt = {{ jwks_url = \"{url}\", algorithms = [{algorithms}], leeway = \"{leeway}\" }} }}"
            ),
        )
    };
    let url = format!("http://{}/jwks.json", keys.addr);
    let gw = TestGateway::from_file(dir.path(), &toml("\"RS256\"", "30s", &url)).await;
    let bearer = format!("Bearer {}", token("ann"));
    let status = || async { get_with(&gw.url("/kept"), &[("authorization", &bearer)]).await.0.status };
    for _ in 0..100 {
        if status().await == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status().await, 200, "the first fetch");
    down.store(true, std::sync::atomic::Ordering::SeqCst);
    // The route's settings change, then the algorithms too: the keys stay.
    for (algorithms, leeway) in [("\"RS256\"", "10s"), ("\"RS256\", \"ES256\"", "10s")] {
        std::fs::write(dir.path().join("gateway.toml"), toml(algorithms, leeway, &url)).unwrap();
        gw.app.reload().expect("reload");
        assert_eq!(status().await, 200, "{algorithms} {leeway}: the last good keys are kept");
    }
    // An algorithm list without RS256 does not verify RS256 tokens with them.
    std::fs::write(dir.path().join("gateway.toml"), toml("\"ES256\"", "10s", &url)).unwrap();
    gw.app.reload().expect("reload");
    assert_eq!(status().await, 401);
    // Another URL: its keys are its own, none yet (fail closed).
    let other = format!("http://{}/jwks.json", refused_addr().await);
    std::fs::write(dir.path().join("gateway.toml"), toml("\"RS256\"", "10s", &other)).unwrap();
    gw.app.reload().expect("reload");
    assert_eq!(status().await, 503);
}

/// With `from = "cookie:session"`, any cookie whose trimmed name is
/// `session` counts, in any Cookie line: a second one (`session =FORGED`,
/// a tab before `=`, in another line) refuses the request, since the
/// upstream's cookie parser (Go's, Python's, Node's trim names) could read
/// it instead of the token checked.
#[tokio::test]
async fn a_second_token_cookie_in_any_spelling_is_refused() {
    let (up, seen) = recording().await;
    let gw = TestGateway::from_toml(&route(up.addr, "crumbs", &jwt(", from = \"cookie:session\""))).await;
    let t = token("ann");
    let valid = format!("session={t}");
    let cases: Vec<(Vec<String>, u16)> = vec![
        (vec![valid.clone()], 200),
        (vec![format!("a=1; session = {t} ")], 200),
        (vec![format!("{valid}; session =FORGED")], 401),
        (vec![format!("session =FORGED; {valid}")], 401),
        (vec![format!("{valid}; session\t=FORGED")], 401),
        (vec![valid.clone(), "session =FORGED".into()], 401),
        (vec!["session =FORGED".into(), valid.clone()], 401),
        (vec![format!("{valid}; session")], 401),
    ];
    let mut wrong = Vec::new();
    for (i, (lines, want)) in cases.iter().enumerate() {
        let headers: Vec<(&str, &str)> = lines.iter().map(|l| ("cookie", l.as_str())).collect();
        let (parts, _) = get_with(&gw.url("/crumbs"), &headers).await;
        if parts.status != *want {
            wrong.push((i, parts.status.as_u16()));
        }
    }
    assert!(wrong.is_empty(), "cases answered otherwise: {wrong:?}");
    assert_eq!(seen.lock().unwrap().len(), 2, "only the single-cookie requests went upstream");
}

/// An IPv4-mapped IPv6 entry (`::ffff:127.0.0.1`, `::ffff:127.0.0.0/104`)
/// in `allow`, `deny`, `server.trusted_proxies` or `metrics.allow` is the
/// IPv4 one: client addresses are compared as IPv4, so before, such an
/// entry never matched (a `deny` failed open).
#[tokio::test]
async fn ipv4_mapped_entries_match_ipv4_clients() {
    let (up, _) = recording().await;
    let toml = format!(
        "[server]\ntrusted_proxies = [\"::ffff:127.0.0.1\"]\n[metrics]\nlisten = \"127.0.0.1:0\"\n\
         allow = [\"::ffff:127.0.0.0/104\"]\n{}{}{}",
        route(up.addr, "mapped_deny", "deny = [\"::ffff:127.0.0.1\"]"),
        route(up.addr, "mapped_allow", "allow = [\"::ffff:127.0.0.0/104\"]"),
        route(up.addr, "mapped_xff", "allow = [\"::ffff:10.0.0.0/104\"]"),
    );
    let gw = TestGateway::from_toml(&toml).await;
    let status = |path: &'static str, xff: &'static str| {
        let url = gw.url(path);
        async move { get_with(&url, &[("x-forwarded-for", xff)]).await.0.status.as_u16() }
    };
    // From the trusted peer 127.0.0.1, the client is the forwarded address.
    let cases = [
        ("/mapped_deny", "127.0.0.1", 403),
        ("/mapped_deny", "192.0.2.1", 200),
        ("/mapped_allow", "127.0.0.9", 200),
        ("/mapped_allow", "192.0.2.1", 403),
        ("/mapped_xff", "10.1.2.3", 200),
        ("/mapped_xff", "::ffff:10.1.2.3", 200),
        ("/mapped_xff", "192.0.2.1", 403),
    ];
    let mut wrong = Vec::new();
    for (path, xff, want) in cases {
        let got = status(path, xff).await;
        if got != want {
            wrong.push((path, xff, got));
        }
    }
    assert!(wrong.is_empty(), "answered otherwise: {wrong:?}");
    let (parts, _) = get(&format!("http://{}/healthz", gw.admin.unwrap())).await;
    assert_eq!(parts.status, 200, "metrics.allow");
}

/// The admin listener refuses an HTTP/1.1 request with two `Host` fields or
/// none (400, RFC 9112 §3.2), as the main listener does; before, it
/// answered `/-/config`. An HTTP/1.0 probe may still leave `Host` out.
#[tokio::test]
async fn the_admin_listener_wants_exactly_one_host_in_http11() {
    let gw = TestGateway::from_toml("[metrics]\nlisten = \"127.0.0.1:0\"\n").await;
    let admin = gw.admin.unwrap();
    let cases = [
        ("GET /-/config HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", 200),
        ("GET /-/config HTTP/1.1\r\nConnection: close\r\n\r\n", 400),
        ("GET /-/config HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n", 400),
        ("GET /-/config HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", 400),
        ("GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n", 400),
        ("GET /healthz HTTP/1.0\r\n\r\n", 200),
        ("GET /healthz HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", 400),
    ];
    let mut wrong = Vec::new();
    for (request, want) in cases {
        let r = raw(admin, request.as_bytes(), Duration::from_secs(3)).await;
        if r.status() != want {
            wrong.push((request, r.status()));
        }
    }
    assert!(wrong.is_empty(), "answered otherwise: {wrong:?}");
}

/// An HTTP/2 client's cookie crumbs (several `cookie` fields) reach the
/// forward auth service joined with `; `, as they reach the upstream (RFC
/// 9113 §8.2.3): the two see the same `Cookie` header.
#[tokio::test]
async fn http2_cookie_crumbs_reach_the_auth_service_joined() {
    let (up, seen) = recording().await;
    let (auth, asked) = allowing_auth_service().await;
    let fwd = format!("auth = {{ forward = {{ url = \"http://{}/v\", response_headers = [\"x-user\"] }} }}", auth.addr);
    let gw = TestGateway::from_toml(&route(up.addr, "h2crumbs", &fwd)).await;
    let (mut h2, _conn) = h2_client(gw.addr).await;
    let req = Request::get(gw.url("/h2crumbs/x"))
        .header("cookie", "a=1")
        .header("cookie", "session=s")
        .header("cookie", "b=2")
        .body(full(""))
        .unwrap();
    let response = h2.send_request(req).await.unwrap();
    assert_eq!(response.status(), 200);
    let cookies =
        |h: &HeaderMap| h.get_all("cookie").iter().map(|v| v.to_str().unwrap().to_owned()).collect::<Vec<_>>();
    assert_eq!(cookies(&asked.lock().unwrap()[0]), ["a=1; session=s; b=2"], "the auth service");
    assert_eq!(cookies(&seen.lock().unwrap()[0]), ["a=1; session=s; b=2"], "the upstream");
}

/// A gateway process, killed when dropped.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `jwks_url` is logged as `/-/config` shows it, its secret query
/// parameters redacted: on a failed fetch (warn), on a fetch (debug), and
/// by `gateway check`. Before, the URL was logged as written.
#[tokio::test]
async fn a_jwks_url_is_logged_redacted() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let (up, _) = recording().await;
    let (keys, _) = key_server().await;
    let down = refused_addr().await;
    let port = common::process::free_port();
    let jwt = |url: String| format!("auth = {{ jwt = {{ jwks_url = \"{url}\", algorithms = [\"RS256\"] }} }}");
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\n{}{}",
        route(up.addr, "logged_down", &jwt(format!("http://{down}/jwks.json?token=S3CRET-ONE&v=1"))),
        route(up.addr, "logged_up", &jwt(format!("http://{}/jwks.json?api_key=S3CRET-TWO", keys.addr))),
    );
    let path = dir.path().join("gw.toml");
    std::fs::write(&path, toml).unwrap();
    let check = std::process::Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&check.stdout), String::from_utf8_lossy(&check.stderr));
    assert!(check.status.success(), "{said}");
    assert!(said.contains("?token=<redacted>&v=1") && !said.contains("S3CRET"), "gateway check: {said}");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args(["--config"])
        .arg(&path)
        .env("RUST_LOG", "gateway=debug")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let _child = Child(child);
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let l = lines.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            l.lock().unwrap().push(line);
        }
    });
    let seen = |what: &str| lines.lock().unwrap().iter().any(|l| l.contains(what));
    for _ in 0..200 {
        if seen("JWKS fetch failed") && seen("JWKS fetched") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lines = lines.lock().unwrap();
    let failed = lines.iter().find(|l| l.contains("JWKS fetch failed")).expect("a failed fetch is logged");
    assert!(failed.contains("?token=<redacted>&v=1"), "{failed}");
    let fetched = lines.iter().find(|l| l.contains("JWKS fetched")).expect("a fetch is logged");
    assert!(fetched.contains("?api_key=<redacted>"), "{fetched}");
    let leaked: Vec<&String> = lines.iter().filter(|l| l.contains("S3CRET")).collect();
    assert!(leaked.is_empty(), "{leaked:?}");
}

/// An HTTP/1.1 client's two `Cookie` lines (RFC 6265 says a user agent
/// sends one) reach the forward auth service and the upstream as one line
/// joined with `; `, as an HTTP/2 client's crumbs do, empty lines left out:
/// a parser that reads one line reads them all. Before, both got the lines
/// apart.
#[tokio::test]
async fn http1_cookie_lines_reach_the_auth_service_and_the_upstream_joined() {
    let (up, seen) = recording().await;
    let (auth, asked) = allowing_auth_service().await;
    let fwd = format!("auth = {{ forward = {{ url = \"http://{}/v\", response_headers = [\"x-user\"] }} }}", auth.addr);
    let gw = TestGateway::from_toml(&route(up.addr, "h1lines", &fwd)).await;
    let (parts, _) =
        get_with(&gw.url("/h1lines/x"), &[("cookie", "a=1"), ("cookie", " "), ("cookie", "session=s; b=2")]).await;
    assert_eq!(parts.status, 200);
    let cookies =
        |h: &HeaderMap| h.get_all("cookie").iter().map(|v| v.to_str().unwrap().to_owned()).collect::<Vec<_>>();
    assert_eq!(cookies(&asked.lock().unwrap()[0]), ["a=1; session=s; b=2"], "the auth service");
    assert_eq!(cookies(&seen.lock().unwrap()[0]), ["a=1; session=s; b=2"], "the upstream");
}
