//! Config reload: a valid file takes effect for new
//! requests at once, under load, without dropping any; unchanged upstreams
//! keep their pools, removed ones close their idle connections; an invalid
//! file changes nothing; SIGHUP and the admin listener's `POST /-/reload`.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use gateway::config::{self, Source};
use http::{Request, Response};
use hyper::body::Incoming;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Writes `toml` as the config file in `dir` and starts a gateway from it.
async fn from_file(dir: &Path, toml: &str) -> TestGateway {
    let path = dir.join("gateway.toml");
    std::fs::write(&path, toml).unwrap();
    let mut c = config::load(&Source::File(path)).unwrap_or_else(|e| panic!("{e}"));
    c.server.listen = "127.0.0.1:0".parse().unwrap();
    // As the command line does when the file leaves it unset.
    c.server.access_log_format.get_or_insert(config::AccessLogFormat::Combined);
    TestGateway::start(c).await
}

fn rewrite(dir: &Path, toml: &str) {
    std::fs::write(dir.join("gateway.toml"), toml).unwrap();
}

const SERVER: &str = "[server]\nlisten = \"127.0.0.1:0\"\n";

fn with_routes(up: SocketAddr, timeout: &str, extra: &str) -> String {
    format!(
        "{SERVER}[upstreams.app]\nurl = \"http://{up}\"\n\
         [[routes]]\nname = \"rl_a\"\nprefix = \"/a\"\nupstream = \"app\"\ntimeout = \"{timeout}\"\n{extra}"
    )
}

/// The metrics are the process's, and every test here reloads: one at a
/// time, so each counts only its own reloads.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    sample(text, name, labels).unwrap_or(0.0)
}

