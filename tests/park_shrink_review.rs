//! A hostile review, by raw sockets, of what a parked connection no longer
//! keeps (see `listener::h1::park` and `Peer::interims`): the 1xx queue an
//! upstream makes at its first 1xx (on a later request, after a park, for
//! an HTTP/1.0 request, from a cache fill's task, in a flood), the upgrade
//! mark set at the first HTTP/1.1 request, the stops a resumed connection
//! rebuilds (a shutdown while some are parked and some resumed, its
//! timeout), and the slot and count it takes back (rounds under a cap).

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::{TestGateway, bounded, closed_within, metrics_text, sample};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;

const HINT: &[u8] = b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n";

/// An upstream that answers by the target: `hold` sends a 103 and its 200
/// only once `told` is notified (cacheable for 60 s); `hint` a 103 with its
/// 200 in one write; `flood` ten 103s with its 200 in one write; `slow` its
/// 200 after 800 ms; `ws` a 101 to an echo tunnel; anything else `ok`
/// (echoing a request body, if any).
async fn upstream(told: Arc<Notify>) -> SocketAddr {
    common::raw_upstream(move |mut s: TcpStream| {
        let told = told.clone();
        async move {
            s.set_nodelay(true).unwrap();
            while let Some(head) = common::read_head(&mut s).await {
                let target = common::request_line(&head);
                let mut out = Vec::new();
                let body = if target.contains("hold") {
                    let _ = s.write_all(HINT).await;
                    told.notified().await;
                    b"held".to_vec()
                } else if target.contains("hint") {
                    out.extend_from_slice(HINT);
                    b"hint".to_vec()
                } else if target.contains("flood") {
                    out.extend_from_slice(&HINT.repeat(10));
                    b"flood".to_vec()
                } else if target.contains("slow") {
                    tokio::time::sleep(Duration::from_millis(800)).await;
                    b"slow".to_vec()
                } else if target.contains("/ws") {
                    return echo(s).await;
                } else {
                    request_body(&mut s, &head).await.unwrap_or_else(|| b"ok".to_vec())
                };
                let cc = "cache-control: max-age=60\r\n";
                out.extend_from_slice(
                    format!("HTTP/1.1 200 OK\r\n{cc}content-length: {}\r\n\r\n", body.len()).as_bytes(),
                );
                out.extend_from_slice(&body);
                let _ = s.write_all(&out).await;
            }
        }
    })
    .await
}

/// The request body `head` announces by `Content-Length`, read (the bytes
/// past the head in `head` first).
async fn request_body(s: &mut TcpStream, head: &[u8]) -> Option<Vec<u8>> {
    let text = String::from_utf8_lossy(head).to_ascii_lowercase();
    let length: usize = text.lines().find_map(|l| l.strip_prefix("content-length: "))?.trim().parse().ok()?;
    let end = head.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let mut body = head[end..].to_vec();
    let mut buf = [0u8; 1024];
    while body.len() < length {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => body.extend_from_slice(&buf[..n]),
        }
    }
    Some(body)
}

