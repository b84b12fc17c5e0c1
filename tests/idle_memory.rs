//! What an idle keep-alive client connection holds, counted on this test
//! binary's heap (the gateway runs in it): the own HTTP/1.1 connection
//! keeps its socket and a few words of state between requests, not a
//! request's room (benches/memory `--idle` measures the RSS).

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::counting::{Counting, LIVE};
use common::{TestGateway, TestUpstream, full, proxy_toml};
use gateway::config::Http1Server;
use http::Response;

#[global_allocator]
static ALLOC: Counting = Counting;

/// The tests read one heap: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Connections held idle at once.
const IDLE: usize = 200;

/// One request on a new blocking socket (which takes nothing from the
/// heap counted), read to its end; the socket is kept open.
fn one_request(addr: SocketAddr) -> TcpStream {
    request_with(addr, "")
}

/// [`one_request`] with `fields` in its head.
fn request_with(addr: SocketAddr, fields: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(format!("GET /d/x HTTP/1.1\r\nHost: t\r\n{fields}\r\n").as_bytes()).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.ends_with(b"\r\n\r\nok") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got.starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&got));
    s
}

/// The heap the gateway holds per client connection that `open` leaves
/// behind (`IDLE` of them, after a few to warm pools, metrics and the
/// first connection's one-offs), `settle` after the last one opened, with
/// `server.park_after` = `park`.
async fn held_per_connection(
    http1: Http1Server,
    open: fn(SocketAddr) -> TcpStream,
    park: Option<Duration>,
    settle: Duration,
) -> isize {
    let up = TestUpstream::start(|_req| async { Response::new(full("ok")) }).await;
    let mut config = common::config(&proxy_toml(up.addr, "d", "", ""), Path::new(env!("CARGO_MANIFEST_DIR")));
    config.server.http1 = http1;
    config.server.park_after = park;
    let gw = TestGateway::start(config).await;
    let addr = gw.addr;
    let held = tokio::task::spawn_blocking(move || {
        drop((0..5).map(|_| open(addr)).collect::<Vec<_>>());
        std::thread::sleep(Duration::from_millis(300));
        let before = LIVE.load(Ordering::Relaxed);
        let open: Vec<_> = (0..IDLE).map(|_| open(addr)).collect();
        std::thread::sleep(settle);
        let grew = LIVE.load(Ordering::Relaxed) - before;
        drop(open);
        grew
    })
    .await
    .unwrap();
    held / IDLE as isize
}

/// The heap the gateway holds per idle client connection, each left after
/// one request through it (one at a time, so one pooled upstream
/// connection serves them all), none parked.
async fn held_per_idle_connection(http1: Http1Server) -> isize {
    held_per_connection(http1, one_request, None, Duration::from_millis(300)).await
}

/// The heap the gateway holds per client connection that sent the first
/// bytes of a head and stalled (a slowloris, held until the header read
/// timeout), each after one request through it.
async fn held_per_stalled_head(http1: Http1Server) -> isize {
    held_per_connection(
        http1,
        |addr| {
            let mut s = one_request(addr);
            s.write_all(b"GET /d/x HTTP/1.1\r\nHost: t\r\nX-Stalled: aaaaaaaa").unwrap();
            s
        },
        None,
        Duration::from_millis(300),
    )
    .await
}

/// A connection holding half a head keeps it and the room for one
/// request's exchange, not more: many of them, each stalled until the
/// header read timeout, stay bounded (hyper's holds its two buffers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_head_holds_a_bounded_amount() {
    let _one = SERIAL.lock().await;
    let own = held_per_stalled_head(Http1Server::Gateway).await;
    let hyper = held_per_stalled_head(Http1Server::Hyper).await;
    eprintln!("a stalled head holds {own} bytes (own), {hyper} bytes (hyper's)");
    assert!(own <= 8192 && own < hyper, "a stalled head holds {own} bytes (hyper's: {hyper})");
}

/// Between requests the own connection keeps its socket, its state and a
/// small future: its read buffer is given back, and the room for a
/// request's parse, exchange and response is boxed and dropped while it
/// waits. Each idle connection held 4,481 bytes here before (a future that kept
/// room for all of them, and an argument's copy beside each one moved in);
/// hyper's keeps its buffers (the second test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_own_http1_connection_holds_little() {
    let _one = SERIAL.lock().await;
    let held = held_per_idle_connection(Http1Server::Gateway).await;
    eprintln!("own HTTP/1.1: {held} bytes per idle connection");
    assert!(held <= 2048, "an idle own HTTP/1.1 connection holds {held} bytes");
}

/// Idle for `server.park_after`, the own connection parks: it gives its
/// task up (the task's cell, the watchdog's timer) and keeps its socket,
/// its state and a small cell its socket wakes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_connection_holds_less_than_its_task() {
    let _one = SERIAL.lock().await;
    let waiting = held_per_idle_connection(Http1Server::Gateway).await;
    // Past 100 ms, and the listener's next look.
    let park = Some(Duration::from_millis(100));
    let parked = held_per_connection(Http1Server::Gateway, one_request, park, Duration::from_millis(600)).await;
    eprintln!("own HTTP/1.1: {waiting} bytes per idle connection in its task, {parked} parked");
    assert!(parked <= 1024 && parked + 512 <= waiting, "parked: {parked} bytes per connection, waiting: {waiting}");
}

/// A parked connection keeps none of the bytes it read: its last head,
/// 2 KiB here, shared its read buffer's allocation, which the buffer kept
/// while the connection idled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_connection_keeps_no_read_buffer() {
    let _one = SERIAL.lock().await;
    let long = |addr| request_with(addr, &format!("X-Long: {}\r\n", "a".repeat(2048)));
    let park = Some(Duration::from_millis(100));
    let parked = held_per_connection(Http1Server::Gateway, long, park, Duration::from_millis(600)).await;
    eprintln!("own HTTP/1.1: {parked} bytes per connection parked after a 2 KiB head");
    assert!(parked <= 1024, "parked after a 2 KiB head: {parked} bytes per connection");
}

/// The figure above is the connection's, not the test's: hyper's
/// connection, measured the same way, holds several times more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_hyper_connection_holds_its_buffers() {
    let _one = SERIAL.lock().await;
    let held = held_per_idle_connection(Http1Server::Hyper).await;
    eprintln!("hyper's HTTP/1.1: {held} bytes per idle connection");
    assert!(held >= 8192, "an idle hyper connection holds {held} bytes");
}
