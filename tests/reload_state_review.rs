//! What a reload keeps, claim by claim (docs/configuration.md, "Reload"):
//! an upstream's retry budget while `retry_budget` is unchanged (a changed
//! one applies), a higher `max_requests` freeing queued requests at once,
//! endpoints' pools across a change of their upstream's admission, the
//! checks of a replaced endpoint stopping (probes counted at the upstream),
//! a limit a reload adds not counting the requests already under way,
//! learned limits, rate limits (local and shared through Redis), and the
//! metric series of removed routes and upstreams staying.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio::sync::Semaphore;

fn rewrite(dir: &Path, toml: &str) {
    std::fs::write(dir.join("gateway.toml"), toml).unwrap();
}

async fn status_of(url: String) -> u16 {
    get(&url).await.0.status.as_u16()
}

/// Polls `done` every 20 ms for up to 10 s; whether it came true.
async fn within_10s(mut done: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + Duration::from_secs(10);
    while !done() {
        if Instant::now() > until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// An upstream whose requests to `/held` note their query in `order`, then
/// wait for a permit of `gate` (one each) and count in `held` meanwhile;
/// `/hz` and `/hz2` are counted; anything else answers at once.
struct Gated {
    up: TestUpstream,
    gate: Arc<Semaphore>,
    held: Arc<AtomicUsize>,
    order: Arc<Mutex<Vec<String>>>,
    hz: Arc<AtomicUsize>,
    hz2: Arc<AtomicUsize>,
}

async fn gated() -> Gated {
    let gate = Arc::new(Semaphore::new(0));
    let held = Arc::new(AtomicUsize::new(0));
    let order = Arc::new(Mutex::new(Vec::new()));
    let (hz, hz2) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (g, h, o, p, p2) = (gate.clone(), held.clone(), order.clone(), hz.clone(), hz2.clone());
    let up = TestUpstream::start(move |req: Request<Incoming>| {
        let (g, h, o, p, p2) = (g.clone(), h.clone(), o.clone(), p.clone(), p2.clone());
        async move {
            match req.uri().path() {
                "/held" => {
                    o.lock().unwrap().push(req.uri().query().unwrap_or_default().to_owned());
                    h.fetch_add(1, Ordering::SeqCst);
                    g.acquire().await.unwrap().forget();
                    h.fetch_sub(1, Ordering::SeqCst);
                }
                "/hz" => drop(p.fetch_add(1, Ordering::SeqCst)),
                "/hz2" => drop(p2.fetch_add(1, Ordering::SeqCst)),
                _ => {}
            }
            Response::new(full("up"))
        }
    })
    .await;
    Gated { up, gate, held, order, hz, hz2 }
}

/// A changed `retry_budget` applies at once; an unchanged one carries its
/// balance over a reload that changes the upstream's other settings.
#[tokio::test]
async fn a_changed_retry_budget_applies_and_an_unchanged_one_carries_over() {
    let seen = Arc::new(AtomicUsize::new(0));
    let s = seen.clone();
    let up = TestUpstream::start(move |_req: Request<Incoming>| {
        let s = s.clone();
        async move {
            s.fetch_add(1, Ordering::SeqCst);
            let mut r = Response::new(full("busy"));
            *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            r
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let toml = |per_second: u32, connect: &str| {
        format!(
            "[server]\n[upstreams.rs_budget]\nurl = \"http://{}\"\nconnect_timeout = \"{connect}\"\n\
             retry_budget = {{ ratio = 0.0, min_per_second = {per_second} }}\n\
             [[routes]]\nname = \"rs_budget\"\nprefix = \"/\"\nupstream = \"rs_budget\"\n\
             retries = 1\nretry_on = [\"503\"]\n",
            up.addr
        )
    };
    let gw = TestGateway::from_file(dir.path(), &toml(0, "1s")).await;
    let url = gw.url("/x");
    // Upstream requests one GET made: 2 when its retry was allowed.
    let tries = || async {
        let before = seen.load(Ordering::SeqCst);
        assert_eq!(get(&url).await.0.status, 503);
        seen.load(Ordering::SeqCst) - before
    };
    assert_eq!(tries().await, 1, "an empty budget allows no retry");

    // min_per_second = 1 over the budget's 10 s window: 10 retries.
    rewrite(dir.path(), &toml(1, "1s"));
    gw.app.reload().expect("reload");
    assert_eq!(tries().await, 2, "the changed retry_budget was not applied");
    let mut retried = 1;
    while tries().await == 2 {
        retried += 1;
        assert!(retried <= 10, "more retries than the budget holds");
    }

    rewrite(dir.path(), &toml(1, "2s"));
    gw.app.reload().expect("reload");
    assert_eq!(tries().await, 1, "the spent budget did not carry over the reload");
}

fn admission_toml(up: &TestUpstream, upstream_keys: &str, route_keys: &str) -> String {
    format!(
        "[server]\n[upstreams.rs_adm]\nurl = \"http://{}\"\n{upstream_keys}\n\
         [[routes]]\nname = \"rs_adm\"\nprefix = \"/\"\nupstream = \"rs_adm\"\ntimeout = \"30s\"\n{route_keys}\n",
        up.addr
    )
}

/// A higher `max_requests` lets queued requests through at once, without
/// waiting for the ones in flight to finish.
#[tokio::test]
async fn a_higher_max_requests_frees_queued_requests_at_once() {
    let g = gated().await;
    let dir = tempfile::tempdir().unwrap();
    let limit = |n: usize| format!("max_requests = {n}\nqueue = 10\nqueue_timeout = \"20s\"");
    let gw = TestGateway::from_file(dir.path(), &admission_toml(&g.up, &limit(1), "")).await;
    let requests: Vec<_> = (0..3).map(|_| tokio::spawn(status_of(gw.url("/held")))).collect();
    assert!(within_10s(|| g.held.load(Ordering::SeqCst) == 1).await);
    rewrite(dir.path(), &admission_toml(&g.up, &limit(3), ""));
    gw.app.reload().expect("reload");
    let held = g.held.clone();
    assert!(within_10s(|| held.load(Ordering::SeqCst) == 3).await, "the queued two did not get the new slots");
    g.gate.add_permits(3);
    for r in requests {
        assert_eq!(r.await.unwrap(), 200);
    }
}

/// Requests queued before a reload that changes the upstream's settings
/// and one queued after it wait in one queue, in their order: the later one
/// gets no slot of its own ahead of them.
#[tokio::test]
async fn the_queue_keeps_its_order_across_a_reload() {
    let g = gated().await;
    let dir = tempfile::tempdir().unwrap();
    let keys = |wait: &str| format!("max_requests = 1\nqueue = 10\nqueue_timeout = \"{wait}\"");
    let gw = TestGateway::from_file(dir.path(), &admission_toml(&g.up, &keys("20s"), "")).await;
    let app = gw.app.clone();
    let queued = move || app.upstreams()[0].queued().unwrap().0;
    let mut requests = vec![tokio::spawn(status_of(gw.url("/held?0")))];
    let h = g.held.clone();
    assert!(within_10s(|| h.load(Ordering::SeqCst) == 1).await);
    for n in 1..4 {
        if n == 3 {
            rewrite(dir.path(), &admission_toml(&g.up, &keys("21s"), ""));
            gw.app.reload().expect("reload");
        }
        requests.push(tokio::spawn(status_of(gw.url(&format!("/held?{n}")))));
        assert!(within_10s(|| queued() == n).await, "request {n} is not queued behind the others");
    }
    g.gate.add_permits(4);
    for r in requests {
        assert_eq!(r.await.unwrap(), 200);
    }
    assert_eq!(*g.order.lock().unwrap(), ["0", "1", "2", "3"]);
}

/// An endpoint replaced by a reload (its checks' settings changed) goes on
/// unhealthy until its new checks say otherwise.
#[tokio::test]
async fn an_unhealthy_endpoint_stays_unhealthy_while_its_new_checks_run() {
    let hang = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let h = hang.clone();
    let up = TestUpstream::start(move |req: Request<Incoming>| {
        let h = h.clone();
        async move {
            let mut r = Response::new(full("up"));
            if req.uri().path() == "/hz" {
                if h.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                }
                *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            }
            r
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let health = |interval: &str| {
        format!(
            "[upstreams.rs_adm.health]\npath = \"/hz\"\ninterval = \"{interval}\"\ntimeout = \"30s\"\n\
             unhealthy_after = 1\nhealthy_after = 1"
        )
    };
    let gw = TestGateway::from_file(dir.path(), &admission_toml(&up, &health("50ms"), "")).await;
    let app = gw.app.clone();
    assert!(within_10s(|| !app.upstreams()[0].endpoints()[0].is_healthy()).await, "the checks never failed");
    assert_eq!(status_of(gw.url("/x")).await, 503);
    // The new checks' first probe gets no answer for the rest of the test.
    hang.store(true, Ordering::SeqCst);
    rewrite(dir.path(), &admission_toml(&up, &health("60ms"), ""));
    gw.app.reload().expect("reload");
    assert_eq!(status_of(gw.url("/x")).await, 503, "the replaced endpoint's health was not carried over");
}

/// An upstream whose admission changed keeps the endpoints whose own
/// settings did not: the next request reuses the pooled connection.
#[tokio::test]
async fn a_changed_max_requests_keeps_the_endpoints_pools() {
    let g = gated().await;
    let dir = tempfile::tempdir().unwrap();
    let limit = |n: usize| format!("max_requests = {n}");
    let gw = TestGateway::from_file(dir.path(), &admission_toml(&g.up, &limit(4), "")).await;
    assert_eq!(status_of(gw.url("/x")).await, 200);
    assert_eq!(g.up.connections(), 1);
    rewrite(dir.path(), &admission_toml(&g.up, &limit(8), ""));
    gw.app.reload().expect("reload");
    assert_eq!(status_of(gw.url("/x")).await, 200);
    assert_eq!(g.up.connections(), 1, "the reload dropped the endpoint's pool");
}

/// A reload that replaces an endpoint (its health checks changed) stops
/// the old checks, even while a request still holds the old endpoint: the
/// old path gets at most the probe under way, the new one its probes.
#[tokio::test]
async fn a_replaced_endpoints_probes_stop_reaching_the_upstream() {
    let g = gated().await;
    let dir = tempfile::tempdir().unwrap();
    let health = |path: &str| {
        format!(
            "[upstreams.rs_adm.health]\npath = \"{path}\"\ninterval = \"50ms\"\ntimeout = \"1s\"\n\
             unhealthy_after = 1\nhealthy_after = 1"
        )
    };
    let gw = TestGateway::from_file(dir.path(), &admission_toml(&g.up, &health("/hz"), "")).await;
    let hz = g.hz.clone();
    assert!(within_10s(|| hz.load(Ordering::SeqCst) >= 2).await, "no checks");
    let held = tokio::spawn(status_of(gw.url("/held")));
    let h = g.held.clone();
    assert!(within_10s(|| h.load(Ordering::SeqCst) == 1).await);
    rewrite(dir.path(), &admission_toml(&g.up, &health("/hz2"), ""));
    gw.app.reload().expect("reload");
    let old = g.hz.load(Ordering::SeqCst);
    let hz2 = g.hz2.clone();
    assert!(within_10s(|| hz2.load(Ordering::SeqCst) >= 10).await, "the new checks do not run");
    let after = g.hz.load(Ordering::SeqCst) - old;
    assert!(after <= 1, "{after} probes of the replaced endpoint's checks came after the reload");
    g.gate.add_permits(1);
    assert_eq!(held.await.unwrap(), 200);
}

/// A `max_concurrent` (route) or `max_requests` (upstream) that a reload
/// adds counts the requests it admits: one under way at the reload was
/// admitted by nothing that counted, so it takes no slot of the new limit.
#[tokio::test]
async fn a_max_concurrent_a_reload_adds_does_not_count_requests_under_way() {
    added_limit_counts_only_what_it_admits("", "max_concurrent = 1").await;
}

#[tokio::test]
async fn a_max_requests_a_reload_adds_does_not_count_requests_under_way() {
    added_limit_counts_only_what_it_admits("max_requests = 1\nqueue = 0", "").await;
}

async fn added_limit_counts_only_what_it_admits(upstream_keys: &str, route_keys: &str) {
    let g = gated().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = TestGateway::from_file(dir.path(), &admission_toml(&g.up, "", "")).await;
    let before = tokio::spawn(status_of(gw.url("/held")));
    let h = g.held.clone();
    assert!(within_10s(|| h.load(Ordering::SeqCst) == 1).await);

    rewrite(dir.path(), &admission_toml(&g.up, upstream_keys, route_keys));
    gw.app.reload().expect("reload");
    assert_eq!(status_of(gw.url("/x")).await, 200, "the new limit counted the request under way");
    // The new limit counts what it admits.
    let after = tokio::spawn(status_of(gw.url("/held")));
    assert!(within_10s(|| h.load(Ordering::SeqCst) == 2).await);
    assert_eq!(status_of(gw.url("/x")).await, 503, "the added limit does not count");
    g.gate.add_permits(2);
    assert_eq!(before.await.unwrap(), 200);
    assert_eq!(after.await.unwrap(), 200);
}

/// The series of a route and an upstream a reload removed stay, with their
/// counts, until a restart.
#[tokio::test]
async fn the_series_of_removed_routes_and_upstreams_stay() {
    let (up, _) = counting_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let metrics = "[metrics]\nlisten = \"127.0.0.1:0\"\n";
    let gw = TestGateway::from_file(dir.path(), &format!("{metrics}{}", proxy_toml(up.addr, "rs_gone", "", ""))).await;
    for _ in 0..3 {
        assert_eq!(status_of(gw.url("/rs_gone/x")).await, 200);
    }
    let series = |m: &str| {
        let route = sample(m, "http_server_requests_total", &[("route", "rs_gone"), ("status", "200")]);
        let upstream = sample(m, "gateway_upstream_request_duration_seconds_count", &[("upstream", "rs_gone")]);
        (route, upstream)
    };
    let admin = gw.admin.unwrap();
    assert_eq!(series(&metrics_text(admin).await), (Some(3.0), Some(3.0)));
    rewrite(
        dir.path(),
        &format!("{metrics}[[routes]]\nname = \"rs_other\"\nprefix = \"/\"\nrespond = {{ status = 200 }}\n"),
    );
    gw.app.reload().expect("reload");
    assert_eq!(status_of(gw.url("/rs_gone/x")).await, 200, "the new file's route");
    assert_eq!(series(&metrics_text(admin).await), (Some(3.0), Some(3.0)), "the removed series went");
}

/// A route's `rate_limit` unchanged keeps its buckets across a reload that
/// changes the route's other keys.
#[tokio::test]
async fn a_rate_limit_keeps_its_buckets_when_only_the_routes_other_keys_change() {
    let (up, _) = counting_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let keys =
        |max_body: &str| format!("max_body = \"{max_body}\"\nrate_limit = {{ rate = \"1/m\", key = \"route\" }}");
    let gw = TestGateway::from_file(dir.path(), &admission_toml(&up, "", &keys("1MiB"))).await;
    assert_eq!(status_of(gw.url("/x")).await, 200);
    assert_eq!(status_of(gw.url("/x")).await, 429);
    rewrite(dir.path(), &admission_toml(&up, "", &keys("2MiB")));
    gw.app.reload().expect("reload");
    assert_eq!(status_of(gw.url("/x")).await, 429, "the bucket was refilled by a reload that left it unchanged");
}

/// Sends requests from 8 clients until upstream 0 of `gw` has learned a
/// limit (measured its minimum latency); the limit, measuring, and the
/// minimum latency.
async fn learn(gw: &TestGateway) -> (usize, bool, Option<Duration>) {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let (url, stop) = (gw.url("/x"), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    get(&url).await;
                }
            })
        })
        .collect();
    let l = || learned(gw);
    assert!(within_10s(|| !l().1 && l().2.is_some()).await, "no limit learned: {:?}", l());
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.await.unwrap();
    }
    learned(gw)
}

fn learned(gw: &TestGateway) -> (usize, bool, Option<Duration>) {
    let l = gw.app.upstreams()[0].limit().unwrap();
    l.learned.map_or((l.limit, false, None), |s| (l.limit, s.measuring, s.min_rtt))
}

async fn flat_upstream() -> TestUpstream {
    TestUpstream::start(|_req: Request<Incoming>| async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        Response::new(full("up"))
    })
    .await
}

/// A learned limit is kept within the new bounds: raising `auto_min` above
/// it lifts it there, without measuring again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learned_limit_is_kept_within_new_bounds() {
    let up = flat_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let keys = |min: usize| format!("max_requests = \"auto\"\nauto_min = {min}");
    let gw = TestGateway::from_file(dir.path(), &admission_toml(&up, &keys(3), "")).await;
    let (limit, _, min_rtt) = learn(&gw).await;
    rewrite(dir.path(), &admission_toml(&up, &keys(limit + 2), ""));
    gw.app.reload().expect("reload");
    assert_eq!(learned(&gw), (limit + 2, false, min_rtt), "learned {limit}, then auto_min = {}", limit + 2);
}

