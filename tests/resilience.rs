//! Protecting the slow service: the admission queue (`max_requests`),
//! several endpoints and their balance, active health checks and `/readyz`,
//! passive ejection with its trial, retries and the retry budget. Upstreams
//! are written in the tests, and every claim about what reached them is
//! counted there.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http::{Request, Response, StatusCode};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// An upstream that holds each request for `delay`, counts the requests it
/// saw and the most it ever had at once, and answers `status`.
struct Slow {
    up: TestUpstream,
    seen: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
}

async fn slow_upstream(delay: Duration, status: Arc<AtomicUsize>) -> Slow {
    let (seen, peak, now) =
        (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (s, p, n) = (seen.clone(), peak.clone(), now.clone());
    let up = TestUpstream::start(move |req: Request<hyper::body::Incoming>| {
        let (s, p, n, status) = (s.clone(), p.clone(), n.clone(), status.clone());
        async move {
            s.fetch_add(1, Ordering::SeqCst);
            let at_once = n.fetch_add(1, Ordering::SeqCst) + 1;
            p.fetch_max(at_once, Ordering::SeqCst);
            if !req.uri().path().ends_with("/fast") {
                tokio::time::sleep(delay).await;
            }
            n.fetch_sub(1, Ordering::SeqCst);
            let code = StatusCode::from_u16(status.load(Ordering::SeqCst) as u16).unwrap();
            Response::builder().status(code).body(full("done")).unwrap()
        }
    })
    .await;
    Slow { up, seen, peak }
}

fn ok() -> Arc<AtomicUsize> {
    Arc::new(AtomicUsize::new(200))
}

async fn status_of(url: String) -> (u16, Option<String>) {
    let (parts, _) = get(&url).await;
    let retry_after = parts.headers.get("retry-after").map(|v| v.to_str().unwrap().to_owned());
    (parts.status.as_u16(), retry_after)
}

#[tokio::test]
async fn the_queue_never_lets_more_than_max_requests_reach_the_upstream() {
    let slow = slow_upstream(Duration::from_millis(200), ok()).await;
    let gw = TestGateway::from_toml(&format!(
        "[upstreams.q]\nurl = \"http://{}\"\nmax_requests = 2\nqueue = 20\n\
         [[routes]]\nname = \"q\"\nprefix = \"/q\"\nupstream = \"q\"\n",
        slow.up.addr
    ))
    .await;
    let all: Vec<_> = (0..8).map(|_| tokio::spawn(status_of(gw.url("/q")))).collect();
    for r in all {
        assert_eq!(r.await.unwrap().0, 200);
    }
    assert_eq!(slow.seen.load(Ordering::SeqCst), 8);
    assert_eq!(slow.peak.load(Ordering::SeqCst), 2, "more than max_requests reached the upstream at once");
    let m = metrics_text(gw.addr).await;
    assert_eq!(sample(&m, "gateway_upstream_queue_depth", &[("upstream", "q")]), Some(0.0));
    assert_eq!(sample(&m, "gateway_upstream_requests_in_flight", &[("upstream", "q")]), Some(0.0));
    assert_eq!(sample(&m, "gateway_upstream_queue_wait_seconds_count", &[("upstream", "q")]), Some(8.0));
}

#[tokio::test]
async fn a_full_queue_and_a_long_wait_are_503_with_retry_after_and_counted() {
    let slow = slow_upstream(Duration::from_millis(1500), ok()).await;
    let gw = TestGateway::from_toml(&format!(
        "[upstreams.qf]\nurl = \"http://{}\"\nmax_requests = 1\nqueue = 1\nqueue_timeout = \"300ms\"\n\
         [[routes]]\nname = \"qf\"\nprefix = \"/qf\"\nupstream = \"qf\"\n\
         [[routes]]\nname = \"qf_short\"\nprefix = \"/short\"\nupstream = \"qf\"\ntimeout = \"150ms\"\n",
        slow.up.addr
    ))
    .await;
    let first = tokio::spawn(status_of(gw.url("/qf")));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let queued = tokio::spawn(status_of(gw.url("/qf")));
    let deadline = Instant::now() + Duration::from_secs(1);
    while sample(&metrics_text(gw.addr).await, "gateway_upstream_queue_depth", &[("upstream", "qf")]) != Some(1.0) {
        assert!(Instant::now() < deadline, "the second request was never queued");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The queue's one place is taken: turned away at once, not after the
    // queue_timeout (300 ms) a queued request waits.
    let started = Instant::now();
    assert_eq!(status_of(gw.url("/qf")).await, (503, Some("1".into())));
    assert!(started.elapsed() < Duration::from_millis(250), "a full queue must answer at once");
    // The queued one waited its queue_timeout.
    assert_eq!(queued.await.unwrap(), (503, Some("1".into())));
    // A route timeout shorter than the queue's wins: 504.
    assert_eq!(status_of(gw.url("/short")).await.0, 504);
    assert_eq!(first.await.unwrap().0, 200);
    assert_eq!(slow.seen.load(Ordering::SeqCst), 1, "only the admitted request reached the upstream");
    let m = metrics_text(gw.addr).await;
    assert_eq!(rejected(&m, "qf", "queue_full"), 1.0);
    assert_eq!(rejected(&m, "qf", "queue_timeout"), 1.0);
    // The 504 from the queue is a wait, not the upstream's failure.
    assert_eq!(rejected(&m, "qf_short", "queue_timeout"), 1.0);
    assert_eq!(sample(&m, "gateway_upstream_errors_total", &[("upstream", "qf"), ("kind", "timeout")]), Some(0.0));
    assert_eq!(sample(&m, "gateway_upstream_max_requests", &[("upstream", "qf")]), Some(1.0));
    assert!(sample(&m, "gateway_upstream_queue_wait_seconds_bucket", &[("upstream", "qf"), ("le", "0.5")]).is_some());
}

#[tokio::test]
async fn a_client_that_leaves_the_queue_never_reaches_the_upstream() {
    let slow = slow_upstream(Duration::from_millis(600), ok()).await;
    let gw = TestGateway::from_toml(&format!(
        "[upstreams.ql]\nurl = \"http://{}\"\nmax_requests = 1\n\
         [[routes]]\nname = \"ql\"\nprefix = \"/ql\"\nupstream = \"ql\"\n",
        slow.up.addr
    ))
    .await;
    let first = tokio::spawn(status_of(gw.url("/ql")));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut leaver = TcpStream::connect(gw.addr).await.unwrap();
    leaver.write_all(b"GET /ql HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let m = metrics_text(gw.addr).await;
    assert_eq!(sample(&m, "gateway_upstream_queue_depth", &[("upstream", "ql")]), Some(1.0));
    drop(leaver);
    assert_eq!(first.await.unwrap().0, 200);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(slow.seen.load(Ordering::SeqCst), 1, "the request that left the queue reached the upstream");
    let m = metrics_text(gw.addr).await;
    assert_eq!(sample(&m, "gateway_upstream_queue_depth", &[("upstream", "ql")]), Some(0.0));
}

#[tokio::test]
async fn round_robin_splits_exactly() {
    let (a, b, c) = (
        slow_upstream(Duration::ZERO, ok()).await,
        slow_upstream(Duration::ZERO, ok()).await,
        slow_upstream(Duration::ZERO, ok()).await,
    );
    let addrs = [a.up.addr, b.up.addr, c.up.addr];
    let gw = TestGateway::from_toml(&endpoints_toml("rr", &addrs, "balance = \"round_robin\"", "")).await;
    for _ in 0..30 {
        assert_eq!(status_of(gw.url("/rr/fast")).await.0, 200);
    }
    let counts = [&a, &b, &c].map(|s| s.seen.load(Ordering::SeqCst));
    assert_eq!(counts, [10, 10, 10]);
    let m = metrics_text(gw.addr).await;
    let opened =
        sample(&m, "gateway_upstream_connections_opened_total", &[("endpoint", &format!("http://{}", addrs[1]))]);
    assert_eq!(opened, Some(1.0), "each endpoint has its own pool: {m}");
}

#[tokio::test]
async fn least_request_prefers_the_less_loaded_endpoint() {
    let (a, b) = (slow_upstream(Duration::from_secs(2), ok()).await, slow_upstream(Duration::from_secs(2), ok()).await);
    let gw = TestGateway::from_toml(&endpoints_toml("lr", &[a.up.addr, b.up.addr], "", "")).await;
    // One slow request occupies one endpoint...
    let busy = tokio::spawn(status_of(gw.url("/lr/slow")));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let loaded = if a.seen.load(Ordering::SeqCst) == 1 { &a } else { &b };
    // ...so every quick request goes to the other one.
    for _ in 0..20 {
        assert_eq!(status_of(gw.url("/lr/fast")).await.0, 200);
    }
    assert_eq!(loaded.seen.load(Ordering::SeqCst), 1, "a request went to the busier endpoint");
    assert_eq!(a.seen.load(Ordering::SeqCst) + b.seen.load(Ordering::SeqCst), 21);
    assert_eq!(busy.await.unwrap().0, 200);
}

/// An upstream whose `/health` answers 200 or 503 as `healthy` says, and
/// counts the other requests it serves.
async fn checked_upstream(healthy: Arc<AtomicBool>) -> (TestUpstream, Arc<AtomicUsize>) {
    let served = Arc::new(AtomicUsize::new(0));
    let s = served.clone();
    let up = TestUpstream::start(move |req: Request<hyper::body::Incoming>| {
        let (healthy, s) = (healthy.clone(), s.clone());
        async move {
            if req.uri().path() == "/health" {
                let code = if healthy.load(Ordering::SeqCst) { 200 } else { 503 };
                return Response::builder().status(code).body(full("")).unwrap();
            }
            s.fetch_add(1, Ordering::SeqCst);
            Response::new(full("served"))
        }
    })
    .await;
    (up, served)
}

async fn wait_until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not within 5 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn an_endpoint_failing_its_health_checks_gets_no_traffic_and_readyz_follows() {
    let (a_ok, b_ok) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicBool::new(true)));
    let ((a, a_served), (b, b_served)) = (checked_upstream(a_ok.clone()).await, checked_upstream(b_ok.clone()).await);
    let health = "[upstreams.hc.health]\npath = \"/health\"\ninterval = \"100ms\"\ntimeout = \"200ms\"\nunhealthy_after = 2\nhealthy_after = 2\n";
    let toml = format!("{}{health}", endpoints_toml("hc", &[a.addr, b.addr], "balance = \"round_robin\"", ""));
    let gw = TestGateway::from_toml(&toml).await;
    let readyz = || async { get(&gw.url("/readyz")).await };
    assert_eq!(readyz().await.0.status, 200);

    // A fails its checks: all traffic goes to B, and the gateway stays ready.
    a_ok.store(false, Ordering::SeqCst);
    let a_gauge = format!("http://{}", a.addr);
    wait_until("A marked unhealthy", async || {
        sample(&metrics_text(gw.addr).await, "gateway_upstream_endpoint_healthy", &[("endpoint", &a_gauge)])
            == Some(0.0)
    })
    .await;
    let before = a_served.load(Ordering::SeqCst);
    for _ in 0..10 {
        assert_eq!(status_of(gw.url("/hc")).await.0, 200);
    }
    assert_eq!(a_served.load(Ordering::SeqCst), before, "an unhealthy endpoint got traffic");
    assert_eq!(readyz().await.0.status, 200);

    // Both fail: 503 at once with Retry-After, and /readyz names the upstream.
    b_ok.store(false, Ordering::SeqCst);
    wait_until("/readyz turns 503", async || readyz().await.0.status == 503).await;
    let (parts, body) = readyz().await;
    assert_eq!(parts.status, 503);
    assert!(String::from_utf8_lossy(&body).contains("hc"), "{body:?}");
    let served = b_served.load(Ordering::SeqCst);
    let (status, retry_after) = status_of(gw.url("/hc")).await;
    assert_eq!((status, retry_after.is_some()), (503, true));
    assert_eq!(b_served.load(Ordering::SeqCst), served);
    let m = metrics_text(gw.addr).await;
    assert!(
        sample(&m, "gateway_upstream_errors_total", &[("upstream", "hc"), ("kind", "unavailable")]).unwrap() >= 1.0
    );

    // A recovers: ready again, and A serves.
    a_ok.store(true, Ordering::SeqCst);
    wait_until("/readyz back to 200", async || readyz().await.0.status == 200).await;
    for _ in 0..4 {
        assert_eq!(status_of(gw.url("/hc")).await.0, 200);
    }
    assert!(a_served.load(Ordering::SeqCst) > before, "a recovered endpoint gets traffic again");
}

#[tokio::test]
async fn consecutive_failures_eject_then_fast_503_then_one_trial() {
    let status = Arc::new(AtomicUsize::new(502));
    let slow = slow_upstream(Duration::ZERO, status.clone()).await;
    let gw = TestGateway::from_toml(&format!(
        "[upstreams.ej]\nurl = \"http://{}\"\n[upstreams.ej.outlier]\nconsecutive_failures = 3\nejection_time = \"500ms\"\n\
         [[routes]]\nname = \"ej\"\nprefix = \"/ej\"\nupstream = \"ej\"\n",
        slow.up.addr
    ))
    .await;
    for _ in 0..3 {
        assert_eq!(status_of(gw.url("/ej")).await.0, 502);
    }
    // Ejected: answered at once, the upstream not asked.
    for _ in 0..5 {
        let (code, retry_after) = status_of(gw.url("/ej")).await;
        assert_eq!((code, retry_after.as_deref()), (503, Some("1")));
    }
    assert_eq!(slow.seen.load(Ordering::SeqCst), 3);
    // After the ejection time one trial: it fails, ejected again.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(status_of(gw.url("/ej")).await.0, 502);
    assert_eq!(status_of(gw.url("/ej")).await.0, 503);
    assert_eq!(slow.seen.load(Ordering::SeqCst), 4);
    // The next trial succeeds: back in service.
    status.store(200, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(600)).await;
    for _ in 0..3 {
        assert_eq!(status_of(gw.url("/ej")).await.0, 200);
    }
    let m = metrics_text(gw.addr).await;
    assert_eq!(sample(&m, "gateway_upstream_ejections_total", &[("upstream", "ej")]), Some(2.0));
    assert_eq!(sample(&m, "gateway_upstream_endpoint_ejected", &[("upstream", "ej")]), Some(0.0));
}

#[tokio::test]
async fn a_connect_failure_is_retried_on_the_other_endpoint() {
    let good = slow_upstream(Duration::ZERO, ok()).await;
    let refused = refused_addr().await;
    let toml = endpoints_toml("rc", &[refused, good.up.addr], "balance = \"round_robin\"", "retries = 1");
    let gw = TestGateway::from_toml(&toml).await;
    for i in 0..6 {
        let req = Request::post(gw.url("/rc")).body(full("a body, never sent to the refused one")).unwrap();
        assert_eq!(send(req).await.0.status, 200, "request {i}");
    }
    assert_eq!(good.seen.load(Ordering::SeqCst), 6);
    let m = metrics_text(gw.addr).await;
    assert_eq!(sample(&m, "gateway_upstream_retries_total", &[("upstream", "rc")]), Some(3.0));
    assert_eq!(sample(&m, "gateway_upstream_errors_total", &[("upstream", "rc"), ("kind", "connect")]), Some(0.0));
}

#[tokio::test]
async fn a_post_is_never_retried_after_a_reset_but_a_get_is() {
    let (addr, accepted) = slamming_upstream().await;
    let toml = endpoints_toml("rr2", &[addr], "", "retries = 2\nretry_on = [\"reset\", \"503\"]");
    let gw = TestGateway::from_toml(&toml).await;
    let (parts, _) = send(Request::post(gw.url("/rr2")).body(full("payload")).unwrap()).await;
    assert_eq!(parts.status, 502);
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "a POST must not be sent twice");
    assert_eq!(status_of(gw.url("/rr2")).await.0, 502);
    assert_eq!(accepted.load(Ordering::SeqCst), 4, "a GET is tried three times");
}

