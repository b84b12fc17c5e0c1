//! A hostile review, by raw sockets, of how a listener keeps its parked
//! connections (see `listener::h1::park`): a parked connection leaves the
//! list of connections with a task at the next look and is put back when
//! it wakes, and the parked cells are looked at in the order they parked,
//! up to the first still waiting. Connections parking and waking over and
//! over from two worker threads (at once after their park, after they left
//! the list, with a head split across the wake) park again each round;
//! each closes at its idle timeout, not before and not much after, however
//! many woken cells are ahead of it; woken cells do not pile up on the
//! heap; a shutdown closes parked, unlisted and just-woken connections.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::counting::{Counting, LIVE};
use common::parked::{parked, parked_become};
use common::{TestGateway, closed_within, proxy_toml, read_responses};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

#[global_allocator]
static ALLOC: Counting = Counting;

/// Answered by the gateway itself (a `respond` route): no upstream pool.
const GET: &[u8] = b"GET /alive HTTP/1.1\r\nHost: x\r\n\r\n";

/// The time between two looks of the listener at `park_after = "20ms"`.
const LOOK: Duration = Duration::from_millis(10);

/// How much later than its idle timeout a connection may close: two looks,
/// and room for this test's own scheduling on a loaded machine.
const LATE: Duration = Duration::from_millis(20 + 400);

/// A gateway whose connections park after 20 ms idle, with extra
/// `[server]` keys.
async fn gateway(server: &str) -> TestGateway {
    let server = format!("park_after = \"20ms\"\n{server}");
    TestGateway::from_toml(&proxy_toml(common::refused_addr().await, "p", "", &server)).await
}

/// When a connection's last request was sent and when its answer was read:
/// the gateway's idle time starts between the two (a test task on a loaded
/// machine may read the answer some ms after the gateway wrote it).
struct Served {
    sent: Instant,
    answered: Instant,
}

/// One request answered on `s`, sent whole or with its head split across
/// `gap`.
async fn served(s: &mut TcpStream, split: Option<Duration>) -> Served {
    let rest = match split {
        None => GET,
        Some(gap) => {
            s.write_all(&GET[..20]).await.unwrap();
            tokio::time::sleep(gap).await;
            &GET[20..]
        }
    };
    let sent = Instant::now();
    s.write_all(rest).await.unwrap();
    let (head, body) = read_responses(s, &[false]).await.remove(0);
    assert!(head.starts_with("HTTP/1.1 200") && body == b"alive", "{head:?}");
    Served { sent, answered: Instant::now() }
}

/// `conns`, each served one more request at about the same time, after
/// `wait` (the head split across `split`); each with when it was served.
async fn serve_each(conns: Vec<TcpStream>, wait: Duration, split: Option<Duration>) -> Vec<(TcpStream, Served)> {
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut s| {
            tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                let when = served(&mut s, split).await;
                (s, when)
            })
        })
        .collect();
    let mut served = Vec::new();
    for t in tasks {
        served.push(t.await.expect("a request went unanswered"));
    }
    served
}

/// `n` new connections, each served once.
async fn connected(gw: &TestGateway, n: usize) -> Vec<(TcpStream, Served)> {
    let mut conns = Vec::new();
    for _ in 0..n {
        conns.push(TcpStream::connect(gw.addr).await.unwrap());
    }
    serve_each(conns, Duration::ZERO, None).await
}

/// The streams of `conns`, less when each was served.
fn streams(conns: Vec<(TcpStream, Served)>) -> Vec<TcpStream> {
    conns.into_iter().map(|(s, _)| s).collect()
}

/// Asserts that each connection closes at its idle timeout `idle`: not
/// before `idle` from when its last request was sent, and not later than
/// [`LATE`] after `idle` from when its answer was read.
async fn close_at_idle_timeout(conns: Vec<(TcpStream, Served)>, idle: Duration, which: &str) {
    let waits: Vec<_> = conns
        .into_iter()
        .map(|(mut s, when)| {
            tokio::spawn(async move {
                let left = (when.answered + idle + LATE).saturating_duration_since(Instant::now());
                closed_within(&mut s, left).await.map(|_| when.sent.elapsed())
            })
        })
        .collect();
    for (i, w) in waits.into_iter().enumerate() {
        match w.await.unwrap() {
            None => panic!("{which} {i}: still open {LATE:?} after its idle timeout of {idle:?}"),
            // A few ms of slack: the gateway's clock counts whole ms.
            Some(after) => {
                assert!(
                    after + Duration::from_millis(5) >= idle,
                    "{which} {i}: closed {after:?} after its last request was sent, before its idle timeout of {idle:?}"
                )
            }
        }
    }
}