/// An upstream that leaves `"auto"` for a fixed limit and comes back
/// learns again: what it learned before is not brought back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_is_learned_again_after_a_fixed_one() {
    let up = flat_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let auto = admission_toml(&up, "max_requests = \"auto\"", "");
    let gw = TestGateway::from_file(dir.path(), &auto).await;
    learn(&gw).await;
    rewrite(dir.path(), &admission_toml(&up, "max_requests = 5", ""));
    gw.app.reload().expect("reload");
    assert_eq!(learned(&gw), (5, false, None));
    rewrite(dir.path(), &auto);
    gw.app.reload().expect("reload");
    assert_eq!(learned(&gw), (3, true, None), "the earlier learned limit came back");
}

/// A `shared = "redis"` limit's buckets are Redis's, the same for every
/// gateway using them: a reload that changes the limit applies the new
/// rate and burst to the bucket as it stands there, not to a full one.
#[tokio::test]
async fn a_changed_shared_rate_limit_goes_on_from_the_bucket_in_redis() {
    let Some(redis) = common::redis_server::Redis::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let toml = |burst: u32| {
        common::limits::shared_toml(
            "rs_shared",
            &format!("rate = \"1/m\", burst = {burst}, key = \"route\""),
            &redis.url(),
            "",
        )
    };
    let gw = TestGateway::from_file(dir.path(), &toml(1)).await;
    assert_eq!(status_of(gw.url("/")).await, 200);
    assert_eq!(status_of(gw.url("/")).await, 429);
    rewrite(dir.path(), &toml(3));
    gw.app.reload().expect("reload");
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(status_of(gw.url("/")).await);
    }
    assert_eq!(got, [200, 200, 429, 429], "burst 3 less the one taken under burst 1");
}