#[tokio::test]
async fn a_503_is_retried_when_the_route_asks() {
    let (busy, fine) = (Arc::new(AtomicUsize::new(503)), ok());
    let (a, b) = (slow_upstream(Duration::ZERO, busy).await, slow_upstream(Duration::ZERO, fine).await);
    let toml = endpoints_toml(
        "r503",
        &[a.up.addr, b.up.addr],
        "balance = \"round_robin\"",
        "retries = 1\nretry_on = [\"503\"]",
    );
    let gw = TestGateway::from_toml(&toml).await;
    for _ in 0..4 {
        assert_eq!(status_of(gw.url("/r503")).await.0, 200);
    }
    assert_eq!((a.seen.load(Ordering::SeqCst), b.seen.load(Ordering::SeqCst)), (2, 4));
}

#[tokio::test]
async fn the_retry_budget_stops_retries() {
    let refused = refused_addr().await;
    // A share of 0.2 and no floor: one retry per five requests.
    let toml = endpoints_toml("rb", &[refused], "retry_budget = { ratio = 0.2, min_per_second = 0 }", "retries = 1");
    let gw = TestGateway::from_toml(&toml).await;
    for _ in 0..20 {
        assert_eq!(status_of(gw.url("/rb")).await.0, 502);
    }
    let m = metrics_text(gw.addr).await;
    assert_eq!(sample(&m, "gateway_upstream_retries_total", &[("upstream", "rb")]), Some(4.0));
    assert_eq!(sample(&m, "gateway_upstream_retries_skipped_total", &[("upstream", "rb")]), Some(16.0));
    still_serving_without_route(&gw).await;
}