async fn echo(mut s: TcpStream) {
    let _ = s.write_all(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n").await;
    let mut buf = [0u8; 1024];
    while let Ok(n) = s.read(&mut buf).await {
        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A gateway whose connections park after 50 ms, with `/u` proxied to the
/// upstream and `/c` to it through a cache, and its metrics on an admin
/// listener; with extra `[server]` keys.
async fn gateway(up: SocketAddr, server: &str) -> TestGateway {
    TestGateway::from_toml(&format!(
        "[server]\npark_after = \"50ms\"\n{server}\n[metrics]\nlisten = \"127.0.0.1:0\"\n\
         [upstreams.u]\nurl = \"http://{up}\"\n\
         [[routes]]\nname = \"u\"\nprefix = \"/u\"\nupstream = \"u\"\n\
         [[routes]]\nname = \"c\"\nprefix = \"/c\"\nupstream = \"u\"\ncache = {{ max_size = \"1MiB\" }}\n"
    ))
    .await
}

async fn parked(gw: &TestGateway) -> f64 {
    sample(&metrics_text(gw.admin.unwrap()).await, "gateway_connections_parked", &[]).unwrap_or(0.0)
}

/// Waits (up to 3 s) until `want` connections are parked; fails otherwise.
async fn parked_becomes(gw: &TestGateway, want: f64) {
    let mut seen = parked(gw).await;
    for _ in 0..60 {
        if seen == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        seen = parked(gw).await;
    }
    assert_eq!(seen, want, "parked connections");
}

/// Reads from `s` until its text ends with `end` (within 3 s, else fails
/// with `what`); the text read.
async fn read_until(s: &mut TcpStream, end: &str, what: &str) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(3), async {
        while !got.ends_with(end.as_bytes()) {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    let text = String::from_utf8_lossy(&got).into_owned();
    assert!(read.is_ok() && text.ends_with(end), "{what}: no {end:?} in {text:?}");
    text
}

/// Sends `request` on `s` and reads its answer, ending in `body`.
async fn exchange(s: &mut TcpStream, request: &str, body: &str) -> String {
    s.write_all(request.as_bytes()).await.unwrap();
    read_until(s, &format!("\r\n\r\n{body}"), request).await
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n")
}

/// The 103 of `GET path`, read before its upstream answers (it answers
/// once `told`), then the answer.
async fn held_exchange(s: &mut TcpStream, path: &str, told: &Notify) {
    s.write_all(get(path).as_bytes()).await.unwrap();
    let hint = read_until(s, "rel=preload\r\n\r\n", "a 103 before the answer").await;
    assert!(hint.starts_with("HTTP/1.1 103 Early Hints\r\n"), "{hint:?}");
    told.notify_one();
    let answer = read_until(s, "\r\n\r\nheld", "the answer after the 103").await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer:?}");
}

/// A connection's first 1xx may come on any request: after requests with
/// none and a park, each 103 goes out as it comes (its upstream answers
/// only once the client has read it), after a second park too.
#[tokio::test]
async fn early_hints_first_sent_after_a_park_go_out_before_the_answer() {
    let _one = common::parked::one_at_a_time().await;
    let told = Arc::new(Notify::new());
    let gw = gateway(upstream(told.clone()).await, "idle_timeout = \"5s\"").await;
    let base = parked(&gw).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    for _ in 0..2 {
        exchange(&mut s, &get("/u/p"), "ok").await;
    }
    for _ in 0..2 {
        parked_becomes(&gw, base + 1.0).await;
        held_exchange(&mut s, "/u/hold", &told).await;
    }
}

/// The queue first made for an HTTP/1.0 request (which gets no 1xx) after
/// an HTTP/1.1 one: its 103 reaches neither that answer nor, after a park,
/// the next HTTP/1.1 request's.
#[tokio::test]
async fn early_hints_first_sent_to_an_http10_request_reach_no_later_answer() {
    let _one = common::parked::one_at_a_time().await;
    let gw = gateway(upstream(Arc::default()).await, "idle_timeout = \"5s\"").await;
    let base = parked(&gw).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    exchange(&mut s, &get("/u/p"), "ok").await;
    let old = "GET /u/hint HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n\r\n";
    let text = exchange(&mut s, old, "hint").await;
    assert!(text.starts_with("HTTP/1.0 200 OK\r\n"), "a 1xx to HTTP/1.0: {text:?}");
    parked_becomes(&gw, base + 1.0).await;
    let text = exchange(&mut s, &get("/u/p"), "ok").await;
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "a stale 1xx: {text:?}");
    exchange(&mut s, &get("/u/hint"), "hint").await;
}

/// An upstream that floods 1xx on a parked connection's later request
/// gets at most four of them through, and none is left for the next
/// answer.
#[tokio::test]
async fn a_flood_of_1xx_after_a_park_is_bounded_and_leaves_nothing_behind() {
    let _one = common::parked::one_at_a_time().await;
    let gw = gateway(upstream(Arc::default()).await, "idle_timeout = \"5s\"").await;
    let base = parked(&gw).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    exchange(&mut s, &get("/u/p"), "ok").await;
    parked_becomes(&gw, base + 1.0).await;
    let text = exchange(&mut s, &get("/u/flood"), "flood").await;
    let hints = text.matches("HTTP/1.1 103 ").count();
    assert!((1..=4).contains(&hints), "{hints} 103s forwarded: {text:?}");
    assert!(text.contains("HTTP/1.1 200 OK\r\n"), "{text:?}");
    parked_becomes(&gw, base + 1.0).await;
    let text = exchange(&mut s, &get("/u/p"), "ok").await;
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "a 1xx left over: {text:?}");
}

/// A cache fill runs in a task of its own: the 103 its upstream sends on
/// a connection's first request (no queue yet) goes out before the
/// answer; the hit that follows, after a park, sends none.
#[tokio::test]
async fn a_cache_fills_early_hints_go_out_before_its_answer_and_a_hit_sends_none() {
    let _one = common::parked::one_at_a_time().await;
    let told = Arc::new(Notify::new());
    let gw = gateway(upstream(told.clone()).await, "idle_timeout = \"5s\"").await;
    let base = parked(&gw).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    held_exchange(&mut s, "/c/hold", &told).await;
    parked_becomes(&gw, base + 1.0).await;
    let text = exchange(&mut s, &get("/c/hold"), "held").await;
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "a 1xx on a hit: {text:?}");
    assert!(text.to_ascii_lowercase().contains("\r\nage: "), "not a hit: {text:?}");
}

