//! Unix-socket upstreams: `url = "unix:PATH"`, pooled
//! like TCP, the socket may appear after the gateway starts, relative paths
//! resolve against the config file's folder, health checks reach it too.

mod common;

use std::convert::Infallible;
use std::os::unix::ffi::OsStringExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::UnixListener;

/// An HTTP/1 server on the Unix socket at `path`: answers `unix ok` and
/// keeps each request's `Host`; counts the connections it accepts.
fn unix_upstream(path: &Path) -> (Arc<AtomicUsize>, Arc<Mutex<Vec<String>>>) {
    let listener = UnixListener::bind(path).expect("bind the test socket");
    let connections = Arc::new(AtomicUsize::new(0));
    let hosts = Arc::new(Mutex::new(Vec::new()));
    let (count, seen) = (connections.clone(), hosts.clone());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let seen = seen.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let host = req.headers().get("host").map(|h| h.to_str().unwrap().to_owned());
                    seen.lock().unwrap().push(format!("{} {}", req.uri(), host.unwrap_or_default()));
                    async { Ok::<_, Infallible>(Response::new(full("unix ok"))) }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
            });
        }
    });
    (connections, hosts)
}

fn toml(url: &str, extra_upstream: &str) -> String {
    format!(
        "[server]\n[upstreams.app]\nurl = \"{url}\"\n{extra_upstream}\n\
         [[routes]]\nname = \"app\"\nprefix = \"/app\"\nupstream = \"app\"\n\
         [[routes]]\nname = \"own\"\nprefix = \"/own\"\nupstream = \"app\"\nhost = \"upstream\"\n"
    )
}

#[tokio::test]
async fn requests_reach_a_unix_socket_upstream_pooled_with_the_right_host() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("app.sock");
    let (connections, hosts) = unix_upstream(&sock);
    let gw = TestGateway::start(config(&toml(&format!("unix:{}", sock.display()), ""), dir.path())).await;
    for i in 0..20 {
        let (parts, body) = get(&gw.url(&format!("/app/x?i={i}"))).await;
        assert_eq!((parts.status.as_u16(), &body[..]), (200, &b"unix ok"[..]));
    }
    assert!(connections.load(Ordering::SeqCst) <= 2, "pooled: {} connections", connections.load(Ordering::SeqCst));
    let (parts, _) = get(&gw.url("/own/y")).await;
    assert_eq!(parts.status, 200);
    let hosts = hosts.lock().unwrap();
    assert_eq!(hosts[0], format!("/app/x?i=0 {}", gw.addr), "the client's Host is preserved");
    assert_eq!(hosts.last().unwrap(), "/own/y localhost", "host = \"upstream\" sends localhost");
}

#[tokio::test]
async fn a_relative_socket_that_appears_later_is_502_connect_until_it_does() {
    let dir = tempfile::tempdir().unwrap();
    // Relative: resolved against the config's folder, not the working one.
    let gw = TestGateway::start(config(&toml("unix:run/app.sock", ""), dir.path())).await;
    let (parts, _) = get(&gw.url("/app/early")).await;
    assert_eq!(parts.status, 502, "no socket yet");
    let text = metrics_text(gw.addr).await;
    assert_eq!(sample(&text, "gateway_upstream_errors_total", &[("upstream", "app"), ("kind", "connect")]), Some(1.0));

    std::fs::create_dir(dir.path().join("run")).unwrap();
    let (connections, _) = unix_upstream(&dir.path().join("run/app.sock"));
    let (parts, body) = get(&gw.url("/app/late")).await;
    assert_eq!((parts.status.as_u16(), &body[..]), (200, &b"unix ok"[..]));
    assert_eq!(connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn health_checks_reach_the_socket_and_readyz_follows() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("app.sock");
    let health = "[upstreams.app.health]\npath = \"/health\"\ninterval = \"100ms\"\nhealthy_after = 1\n";
    let gw = TestGateway::start(config(&toml("unix:app.sock", health), dir.path())).await;
    let ready = |gw: &TestGateway| {
        let url = gw.url("/readyz");
        async move { get(&url).await.0.status.as_u16() }
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(ready(&gw).await, 503, "no socket: not ready");
    let (_, hosts) = unix_upstream(&sock);
    let mut status = 0;
    for _ in 0..50 {
        status = ready(&gw).await;
        if status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status, 200, "ready once the socket answers its checks");
    assert!(hosts.lock().unwrap().iter().any(|h| h == "/health localhost"), "{:?}", hosts.lock().unwrap());
}

#[test]
fn bad_unix_urls_are_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let long = format!("unix:/{}", "d".repeat(120));
    for (url, want) in [
        ("unix:", "missing socket path"),
        (long.as_str(), "longer than a Unix socket address allows"),
        ("unix://run/app.sock", "use unix:/absolute/path or unix:relative/path"),
        // Taken as written: a percent-encoding or a NUL would name a file
        // of that spelling, not what was meant.
        ("unix:%00x", "not percent-decoded"),
        ("unix:x\\u0000y", "NUL byte"),
        ("unix:@", "an abstract socket's name has 1 to 107 bytes"),
    ] {
        let source = gateway::config::Source::Inline { text: toml(url, ""), base_dir: dir.path().to_path_buf() };
        let err = gateway::config::load(&source).expect_err(url).to_string();
        assert!(err.contains("upstreams.app.url") && err.contains(want), "{url}: {err}");
    }
}

/// `unix:@NAME` is a Linux abstract socket (no file; common for sidecars
/// such as `@envoy_admin`), not a file named `@NAME`.
#[tokio::test]
async fn an_abstract_socket_upstream_is_reached() {
    let dir = tempfile::tempdir().unwrap();
    let name = format!("gateway-test-{}-{}", std::process::id(), dir.path().file_name().unwrap().to_string_lossy());
    let abstract_path = std::ffi::OsString::from_vec([&[0], name.as_bytes()].concat());
    let (connections, _) = unix_upstream(Path::new(&abstract_path));
    let gw = TestGateway::start(config(&toml(&format!("unix:@{name}"), ""), dir.path())).await;
    let (parts, body) = get(&gw.url("/app/x")).await;
    assert_eq!((parts.status.as_u16(), &body[..]), (200, &b"unix ok"[..]));
    assert_eq!(connections.load(Ordering::SeqCst), 1);
    assert!(!dir.path().join(format!("@{name}")).exists());
}
