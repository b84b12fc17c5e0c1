//! The service as operators see it: built-in endpoints, metrics after
//! traffic, unmatched requests, fixed responses and graceful shutdown.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Routes `/api` to `upstream` as route `api_name`, and `/fixed` and `/doc`
/// as routes `{api_name}_fixed` and `{api_name}_doc` (route names are
/// unique per test, since all tests in this binary share one metrics
/// registry).
fn traffic_config(upstream: std::net::SocketAddr, api_name: &str) -> String {
    format!(
        r#"
[upstreams.svc_{api_name}]
url = "http://{upstream}"

[[routes]]
name = "{api_name}"
prefix = "/api"
upstream = "svc_{api_name}"
rewrite = "/"
timeout = "1500ms"

[[routes]]
name = "{api_name}_fixed"
prefix = "/fixed"
respond = {{ status = 202, body = "accepted" }}

[[routes]]
name = "{api_name}_doc"
prefix = "/doc"
file = "config/public/demo.txt"
"#
    )
}

/// Held by the tests that send a request no route matches: route
/// `unmatched` is every gateway's in this binary, so one at a time, and
/// its count read as a difference.
static UNMATCHED: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn metrics_hold_every_series_with_labels_after_traffic() {
    let _one_at_a_time = UNMATCHED.lock().await;
    let up = TestUpstream::start(|_req| async { Response::new(full("fine")) }).await;
    let gw = TestGateway::from_toml(&traffic_config(up.addr, "api")).await;
    let before = metrics_text(gw.addr).await;
    for _ in 0..3 {
        assert_eq!(get(&gw.url("/api/x?y=1")).await.0.status, 200);
    }
    let (parts, body) = get(&gw.url("/fixed")).await;
    assert_eq!((parts.status.as_u16(), &body[..]), (202, &b"accepted"[..]));
    assert_eq!(get(&gw.url("/doc")).await.0.status, 200);
    assert_eq!(get(&gw.url("/no/such/route/12345")).await.0.status, 404);
    send(Request::builder().method("FROB").uri(gw.url("/fixed")).body(full(Bytes::new())).unwrap()).await;

    let m = metrics_text(gw.addr).await;
    let requests_in = |m: &str, route, method, status| {
        sample(m, "http_server_requests_total", &[("route", route), ("method", method), ("status", status)])
    };
    let requests = |route, method, status| requests_in(&m, route, method, status);
    assert_eq!(requests("api", "GET", "200"), Some(3.0));
    assert_eq!(requests("api_fixed", "GET", "202"), Some(1.0));
    assert_eq!(requests("api_doc", "GET", "200"), Some(1.0));
    let unmatched = |m| requests_in(m, "unmatched", "GET", "404").unwrap_or(0.0);
    assert_eq!(unmatched(&m) - unmatched(&before), 1.0);
    // Unknown methods share one label value, so a client cannot mint series.
    assert_eq!(requests("api_fixed", "other", "202"), Some(1.0));
    assert!(!m.contains("/no/such/route"), "raw paths must never become labels");
    assert!(!m.contains("FROB"));

    let hist = |name: &str, labels: &[(&str, &str)]| sample(&m, name, labels);
    assert_eq!(
        hist("http_server_request_duration_seconds_count", &[("route", "api"), ("method", "GET"), ("status", "200")]),
        Some(3.0)
    );
    for le in ["0.001", "0.5", "1", "2", "5", "10", "+Inf"] {
        assert!(
            hist("http_server_request_duration_seconds_bucket", &[("route", "api"), ("le", le)]).is_some(),
            "bucket le={le} missing"
        );
    }
    assert_eq!(
        hist("gateway_upstream_request_duration_seconds_count", &[("upstream", "svc_api"), ("status", "200")]),
        Some(3.0)
    );
    assert_eq!(hist("http_server_active_requests", &[("route", "api")]), Some(0.0));
    assert_eq!(hist("gateway_upstream_errors_total", &[("upstream", "svc_api"), ("kind", "connect")]), Some(0.0));
    assert_eq!(hist("gateway_upstream_connections_opened_total", &[("upstream", "svc_api")]), Some(1.0));
    assert_eq!(hist("gateway_route_timeout_seconds", &[("route", "api")]), Some(1.5));
    for process in ["process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds"] {
        assert!(hist(process, &[]).is_some(), "{process} missing");
    }
    assert!(hist("process_resident_memory_bytes", &[]).unwrap() > 1e6);

    // Every sample line parses as `name{labels} value`, and every family has
    // TYPE and HELP metadata, which is what promtool checks.
    for line in m.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("bad line {line:?}"));
        assert!(value.parse::<f64>().is_ok(), "bad value in {line:?}");
        let name = series.split('{').next().unwrap();
        assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'), "bad name in {line:?}");
        let family = name.trim_end_matches("_bucket").trim_end_matches("_count").trim_end_matches("_sum");
        assert!(
            m.contains(&format!("# TYPE {family} ")) || m.contains(&format!("# TYPE {name} ")),
            "no TYPE for {name}"
        );
        assert!(
            m.contains(&format!("# HELP {family} ")) || m.contains(&format!("# HELP {name} ")),
            "no HELP for {name}"
        );
    }
}