async fn still_serving_without_route(gw: &TestGateway) {
    assert_eq!(get(&gw.url("/healthz")).await.0.status, 200);
}

#[tokio::test]
async fn bad_resilience_configs_name_the_key() {
    let cases: &[(&str, &str)] = &[
        ("[upstreams.x]\nurl = \"http://127.0.0.1:1\"\nendpoints = [\"http://127.0.0.1:2\"]\n", "upstreams.x.url"),
        ("[upstreams.x]\nendpoints = []\n", "upstreams.x.endpoints"),
        ("[upstreams.x]\nurl = \"http://127.0.0.1:1\"\nqueue = 5\n", "upstreams.x.queue"),
        ("[upstreams.x]\nurl = \"http://127.0.0.1:1\"\nbalance = \"random\"\n", "upstreams.x.balance"),
        (
            "[upstreams.x]\nurl = \"http://127.0.0.1:1\"\n[upstreams.x.health]\ninterval = \"1s\"\n",
            "upstreams.x.health.path",
        ),
        (
            "[upstreams.x]\nurl = \"http://127.0.0.1:1\"\n[[routes]]\nname = \"r\"\nprefix = \"/r\"\nupstream = \"x\"\nretry_on = [\"timeout\"]\n",
            "routes[0].retry_on",
        ),
    ];
    assert_refused_by_check(env!("CARGO_BIN_EXE_gateway"), cases);
    let _ = Bytes::new();
}

