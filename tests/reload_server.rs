//! A reload keeps the running `[server]` (but for renewed `tls` files):
//! the new file's routes are built against it and checked against it and
//! the file's own, later reloads are compared with it, `/-/config` shows
//! it, and discovery's rebuilds keep it. Loopback only, each test bounded
//! in time.

mod common;
#[path = "discovery/dns.rs"]
mod dns;
#[path = "discovery/upstreams.rs"]
mod upstreams;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::pki::Pki;
use common::*;
use gateway::config::{self, Source};
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

fn write(dir: &Path, toml: &str) {
    std::fs::write(dir.join("gateway.toml"), toml).unwrap();
}

/// `[server]` on port 0 (as `TestGateway::from_file` runs it, so that
/// `listen` alone is no change) with `server`, upstream `app` at `up`, and
/// `routes`.
fn file(server: &str, up: SocketAddr, routes: &str) -> String {
    format!("[server]\nlisten = \"127.0.0.1:0\"\n{server}\n[upstreams.app]\nurl = \"http://{up}\"\n{routes}")
}

/// An upstream that answers the request's header lines (`name: value`),
/// sorted, one a line.
async fn echo_upstream() -> TestUpstream {
    TestUpstream::start(|req: Request<Incoming>| async move {
        let mut lines: Vec<String> =
            req.headers().iter().map(|(n, v)| format!("{n}: {}", String::from_utf8_lossy(v.as_bytes()))).collect();
        lines.sort();
        Response::new(full(lines.join("\n")))
    })
    .await
}

async fn post_status(url: String, len: usize) -> u16 {
    send(Request::post(url).body(full(vec![b'x'; len])).unwrap()).await.0.status.as_u16()
}

async fn get_status_with(url: String, headers: &[(&str, &str)]) -> u16 {
    let mut req = Request::get(url);
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    send(req.body(full("")).unwrap()).await.0.status.as_u16()
}

const ROUTES: &str = "[[routes]]\nname = \"echo\"\nprefix = \"/echo\"\nupstream = \"app\"\n\
    [[routes]]\nname = \"fenced\"\nprefix = \"/fenced\"\nupstream = \"app\"\nallow = [\"10.9.8.7\"]\n";

const ADDED: &str = "[[routes]]\nname = \"added\"\nprefix = \"/added\"\nrespond = { status = 200, body = \"added\" }\n\
    [[routes]]\nname = \"limited\"\nprefix = \"/limited\"\nupstream = \"app\"\nrate_limit = { rate = \"1/m\", burst = 1 }\n\
    [[routes]]\nname = \"more\"\nprefix = \"/more\"\nupstream = \"app\"\n";

const START: &str = "request_id = false\ntrace_context = false\ndrop_underscore_headers = false\nmax_body = \"1KiB\"\n";
const CHANGED: &str = "request_id = true\ntrace_context = true\ndrop_underscore_headers = true\nmax_body = \"1MiB\"\n\
    trusted_proxies = [\"127.0.0.1\"]\n";

/// Every `[server]` key a route takes something from, changed by one
/// reload: the reload applies the file's routes (a new one answers) but
/// none of the changes, in the routes the file kept or in those it added.
#[tokio::test]
async fn no_server_key_changed_by_a_reload_reaches_the_new_routes() {
    bounded(async {
        let up = echo_upstream().await;
        let dir = tempfile::tempdir().unwrap();
        let gw = TestGateway::from_file(dir.path(), &file(START, up.addr, ROUTES)).await;
        write(dir.path(), &file(CHANGED, up.addr, &format!("{ROUTES}{ADDED}")));
        assert_eq!(gw.app.reload().expect("a valid file"), vec!["server"]);
        let (parts, body) = get(&gw.url("/added")).await;
        assert_eq!((parts.status.as_u16(), &body[..]), (200, &b"added"[..]), "the file's routes apply");

        // request_id, trace_context, drop_underscore_headers: still off.
        let req = Request::get(gw.url("/echo/x")).header("x_under", "1").body(full("")).unwrap();
        let (parts, body) = send(req).await;
        let seen = String::from_utf8_lossy(&body).into_owned();
        assert!(parts.headers.get("x-request-id").is_none(), "request IDs turned on: {:?}", parts.headers);
        assert!(!seen.contains("x-request-id"), "the upstream got an ID: {seen}");
        assert!(!seen.contains("traceparent"), "the upstream got a traceparent: {seen}");
        assert!(seen.contains("x_under: 1"), "an underscore header was dropped: {seen}");

        // max_body: the running 1KiB, on a kept and on an added route.
        assert_eq!(post_status(gw.url("/echo/x"), 4096).await, 413);
        assert_eq!(post_status(gw.url("/more/x"), 4096).await, 413);

        // trusted_proxies: still none, so X-Forwarded-For is not believed,
        // by an access list or by a rate limit's client key.
        assert_eq!(get_status_with(gw.url("/fenced/x"), &[("x-forwarded-for", "10.9.8.7")]).await, 403);
        assert_eq!(get_status_with(gw.url("/limited/x"), &[("x-forwarded-for", "10.0.0.1")]).await, 200);
        assert_eq!(
            get_status_with(gw.url("/limited/x"), &[("x-forwarded-for", "10.0.0.2")]).await,
            429,
            "two clients behind an untrusted peer share its bucket"
        );
    })
    .await;
}

