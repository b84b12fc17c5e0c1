//! `max_requests = "auto"` on real sockets: an upstream with a fixed
//! number of workers (a semaphore; requests past it wait inside the
//! upstream, as in a thread pool's queue), clients that offer far more than
//! it can do, and what the gateway learns and answers. Each test has its
//! own upstream name: the metrics are the process's.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use http::{Request, Response};
use serde_json::Value;
use tokio::sync::Semaphore;

/// The upstream: `workers` at `service` each; counts the requests inside it
/// at once (working or waiting for a worker) and the most since reset, and
/// the answers it gave.
struct Workers {
    up: TestUpstream,
    peak: Arc<AtomicUsize>,
    served: Arc<AtomicUsize>,
}

async fn workers(workers: usize, service: Duration) -> Workers {
    let (sem, inside, peak) =
        (Arc::new(Semaphore::new(workers)), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let served = Arc::new(AtomicUsize::new(0));
    let (i, p, s) = (inside.clone(), peak.clone(), served.clone());
    let up = TestUpstream::start(move |_req: Request<hyper::body::Incoming>| {
        let (sem, i, p, s) = (sem.clone(), i.clone(), p.clone(), s.clone());
        async move {
            p.fetch_max(i.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
            let worker = sem.acquire_owned().await.unwrap();
            tokio::time::sleep(service).await;
            drop(worker);
            i.fetch_sub(1, Ordering::SeqCst);
            s.fetch_add(1, Ordering::SeqCst);
            Response::new(full("done"))
        }
    })
    .await;
    Workers { up, peak, served }
}

/// `clients` clients, each sending one request after another to `url`
/// until `until`, pausing `pause` after a 503 as a client told to retry
/// later would.
async fn load(url: String, clients: usize, until: Instant, pause: Duration) -> Vec<(u16, Duration)> {
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                let mut out = Vec::new();
                while Instant::now() < until {
                    let started = Instant::now();
                    let status = get(&url).await.0.status.as_u16();
                    out.push((status, started.elapsed()));
                    if status == 503 {
                        tokio::time::sleep(pause).await;
                    }
                }
                out
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

fn gateway_toml(name: &str, up: std::net::SocketAddr, upstream_keys: &str, route_keys: &str) -> String {
    format!(
        "[metrics]\nlisten = \"127.0.0.1:0\"\n\
         [upstreams.{name}]\nurl = \"http://{up}\"\nmax_requests = \"auto\"\n{upstream_keys}\n\
         [[routes]]\nname = \"{name}\"\nprefix = \"/{name}\"\nupstream = \"{name}\"\n{route_keys}\n"
    )
}

async fn upstream_status(admin: std::net::SocketAddr, name: &str) -> Value {
    let (_, body) = get(&format!("http://{admin}/-/upstreams")).await;
    let v: Value = serde_json::from_slice(&body).unwrap();
    v.as_array().unwrap().iter().find(|u| u["name"] == name).cloned().expect("the upstream is listed")
}

/// Clients offering eight times what the upstream can work on: the limit
/// learned settles near its four workers (the algorithm keeps a little
/// queue at the upstream to keep them busy), far below the 32 clients, and
/// the minimum latency measured is the upstream's own service time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limit_settles_near_the_upstreams_capacity() {
    let up = workers(4, Duration::from_millis(50)).await;
    let gw = TestGateway::from_toml(&gateway_toml("ad_conv", up.up.addr, "", "timeout = \"5s\"")).await;
    let admin = gw.admin.unwrap();
    let start = Instant::now();
    let clients = tokio::spawn(load(gw.url("/ad_conv"), 32, start + Duration::from_secs(5), Duration::from_millis(50)));
    tokio::time::sleep(Duration::from_secs(3)).await;
    up.peak.store(0, Ordering::SeqCst);
    let mut limits = Vec::new();
    while start.elapsed() < Duration::from_millis(4800) {
        let m = metrics_text(admin).await;
        limits.push(sample(&m, "gateway_upstream_concurrency_limit", &[("upstream", "ad_conv")]).unwrap());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let answers = clients.await.unwrap();
    let m = metrics_text(admin).await;
    let min_rtt = sample(&m, "gateway_upstream_min_rtt_seconds", &[("upstream", "ad_conv")]).unwrap();
    assert!((0.045..0.2).contains(&min_rtt), "min RTT {min_rtt}");
    assert!(limits.iter().all(|l| (3.0..=16.0).contains(l)), "limits {limits:?}");
    let peak = up.peak.load(Ordering::SeqCst);
    assert!(peak <= 16, "{peak} requests inside the upstream at once");
    assert!(answers.iter().any(|(s, _)| *s == 200), "nothing served");
    assert!(answers.iter().all(|(s, _)| *s == 200 || *s == 503), "{answers:?}");
    let status = upstream_status(admin, "ad_conv").await;
    let limit = &status["limit"];
    assert!(limit["max_requests"].as_u64().is_some_and(|l| (3..=16).contains(&l)), "{status}");
    assert!(limit["auto"]["min_rtt_seconds"].as_f64().is_some_and(|s| (0.045..0.2).contains(&s)), "{status}");
}

/// Under overload with nothing tuned (the default queue of 100 places and
/// 5 s), the queue stays useful: the ones that cannot be served in time are
/// told so soon with 503, not after seconds in the queue or with the
/// route's 504, and the requests served waited little. Without CoDel on
/// the queue, 40 clients in a FIFO queue before an upstream that does 10
/// a second would wait there past the route's 3 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_gets_fast_503s_not_timeouts() {
    let up = workers(2, Duration::from_millis(200)).await;
    let gw = TestGateway::from_toml(&gateway_toml("ad_over", up.up.addr, "", "timeout = \"3s\"")).await;
    let start = Instant::now();
    let answers = load(gw.url("/ad_over"), 40, start + Duration::from_secs(6), Duration::from_millis(200)).await;
    let of = |status| answers.iter().filter(|(s, _)| *s == status).map(|(_, d)| *d).collect::<Vec<_>>();
    let (served, refused) = (of(200), of(503));
    assert!(answers.iter().all(|(s, _)| *s == 200 || *s == 503), "not only 200 and 503: {answers:?}");
    assert!(!served.is_empty() && !refused.is_empty(), "{} served, {} refused", served.len(), refused.len());
    // Bounds far from the route's timeout, for a loaded machine: what is
    // tested is that no one waits it out.
    let slowest = |d: &[Duration]| d.iter().max().copied().unwrap();
    assert!(slowest(&refused) < Duration::from_millis(1500), "a 503 took {:?}", slowest(&refused));
    assert!(slowest(&served) < Duration::from_secs(2), "a 200 took {:?}", slowest(&served));
    let m = metrics_text(gw.admin.unwrap()).await;
    let sloughed = sample(&m, "gateway_upstream_queue_sloughed_total", &[("upstream", "ad_over")]).unwrap_or(0.0);
    assert!(sloughed > 0.0, "CoDel turned none away");
    assert!(up.peak.load(Ordering::SeqCst) <= 12, "the upstream had {} at once", up.peak.load(Ordering::SeqCst));
    // The clients gone, the queue is empty: it stands no more (it was
    // shown overloaded until a request waited again).
    let overloaded = sample(&m, "gateway_upstream_queue_overloaded", &[("upstream", "ad_over")]);
    assert_eq!(overloaded, Some(0.0), "the idle queue is shown overloaded");
    let status = upstream_status(gw.admin.unwrap(), "ad_over").await;
    assert_eq!(status["limit"]["auto"]["overloaded"], false, "{status}");
}

/// A reload that changes the upstream's settings but not where it sends
/// keeps what was learned (the limit, the minimum latency); one that points
/// it elsewhere learns again, from a new measurement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_a_learned_limit_for_the_same_upstream() {
    let up = workers(4, Duration::from_millis(30)).await;
    let other = workers(4, Duration::from_millis(30)).await;
    let dir = tempfile::tempdir().unwrap();
    let toml = |addr, queue: usize| gateway_toml("ad_reload", addr, &format!("queue = {queue}"), "");
    let gw = TestGateway::from_file(dir.path(), &toml(up.up.addr, 100)).await;
    let admin = gw.admin.unwrap();
    load(gw.url("/ad_reload"), 16, Instant::now() + Duration::from_secs(3), Duration::from_millis(20)).await;
    let before = upstream_status(admin, "ad_reload").await["limit"].clone();
    assert_eq!(before["auto"]["measuring"], false, "{before}");
    assert!(before["auto"]["min_rtt_seconds"].as_f64().is_some(), "{before}");

    std::fs::write(dir.path().join("gateway.toml"), toml(up.up.addr, 50)).unwrap();
    gw.app.reload().expect("reload");
    let after = upstream_status(admin, "ad_reload").await;
    assert_eq!(after["limit"], before, "the learned limit was not kept");
    assert_eq!(after["queue"]["size"], 50);

    std::fs::write(dir.path().join("gateway.toml"), toml(other.up.addr, 50)).unwrap();
    gw.app.reload().expect("reload");
    let elsewhere = upstream_status(admin, "ad_reload").await["limit"].clone();
    assert_eq!(elsewhere["auto"]["measuring"], true, "{elsewhere}");
    assert_eq!(elsewhere["max_requests"], 3, "{elsewhere}");
}

/// No overload: an upstream that answers every request in the same time
/// however many it has (no workers to wait for), and more clients than the
/// floor. The limit soon lets every client's request through at once: the
/// first measurement of the minimum does not hold it at the floor until 50
/// answers came (8 s here, and 4 s more to climb), but about a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flat_upstream_soon_gets_every_request_at_once() {
    const CLIENTS: usize = 60;
    let up = workers(10 * CLIENTS, Duration::from_millis(500)).await;
    let gw = TestGateway::from_toml(&gateway_toml("ad_flat", up.up.addr, "", "timeout = \"5s\"")).await;
    let admin = gw.admin.unwrap();
    let start = Instant::now();
    let _clients =
        tokio::spawn(load(gw.url("/ad_flat"), CLIENTS, start + Duration::from_secs(15), Duration::from_millis(50)));
    let limit = || async {
        let m = metrics_text(admin).await;
        sample(&m, "gateway_upstream_concurrency_limit", &[("upstream", "ad_flat")]).unwrap_or(0.0)
    };
    // About 5 s; far from the 12 s it took before, for a loaded machine.
    let mut limits = Vec::new();
    while limits.last().is_none_or(|&l| l < CLIENTS as f64) && start.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        limits.push(limit().await);
    }
    assert!(limits.last().is_some_and(|&l| l >= CLIENTS as f64), "limits every 100 ms: {limits:?}");
    // From then on every client has its request at the upstream at once.
    up.peak.store(0, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(up.peak.load(Ordering::SeqCst), CLIENTS, "limits every 100 ms: {limits:?}");
}