#[tokio::test]
async fn a_request_whose_time_ran_out_in_the_queue_is_not_sent() {
    let slow = slow_upstream(Duration::from_millis(300), ok()).await;
    let gw = TestGateway::from_toml(&format!(
        "[upstreams.late]\nurl = \"http://{}\"\nmax_requests = 1\n\
         [[routes]]\nname = \"late\"\nprefix = \"/late\"\nupstream = \"late\"\ntimeout = \"1s\"\n",
        slow.up.addr
    ))
    .await;
    // One alone, so the gateway knows the upstream takes 300 ms.
    assert_eq!(status_of(gw.url("/late")).await.0, 200);
    let all: Vec<_> = (0..6).map(|_| tokio::spawn(status_of(gw.url("/late")))).collect();
    let mut statuses = Vec::new();
    for r in all {
        statuses.push(r.await.unwrap().0);
    }
    statuses.sort();
    // Three fit in the route's second; the others, admitted with less than
    // 300 ms left, are answered 503 instead of taking the upstream's time.
    assert_eq!(statuses, [200, 200, 200, 503, 503, 503]);
    assert_eq!(slow.seen.load(Ordering::SeqCst), 4, "requests that could not finish were sent");
}

#[tokio::test]
async fn a_client_whose_body_is_too_large_does_not_get_the_upstream_ejected() {
    let slow = slow_upstream(Duration::ZERO, ok()).await;
    let gw = TestGateway::from_toml(&format!(
        "[upstreams.cb]\nurl = \"http://{}\"\n[upstreams.cb.outlier]\nconsecutive_failures = 2\nejection_time = \"30s\"\n\
         [[routes]]\nname = \"cb\"\nprefix = \"/cb\"\nupstream = \"cb\"\nmax_body = \"1KiB\"\n",
        slow.up.addr
    ))
    .await;
    // Streamed past the limit after the exchange with the upstream began:
    // the client's fault, three times over.
    for _ in 0..3 {
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(b"POST /cb HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n").await.unwrap();
        for _ in 0..4 {
            s.write_all(format!("200\r\n{}\r\n", "z".repeat(512)).as_bytes()).await.unwrap();
        }
        let r = read_for(&mut s, Duration::from_secs(3)).await;
        assert_eq!(r.status(), 413, "{}", r.text);
    }
    assert_eq!(status_of(gw.url("/cb")).await.0, 200);
    let m = metrics_text(gw.addr).await;
    assert_eq!(sample(&m, "gateway_upstream_ejections_total", &[("upstream", "cb")]), Some(0.0));
}

