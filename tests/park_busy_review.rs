//! A hostile review, by raw sockets, of how a listener's looks treat busy
//! connections (see `listener::h1::park`): a look drops a busy or parked
//! connection from its list, and the connection puts itself back when it
//! next waits idle (or wakes). Whatever kept it busy across the looks (a
//! slow upstream, pipelined requests, a body trickling in, `Expect:
//! 100-continue`, a request arriving as it is asked to park, HTTP/1.0
//! keep-alive), it parks again within a few looks of its answer; what ends
//! busy (a client that leaves, `Connection: close`, an upgrade, a shutdown)
//! takes nothing from the others and leaves the parked gauge at its base.
//! All from two worker threads: the looks on one, a connection on another.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use common::counting::{Counting, LIVE};
use common::parked::{parked, parked_become};
use common::{
    TestGateway, TestUpstream, closed_within, full, proxy_toml, read_head, read_responses, switching_upstream,
};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[global_allocator]
static ALLOC: Counting = Counting;

/// The time between two looks of the listener at `park_after = "20ms"`.
const LOOK: Duration = Duration::from_millis(10);

/// How long the upstream takes over `/p/slow`: fifteen looks.
const SLOW: Duration = Duration::from_millis(150);

/// How long a connection may take to park after its answer: a few looks,
/// and room for a loaded machine (a connection left out of the looks never
/// parks at all).
const PARKS_WITHIN: Duration = Duration::from_secs(1);

/// An upstream that echoes a request's body (or answers `ok`), after
/// [`SLOW`] when the path says `slow`.
async fn upstream() -> SocketAddr {
    let up = TestUpstream::start(|req: http::Request<hyper::body::Incoming>| async move {
        if req.uri().path().contains("slow") {
            tokio::time::sleep(SLOW).await;
        }
        let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        http::Response::new(full(if body.is_empty() { Bytes::from_static(b"ok") } else { body }))
    })
    .await;
    let addr = up.addr;
    // The upstream lives as long as the process: the gateway's pool holds it.
    std::mem::forget(up);
    addr
}

/// A bare 101 to "echo", for [`switching_upstream`].
const SWITCH_TO_ECHO: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n";

/// A gateway whose connections park after 20 ms idle: `/p` to
/// [`upstream`], `/ws` to [`switching_upstream`], `/alive` answered by
/// itself; with extra `[server]` keys.
async fn gateway(server: &str) -> TestGateway {
    let (up, sw) = (upstream().await, switching_upstream(SWITCH_TO_ECHO).await);
    TestGateway::from_toml(&format!(
        "[server]\npark_after = \"20ms\"\n{server}\n\
         [upstreams.p]\nurl = \"http://{up}\"\n[upstreams.ws]\nurl = \"http://{sw}\"\n\
         [[routes]]\nname = \"p\"\nprefix = \"/p\"\nupstream = \"p\"\n\
         [[routes]]\nname = \"ws\"\nprefix = \"/ws\"\nupstream = \"ws\"\n\
         [[routes]]\nname = \"alive\"\nprefix = \"/alive\"\nrespond = {{ status = 200, body = \"alive\" }}\n"
    ))
    .await
}

/// Asserts that `n` more than `base` are parked within [`PARKS_WITHIN`].
async fn all_park(base: f64, n: usize, what: &str) {
    let now = parked_become(base + n as f64, PARKS_WITHIN).await;
    assert_eq!(now - base, n as f64, "{what}: not all {n} parked again within {PARKS_WITHIN:?}");
}

/// Writes `req` and reads `n` answers; asserts each is a 200 with `body`.
async fn answered(s: &mut TcpStream, req: &[u8], n: usize, body: &[u8]) {
    s.write_all(req).await.unwrap();
    for (head, got) in read_responses(s, &vec![false; n]).await {
        assert!(head.starts_with("HTTP/1.") && head[8..].starts_with(" 200"), "{head:?}");
        assert_eq!(got, body, "{head:?}");
    }
}

/// `n` new connections.
async fn connect(gw: &TestGateway, n: usize) -> Vec<TcpStream> {
    let mut conns = Vec::new();
    for _ in 0..n {
        conns.push(TcpStream::connect(gw.addr).await.unwrap());
    }
    conns
}