/// Forty connections park and wake in fifteen rounds, from two worker
/// threads. Each round's request comes at once after all have parked (many
/// still listed, some already left the list), four looks later (all left
/// the list: the wake must put each back), or with its head split across
/// the wake, its end three looks after its start (busy meanwhile, listed
/// again). Every round, every connection parks again. Then half close
/// while parked (their cells woken, among the others'), and the rest close
/// at their idle timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_parking_and_waking_in_rounds_park_again_every_round() {
    let _one = common::parked::one_at_a_time().await;
    const N: usize = 40;
    let idle = Duration::from_millis(700);
    let gw = gateway("idle_timeout = \"700ms\"").await;
    let base = parked();
    let mut conns = connected(&gw, N).await;
    for round in 0..15 {
        let now = parked_become(base + N as f64, Duration::from_secs(1)).await;
        assert_eq!(now - base, N as f64, "round {round}: not all parked again");
        let (wait, split) = match round % 3 {
            0 => (Duration::ZERO, None),
            1 => (LOOK * 4, None),
            _ => (LOOK * 4, Some(LOOK * 3)),
        };
        conns = serve_each(streams(conns), wait, split).await;
    }
    assert_eq!(parked_become(base + N as f64, Duration::from_secs(1)).await - base, N as f64, "not all parked at last");
    // Every other one closed by its client while parked.
    let kept: Vec<_> = conns.into_iter().enumerate().filter(|(i, _)| i % 2 == 0).map(|(_, c)| c).collect();
    assert_eq!(parked_become(base + kept.len() as f64, Duration::from_secs(1)).await - base, kept.len() as f64);
    close_at_idle_timeout(kept, idle, "connection").await;
    assert_eq!(parked_become(base, Duration::from_millis(200)).await, base, "the gauge did not come back");
}

/// One connection parks first and stays at the front of the parked cells
/// (its idle timeout not passed) while thirty others park and wake twenty
/// times each behind it, leaving some 600 woken cells: the heap does not
/// keep them (the listener drops woken cells behind a waiting one once
/// they have doubled), and every connection, the first and those parked
/// behind all the woken cells, closes at its idle timeout, not before and
/// not much after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_connections_behind_hundreds_of_woken_cells_close_at_their_idle_timeout() {
    let _one = common::parked::one_at_a_time().await;
    const N: usize = 30;
    // Long enough that the first's idle timeout does not pass while the
    // others cycle, on a loaded machine too.
    let idle = Duration::from_millis(4000);
    let gw = gateway("idle_timeout = \"4s\"").await;
    let base = parked();
    let front = connected(&gw, 1).await;
    assert_eq!(parked_become(base + 1.0, Duration::from_secs(1)).await - base, 1.0);
    let mut conns = connected(&gw, N).await;
    let mut heap = 0;
    for round in 0..23 {
        let all = base + 1.0 + N as f64;
        assert_eq!(parked_become(all, Duration::from_secs(1)).await, all, "round {round}: not all parked again");
        if round == 3 {
            // Pools, buffers and the cells' deque warmed up.
            heap = LIVE.load(Ordering::Relaxed);
        }
        conns = serve_each(streams(conns), Duration::ZERO, None).await;
    }
    let all = base + 1.0 + N as f64;
    assert_eq!(parked_become(all, Duration::from_secs(1)).await, all, "not all parked at last");
    let grew = LIVE.load(Ordering::Relaxed) - heap;
    assert!(front[0].1.sent.elapsed() < idle, "the first one's idle timeout passed while the others cycled");
    // 600 woken cells kept would be some 45 KB.
    assert!(grew < 20_000, "the heap grew by {grew} bytes over {} parks and wakes", 20 * N);
    close_at_idle_timeout(front, idle, "the first").await;
    close_at_idle_timeout(conns, idle, "one behind").await;
    assert_eq!(parked_become(base, Duration::from_millis(200)).await, base, "the gauge did not come back");
}