/// An upstream that answers requests with `ok` on kept-alive connections
/// until `failing` is set; then it resets each connection as soon as it has
/// read a request head (a crashing worker). Counts the heads it read.
async fn resetting_upstream(failing: Arc<AtomicBool>) -> (SocketAddr, Arc<AtomicUsize>) {
    let heads = Arc::new(AtomicUsize::new(0));
    let h = heads.clone();
    let addr = raw_upstream(move |mut s: TcpStream| {
        let (failing, heads) = (failing.clone(), h.clone());
        async move {
            while read_head(&mut s).await.is_some() {
                heads.fetch_add(1, Ordering::SeqCst);
                if failing.load(Ordering::SeqCst) {
                    let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
                    return;
                }
                if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    (addr, heads)
}

/// The resend after a stale pooled connection is a retry like any other:
/// a request reaches the upstreams at most `1 + retries` times, plus one
/// resend for a pooled connection that failed before any response byte.
#[tokio::test]
async fn a_stale_connection_resend_counts_toward_retries() {
    let failing = Arc::new(AtomicBool::new(false));
    let ((a, a_heads), (b, b_heads)) =
        (resetting_upstream(failing.clone()).await, resetting_upstream(failing.clone()).await);
    let toml = endpoints_toml(
        "rstale",
        &[a, b],
        "balance = \"round_robin\"",
        "retries = 1\nretry_on = [\"connect\", \"reset\", \"503\"]",
    );
    let gw = TestGateway::from_toml(&toml).await;
    // One idle pooled connection to each endpoint.
    for _ in 0..2 {
        assert_eq!(status_of(gw.url("/rstale/x")).await.0, 200);
    }
    let warm = a_heads.load(Ordering::SeqCst) + b_heads.load(Ordering::SeqCst);
    assert_eq!(warm, 2);
    failing.store(true, Ordering::SeqCst);
    assert_eq!(status_of(gw.url("/rstale/x")).await.0, 502);
    let reached = a_heads.load(Ordering::SeqCst) + b_heads.load(Ordering::SeqCst) - warm;
    assert_eq!(reached, 3, "one GET reached the upstreams {reached} times with retries = 1");
    let m = metrics_text(gw.addr).await;
    assert_eq!(sample(&m, "gateway_upstream_retries_total", &[("upstream", "rstale")]), Some(2.0));
}
