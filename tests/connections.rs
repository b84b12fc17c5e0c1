//! Client connections: the header-read, idle and send timeouts on every
//! listener, the connection caps, and TCP keepalive. Each test drives the
//! gateway with raw sockets or a real HTTP/2 client, as an attacker or a
//! forgetful client would.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http::{Request, Response};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Held by the tests that count connection-level rejections (`route=""`),
/// which every gateway in this test binary shares: one at a time, each
/// counts exactly its own.
static COUNTING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn connections_that_never_send_a_head_are_closed_at_the_header_read_timeout() {
    let _one_at_a_time = COUNTING.lock().await;
    let (up, seen) = counting_upstream().await;
    let gw = TestGateway::from_toml(&proxy_toml(up.addr, "silent", "", "header_read_timeout = \"300ms\"")).await;
    let before = rejected(&metrics_text(gw.addr).await, "", "header_timeout");
    // Nothing at all; half the HTTP/2 preface; half an HTTP/1 request line.
    let openings: [&[u8]; 3] = [b"", b"PRI * HTTP/2.0\r\n", b"GET /silent HT"];
    let mut socks = Vec::new();
    for opening in openings {
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(opening).await.unwrap();
        socks.push(s);
    }
    for (s, opening) in socks.iter_mut().zip(openings) {
        let took = closed_within(s, Duration::from_secs(3)).await;
        let what = String::from_utf8_lossy(opening);
        let took = took.unwrap_or_else(|| panic!("a connection that sent {what:?} was never closed"));
        assert!(took < Duration::from_millis(300 + 1500), "{what:?}: closed after {took:?}");
    }
    assert_eq!(seen.load(Ordering::SeqCst), 0);
    let m = metrics_text(gw.addr).await;
    assert_eq!(rejected(&m, "", "header_timeout") - before, 3.0, "{m}");
    still_serving(&gw).await;
}

/// The listener tells HTTP/1 from HTTP/2 by peeking at a connection's first
/// bytes: whatever differs from HTTP/2's preface at once is HTTP/1; the rest
/// waits for more. Heads shorter than the preface, and openings cut where
/// they still match it, must be served all the same, by either protocol.
#[tokio::test]
async fn http_versions_are_told_apart_from_first_bytes_that_arrive_in_pieces() {
    let (up, _) = counting_upstream().await;
    let gw = TestGateway::from_toml(&proxy_toml(up.addr, "u", "", "")).await;
    // (first write, second write after a pause, the status expected);
    // HTTP/1.0, so the gateway closes after answering.
    let openings: [(&[u8], &[u8], u16); 4] = [
        // Shorter than the preface, in one piece: answered without waiting
        // for more (400: HTTP/1.0 without a Host).
        (b"GET /alive HTTP/1.0\r\n\r\n", b"", 400),
        // Differs from the preface at the first byte.
        (b"G", b"ET /alive HTTP/1.0\r\nhost: a\r\n\r\n", 200),
        // Matches the preface's first bytes, then differs.
        (b"P", b"OST /alive HTTP/1.0\r\nhost: a\r\ncontent-length: 0\r\n\r\n", 200),
        (b"PRI", b" /alive HTTP/1.0\r\nhost: a\r\n\r\n", 200),
    ];
    for (first, second, expected) in openings {
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(first).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        s.write_all(second).await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut answer)).await.unwrap().unwrap();
        let what = String::from_utf8_lossy(first).into_owned() + "|" + &String::from_utf8_lossy(second);
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with(&format!("HTTP/1.0 {expected} ")), "{what:?} got {answer:?}");
    }
    // HTTP/2 with prior knowledge, its preface in two pieces: the gateway's
    // first frame back is its SETTINGS (type 4).
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.write_all(b"\r\nSM\r\n\r\n").await.unwrap();
    s.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
    let mut frame = [0u8; 9];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut frame)).await.unwrap().unwrap();
    assert_eq!(frame[3], 4, "expected a SETTINGS frame, got header {frame:?}");
    // Part of the preface, then the end of the stream: neither protocol
    // is known; the connection is closed, nothing answered.
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    s.shutdown().await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut answer)).await.unwrap().unwrap();
    assert_eq!(String::from_utf8_lossy(&answer), "");
    still_serving(&gw).await;
}