/// A shutdown with connections parked long since (they left the list),
/// parked just now (most still listed), woken a moment ago (back in the
/// list, waiting in their tasks) and woken by the start of a head: the
/// parked and the idle ones close at once, the begun head is answered, the
/// gauge comes back and the gateway's task ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_closes_parked_unlisted_and_just_woken_connections() {
    let _one = common::parked::one_at_a_time().await;
    let mut gw = gateway("idle_timeout = \"30s\"\nshutdown_timeout = \"10s\"").await;
    let base = parked();
    let mut long = streams(connected(&gw, 10).await);
    assert_eq!(parked_become(base + 10.0, Duration::from_secs(1)).await - base, 10.0);
    tokio::time::sleep(LOOK * 5).await;
    // One wakes to the start of a head (the gauge tells it was read).
    let mut begun = long.pop().unwrap();
    begun.write_all(&GET[..20]).await.unwrap();
    assert_eq!(parked_become(base + 9.0, Duration::from_secs(1)).await - base, 9.0);
    let mut just = streams(connected(&gw, 5).await);
    while parked() <= base + 9.0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut woken = streams(serve_each(long.split_off(5), Duration::ZERO, None).await);
    gw.shutdown();
    let shut = Instant::now();
    for (i, s) in long.iter_mut().chain(&mut just).chain(&mut woken).enumerate() {
        let took = closed_within(s, Duration::from_secs(3)).await;
        assert!(took.is_some(), "connection {i} still open 3 s after the shutdown began");
    }
    assert!(shut.elapsed() < Duration::from_secs(1), "closed {:?} after the shutdown began", shut.elapsed());
    begun.write_all(&GET[20..]).await.unwrap();
    let (head, _) = read_responses(&mut begun, &[false]).await.remove(0);
    assert!(head.starts_with("HTTP/1.1 200"), "a head begun before the shutdown: {head:?}");
    tokio::time::timeout(Duration::from_secs(2), &mut gw.task).await.expect("the gateway waited").unwrap();
    assert_eq!(parked(), base, "the gauge did not come back");
}

/// After a burst of parked connections has gone, the woken cells behind
/// one still waiting are dropped as soon as they have doubled the parked
/// ones left, not only once they have doubled the burst: the heap keeps no
/// more than that of them, whatever came before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn woken_cells_after_a_burst_has_gone_do_not_pile_up_to_twice_the_burst() {
    let _one = common::parked::one_at_a_time().await;
    const BURST: usize = 400;
    const N: usize = 20;
    let gw = gateway("idle_timeout = \"5s\"").await;
    let base = parked();
    let burst = connected(&gw, BURST).await;
    let all = base + BURST as f64;
    assert_eq!(parked_become(all, Duration::from_secs(2)).await, all, "the burst did not park");
    drop(burst);
    assert_eq!(parked_become(base, Duration::from_secs(2)).await, base, "the burst did not close");
    let _front = connected(&gw, 1).await;
    assert_eq!(parked_become(base + 1.0, Duration::from_secs(1)).await - base, 1.0);
    let mut conns = connected(&gw, N).await;
    let mut heap = None;
    let mut most = 0;
    for round in 0..24 {
        let all = base + 1.0 + N as f64;
        assert_eq!(parked_become(all, Duration::from_secs(1)).await, all, "round {round}: not all parked again");
        // From the third round: the burst's cells dropped, pools, buffers
        // and the cells' deque warmed up.
        if round >= 3 {
            let now = LIVE.load(Ordering::Relaxed);
            most = most.max(now - *heap.get_or_insert(now));
        }
        conns = serve_each(streams(conns), Duration::ZERO, None).await;
    }
    // 400 woken cells kept would be some 29 KB.
    assert!(most < 18_000, "the heap grew by up to {most} bytes over {} parks and wakes", 24 * N);
}