/// A fixed response is built in the request's own header map, emptied
/// (hyper parses the next request into it): none of a request's headers
/// may come back, on the first request of a connection or a later one.
#[tokio::test]
async fn a_fixed_response_carries_none_of_the_requests_headers() {
    // A route name of its own: the tests in this binary share one metrics
    // registry.
    let toml = r#"
[[routes]]
name = "fixed_headers"
prefix = "/fixed"
respond = { status = 202, body = "accepted" }
"#;
    let gw = TestGateway::from_toml(toml).await;
    let two = b"GET /fixed HTTP/1.1\r\nHost: x\r\nCookie: secret=1\r\nAuthorization: Bearer token\r\nX-One: 1\r\n\r\n\
GET /fixed HTTP/1.1\r\nHost: x\r\nX-Two: 2\r\nConnection: close\r\n\r\n";
    let r = raw(gw.addr, two, Duration::from_secs(5)).await;
    let text = r.text.to_ascii_lowercase();
    assert_eq!(text.matches("http/1.1 202 accepted\r\n").count(), 2, "{}", r.text);
    assert_eq!(text.matches("\r\ncontent-type: text/plain; charset=utf-8\r\n").count(), 2, "{}", r.text);
    assert_eq!(text.matches("\r\nx-request-id: ").count(), 2, "{}", r.text);
    for leaked in ["\r\ncookie:", "secret", "\r\nauthorization:", "token", "\r\nx-one:", "\r\nx-two:", "\r\nhost:"] {
        assert!(!text.contains(leaked), "{leaked:?} came back: {}", r.text);
    }
}

#[tokio::test]
async fn health_endpoints_answer() {
    let gw = TestGateway::from_toml("").await;
    let (parts, body) = get(&gw.url("/healthz")).await;
    assert_eq!((parts.status.as_u16(), &body[..]), (200, &b"ok\n"[..]));
    assert_eq!(get(&gw.url("/readyz")).await.0.status, 200);
    let (parts, _) = get(&gw.url("/metrics")).await;
    assert!(parts.headers["content-type"].to_str().unwrap().starts_with("text/plain; version=0.0.4"));
}

#[tokio::test]
async fn separate_metrics_listener() {
    let _one_at_a_time = UNMATCHED.lock().await;
    let mut config = config("[metrics]\npath = \"/m\"\n", std::path::Path::new("."));
    config.metrics.listen = Some("127.0.0.1:0".parse().unwrap());
    let mut gw = TestGateway::start(config).await;
    let (main, admin) = (gw.addr, gw.admin.unwrap());
    assert!(get(&format!("http://{admin}/m")).await.1.starts_with(b"# "));
    assert_eq!(get(&format!("http://{admin}/healthz")).await.0.status, 200);
    // Not on the main listener, where it is just an unmatched path.
    assert_eq!(get(&format!("http://{main}/m")).await.0.status, 404);
    gw.shutdown();
    gw.task.await.unwrap();
}