#[tokio::test]
async fn idle_keep_alive_closes_at_the_idle_timeout_not_the_header_timeout() {
    let _one_at_a_time = COUNTING.lock().await;
    let (up, _) = counting_upstream().await;
    let gw = TestGateway::from_toml(&proxy_toml(
        up.addr,
        "idle",
        "",
        "header_read_timeout = \"300ms\"\nidle_timeout = \"1500ms\"",
    ))
    .await;
    let before = rejected(&metrics_text(gw.addr).await, "", "header_timeout");
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(b"GET /alive HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    assert!(one_response(&mut s).await.text.starts_with("HTTP/1.1 200"));
    // Idle past the header timeout: a keep-alive connection is still open
    // and serves its next request (nginx's keepalive_timeout, not
    // client_header_timeout).
    tokio::time::sleep(Duration::from_millis(800)).await;
    let sent = Instant::now();
    s.write_all(b"GET /alive HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let r = one_response(&mut s).await;
    assert!(r.text.starts_with("HTTP/1.1 200"), "closed at the header timeout while idle: {:?}", r.text);
    // Then idle past the idle timeout, counted from before the request was
    // sent (the gateway's count starts after it gets it): closed.
    closed_within(&mut s, Duration::from_secs(4)).await.expect("idle keep-alive connection never closed");
    let idle = sent.elapsed();
    assert!(
        idle >= Duration::from_millis(1495),
        "closed {idle:?} after its last request was sent, before the idle timeout"
    );

    // A next request head that starts and stalls is cut at the header timeout.
    let mut t = TcpStream::connect(gw.addr).await.unwrap();
    t.write_all(b"GET /alive HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    assert!(one_response(&mut t).await.text.starts_with("HTTP/1.1 200"));
    t.write_all(b"GET /alive HTTP/1.1\r\nHo").await.unwrap();
    let took = closed_within(&mut t, Duration::from_secs(3)).await.expect("stalled second head never cut");
    assert!(took < Duration::from_millis(1200), "a stalled head waited {took:?}: the idle timeout, not the header one");
    // Only the stalled head is a rejection; the idle close is housekeeping.
    let m = metrics_text(gw.addr).await;
    assert_eq!(rejected(&m, "", "header_timeout") - before, 1.0);
}

#[tokio::test]
async fn idle_http2_connection_gets_goaway_and_closes_at_the_idle_timeout() {
    let (up, _) = counting_upstream().await;
    let gw = TestGateway::from_toml(&proxy_toml(up.addr, "idleh2", "", "idle_timeout = \"500ms\"")).await;
    let (mut sender, conn) = h2_client(gw.addr).await;
    // Taken before the request: the connection's idle time starts after it.
    let sent = Instant::now();
    let resp = sender.send_request(Request::get(gw.url("/idleh2")).body(full(Bytes::new())).unwrap()).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(&resp.into_body().collect().await.unwrap().to_bytes()[..], b"ok");
    let ended = tokio::time::timeout(Duration::from_secs(4), conn).await;
    assert!(ended.is_ok(), "an idle HTTP/2 connection was never closed");
    assert!(sent.elapsed() >= Duration::from_millis(495), "closed {:?} after its request was sent", sent.elapsed());
    // GOAWAY: the client knows not to send more on it.
    assert!(sender.is_closed());
}

#[tokio::test]
async fn admin_listener_has_the_header_timeout_and_its_own_connection_cap() {
    let _one_at_a_time = COUNTING.lock().await;
    let mut config = config(
        "[server]\nheader_read_timeout = \"300ms\"\n[metrics]\nmax_connections = 2\n",
        std::path::Path::new("."),
    );
    config.metrics.listen = Some("127.0.0.1:0".parse().unwrap());
    let mut gw = TestGateway::start(config).await;
    let (main, admin) = (gw.addr, gw.admin.unwrap());
    // A silent connection to the admin listener is closed.
    let mut silent = TcpStream::connect(admin).await.unwrap();
    let took = closed_within(&mut silent, Duration::from_secs(3)).await.expect("silent admin connection kept open");
    assert!(took < Duration::from_millis(300 + 1500));
    // Two kept-alive connections fill the admin cap; a third waits, and the
    // main listener is unaffected.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(admin).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await.unwrap();
        assert!(one_response(&mut s).await.text.starts_with("HTTP/1.1 200"));
        held.push(s);
    }
    let mut third = TcpStream::connect(admin).await.unwrap();
    third.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").await.unwrap();
    assert!(read_for(&mut third, Duration::from_millis(200)).await.text.is_empty(), "past the admin cap");
    assert_eq!(get(&format!("http://{main}/healthz")).await.0.status, 404, "main listener serves (no built-ins)");
    drop(held.pop());
    assert!(read_for(&mut third, Duration::from_secs(2)).await.text.starts_with("HTTP/1.1 200"));
    gw.shutdown();
    gw.task.await.unwrap();
}

/// An upstream that streams `total` bytes of `x` as fast as it is read, and
/// counts the connections that closed under it.
async fn firehose_upstream(total: usize) -> (TestUpstream, Arc<AtomicUsize>) {
    let ended = Arc::new(AtomicUsize::new(0));
    let e = ended.clone();
    let up = TestUpstream::start(move |_req| {
        let e = e.clone();
        async move {
            let guard = DropCounter(e);
            let chunks = futures_util::stream::unfold((0usize, guard), move |(sent, guard)| async move {
                (sent < total).then(|| {
                    let frame =
                        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(Frame::data(Bytes::from(vec![b'x'; 65536])));
                    (frame, (sent + 65536, guard))
                })
            });
            Response::new(StreamBody::new(chunks).boxed())
        }
    })
    .await;
    (up, ended)
}

/// Counts, on drop, a response body the upstream stopped producing.
struct DropCounter(Arc<AtomicUsize>);

impl Drop for DropCounter {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

async fn wait_for(what: &str, within: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_client_that_stops_reading_is_cut_at_the_send_timeout() {
    let _one_at_a_time = COUNTING.lock().await;
    let (up, ended) = firehose_upstream(256 * 1024 * 1024).await;
    let gw = TestGateway::from_toml(&proxy_toml(up.addr, "noread", "", "send_timeout = \"300ms\"")).await;
    let before = rejected(&metrics_text(gw.addr).await, "", "send_timeout");
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(b"GET /noread HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    // Never read: the socket buffers fill and the gateway can send no more.
    let addr = gw.addr;
    wait_for("send_timeout counted", Duration::from_secs(5), async || {
        rejected(&metrics_text(addr).await, "", "send_timeout") - before == 1.0
    })
    .await;
    // The upstream's response was abandoned (its connection dropped, not
    // pooled), and the client's connection is closed.
    wait_for("upstream body dropped", Duration::from_secs(3), async || ended.load(Ordering::SeqCst) == 1).await;
    assert!(closed_within(&mut s, Duration::from_secs(5)).await.is_some(), "the client connection stayed open");
    let m = metrics_text(gw.addr).await;
    assert_eq!(sample(&m, "http_server_active_requests", &[("route", "noread")]), Some(0.0));
    still_serving(&gw).await;
}

#[tokio::test]
async fn an_http2_client_that_stops_reading_is_cut_at_the_send_timeout() {
    let _one_at_a_time = COUNTING.lock().await;
    let (up, ended) = firehose_upstream(256 * 1024 * 1024).await;
    let gw = TestGateway::from_toml(&proxy_toml(up.addr, "noreadh2", "", "send_timeout = \"300ms\"")).await;
    let before = rejected(&metrics_text(gw.addr).await, "", "send_timeout");
    let (mut sender, conn) = h2_client(gw.addr).await;
    // The body is never polled: HTTP/2 flow control stops the gateway once
    // the client's window is full, with the socket itself idle.
    let resp = sender.send_request(Request::get(gw.url("/noreadh2")).body(full(Bytes::new())).unwrap()).await.unwrap();
    assert_eq!(resp.status(), 200);
    let addr = gw.addr;
    wait_for("send_timeout counted", Duration::from_secs(5), async || {
        rejected(&metrics_text(addr).await, "", "send_timeout") - before == 1.0
    })
    .await;
    wait_for("upstream body dropped", Duration::from_secs(3), async || ended.load(Ordering::SeqCst) == 1).await;
    assert!(tokio::time::timeout(Duration::from_secs(3), conn).await.is_ok(), "the HTTP/2 connection stayed open");
    drop(resp);
}

#[tokio::test]
async fn a_stalled_http2_stream_is_cut_even_while_the_connection_is_otherwise_busy() {
    let _one_at_a_time = COUNTING.lock().await;
    let (up, ended) = firehose_upstream(256 * 1024 * 1024).await;
    let gw = TestGateway::from_toml(&proxy_toml(up.addr, "stallh2", "", "send_timeout = \"300ms\"")).await;
    let before = rejected(&metrics_text(gw.addr).await, "", "send_timeout");
    let (mut client, mut ping_pong) = raw_h2(gw.addr, 65535).await;
    let (resp, _) = client.send_request(Request::get(gw.url("/stallh2")).body(()).unwrap(), true).unwrap();
    // The response is never read (its window never reopens), while PINGs
    // keep the connection itself writing.
    let _resp = resp.await.unwrap();
    let pings = tokio::spawn(async move {
        while ping_pong.ping(h2::Ping::opaque()).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let addr = gw.addr;
    wait_for("send_timeout counted", Duration::from_secs(5), async || {
        rejected(&metrics_text(addr).await, "", "send_timeout") - before == 1.0
    })
    .await;
    wait_for("upstream body dropped", Duration::from_secs(3), async || ended.load(Ordering::SeqCst) == 1).await;
    assert!(tokio::time::timeout(Duration::from_secs(3), pings).await.is_ok(), "the connection stayed open");
}

#[tokio::test]
async fn a_slow_but_steady_reader_is_not_cut_by_the_send_timeout() {
    let _one_at_a_time = COUNTING.lock().await;
    let (up, ended) = firehose_upstream(256 * 1024 * 1024).await;
    let gw = TestGateway::from_toml(&proxy_toml(up.addr, "steady", "", "send_timeout = \"500ms\"")).await;
    let before = rejected(&metrics_text(gw.addr).await, "", "send_timeout");
    // A small receive window, as a phone's or a throttled client's: the
    // gateway's send buffer fills and drains only at the reading pace.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut s = socket.connect(gw.addr).await.unwrap();
    s.write_all(b"GET /steady HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    // 40 KiB every 100 ms (400 KiB/s, far from stopped) for 3 s.
    let mut buf = vec![0u8; 40 * 1024];
    for _ in 0..30 {
        let mut step = 0;
        while step < buf.len() {
            match tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf[step..])).await {
                Ok(Ok(n)) if n > 0 => step += n,
                other => panic!("the connection ended or stalled: {other:?}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let m = metrics_text(gw.addr).await;
    assert_eq!(rejected(&m, "", "send_timeout") - before, 0.0, "a reader taking 400 KiB/s was treated as stopped");
    assert_eq!(ended.load(Ordering::SeqCst), 0, "the upstream response was abandoned");
}

#[tokio::test]
async fn a_slow_http2_reader_is_not_cut_by_the_idle_timeout_while_its_response_drains() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("big.bin"), vec![b'z'; 200 * 1024]).unwrap();
    let toml = "[server]\nidle_timeout = \"400ms\"\nheader_read_timeout = \"300ms\"\n[[routes]]\nname = \"bigfile\"\nprefix = \"/big\"\nfile = \"big.bin\"\n";
    let gw = TestGateway::start(config(toml, dir.path())).await;
    // A 4 KiB window reopened every 25 ms: 160 KiB/s, so the 200 KiB (a
    // cached file, handed to HTTP/2 at once) takes over a second to drain.
    let (mut client, _ping) = raw_h2(gw.addr, 4096).await;
    let (resp, _) = client.send_request(Request::get(gw.url("/big")).body(()).unwrap(), true).unwrap();
    let mut body = resp.await.unwrap().into_body();
    let mut got = 0usize;
    let mut owed = 0usize;
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(5), body.data()).await.expect("no stall") {
        let chunk = chunk.unwrap_or_else(|e| panic!("cut after {got} bytes: {e}"));
        got += chunk.len();
        owed += chunk.len();
        if owed >= 4096 {
            tokio::time::sleep(Duration::from_millis(25)).await;
            body.flow_control().release_capacity(owed).unwrap();
            owed = 0;
        }
    }
    assert_eq!(got, 200 * 1024);
}

#[tokio::test]
async fn connections_past_max_connections_wait_and_each_waiting_one_is_counted_once() {
    let (up, _) = counting_upstream().await;
    let gw = TestGateway::from_toml(&proxy_toml(up.addr, "conncap", "", "max_connections = 2")).await;
    let waited = || async { rejected(&metrics_text_on_fresh_slot(gw.addr).await, "", "max_connections") };
    let mut held = hold_served(gw.addr, 2).await;
    // Two more connections are accepted by the kernel but not served...
    let mut waiting = send_waiting(gw.addr, 2).await;
    for s in &mut waiting {
        assert!(read_for(s, Duration::from_millis(300)).await.text.is_empty(), "served past max_connections");
    }
    // ...until slots free: each is then served, in turn.
    drop(held.pop());
    let r = read_for(&mut waiting[0], Duration::from_secs(3)).await;
    assert!(r.text.starts_with("HTTP/1.1 200") && r.closed, "{}", r.text);
    let r = read_for(&mut waiting[1], Duration::from_secs(3)).await;
    assert!(r.text.starts_with("HTTP/1.1 200") && r.closed, "{}", r.text);
    drop(held);
    // Exactly the two connections that had to wait are counted.
    assert_eq!(waited().await, 2.0);
    assert_eq!(waited().await, 2.0, "counting must not depend on how often the accept loop runs");

    // Five waiting at once, let in as slots free: each is counted.
    let held = hold_served(gw.addr, 2).await;
    let mut waiting = send_waiting(gw.addr, 5).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(held);
    for s in &mut waiting {
        let r = read_for(s, Duration::from_secs(3)).await;
        assert!(r.text.starts_with("HTTP/1.1 200"), "{}", r.text);
    }
    assert_eq!(waited().await, 7.0);
}

/// `n` connections, each served one request and kept open (holding a
/// `max_connections` slot).
async fn hold_served(addr: std::net::SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for _ in 0..n {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /alive HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        assert!(one_response(&mut s).await.text.starts_with("HTTP/1.1 200"));
        held.push(s);
    }
    held
}

/// `n` connections that have each sent a request and wait for a slot.
async fn send_waiting(addr: std::net::SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut waiting = Vec::new();
    for _ in 0..n {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /alive HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
        waiting.push(s);
    }
    waiting
}

/// Fetches `/metrics` on a new connection (which may itself have to wait for
/// a slot; the caller has freed them).
async fn metrics_text_on_fresh_slot(addr: std::net::SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
    let r = read_for(&mut s, Duration::from_secs(3)).await;
    assert!(r.text.starts_with("HTTP/1.1 200"), "{}", r.text);
    r.text
}

#[tokio::test]
async fn accepted_sockets_have_tcp_keepalive() {
    let gw = TestGateway::from_toml("[server]\ntcp_keepalive = \"45s\"\n").await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await.unwrap();
    assert!(one_response(&mut s).await.text.starts_with("HTTP/1.1 200"));
    // `ss -o` shows the kernel's keepalive timer on the gateway's side of
    // the connection (source port = the gateway's).
    let out = std::process::Command::new("ss")
        .args(["-tnoH", "state", "established", "sport", "=", &format!(":{}", gw.addr.port())])
        .output()
        .expect("ss (iproute2) is installed");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("timer:(keepalive,"), "no keepalive timer on the accepted socket: {text:?}");
    drop(s);
}
