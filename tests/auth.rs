//! Per-route access control end to end on real sockets: address lists
//! (the right-most untrusted `X-Forwarded-For` rule), the admin listener's
//! `allow`, and Basic credentials from an htpasswd file with several hash
//! kinds. Each refusal is checked on both sides: its status and challenge
//! at the client, and nothing at the upstream, which records every request
//! it receives. JWT tests are in `auth_jwt.rs`, the flood of wrong
//! passwords in `auth_flood.rs` (alone in its process: the bound on
//! verifications is process-wide).

mod auth_common;
mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Instant;

use http::{Request, Response};

use auth_common::*;
use common::*;

#[tokio::test]
async fn address_lists_refuse_with_403_and_deny_wins() {
    let (up, seen) = recording().await;
    // The test's own address is 127.0.0.1.
    let toml = format!(
        "{}{}{}",
        route(up.addr, "addr_in", "allow = [\"127.0.0.0/8\"]\ndeny = [\"10.0.0.0/8\"]"),
        route(up.addr, "addr_out", "allow = [\"10.0.0.0/8\", \"2001:db8::/32\"]"),
        route(up.addr, "addr_denied", "allow = [\"127.0.0.0/8\"]\ndeny = [\"127.0.0.1\"]"),
    );
    let gw = TestGateway::from_toml(&toml).await;
    let (ok, body) = get(&gw.url("/addr_in")).await;
    assert_eq!((ok.status.as_u16(), &body[..]), (200, &b"from upstream"[..]));
    // Not from an untrusted peer: its own X-Forwarded-For is ignored.
    let (out, body) = get_with(&gw.url("/addr_out"), &[("x-forwarded-for", "10.1.2.3")]).await;
    assert_eq!((out.status.as_u16(), &body[..]), (403, &b"forbidden\n"[..]));
    let (denied, _) = get(&gw.url("/addr_denied")).await;
    assert_eq!(denied.status, 403, "deny wins over allow");
    assert_eq!(seen.lock().unwrap().len(), 1, "the upstream saw only the admitted request");
    let text = metrics_text(gw.addr).await;
    let count = |route, result| {
        sample(&text, "gateway_auth_total", &[("route", route), ("kind", "address"), ("result", result)])
    };
    assert_eq!(count("addr_in", "allowed"), Some(1.0));
    assert_eq!(count("addr_out", "denied"), Some(1.0));
    assert_eq!(count("addr_denied", "denied"), Some(1.0));
    // Built-ins are not a route: unaffected.
    let (health, _) = get(&gw.url("/healthz")).await;
    assert_eq!(health.status, 200);
}

#[tokio::test]
async fn behind_a_trusted_proxy_the_right_most_untrusted_forwarded_address_counts() {
    let (up, seen) = recording().await;
    let toml = format!(
        "[server]\ntrusted_proxies = [\"127.0.0.1\", \"192.168.0.0/16\"]\n{}",
        route(up.addr, "xff", "allow = [\"10.0.0.0/8\"]\ndeny = [\"10.9.0.0/16\"]"),
    );
    let gw = TestGateway::from_toml(&toml).await;
    let status = |xff: &'static str| {
        let url = gw.url("/xff");
        async move {
            let headers: Vec<(&str, &str)> = if xff.is_empty() { vec![] } else { vec![("x-forwarded-for", xff)] };
            get_with(&url, &headers).await.0.status.as_u16()
        }
    };
    // (X-Forwarded-For the trusted peer passes on, status)
    let cases = [
        ("10.1.2.3", 200),
        // A client that put an allowed address in front of its own.
        ("10.1.2.3, 203.0.113.7", 403),
        // Trusted hops to the right are skipped.
        ("203.0.113.7, 10.1.2.3, 192.168.1.1", 200),
        ("10.9.1.1", 403),
        // The peer itself (trusted, not in allow) when nothing was forwarded.
        ("", 403),
        ("not-an-address", 403),
    ];
    let mut admitted = 0;
    for (xff, want) in cases {
        assert_eq!(status(xff).await, want, "X-Forwarded-For: {xff:?}");
        admitted += usize::from(want == 200);
    }
    assert_eq!(seen.lock().unwrap().len(), admitted);
}