/// No overload, from a cold start, with many clients: the slow start
/// doubles the limit each round trip of the upstream while its latency
/// stays flat, so it lets every client through within a few rounds of
/// answers; the gradient's climb alone (a quarter and its root a round
/// trip) took about a thousand answers here. Counted in the upstream's
/// answers, not in seconds, so that a loaded machine does not change it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_a_cold_start_the_limit_doubles_each_round_trip() {
    const CLIENTS: usize = 300;
    let up = workers(10 * CLIENTS, Duration::from_millis(400)).await;
    let gw = TestGateway::from_toml(&gateway_toml("ad_cold", up.up.addr, "", "timeout = \"5s\"")).await;
    let admin = gw.admin.unwrap();
    let start = Instant::now();
    let _clients =
        tokio::spawn(load(gw.url("/ad_cold"), CLIENTS, start + Duration::from_secs(15), Duration::from_millis(200)));
    let mut limits = Vec::new();
    while limits.last().is_none_or(|&(l, _)| l < CLIENTS as f64) && start.elapsed() < Duration::from_secs(14) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let m = metrics_text(admin).await;
        let limit = sample(&m, "gateway_upstream_concurrency_limit", &[("upstream", "ad_cold")]).unwrap_or(0.0);
        limits.push((limit, up.served.load(Ordering::SeqCst)));
    }
    let (limit, served) = *limits.last().unwrap();
    assert!(limit >= CLIENTS as f64, "(limit, answers) every 50 ms: {limits:?}");
    // 3 + 6 + ... + 192 answers, a round trip of each limit, and the first
    // measurement's: about 390. The gradient's climb, when a few late
    // answers ended the slow start, took 700 to 850 here.
    assert!(served < 700, "{served} answers before the limit reached {CLIENTS}: {limits:?}");
}