/// The upgrade mark is set at a connection's first HTTP/1.1 request: on a
/// connection whose first request was HTTP/1.0 and that parked, an
/// upgrade still runs the tunnel.
#[tokio::test]
async fn an_upgrade_after_an_http10_request_and_a_park_runs_its_tunnel() {
    let _one = common::parked::one_at_a_time().await;
    let gw = gateway(upstream(Arc::default()).await, "idle_timeout = \"5s\"").await;
    let base = parked(&gw).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    let old = "GET /u/p HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n\r\n";
    exchange(&mut s, old, "ok").await;
    parked_becomes(&gw, base + 1.0).await;
    s.write_all(b"GET /u/ws HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: echo\r\n\r\n").await.unwrap();
    let head = read_until(&mut s, "\r\n\r\n", "the 101").await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head:?}");
    s.write_all(b"ping").await.unwrap();
    let mut echoed = [0u8; 4];
    bounded(s.read_exact(&mut echoed)).await.unwrap();
    assert_eq!(&echoed, b"ping");
}

/// `Expect: 100-continue` on a parked connection, its body split across
/// reads and past the time to park: the `100 Continue` once, then the
/// whole body reaches the upstream; the connection parks again after.
#[tokio::test]
async fn an_expect_after_a_park_with_its_body_split_is_answered_whole() {
    let _one = common::parked::one_at_a_time().await;
    let gw = gateway(upstream(Arc::default()).await, "idle_timeout = \"5s\"").await;
    let base = parked(&gw).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    exchange(&mut s, &get("/u/p"), "ok").await;
    for round in 0..2 {
        parked_becomes(&gw, base + 1.0).await;
        let head = "POST /u/e HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n";
        s.write_all(head.as_bytes()).await.unwrap();
        let interim = read_until(&mut s, "\r\n\r\n", "the 100 Continue").await;
        assert_eq!(interim, "HTTP/1.1 100 Continue\r\n\r\n", "round {round}");
        s.write_all(b"hello").await.unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
        s.write_all(b"world").await.unwrap();
        let text = read_until(&mut s, "\r\n\r\nhelloworld", "the echoed body").await;
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "round {round}: {text:?}");
    }
}