#[tokio::test]
async fn the_admin_listener_answers_only_its_allow_list() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (allow, want) in [("[\"10.0.0.0/8\"]", 403), ("[\"127.0.0.1\"]", 200)] {
        let c = config(&format!("[metrics]\nlisten = \"127.0.0.1:0\"\nallow = {allow}\n"), dir);
        let gw = TestGateway::start(c).await;
        let admin = gw.admin.unwrap();
        for path in ["/metrics", "/healthz"] {
            let (parts, _) = get(&format!("http://{admin}{path}")).await;
            assert_eq!(parts.status, want, "allow = {allow}: {path}");
        }
    }
    // A list that would guard nothing, or let everyone in, is refused.
    for (toml, says) in [
        ("[metrics]\nallow = [\"10.0.0.0/8\"]\n", "needs metrics.listen"),
        ("[metrics]\nlisten = \"127.0.0.1:0\"\nallow = []\n", "is empty"),
    ] {
        let e = gateway::config::load(&gateway::config::Source::Inline { text: toml.into(), base_dir: dir.into() })
            .expect_err(toml);
        assert!(e.to_string().contains("metrics.allow") && e.to_string().contains(says), "{toml}: {e}");
    }
}

#[tokio::test]
async fn basic_credentials_of_each_hash_kind_and_every_refusal() {
    let dir = tempfile::tempdir().unwrap();
    htpasswd(dir.path(), 4);
    let (up, seen) = recording().await;
    let toml = format!(
        "{}{}",
        route(up.addr, "basic_kinds", "auth = { basic = { htpasswd = \"users.htpasswd\", realm = \"ops\" } }"),
        route(up.addr, "basic_fwd", "auth = { basic = { htpasswd = \"users.htpasswd\" } }\nforward_credentials = true"),
    );
    let gw = TestGateway::start(config(&toml, dir.path())).await;
    let url = gw.url("/basic_kinds");
    for user in ["ann", "bob", "sue", "sam", "ada"] {
        let (parts, body) = get_with(&url, &[("authorization", &basic(user, &format!("pw-{user}")))]).await;
        assert_eq!((parts.status.as_u16(), &body[..]), (200, &b"from upstream"[..]), "{user}");
    }
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 5);
        assert!(seen.iter().all(|h| h.get("authorization").is_none()), "consumed credentials are not forwarded");
    }
    let refusals = [
        vec![],
        vec![("authorization", basic("ann", "wrong"))],
        vec![("authorization", basic("nobody", "pw-ann"))],
        vec![("authorization", basic("ann", "pw-bob"))],
        vec![("authorization", "Basic !!not-base64".to_owned())],
        vec![("authorization", "Bearer x.y.z".to_owned())],
    ];
    for headers in &refusals {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (parts, body) = get_with(&url, &headers).await;
        assert_eq!(parts.status, 401, "{headers:?}");
        assert_eq!(header(&parts, "www-authenticate"), Some("Basic realm=\"ops\", charset=\"UTF-8\""));
        assert_eq!(&body[..], b"unauthorized\n");
    }
    assert_eq!(seen.lock().unwrap().len(), 5, "no refused request reached the upstream");
    // forward_credentials keeps the header for the upstream.
    let (parts, _) = get_with(&gw.url("/basic_fwd"), &[("authorization", &basic("ann", "pw-ann"))]).await;
    assert_eq!(parts.status, 200);
    assert_eq!(seen.lock().unwrap()[5].get("authorization").unwrap(), &basic("ann", "pw-ann"));
    // A second Authorization (which the upstream would get too) is refused.
    let (parts, _) = get_with(
        &gw.url("/basic_fwd"),
        &[("authorization", &basic("ann", "pw-ann")), ("authorization", &basic("admin", "forged"))],
    )
    .await;
    assert_eq!(parts.status, 401, "two Authorization headers");
    assert_eq!(seen.lock().unwrap().len(), 6, "the refused one did not reach the upstream");
    let text = metrics_text(gw.addr).await;
    let count = |result| {
        sample(&text, "gateway_auth_total", &[("route", "basic_kinds"), ("kind", "basic"), ("result", result)])
    };
    assert_eq!((count("allowed"), count("denied")), (Some(5.0), Some(6.0)));
}