/// Clients uploading slowly at a cold start: the learned minimum latency
/// is the upstream's own (it reads a body whole, then works 100 ms), not
/// the clients' uploads, which took 1.5 s here (a body trickled, or sent
/// at once and ended late). Counted from the request's
/// start, three uploaders held the measurement's three slots and made the
/// minimum about 1.6 s, so the limit let far more in than the upstream
/// could do (hostile review of `max_requests = "auto"`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upload_is_not_taken_for_the_upstreams_latency() {
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let up = TestUpstream::start(|req: Request<hyper::body::Incoming>| async move {
        let _ = req.into_body().collect().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        Response::new(full("done"))
    })
    .await;
    // The body streamed, not read ahead: a large upload does the same.
    let toml = gateway_toml("ad_upload", up.addr, "", "timeout = \"10s\"\nrequest_buffer = \"0\"");
    let gw = TestGateway::from_toml(&toml).await;
    let admin = gw.admin.unwrap();
    // One trickles its body; two send it at once and its end (the last
    // chunk) 1.5 s later.
    let uploads = (0..3).map(|i| {
        let addr = gw.addr;
        tokio::spawn(async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let head = "POST /ad_upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
            s.write_all(head.as_bytes()).await.unwrap();
            for _ in 0..15 {
                s.write_all(format!("400\r\n{}\r\n", "u".repeat(1024)).as_bytes()).await.unwrap();
                if i == 0 {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            if i > 0 {
                tokio::time::sleep(Duration::from_millis(1500)).await;
            }
            s.write_all(b"0\r\n\r\n").await.unwrap();
            let mut answer = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer)).await;
            String::from_utf8_lossy(&answer).into_owned()
        })
    });
    let uploads: Vec<_> = uploads.collect();
    // Then clients of the same upstream that send no body.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let until = Instant::now() + Duration::from_secs(3);
    let gets = tokio::spawn(load(gw.url("/ad_upload"), 6, until, Duration::from_millis(50)));
    for upload in uploads {
        let answer = upload.await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    }
    gets.await.unwrap();
    let status = upstream_status(admin, "ad_upload").await;
    let min_rtt = status["limit"]["auto"]["min_rtt_seconds"].as_f64();
    assert!(min_rtt.is_some_and(|s| (0.095..0.5).contains(&s)), "{status}");
}