/// Each reload is compared with the `[server]` running (the start's), not
/// with the file the last reload read: a change stays reported until it
/// is undone, and undoing it is no change.
#[tokio::test]
async fn successive_reloads_are_compared_with_the_running_server() {
    bounded(async {
        let (up, _) = counting_upstream().await;
        let dir = tempfile::tempdir().unwrap();
        let small = file("max_body = \"1KiB\"\n", up.addr, ROUTES);
        let large = file("max_body = \"1MiB\"\n", up.addr, ROUTES);
        let gw = TestGateway::from_file(dir.path(), &small).await;
        write(dir.path(), &large);
        assert_eq!(gw.app.reload().unwrap(), vec!["server"], "first");
        write(dir.path(), &format!("{large}{ADDED}"));
        assert_eq!(gw.app.reload().unwrap(), vec!["server"], "still not applied: still to report");
        assert_eq!(get(&gw.url("/added")).await.0.status, 200);
        assert_eq!(post_status(gw.url("/echo/x"), 4096).await, 413);
        write(dir.path(), &small);
        assert_eq!(gw.app.reload().unwrap(), Vec::<&str>::new(), "back to what runs: nothing to restart");
        assert_eq!(get(&gw.url("/added")).await.0.status, 404);
        write(dir.path(), &large);
        assert_eq!(gw.app.reload().unwrap(), vec!["server"]);
        assert_eq!(post_status(gw.url("/echo/x"), 4096).await, 413);
    })
    .await;
}

/// A file that turns request IDs (or trace context) on while a route's
/// header rule sets the very field they reserve is refused by a start
/// (`gateway check`, a restart). The running `[server]` still has the
/// switch off, but the reload refuses the file too: the gateway never runs
/// a file its next restart would refuse.
#[tokio::test]
async fn a_reload_refuses_a_file_its_next_start_would_refuse() {
    bounded(async {
        let up = echo_upstream().await;
        let mut accepted = Vec::new();
        for (switch, field) in [("request_id", "X-Request-Id"), ("trace_context", "traceparent")] {
            let route = format!(
                "[[routes]]\nname = \"ruled\"\nprefix = \"/ruled\"\nupstream = \"app\"\n\
                 request_headers = {{ set = {{ \"{field}\" = \"fixed\" }} }}\n"
            );
            let dir = tempfile::tempdir().unwrap();
            let off = file("request_id = false\ntrace_context = false\n", up.addr, &route);
            let gw = TestGateway::from_file(dir.path(), &off).await;
            write(dir.path(), &off.replace(&format!("{switch} = false"), &format!("{switch} = true")));
            let start = config::load(&Source::File(dir.path().join("gateway.toml")));
            let start = start.expect_err("a start refuses the file").to_string();
            if let Ok(restart) = gw.app.reload() {
                accepted.push(format!("{switch}: reload Ok({restart:?}); a start says: {start}"));
            }
        }
        assert!(accepted.is_empty(), "reloads accepted files the next start refuses:\n{}", accepted.join("\n"));
    })
    .await;
}

/// `/-/config` is "the configuration being served": after a reload whose
/// `[server]` change was not applied, it shows the `[server]` that runs,
/// not the file's.
#[tokio::test]
async fn the_config_endpoint_shows_the_server_section_being_served() {
    bounded(async {
        let (up, _) = counting_upstream().await;
        let dir = tempfile::tempdir().unwrap();
        let admin = "[metrics]\nlisten = \"127.0.0.1:0\"\n";
        let small = format!("{admin}{}", file("max_body = \"1KiB\"\n", up.addr, ROUTES));
        let gw = TestGateway::from_file(dir.path(), &small).await;
        write(dir.path(), &small.replace("1KiB", "1MiB"));
        assert_eq!(gw.app.reload().unwrap(), vec!["server"]);
        assert_eq!(post_status(gw.url("/echo/x"), 4096).await, 413, "1KiB runs on");
        let (_, body) = get(&format!("http://{}/-/config", gw.admin.unwrap())).await;
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["server"]["max_body"], "1KiB", "/-/config shows a max_body not in force");
    })
    .await;
}