/// Runs `each` on every connection at once, from its own task.
async fn on_each<F, Fut>(conns: Vec<TcpStream>, each: F) -> Vec<TcpStream>
where
    F: Fn(usize, TcpStream) -> Fut,
    Fut: std::future::Future<Output = TcpStream> + Send + 'static,
{
    let tasks: Vec<_> = conns.into_iter().enumerate().map(|(i, s)| tokio::spawn(each(i, s))).collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("a connection's exchange failed"));
    }
    out
}

const SLOW_GET: &[u8] = b"GET /p/slow HTTP/1.1\r\nHost: x\r\n\r\n";
const GET: &[u8] = b"GET /alive HTTP/1.1\r\nHost: x\r\n\r\n";

/// Connections whose answers take fifteen looks (each look drops them from
/// its list): not parked while busy, and all park again after each answer,
/// round after round; closed, the gauge comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_busy_across_looks_park_again_after_each_answer() {
    let _one = common::parked::one_at_a_time().await;
    const N: usize = 8;
    let gw = gateway("idle_timeout = \"10s\"").await;
    let base = parked();
    let mut conns = connect(&gw, N).await;
    for round in 0..3 {
        if round > 0 {
            // Parked long enough to have left the list: the wake puts each back.
            tokio::time::sleep(LOOK * 4).await;
        }
        conns = on_each(conns, |_, mut s| async move {
            answered(&mut s, SLOW_GET, 1, b"ok").await;
            s
        })
        .await;
        all_park(base, N, &format!("round {round}")).await;
    }
    // Busy again: none is parked while its answer is awaited.
    for s in &mut conns {
        s.write_all(SLOW_GET).await.unwrap();
    }
    tokio::time::sleep(SLOW / 2).await;
    assert_eq!(parked() - base, 0.0, "parked while busy");
    for s in &mut conns {
        read_responses(s, &[false]).await;
    }
    all_park(base, N, "after the last").await;
    drop(conns);
    assert_eq!(parked_become(base, PARKS_WITHIN).await, base, "the gauge did not come back");
}

/// Pipelined requests (a slow one first, then a body, then one the gateway
/// answers), and a next request written while the answer to the first is
/// awaited: busy across the looks throughout, then parked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_across_looks_then_parked() {
    let _one = common::parked::one_at_a_time().await;
    let gw = gateway("idle_timeout = \"10s\"").await;
    let base = parked();
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    let mut three = SLOW_GET.to_vec();
    three.extend_from_slice(b"POST /p/e HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi");
    three.extend_from_slice(GET);
    s.write_all(&three).await.unwrap();
    let got = read_responses(&mut s, &[false; 3]).await;
    let bodies: Vec<&[u8]> = got.iter().map(|(_, b)| &b[..]).collect();
    assert_eq!(bodies, [&b"ok"[..], b"hi", b"alive"]);
    all_park(base, 1, "after three pipelined").await;
    // The second head comes while the first's answer is awaited.
    s.write_all(SLOW_GET).await.unwrap();
    tokio::time::sleep(LOOK * 5).await;
    s.write_all(GET).await.unwrap();
    let got = read_responses(&mut s, &[false; 2]).await;
    assert_eq!((&got[0].1[..], &got[1].1[..]), (&b"ok"[..], &b"alive"[..]));
    all_park(base, 1, "after a head behind a slow answer").await;
    drop(s);
    assert_eq!(parked_become(base, PARKS_WITHIN).await, base, "the gauge did not come back");
}

/// Writes `bytes` one at a time, a look and a half apart.
async fn trickle(s: &mut TcpStream, bytes: &[u8]) {
    for b in bytes {
        tokio::time::sleep(LOOK + LOOK / 2).await;
        s.write_all(&[*b]).await.unwrap();
    }
}