#[tokio::test]
async fn a_success_is_remembered_and_a_reload_reads_the_file_again() {
    let dir = tempfile::tempdir().unwrap();
    // Slow hashes: a remembered credential is visibly faster.
    htpasswd(dir.path(), 10);
    let (up, _seen) = recording().await;
    let toml = route(up.addr, "remember", "auth = { basic = { htpasswd = \"users.htpasswd\" } }");
    let file = dir.path().join("gateway.toml");
    std::fs::write(&file, &toml).unwrap();
    let mut c = gateway::config::load(&gateway::config::Source::File(file)).unwrap();
    c.server.listen = "127.0.0.1:0".parse().unwrap();
    let gw = TestGateway::start(c).await;
    let url = gw.url("/remember");
    let ann = basic("ann", "pw-ann");
    let t = Instant::now();
    assert_eq!(get_with(&url, &[("authorization", &ann)]).await.0.status, 200);
    let first = t.elapsed();
    let t = Instant::now();
    assert_eq!(get_with(&url, &[("authorization", &ann)]).await.0.status, 200);
    let second = t.elapsed();
    assert!(second * 4 < first, "remembered: {second:?} against a first verification of {first:?}");
    // ann's password changes in the file; a reload forgets what was remembered.
    let new_hash = bcrypt::hash("new-pw", 4).unwrap();
    std::fs::write(dir.path().join("users.htpasswd"), format!("ann:{new_hash}\n")).unwrap();
    gw.app.reload().expect("reload");
    assert_eq!(get_with(&url, &[("authorization", &ann)]).await.0.status, 401);
    assert_eq!(get_with(&url, &[("authorization", &basic("ann", "new-pw"))]).await.0.status, 200);
    // A bad file on reload changes nothing.
    std::fs::write(dir.path().join("users.htpasswd"), "ann:plaintext\n").unwrap();
    let e = gw.app.reload().unwrap_err();
    assert!(e.to_string().contains("users.htpasswd:1"), "{e}");
    assert_eq!(get_with(&url, &[("authorization", &basic("ann", "new-pw"))]).await.0.status, 200);
}

#[test]
fn weak_htpasswd_entries_exit_64_naming_the_line() {
    let dir = tempfile::tempdir().unwrap();
    for (entry, says) in [("bob:secret", "plain-text"), ("bob:$apr1$abcdefgh$0123456789abcdefghijkl", "MD5-crypt")] {
        std::fs::write(
            dir.path().join("users.htpasswd"),
            format!("# users\nann:{}\n{entry}\n", bcrypt::hash("x", 4).unwrap()),
        )
        .unwrap();
        let toml = "[[routes]]\nname = 'r'\nprefix = '/r'\nrespond = { status = 200 }\n\
                    auth = { basic = { htpasswd = 'users.htpasswd' } }\n";
        let path = dir.path().join("gateway.toml");
        std::fs::write(&path, toml).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gateway"))
            .args(["check", "--config", path.to_str().unwrap()])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{stderr}");
        assert!(stderr.contains("routes[0].auth.basic.htpasswd"), "{stderr}");
        assert!(stderr.contains("users.htpasswd:3"), "names the line: {stderr}");
        assert!(stderr.contains(says), "{stderr}");
    }
    // A good file: `gateway check` says what guards the route.
    htpasswd(dir.path(), 4);
    let toml = "[[routes]]\nname = 'r'\nprefix = '/r'\nrespond = { status = 200 }\nallow = ['10.0.0.0/8']\n\
                auth = { basic = { htpasswd = 'users.htpasswd' } }\n";
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, toml).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args(["check", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("allow [\"10.0.0.0/8\"] auth basic"), "{stdout}");
    assert!(stdout.contains("users.htpasswd (5 users)"), "{stdout}");
}

/// A raw HTTP/1.1 GET with one extra header line, answered in full.
fn raw_get(addr: &str, path: &str, extra: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n{extra}\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn the_access_log_names_the_user_and_no_log_line_holds_a_credential() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    htpasswd(dir.path(), 4);
    let addr = common::process::free_addr();
    let toml = format!(
        "[server]\nlisten = \"{addr}\"\naccess_log = true\naccess_log_format = 'json'\n\
         [[routes]]\nname = 'logged'\nprefix = '/logged'\nrespond = {{ status = 200 }}\n\
         auth = {{ basic = {{ htpasswd = 'users.htpasswd' }} }}\n"
    );
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, toml).unwrap();
    let mut gw = std::process::Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args(["--config", path.to_str().unwrap(), "--log-format", "json"])
        .env("RUST_LOG", "debug")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(Instant::now() < deadline, "the gateway never came up");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let good = basic("ann", "pw-ann");
    let wrong = basic("ann", "hunter2-wrong");
    assert!(raw_get(&addr, "/logged/in", &format!("authorization: {good}\r\n")).starts_with("HTTP/1.1 200"));
    assert!(raw_get(&addr, "/logged/out", &format!("authorization: {wrong}\r\n")).starts_with("HTTP/1.1 401"));
    std::process::Command::new("kill").args(["-TERM", &gw.id().to_string()]).status().unwrap();
    assert_eq!(gw.wait().unwrap().code(), Some(0));
    let mut log = String::new();
    gw.stderr.take().unwrap().read_to_string(&mut log).unwrap();
    let line = log.lines().find(|l| l.contains("/logged/in")).unwrap_or_else(|| panic!("no access line:\n{log}"));
    assert!(line.contains("\"user\":\"ann\""), "{line}");
    assert!(log.contains("wrong user or password"), "the refusal's reason is logged:\n{log}");
    for secret in ["pw-ann", "hunter2", good.trim_start_matches("Basic "), wrong.trim_start_matches("Basic ")] {
        assert!(!log.contains(secret), "{secret:?} in the log:\n{log}");
    }
}