/// Sends `GET path` on an open keep-alive connection and returns the status.
async fn status_on(s: &mut tokio::net::TcpStream, path: &str) -> u16 {
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes()).await.unwrap();
    let mut buf = [0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf)).await.expect("answered").unwrap();
    String::from_utf8_lossy(&buf[..n]).get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0)
}

#[tokio::test]
async fn graceful_shutdown_turns_readyz_503_serves_through_the_delay_then_drains() {
    let up = TestUpstream::start(|_req| async {
        tokio::time::sleep(Duration::from_millis(600)).await;
        Response::new(full("slow but complete"))
    })
    .await;
    let toml = format!("[server]\nshutdown_delay = \"800ms\"\n{}", traffic_config(up.addr, "drain"));
    let mut gw = TestGateway::from_toml(&toml).await;
    let url = gw.url("/api/slow");
    let in_flight: Vec<_> = (0..200).map(|_| tokio::spawn(get_owned(url.clone()))).collect();
    tokio::time::sleep(Duration::from_millis(200)).await;

    // A keep-alive connection opened before shutdown sees /readyz turn to 503.
    let mut probe = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    assert_eq!(status_on(&mut probe, "/readyz").await, 200);
    gw.shutdown();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(status_on(&mut probe, "/readyz").await, 503, "/readyz must fail at once on SIGTERM");
    assert_eq!(status_on(&mut probe, "/fixed").await, 202, "requests are still served during the delay");
    // New connections are still accepted and served during the delay, so a
    // load balancer sees "not ready" before anything is refused.
    let mut late = tokio::net::TcpStream::connect(gw.addr).await.expect("accepting during shutdown_delay");
    assert_eq!(status_on(&mut late, "/readyz").await, 503);
    let during_delay = tokio::spawn(get_owned(url.clone()));

    // After the delay: no longer accepting; in-flight requests finish.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(tokio::net::TcpStream::connect(gw.addr).await.is_err(), "new connections must be refused after the delay");
    for r in in_flight.into_iter().chain([during_delay]) {
        let (status, body) = r.await.unwrap();
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        assert_eq!(&body[..], b"slow but complete");
    }
    tokio::time::timeout(Duration::from_secs(5), gw.task).await.expect("drains and returns").unwrap();
}

#[tokio::test]
async fn without_a_delay_shutdown_stops_accepting_at_once() {
    let up = TestUpstream::start(|_req| async {
        tokio::time::sleep(Duration::from_millis(400)).await;
        Response::new(full("done"))
    })
    .await;
    let mut gw = TestGateway::from_toml(&traffic_config(up.addr, "nodelay")).await;
    let slow = tokio::spawn(get_owned(gw.url("/api/x")));
    tokio::time::sleep(Duration::from_millis(100)).await;
    gw.shutdown();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(tokio::net::TcpStream::connect(gw.addr).await.is_err());
    assert_eq!(slow.await.unwrap().0, 200);
    tokio::time::timeout(Duration::from_secs(5), gw.task).await.expect("drains and returns").unwrap();
}

async fn get_owned(url: String) -> (u16, Bytes) {
    let (parts, body) = get(&url).await;
    (parts.status.as_u16(), body)
}

#[tokio::test]
async fn http2_prior_knowledge_is_served() {
    let up = TestUpstream::start(|req: Request<hyper::body::Incoming>| async move {
        let header = |name: &str| req.headers().get(name).map(|h| h.to_str().unwrap().to_owned()).unwrap_or_default();
        Response::new(full(format!("host={} via={}", header("host"), header("via"))))
    })
    .await;
    let gw = TestGateway::from_toml(&traffic_config(up.addr, "h2")).await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<TestBody>();
    let resp = client.request(Request::get(gw.url("/api/h2")).body(full(Bytes::new())).unwrap()).await.unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    // The response came from the upstream over HTTP/1.1, and Via says so.
    let via = gateway::headers::Via::default();
    assert_eq!(resp.headers()["via"], format!("1.1 {}", via.name()));
    let body = http_body_util::BodyExt::collect(resp.into_body()).await.unwrap().to_bytes();
    assert_eq!(String::from_utf8_lossy(&body), format!("host={} via=2 {}", gw.addr, via.name()));
}