/// Request bodies that trickle in across the looks (sized and chunked,
/// and one after its `100 Continue`, to an upstream that answers fifteen
/// looks later): none parks meanwhile, each parks after its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_trickling_in_and_expect_continue_across_looks_then_parked() {
    let _one = common::parked::one_at_a_time().await;
    let gw = gateway("idle_timeout = \"10s\"").await;
    let base = parked();
    let conns = on_each(connect(&gw, 3).await, |i, mut s| async move {
        let (head, body, echo): (&[u8], &[u8], &[u8]) = match i {
            0 => (b"POST /p/e HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\n", b"abcdef", b"abcdef"),
            1 => (
                b"POST /p/e HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
                b"3\r\nabc\r\n0\r\n\r\n",
                b"abc",
            ),
            _ => (
                b"POST /p/slow HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n",
                b"wxyz",
                b"wxyz",
            ),
        };
        s.write_all(head).await.unwrap();
        if i == 2 {
            let interim = read_head(&mut s).await.expect("a 100 Continue");
            assert!(interim.starts_with(b"HTTP/1.1 100"), "{:?}", String::from_utf8_lossy(&interim));
        }
        trickle(&mut s, body).await;
        let (head, got) = read_responses(&mut s, &[false]).await.remove(0);
        assert!(head.starts_with("HTTP/1.1 200") && got == echo, "{head:?} {got:?}");
        s
    })
    .await;
    all_park(base, 3, "after the trickled bodies").await;
    // Once more, with the gauge read mid-body: none parked.
    let conns = on_each(conns, |_, mut s| async move {
        s.write_all(b"POST /p/e HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\n").await.unwrap();
        trickle(&mut s, b"abcdef").await;
        read_responses(&mut s, &[false]).await;
        s
    });
    let (conns, mid) = tokio::join!(conns, async {
        tokio::time::sleep(LOOK * 6).await;
        parked() - base
    });
    assert_eq!(mid, 0.0, "parked with a body half in");
    all_park(base, 3, "after the second bodies").await;
    drop(conns);
    assert_eq!(parked_become(base, PARKS_WITHIN).await, base, "the gauge did not come back");
}

/// HTTP/1.0 with keep-alive parks after a slow answer; HTTP/1.0 without
/// it, `Connection: close` and a client that leaves mid-request (before
/// its answer, or mid-body) close busy, and the connection beside them
/// still parks after each round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_end_busy_leave_the_others_parking() {
    let _one = common::parked::one_at_a_time().await;
    let gw = gateway("idle_timeout = \"10s\"").await;
    let base = parked();
    let mut kept = TcpStream::connect(gw.addr).await.unwrap();
    answered(&mut kept, b"GET /p/slow HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n\r\n", 1, b"ok").await;
    all_park(base, 1, "HTTP/1.0 keep-alive").await;
    let ending: [&[u8]; 4] = [
        b"GET /p/slow HTTP/1.0\r\nHost: x\r\n\r\n",
        b"GET /p/slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        SLOW_GET,
        b"POST /p/e HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\nabc",
    ];
    for (i, req) in ending.into_iter().enumerate() {
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        tokio::join!(
            async {
                answered(&mut kept, SLOW_GET, 1, b"ok").await;
            },
            async {
                s.write_all(req).await.unwrap();
                if i < 2 {
                    read_responses(&mut s, &[false]).await;
                    assert!(closed_within(&mut s, PARKS_WITHIN).await.is_some(), "case {i}: left open");
                } else {
                    // Leaves a few looks in, busy.
                    tokio::time::sleep(LOOK * 4).await;
                    drop(s);
                }
            }
        );
        all_park(base, 1, &format!("beside case {i}")).await;
    }
    drop(kept);
    assert_eq!(parked_become(base, PARKS_WITHIN).await, base, "the gauge did not come back");
}

/// Twenty connections send their next request around when they are asked
/// to park (18 to 33 ms after their answer, the look's turn at 20 to 30):
/// before the ask, just after it (the park refused, the socket readable),
/// just after the park. Every request is answered, and every connection
/// parks again at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_arriving_as_connections_are_asked_to_park() {
    let _one = common::parked::one_at_a_time().await;
    const N: usize = 20;
    let gw = gateway("idle_timeout = \"10s\"").await;
    let base = parked();
    let conns = on_each(connect(&gw, N).await, |i, mut s| async move {
        for round in 0..16 {
            answered(&mut s, GET, 1, b"alive").await;
            tokio::time::sleep(Duration::from_millis(18 + ((i + round) % 16) as u64)).await;
        }
        answered(&mut s, GET, 1, b"alive").await;
        s
    })
    .await;
    all_park(base, N, "after the last").await;
    drop(conns);
    assert_eq!(parked_become(base, PARKS_WITHIN).await, base, "the gauge did not come back");
}