/// `watch_config` is a `[server]` key whose change needs a restart (the
/// watcher is started, or not, with the gateway), and a reload that
/// changes it in the file says so, although the running value (which
/// `--watch` may have set) is copied into the new configuration.
#[tokio::test]
async fn a_changed_watch_config_is_reported_as_needing_a_restart() {
    bounded(async {
        let (up, _) = counting_upstream().await;
        let dir = tempfile::tempdir().unwrap();
        let gw = TestGateway::from_file(dir.path(), &file("watch_config = false\n", up.addr, ROUTES)).await;
        write(dir.path(), &file("watch_config = true\n", up.addr, ROUTES));
        assert_eq!(gw.app.reload().unwrap(), vec!["server"], "watch_config turned on in the file: not applied");
    })
    .await;
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A POST of `len` bytes to `/app/x` over a new TLS connection: the
/// certificate served and the status.
async fn post_over_tls(pki: &Pki, addr: SocketAddr, len: usize) -> (Vec<u8>, u16) {
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(pki.roots())
        .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let tls = TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("a TLS handshake");
    let cert = tls.get_ref().1.peer_certificates().unwrap()[0].as_ref().to_vec();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.unwrap();
    tokio::spawn(conn);
    let req = Request::post("/app/x").header("host", "localhost").body(full(vec![b'x'; len])).unwrap();
    let resp = send.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let _ = resp.into_body().collect().await;
    (cert, status)
}

fn tls_file(server: &str, up: SocketAddr, tls: bool) -> String {
    let tls = if tls { "[server.tls]\ncert = \"server.pem\"\nkey = \"server.key\"\n" } else { "" };
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n{server}\n{tls}[upstreams.app]\nurl = \"http://{up}\"\n\
         [[routes]]\nname = \"app\"\nprefix = \"/app\"\nupstream = \"app\"\n"
    )
}

/// A renewed certificate is served by the reload that also changes another
/// `[server]` key; that change is reported and not applied.
#[tokio::test]
async fn a_certificate_renewed_beside_a_server_change_is_served_and_the_change_is_not() {
    bounded(async {
        let pki = Pki::new();
        pki.issue("server", &["localhost"], false);
        let (up, _) = counting_upstream().await;
        let gw = TestGateway::from_file(pki.dir.path(), &tls_file("max_body = \"1KiB\"\n", up.addr, true)).await;
        let (old, status) = post_over_tls(&pki, gw.addr, 4096).await;
        assert_eq!(status, 413);
        pki.issue("server", &["localhost"], false);
        write(pki.dir.path(), &tls_file("max_body = \"1MiB\"\n", up.addr, true));
        assert_eq!(gw.app.reload().unwrap(), vec!["server"]);
        let (new, status) = post_over_tls(&pki, gw.addr, 4096).await;
        assert_ne!(new, old, "the renewed certificate is served from the next connection");
        assert_eq!(new, pki.certs("server")[0].as_ref().to_vec());
        assert_eq!(status, 413, "max_body changed with it: not applied");
        assert_eq!(post_over_tls(&pki, gw.addr, 100).await.1, 200);
    })
    .await;
}

/// TLS turned off by one reload (reported, TLS runs on), then back on with
/// a renewed certificate by the next: that one is no change to report, and
/// its certificate is served.
#[tokio::test]
async fn tls_off_then_on_again_by_reloads_runs_on_and_renews() {
    bounded(async {
        let pki = Pki::new();
        pki.issue("server", &["localhost"], false);
        let (up, _) = counting_upstream().await;
        let gw = TestGateway::from_file(pki.dir.path(), &tls_file("", up.addr, true)).await;
        let (old, _) = post_over_tls(&pki, gw.addr, 10).await;
        write(pki.dir.path(), &tls_file("", up.addr, false));
        let restart = gw.app.reload().unwrap();
        assert!(restart.iter().all(|s| s.starts_with("server.tls")) && restart.len() == 1, "{restart:?}");
        assert_eq!(post_over_tls(&pki, gw.addr, 10).await, (old.clone(), 200), "TLS runs on with its certificate");
        pki.issue("server", &["localhost"], false);
        write(pki.dir.path(), &tls_file("", up.addr, true));
        assert_eq!(gw.app.reload().unwrap(), Vec::<&str>::new());
        let (new, status) = post_over_tls(&pki, gw.addr, 10).await;
        assert_eq!((new, status), (pki.certs("server")[0].as_ref().to_vec(), 200));
    })
    .await;
}