#[tokio::test]
async fn a_reload_under_load_adds_a_route_and_changes_a_timeout_without_dropping_a_request() {
    let _serial = SERIAL.lock().await;
    let up = TestUpstream::start(|_req: Request<Incoming>| async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        Response::new(full("up"))
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let gw = from_file(dir.path(), &with_routes(up.addr, "2s", "")).await;
    let before = metrics_text(gw.addr).await;
    let ok_before = metric(&before, "gateway_config_reloads_total", &[("result", "ok"), ("trigger", "signal")]);

    let stop = Arc::new(AtomicBool::new(false));
    let (served, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let (stop, served, failed, url) = (stop.clone(), served.clone(), failed.clone(), gw.url("/a/x"));
            tokio::spawn(async move {
                let client = client();
                while !stop.load(Ordering::Relaxed) {
                    let req = Request::get(&url).body(full("")).unwrap();
                    match client.request(req).await {
                        Ok(r) if r.status() == 200 => served.fetch_add(1, Ordering::Relaxed),
                        _ => failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(get(&gw.url("/new")).await.0.status, 404, "not there yet");
    rewrite(
        dir.path(),
        &with_routes(
            up.addr,
            "5s",
            "[[routes]]\nname = \"rl_new\"\nprefix = \"/new\"\nrespond = { status = 200, body = \"new\" }\n",
        ),
    );
    let needs_restart = gw.app.reload().expect("a valid file reloads");
    assert!(needs_restart.is_empty(), "[server] did not change: {needs_restart:?}");
    let (parts, body) = get(&gw.url("/new")).await;
    assert_eq!((parts.status.as_u16(), &body[..]), (200, &b"new"[..]), "the new route serves at once");
    tokio::time::sleep(Duration::from_millis(400)).await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    assert!(served.load(Ordering::Relaxed) > 50, "the load ran: {}", served.load(Ordering::Relaxed));
    assert_eq!(failed.load(Ordering::Relaxed), 0, "no request may fail across a reload");
    // The upstream's pool was kept: 8 clients never needed more than 8
    // connections (a rebuilt pool would have opened new ones).
    assert!(up.connections() <= 8, "pool reconnected: {} connections", up.connections());
    let after = metrics_text(gw.addr).await;
    assert_eq!(metric(&after, "gateway_route_timeout_seconds", &[("route", "rl_a")]), 5.0);
    assert_eq!(
        metric(&after, "gateway_config_reloads_total", &[("result", "ok"), ("trigger", "signal")]),
        ok_before + 1.0
    );
}

#[tokio::test]
async fn an_invalid_file_changes_nothing_and_is_counted() {
    let _serial = SERIAL.lock().await;
    let (up, _) = counting_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = from_file(dir.path(), &with_routes(up.addr, "2s", "")).await;
    let errors = |t: &str| metric(t, "gateway_config_reloads_total", &[("result", "error"), ("trigger", "signal")]);
    let before = errors(&metrics_text(gw.addr).await);
    rewrite(dir.path(), &format!("{SERVER}[[routes]]\nname = \"x\"\nprefix = \"/a\"\nupstream = \"ghost\"\n"));
    let err = gw.app.reload().expect_err("an unknown upstream is refused").to_string();
    assert!(err.contains("gateway.toml") && err.contains("routes[0].upstream") && err.contains("ghost"), "{err}");
    assert_eq!(get(&gw.url("/a/x")).await.0.status, 200, "still served by the old routes");
    assert_eq!(errors(&metrics_text(gw.addr).await), before + 1.0);
}

#[tokio::test]
async fn a_removed_upstream_closes_its_idle_connections() {
    let _serial = SERIAL.lock().await;
    let closed = Arc::new(AtomicBool::new(false));
    let seen = closed.clone();
    // Keep-alive HTTP/1.1 by hand, noting when the gateway closes.
    let up = raw_upstream(move |mut s: TcpStream| {
        let seen = seen.clone();
        async move {
            let mut buf = [0u8; 4096];
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
                    }
                }
            }
            seen.store(true, Ordering::SeqCst);
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let gw = from_file(dir.path(), &with_routes(up, "2s", "")).await;
    assert_eq!(get(&gw.url("/a/x")).await.0.status, 200);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!closed.load(Ordering::SeqCst), "pooled, kept open");
    rewrite(
        dir.path(),
        &format!("{SERVER}[[routes]]\nname = \"rl_only\"\nprefix = \"/a\"\nrespond = {{ status = 204 }}\n"),
    );
    gw.app.reload().unwrap();
    for _ in 0..50 {
        if closed.load(Ordering::SeqCst) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(closed.load(Ordering::SeqCst), "the removed upstream's idle connection must close");
    assert_eq!(get(&gw.url("/a/x")).await.0.status, 204);
}

#[tokio::test]
async fn the_admin_listener_reloads_on_post() {
    let _serial = SERIAL.lock().await;
    let (up, _) = counting_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let admin = "[metrics]\nlisten = \"127.0.0.1:0\"\n";
    let gw = from_file(dir.path(), &format!("{}{admin}", with_routes(up.addr, "2s", ""))).await;
    let admin_url = format!("http://{}/-/reload", gw.admin.unwrap());
    assert_eq!(get(&admin_url).await.0.status, 405, "only POST reloads");
    rewrite(
        dir.path(),
        &format!(
            "{}{admin}[[routes]]\nname = \"rl_post\"\nprefix = \"/p\"\nrespond = {{ status = 200 }}\n",
            with_routes(up.addr, "2s", "")
        ),
    );
    let post = |url: &str| send(Request::post(url).body(full("")).unwrap());
    let admin_ok = |t: &str| metric(t, "gateway_config_reloads_total", &[("result", "ok"), ("trigger", "admin")]);
    let before = admin_ok(&metrics_text(gw.admin.unwrap()).await);
    // A page on another origin can make a browser POST here (a form needs
    // no CORS); the Origin it carries refuses it.
    let forged = Request::post(&admin_url).header("origin", "http://evil.example").body(full("")).unwrap();
    assert_eq!(send(forged).await.0.status, 403);
    assert_eq!(get(&gw.url("/p")).await.0.status, 404, "a refused reload changes nothing");
    let (parts, body) = post(&admin_url).await;
    assert_eq!((parts.status.as_u16(), &body[..]), (200, &b"reloaded\n"[..]));
    assert_eq!(admin_ok(&metrics_text(gw.admin.unwrap()).await), before + 1.0, "counted as the admin's");
    assert_eq!(get(&gw.url("/p")).await.0.status, 200);
    rewrite(dir.path(), "[server]\nlisten = 5\n");
    let (parts, body) = post(&admin_url).await;
    assert_eq!(parts.status, 500);
    assert!(String::from_utf8_lossy(&body).contains("server.listen"), "{body:?}");
    // The main listener does not take reloads.
    assert_eq!(post(&gw.url("/-/reload")).await.0.status, 404);
}

#[test]
fn sighup_reloads_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let addr = common::process::free_addr();
    let path = dir.path().join("gateway.toml");
    let base = format!(
        "[server]\nlisten = \"{addr}\"\n[[routes]]\nname = 'one'\nprefix = '/one'\nrespond = {{ status = 200 }}\n"
    );
    std::fs::write(&path, &base).unwrap();
    let mut gw = Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args(["--config", path.to_str().unwrap()])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let status = |p: &str| process_status(&addr, p);
    let wait_for = |p: &str, want: u16| process_status_becomes(&addr, p, want);
    assert!(wait_for("/one", 200), "the gateway came up");
    assert_eq!(status("/two"), Some(404));
    std::fs::write(&path, format!("{base}[[routes]]\nname = 'two'\nprefix = '/two'\nrespond = {{ status = 200 }}\n"))
        .unwrap();
    Command::new("kill").args(["-HUP", &gw.id().to_string()]).status().unwrap();
    let reloaded = wait_for("/two", 200);
    Command::new("kill").args(["-TERM", &gw.id().to_string()]).status().unwrap();
    let exit = gw.wait().unwrap();
    assert!(reloaded, "SIGHUP must load the new route");
    assert_eq!(exit.code(), Some(0), "still exits cleanly");
}

#[tokio::test]
async fn a_changed_server_section_is_reported_and_not_applied() {
    let _serial = SERIAL.lock().await;
    let (up, _) = counting_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = from_file(dir.path(), &with_routes(up.addr, "2s", "")).await;
    let changed = with_routes(up.addr, "2s", "").replace("[server]\n", "[server]\nmax_uri_length = \"1KiB\"\n");
    rewrite(dir.path(), &changed);
    assert_eq!(gw.app.reload().unwrap(), vec!["server"]);
    // Still the old limit (8 KiB): a 2 KiB target passes.
    let long = format!("/a/{}", "x".repeat(2048));
    assert_eq!(get(&gw.url(&long)).await.0.status, 200);
}

/// A route that leaves `max_body` unset takes `server.max_body`: a reload
/// that changes only the latter (a `[server]` key, not applied until a
/// restart) leaves the route's bound as it was too.
#[tokio::test]
async fn a_routes_default_from_a_changed_server_section_is_not_applied_either() {
    let _serial = SERIAL.lock().await;
    let (up, _) = counting_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let small = with_routes(up.addr, "2s", "").replace("[server]\n", "[server]\nmax_body = \"1KiB\"\n");
    let gw = from_file(dir.path(), &small).await;
    let post = |url: String| async move {
        let req = Request::post(url).body(full(vec![b'x'; 4096])).unwrap();
        send(req).await.0.status.as_u16()
    };
    assert_eq!(post(gw.url("/a/up")).await, 413);
    rewrite(dir.path(), &small.replace("max_body = \"1KiB\"", "max_body = \"1MiB\""));
    assert_eq!(gw.app.reload().unwrap(), vec!["server"]);
    assert_eq!(post(gw.url("/a/up")).await, 413, "the route's bound is still the running server's");
    // A route's own max_body is the file's to change.
    rewrite(dir.path(), &small.replace("timeout = \"2s\"", "timeout = \"2s\"\nmax_body = \"1MiB\""));
    assert_eq!(gw.app.reload().unwrap(), vec![] as Vec<&str>);
    assert_eq!(post(gw.url("/a/up")).await, 200);
}

#[tokio::test]
async fn a_reload_keeps_counting_a_routes_max_concurrent() {
    let _serial = SERIAL.lock().await;
    let up = TestUpstream::start(|_req: Request<Incoming>| async {
        tokio::time::sleep(Duration::from_millis(800)).await;
        Response::new(full("slow"))
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let toml = with_routes(up.addr, "5s", "max_concurrent = 1\n");
    let gw = from_file(dir.path(), &toml).await;
    let first = tokio::spawn(get_owned(gw.url("/a/1")));
    tokio::time::sleep(Duration::from_millis(200)).await;
    gw.app.reload().unwrap();
    assert_eq!(get(&gw.url("/a/2")).await.0.status, 503, "the one slot is still taken across the reload");
    assert_eq!(first.await.unwrap(), 200);
}

async fn get_owned(url: String) -> u16 {
    get(&url).await.0.status.as_u16()
}

/// An upstream that counts requests in flight and notes the most it saw at
/// once; each request takes `hold`.
async fn concurrency_upstream(hold: Duration) -> (TestUpstream, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (n, m) = (now.clone(), most.clone());
    let up = TestUpstream::start(move |_req: Request<Incoming>| {
        let (n, m) = (n.clone(), m.clone());
        async move {
            let at_once = n.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(at_once, Ordering::SeqCst);
            tokio::time::sleep(hold).await;
            n.fetch_sub(1, Ordering::SeqCst);
            Response::new(full("held"))
        }
    })
    .await;
    (up, now, most)
}

/// Reloads that change the upstream's settings while requests are in
/// flight and queued keep one admission: never more than `max_requests` at
/// once, and every queued request is served in its turn.
#[tokio::test]
async fn reloads_under_load_never_let_more_than_max_requests_through() {
    let _serial = SERIAL.lock().await;
    let (up, _, most) = concurrency_upstream(Duration::from_millis(300)).await;
    let dir = tempfile::tempdir().unwrap();
    let toml = |queue_timeout: &str| {
        format!(
            "{SERVER}[upstreams.rl_adm]\nurl = \"http://{}\"\nmax_requests = 2\nqueue = 20\nqueue_timeout = \"{queue_timeout}\"\n\
             [[routes]]\nname = \"rl_adm\"\nprefix = \"/adm\"\nupstream = \"rl_adm\"\ntimeout = \"10s\"\n",
            up.addr
        )
    };
    let gw = from_file(dir.path(), &toml("5s")).await;
    // Requests keep arriving: some in flight and queued on the upstream as
    // it was, some after each reload.
    let mut requests: Vec<_> = (0..4).map(|_| tokio::spawn(get_status_of(gw.url("/adm/x")))).collect();
    for timeout in ["6s", "7s", "8s"] {
        tokio::time::sleep(Duration::from_millis(100)).await;
        rewrite(dir.path(), &toml(timeout));
        gw.app.reload().expect("reload");
        requests.extend((0..3).map(|_| tokio::spawn(get_status_of(gw.url("/adm/x")))));
    }
    for r in requests {
        assert_eq!(r.await.unwrap(), 200, "a queued request lost its place across a reload");
    }
    assert_eq!(most.load(Ordering::SeqCst), 2, "more than max_requests reached the upstream across reloads");
    // A lower max_requests takes effect on the shared count.
    rewrite(dir.path(), &toml("8s").replace("max_requests = 2", "max_requests = 1"));
    gw.app.reload().expect("reload");
    most.store(0, Ordering::SeqCst);
    let requests: Vec<_> = (0..4).map(|_| tokio::spawn(get_status_of(gw.url("/adm/x")))).collect();
    for r in requests {
        assert_eq!(r.await.unwrap(), 200);
    }
    assert_eq!(most.load(Ordering::SeqCst), 1, "the lowered max_requests was not applied");
}

async fn get_status_of(url: String) -> u16 {
    get(&url).await.0.status.as_u16()
}

/// An ejected endpoint stays ejected across a reload that changes its
/// upstream's settings.
#[tokio::test]
async fn an_ejection_outlives_a_reload_that_changes_the_upstream() {
    let _serial = SERIAL.lock().await;
    let seen = Arc::new(AtomicUsize::new(0));
    let s = seen.clone();
    let up = TestUpstream::start(move |_req: Request<Incoming>| {
        s.fetch_add(1, Ordering::SeqCst);
        async {
            let mut r = Response::new(full("down"));
            *r.status_mut() = http::StatusCode::BAD_GATEWAY;
            r
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let toml = |connect: &str| {
        format!(
            "{SERVER}[upstreams.rl_ej]\nurl = \"http://{}\"\nconnect_timeout = \"{connect}\"\n\
             outlier = {{ consecutive_failures = 1, ejection_time = \"60s\" }}\n\
             [[routes]]\nname = \"rl_ej\"\nprefix = \"/ej\"\nupstream = \"rl_ej\"\n",
            up.addr
        )
    };
    let gw = from_file(dir.path(), &toml("1s")).await;
    assert_eq!(get(&gw.url("/ej/x")).await.0.status, 502);
    assert_eq!(get(&gw.url("/ej/x")).await.0.status, 503, "ejected");
    rewrite(dir.path(), &toml("2s"));
    gw.app.reload().expect("reload");
    assert_eq!(get(&gw.url("/ej/x")).await.0.status, 503, "the reload let an ejected endpoint take traffic");
    assert_eq!(seen.load(Ordering::SeqCst), 1, "the ejected endpoint was sent a request");
}

/// A lower `max_requests` takes effect as requests in flight finish, ahead
/// of the queue: it does not wait for the queue to drain.
#[tokio::test]
async fn a_lower_max_requests_applies_before_the_queue_drains() {
    let _serial = SERIAL.lock().await;
    let (up, now, most) = concurrency_upstream(Duration::from_millis(300)).await;
    let dir = tempfile::tempdir().unwrap();
    let toml = |max: usize| {
        format!(
            "{SERVER}[upstreams.rl_lower]\nurl = \"http://{}\"\nmax_requests = {max}\nqueue = 100\nqueue_timeout = \"20s\"\n\
             [[routes]]\nname = \"rl_lower\"\nprefix = \"/lower\"\nupstream = \"rl_lower\"\ntimeout = \"30s\"\n",
            up.addr
        )
    };
    let gw = from_file(dir.path(), &toml(4)).await;
    let requests: Vec<_> = (0..16).map(|_| tokio::spawn(get_status_of(gw.url("/lower/x")))).collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(now.load(Ordering::SeqCst), 4);
    rewrite(dir.path(), &toml(2));
    gw.app.reload().expect("reload");
    // Once the four in flight are done, at most two at a time, although
    // twelve were queued when the limit went down.
    tokio::time::sleep(Duration::from_millis(350)).await;
    most.store(0, Ordering::SeqCst);
    for r in requests {
        assert_eq!(r.await.unwrap(), 200);
    }
    assert_eq!(most.load(Ordering::SeqCst), 2, "the lower max_requests waited for the queue to drain");
}

/// A reload that removes an upstream's health checks while an endpoint is
/// unhealthy makes it take traffic again: without checks, it is healthy.
#[tokio::test]
async fn removing_health_checks_frees_an_unhealthy_endpoint() {
    let _serial = SERIAL.lock().await;
    let up = TestUpstream::start(|req: Request<Incoming>| async move {
        let mut r = Response::new(full("up"));
        if req.uri().path() == "/hz" {
            *r.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
        }
        r
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let base = format!(
        "{SERVER}[upstreams.rl_hc]\nurl = \"http://{}\"\n\
         [[routes]]\nname = \"rl_hc\"\nprefix = \"/hc\"\nupstream = \"rl_hc\"\n",
        up.addr
    );
    let checked = format!(
        "{base}[upstreams.rl_hc.health]\npath = \"/hz\"\ninterval = \"100ms\"\ntimeout = \"100ms\"\nunhealthy_after = 1\nhealthy_after = 1\n"
    );
    let gw = from_file(dir.path(), &checked).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(get(&gw.url("/hc/x")).await.0.status, 503, "unhealthy");
    rewrite(dir.path(), &base);
    gw.app.reload().expect("reload");
    assert_eq!(get(&gw.url("/hc/x")).await.0.status, 200, "without checks the endpoint is healthy");
}

/// The health checks of an endpoint a reload replaced stop, even while a
/// request still holds the old endpoint: without checks configured, a
/// failing check path cannot turn the endpoint unhealthy.
#[tokio::test]
async fn the_checks_of_a_replaced_endpoint_stop_while_its_requests_finish() {
    let _serial = SERIAL.lock().await;
    let failing = Arc::new(AtomicBool::new(false));
    let f = failing.clone();
    let up = TestUpstream::start(move |req: Request<Incoming>| {
        let f = f.clone();
        async move {
            if req.uri().path() == "/slow" {
                tokio::time::sleep(Duration::from_millis(1500)).await;
            }
            let mut r = Response::new(full("up"));
            if req.uri().path() == "/hz" && f.load(Ordering::SeqCst) {
                *r.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
            }
            r
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let base = format!(
        "{SERVER}[upstreams.rl_hc2]\nurl = \"http://{}\"\n\
         [[routes]]\nname = \"rl_hc2\"\nprefix = \"/\"\nupstream = \"rl_hc2\"\n",
        up.addr
    );
    let checked = format!(
        "{base}[upstreams.rl_hc2.health]\npath = \"/hz\"\ninterval = \"100ms\"\ntimeout = \"100ms\"\nunhealthy_after = 1\nhealthy_after = 1\n"
    );
    let gw = from_file(dir.path(), &checked).await;
    let slow = tokio::spawn(get_status_of(gw.url("/slow")));
    tokio::time::sleep(Duration::from_millis(150)).await;
    rewrite(dir.path(), &base);
    gw.app.reload().expect("reload");
    failing.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(get(&gw.url("/x")).await.0.status, 200, "a check of the replaced endpoint marked it unhealthy");
    assert_eq!(slow.await.unwrap(), 200);
    assert_eq!(get(&gw.url("/x")).await.0.status, 200);
}

/// Removing `outlier` clears an ejection: re-added later, it starts from
/// nothing, not from a trial of an endpoint that was serving fine.
#[tokio::test]
async fn removing_outlier_detection_clears_the_ejection() {
    let _serial = SERIAL.lock().await;
    let failing = Arc::new(AtomicBool::new(true));
    let f = failing.clone();
    let up = TestUpstream::start(move |_req: Request<Incoming>| {
        let f = f.clone();
        async move {
            let mut r = Response::new(full("up"));
            if f.load(Ordering::SeqCst) {
                *r.status_mut() = http::StatusCode::BAD_GATEWAY;
            }
            r
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let base = format!(
        "{SERVER}[upstreams.rl_out]\nurl = \"http://{}\"\n\
         [[routes]]\nname = \"rl_out\"\nprefix = \"/\"\nupstream = \"rl_out\"\n",
        up.addr
    );
    let with_outlier =
        format!("{base}[upstreams.rl_out.outlier]\nconsecutive_failures = 1\nejection_time = \"300ms\"\n");
    let gw = from_file(dir.path(), &with_outlier).await;
    assert_eq!(get(&gw.url("/x")).await.0.status, 502);
    assert_eq!(get(&gw.url("/x")).await.0.status, 503, "ejected");
    failing.store(false, Ordering::SeqCst);
    rewrite(dir.path(), &base);
    gw.app.reload().expect("reload");
    let m = metrics_text(gw.addr).await;
    assert_eq!(metric(&m, "gateway_upstream_endpoint_ejected", &[("upstream", "rl_out")]), 0.0);
    tokio::time::sleep(Duration::from_millis(400)).await;
    rewrite(dir.path(), &with_outlier);
    gw.app.reload().expect("reload");
    let at_once: Vec<_> = (0..4).map(|_| tokio::spawn(get_status_of(gw.url("/x")))).collect();
    for r in at_once {
        assert_eq!(r.await.unwrap(), 200, "the old ejection came back as a trial");
    }
}