/// A connection whose request switched protocols (a bare 101 from a raw
/// upstream) carries its tunnel across many looks and is never counted
/// parked; the connection beside it parks, and the gauge comes back once
/// the tunnel is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_across_looks_is_never_parked() {
    let _one = common::parked::one_at_a_time().await;
    let gw = gateway("idle_timeout = \"10s\"").await;
    let base = parked();
    let mut beside = TcpStream::connect(gw.addr).await.unwrap();
    answered(&mut beside, GET, 1, b"alive").await;
    let mut t = TcpStream::connect(gw.addr).await.unwrap();
    t.write_all(b"GET /ws/t HTTP/1.1\r\nHost: h\r\nConnection: upgrade\r\nUpgrade: echo\r\n\r\n").await.unwrap();
    let head = String::from_utf8_lossy(&read_head(&mut t).await.expect("a 101")).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    for round in 0..3 {
        tokio::time::sleep(LOOK * 5).await;
        assert_eq!(parked() - base, 1.0, "round {round}: only the one beside is parked");
        t.write_all(b"ping").await.unwrap();
        let mut echo = [0u8; 4];
        tokio::time::timeout(PARKS_WITHIN, t.read_exact(&mut echo)).await.expect("echo in time").unwrap();
        assert_eq!(&echo, b"ping");
    }
    drop(t);
    answered(&mut beside, GET, 1, b"alive").await;
    all_park(base, 1, "beside the closed tunnel").await;
    drop(beside);
    assert_eq!(parked_become(base, PARKS_WITHIN).await, base, "the gauge did not come back");
}

/// A shutdown while connections are busy across the looks (dropped from
/// the list), parked, and just answered: the busy ones get their answers
/// and close, the others close at once, the gauge comes back and the
/// gateway's task ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_with_connections_busy_across_looks() {
    let _one = common::parked::one_at_a_time().await;
    let mut gw = gateway("idle_timeout = \"10s\"\nshutdown_timeout = \"5s\"").await;
    let base = parked();
    let mut parked_ones = on_each(connect(&gw, 3).await, |_, mut s| async move {
        answered(&mut s, GET, 1, b"alive").await;
        s
    })
    .await;
    all_park(base, 3, "before the shutdown").await;
    let mut busy = connect(&gw, 3).await;
    for s in &mut busy {
        s.write_all(SLOW_GET).await.unwrap();
    }
    let mut just = connect(&gw, 2).await;
    for s in &mut just {
        answered(s, GET, 1, b"alive").await;
    }
    tokio::time::sleep(LOOK * 3).await;
    gw.shutdown();
    for (i, s) in parked_ones.iter_mut().chain(&mut just).enumerate() {
        assert!(closed_within(s, PARKS_WITHIN).await.is_some(), "idle connection {i} open after the shutdown");
    }
    for s in &mut busy {
        let (head, body) = read_responses(s, &[false]).await.remove(0);
        assert!(head.starts_with("HTTP/1.1 200") && body == b"ok", "{head:?}");
        assert!(closed_within(s, PARKS_WITHIN).await.is_some(), "a busy connection open after its answer");
    }
    tokio::time::timeout(Duration::from_secs(3), &mut gw.task).await.expect("the gateway waited").unwrap();
    assert_eq!(parked(), base, "the gauge did not come back");
}

/// What the heap grew by over `n` requests back to back on one new
/// connection to `gw`, after 500 that warm its pools and buffers up; read
/// after the exporter's render (which drains what it keeps of each
/// request); and the connection.
async fn heap_growth(gw: &TestGateway, n: usize) -> (isize, TcpStream) {
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    let mut heap = 0;
    for i in 0..=n + 500 {
        if i == 500 || i == n + 500 {
            tokio::time::sleep(LOOK / 2).await;
            parked();
            heap = LIVE.load(Ordering::Relaxed) - heap;
        }
        answered(&mut s, GET, 1, b"alive").await;
    }
    (heap, s)
}

/// One connection served thousands of requests back to back, each idle
/// wait short of a park, with the looks finding it now busy (dropped from
/// the list), now idle (put back): it is listed once, not once more per
/// idle wait. The heap grows by no more over them than beside a gateway
/// whose connections never park (an entry per request would be some
/// 8 bytes each, 48 KB of list for these).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_idle_waits_list_a_connection_once() {
    let _one = common::parked::one_at_a_time().await;
    const N: usize = 6000;
    let never = TestGateway::from_toml(&proxy_toml(common::refused_addr().await, "p", "", "park_after = \"0s\"")).await;
    let (without, _) = heap_growth(&never, N).await;
    let gw = gateway("idle_timeout = \"10s\"").await;
    let base = parked();
    let (with, s) = heap_growth(&gw, N).await;
    assert!(with - without < 24_000, "the heap grew by {with} bytes over {N} requests ({without} never parking)");
    all_park(base, 1, "after the last").await;
    drop(s);
    assert_eq!(parked_become(base, PARKS_WITHIN).await, base, "the gauge did not come back");
}