/// An upstream that answers who asked (the `x-user` a JWT's claims or an
/// auth service would set is the same case; here the Basic user is told
/// apart by the request count) with `cache_control`, counting requests.
async fn personal(cache_control: &'static str) -> (TestUpstream, Arc<AtomicUsize>) {
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    let up = TestUpstream::start(move |_req: Request<hyper::body::Incoming>| {
        let n = c.fetch_add(1, SeqCst) + 1;
        async move {
            let mut b = Response::builder();
            if !cache_control.is_empty() {
                b = b.header("cache-control", cache_control);
            }
            b.body(full(format!("answer {n}"))).unwrap()
        }
    })
    .await;
    (up, count)
}

#[tokio::test]
async fn a_cache_shares_an_authenticated_answer_only_when_the_upstream_says_it_may() {
    let dir = tempfile::tempdir().unwrap();
    htpasswd(dir.path(), 4);
    for (cache_control, shared) in [("", false), ("max-age=60", false), ("public, max-age=60", true)] {
        let (up, count) = personal(cache_control).await;
        let toml = route(
            up.addr,
            "personal",
            "auth = { basic = { htpasswd = \"users.htpasswd\" } }\ncache = { default_ttl = \"60s\" }",
        );
        let mut c = config(&toml, dir.path());
        c.server.listen = "127.0.0.1:0".parse().unwrap();
        let gw = TestGateway::start(c).await;
        let url = gw.url("/personal");
        let (_, first) = get_with(&url, &[("authorization", &basic("ann", "pw-ann"))]).await;
        let (parts, second) = get_with(&url, &[("authorization", &basic("bob", "pw-bob"))]).await;
        assert_eq!(parts.status, 200);
        assert_eq!(first, &b"answer 1"[..]);
        if shared {
            assert_eq!(second, &b"answer 1"[..], "{cache_control:?}: a public answer is shared");
            assert_eq!(count.load(SeqCst), 1, "{cache_control:?}");
        } else {
            assert_eq!(second, &b"answer 2"[..], "{cache_control:?}: bob must not get ann's answer");
            assert_eq!(count.load(SeqCst), 2, "{cache_control:?}");
        }
    }
}

/// The rate limit is decided before credentials are checked (as nginx's
/// `limit_req` runs before `auth_basic`): guessing passwords is limited
/// like any other request, and a refused guess costs no verification.
#[tokio::test]
async fn wrong_passwords_are_rate_limited_before_they_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    htpasswd(dir.path(), 4);
    let (up, seen) = recording().await;
    let limited = "auth = { basic = { htpasswd = \"users.htpasswd\" } }\nrate_limit = { rate = \"1/m\", burst = 3, headers = true }";
    let gw = TestGateway::start(config(&route(up.addr, "basic_limited", limited), dir.path())).await;
    let url = gw.url("/basic_limited");
    let mut statuses = Vec::new();
    for i in 0..6 {
        let (parts, _) = get_with(&url, &[("authorization", &basic("ann", &format!("guess-{i}")))]).await;
        if i == 0 {
            let state = header(&parts, "ratelimit").unwrap_or("");
            assert!(state.starts_with("\"basic_limited\";r=2;"), "a 401 it counted says what is left: {state}");
        }
        statuses.push(parts.status.as_u16());
    }
    assert_eq!(statuses, [401, 401, 401, 429, 429, 429], "401 for the burst's guesses, then 429");
    let (parts, _) = get_with(&url, &[("authorization", &basic("ann", "pw-ann"))]).await;
    assert_eq!(parts.status, 429, "the client's bucket is empty, whatever it sends");
    assert!(seen.lock().unwrap().is_empty());
    let text = metrics_text(gw.addr).await;
    let denied =
        sample(&text, "gateway_auth_total", &[("route", "basic_limited"), ("kind", "basic"), ("result", "denied")]);
    assert_eq!(denied, Some(3.0), "only the burst's guesses were verified");
}