/// With the watcher, a save that changes `[server]` and the routes applies
/// the routes, not `[server]`.
#[tokio::test]
async fn the_watcher_applies_the_routes_of_a_save_but_not_its_server_change() {
    bounded(async {
        let (up, _) = counting_upstream().await;
        let dir = tempfile::tempdir().unwrap();
        let server = "watch_config = true\nmax_body = \"1KiB\"\n";
        let gw = TestGateway::from_file(dir.path(), &file(server, up.addr, ROUTES)).await;
        // The watcher reads the files it starts from first.
        tokio::time::sleep(Duration::from_millis(300)).await;
        write(dir.path(), &file(&server.replace("1KiB", "1MiB"), up.addr, &format!("{ROUTES}{ADDED}")));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
        while get(&gw.url("/added")).await.0.status != 200 {
            assert!(tokio::time::Instant::now() < deadline, "the watcher did not apply the routes");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(post_status(gw.url("/echo/x"), 4096).await, 413);
        assert_eq!(post_status(gw.url("/more/x"), 4096).await, 413);
    })
    .await;
}

/// Discovery rebuilds the table from the configuration as last loaded:
/// after a reload whose `[server]` change was not applied, the rebuilt
/// routes still take the running `[server]`'s defaults.
#[tokio::test]
async fn a_rebuild_after_discovery_keeps_the_running_server() {
    bounded(async {
        let dns = dns::TestDns::start().await;
        let (port, _ups) = upstreams::on_one_port(&["127.0.0.1", "127.0.0.2"]).await;
        dns.addresses("rv.test", &["127.0.0.1"], 1);
        let toml = |server: &str| {
            format!(
                "[server]\nlisten = \"127.0.0.1:0\"\n{server}\n[resolver]\nnameservers = [\"{}\"]\ntimeout = \"500ms\"\nattempts = 1\n\
                 [upstreams.rv]\ndiscover = {{ dns = \"rv.test:{port}\", interval = \"200ms\", min_ttl = \"100ms\" }}\n\
                 [[routes]]\nname = \"rv\"\nprefix = \"/\"\nupstream = \"rv\"\n",
                dns.addr
            )
        };
        let dir = tempfile::tempdir().unwrap();
        let gw = TestGateway::from_file(dir.path(), &toml("max_body = \"1KiB\"\nrequest_id = false\n")).await;
        upstreams::wait_for_endpoints(&gw, "rv", 1).await;
        write(dir.path(), &toml("max_body = \"1MiB\"\nrequest_id = true\n"));
        assert_eq!(gw.app.reload().unwrap(), vec!["server"]);
        dns.addresses("rv.test", &["127.0.0.1", "127.0.0.2"], 1);
        upstreams::wait_for_endpoints(&gw, "rv", 2).await;
        assert_eq!(post_status(gw.url("/x"), 4096).await, 413, "the rebuild took the file's max_body");
        let (parts, _) = get(&gw.url("/x")).await;
        assert_eq!(parts.status, 200);
        assert!(parts.headers.get("x-request-id").is_none());
    })
    .await;
}

/// The other way round: the file turns request IDs off and sets the field
/// in a route's rule, which a start accepts. The reload refuses it (the
/// running `[server]` still sets the field until a restart), and its
/// reason says that it is the running `[server]` that refuses it.
#[tokio::test]
async fn a_reload_refused_by_the_running_server_says_so() {
    bounded(async {
        let up = echo_upstream().await;
        let dir = tempfile::tempdir().unwrap();
        let gw = TestGateway::from_file(dir.path(), &file("request_id = true\n", up.addr, ROUTES)).await;
        let ruled = "[[routes]]\nname = \"ruled\"\nprefix = \"/ruled\"\nupstream = \"app\"\n\
                     request_headers = { set = { \"X-Request-Id\" = \"fixed\" } }\n";
        write(dir.path(), &file("request_id = false\n", up.addr, &format!("{ROUTES}{ruled}")));
        config::load(&Source::File(dir.path().join("gateway.toml"))).expect("a start takes the file");
        let why = gw.app.reload().expect_err("refused against the running [server]").to_string();
        assert_eq!(get(&gw.url("/ruled/x")).await.0.status, 404, "nothing changed");
        assert!(
            why.contains("running [server]"),
            "the reason does not say the switch is still on until a restart: {why}"
        );
    })
    .await;
}