/// A shutdown with connections parked and others just resumed (their
/// request in flight): the parked close at once, the resumed get their
/// answer and close after it (the stops they rebuilt are the listener's),
/// and the gateway ends well before its shutdown timeout.
#[tokio::test]
async fn a_shutdown_with_parked_and_resumed_connections_ends_each_after_its_answer() {
    let _one = common::parked::one_at_a_time().await;
    const CONNS: usize = 40;
    let mut gw = gateway(upstream(Arc::default()).await, "idle_timeout = \"10s\"\nshutdown_timeout = \"8s\"").await;
    let base = parked(&gw).await;
    let mut conns = Vec::new();
    for _ in 0..CONNS {
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        exchange(&mut s, &get("/u/p"), "ok").await;
        conns.push(s);
    }
    parked_becomes(&gw, base + CONNS as f64).await;
    let mut resumed = conns.split_off(CONNS / 2);
    for s in &mut resumed {
        s.write_all(get("/u/slow").as_bytes()).await.unwrap();
    }
    parked_becomes(&gw, base + (CONNS / 2) as f64).await;
    gw.shutdown();
    for s in &mut conns {
        assert!(closed_within(s, Duration::from_secs(1)).await.is_some(), "a parked connection stayed open");
    }
    let answered: Vec<_> = resumed
        .into_iter()
        .map(|mut s| {
            tokio::spawn(async move {
                let text = read_until(&mut s, "\r\n\r\nslow", "the answer in flight").await;
                let closed = closed_within(&mut s, Duration::from_secs(2)).await.is_some();
                (text.starts_with("HTTP/1.1 200 OK\r\n"), closed)
            })
        })
        .collect();
    for a in answered {
        assert_eq!(a.await.unwrap(), (true, true), "a resumed connection: answered, then closed");
    }
    tokio::time::timeout(Duration::from_secs(3), &mut gw.task).await.expect("the gateway waited").unwrap();
    let left = sample(&gateway::metrics::install().render(), "gateway_connections_parked", &[]);
    assert_eq!(left.unwrap_or(0.0), base, "parked after the shutdown");
}

/// Many connections, each sent a 103 (so each has its queue), park and
/// wake in rounds under a cap of exactly their number: each round all
/// park again (each resumed one kept its slot and its count), and once
/// they close the gauges are back and every slot is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_with_a_queue_park_and_wake_in_rounds_and_leave_nothing_behind() {
    let _one = common::parked::one_at_a_time().await;
    const CONNS: usize = 150;
    let server = format!("idle_timeout = \"10s\"\nmax_connections = {CONNS}");
    let gw = gateway(upstream(Arc::default()).await, &server).await;
    let base = parked(&gw).await;
    let active = || async { sample(&metrics_text(gw.admin.unwrap()).await, "gateway_connections_active", &[]) };
    let before = active().await.unwrap_or(0.0);
    let mut conns = Vec::new();
    for _ in 0..CONNS {
        conns.push(TcpStream::connect(gw.addr).await.unwrap());
    }
    for round in 0..3 {
        let tasks: Vec<_> = conns
            .into_iter()
            .map(|mut s| {
                tokio::spawn(async move {
                    let text = exchange(&mut s, &get("/u/hint"), "hint").await;
                    (text.starts_with("HTTP/1.1 103 Early Hints\r\n"), s)
                })
            })
            .collect();
        conns = Vec::new();
        for t in tasks {
            let (hinted, s) = t.await.expect("a request went unanswered");
            assert!(hinted, "round {round}: no 103 first");
            conns.push(s);
        }
        parked_becomes(&gw, base + CONNS as f64).await;
    }
    assert_eq!(active().await, Some(before + CONNS as f64));
    drop(conns);
    parked_becomes(&gw, base).await;
    for _ in 0..60 {
        if active().await == Some(before) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(active().await, Some(before), "connections still counted");
    let mut again = Vec::new();
    for _ in 0..CONNS {
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(get("/u/p").as_bytes()).await.unwrap();
        again.push(s);
    }
    for s in &mut again {
        read_until(s, "\r\n\r\nok", "a slot still held").await;
    }
}

/// A resumed connection whose request outlives the shutdown timeout is
/// closed at that timeout (the immediate stop it rebuilt is the
/// listener's), its answer never sent.
#[tokio::test]
async fn a_resumed_connection_is_cut_at_the_shutdown_timeout() {
    let _one = common::parked::one_at_a_time().await;
    let mut gw = gateway(upstream(Arc::default()).await, "shutdown_timeout = \"200ms\"").await;
    let base = parked(&gw).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    exchange(&mut s, &get("/u/p"), "ok").await;
    parked_becomes(&gw, base + 1.0).await;
    s.write_all(get("/u/slow").as_bytes()).await.unwrap();
    parked_becomes(&gw, base).await;
    gw.shutdown();
    let mut got = Vec::new();
    let closed = tokio::time::timeout(Duration::from_millis(600), s.read_to_end(&mut got)).await;
    let text = String::from_utf8_lossy(&got);
    assert!(closed.is_ok(), "still open 600 ms after a shutdown with a 200 ms timeout: {text:?}");
    assert!(!text.ends_with("slow"), "answered past the shutdown timeout: {text:?}");
}
