//! A hostile review, by raw sockets, of parked connections (see
//! `listener::h1::park`): what may arrive on a parked connection (a byte
//! and a stall, a pipelined burst, a body split across the wake,
//! `Expect: 100-continue`, an upgrade, a half-close, a reset), many
//! connections parking and waking in rounds, the connection cap, a
//! shutdown with parked, busy and half-sent connections, and the
//! connections that never park (TLS, the admin listener, HTTP/2).

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{TestGateway, bounded, closed_within, metrics_text, read_for, read_responses, rejected, sample};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const GET: &[u8] = b"GET /p HTTP/1.1\r\nHost: x\r\n\r\n";

/// A gateway with one route `/p` to an upstream that answers `ok` (or
/// echoes the request body), `/slow` to one that answers after 800 ms,
/// `/ws` to one that switches to an echo tunnel, and its metrics on an
/// admin listener; with extra `[server]` keys.
async fn gateway(server: &str) -> TestGateway {
    let (up, _) = common::counting_upstream().await;
    // The upstream lives as long as the process: the gateway's pool holds it.
    let up_addr = up.addr;
    std::mem::forget(up);
    TestGateway::from_toml(&toml(up_addr, slow_upstream().await, server)).await
}

fn toml(up: SocketAddr, slow: SocketAddr, server: &str) -> String {
    format!(
        "[server]\n{server}\n[metrics]\nlisten = \"127.0.0.1:0\"\n\
         [upstreams.p]\nurl = \"http://{up}\"\n[upstreams.slow]\nurl = \"http://{slow}\"\n\
         [[routes]]\nname = \"p\"\nprefix = \"/p\"\nupstream = \"p\"\n\
         [[routes]]\nname = \"slow\"\nprefix = \"/slow\"\nupstream = \"slow\"\n\
         [[routes]]\nname = \"ws\"\nprefix = \"/ws\"\nupstream = \"slow\"\n"
    )
}

/// Answers `/ws` with a 101 to `echo` and echoes; anything else with
/// `slow` after 800 ms.
async fn slow_upstream() -> SocketAddr {
    common::raw_upstream(|mut s: TcpStream| async move {
        let Some(head) = common::read_head(&mut s).await else { return };
        if head.starts_with(b"GET /ws") {
            let _ =
                s.write_all(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n").await;
            let mut buf = [0u8; 4096];
            while let Ok(n) = s.read(&mut buf).await {
                if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
            return;
        }
        tokio::time::sleep(Duration::from_millis(800)).await;
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nslow").await;
    })
    .await
}

/// A gauge (0 when absent) on the gateway's admin listener.
async fn gauge(gw: &TestGateway, name: &str) -> f64 {
    sample(&metrics_text(gw.admin.unwrap()).await, name, &[]).unwrap_or(0.0)
}

async fn parked(gw: &TestGateway) -> f64 {
    gauge(gw, "gateway_connections_parked").await
}

/// Waits (up to 3 s) for the gauge `name` to be `want`; the last value seen.
async fn gauge_becomes(gw: &TestGateway, name: &str, want: f64) -> f64 {
    let mut seen = gauge(gw, name).await;
    // Up to 4.5 s: on a loaded CI machine a sweep can come late, and the
    // tests' idle timeouts (5 s and more) must not pass first.
    for _ in 0..90 {
        if seen == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        seen = gauge(gw, name).await;
    }
    seen
}

async fn parked_becomes(gw: &TestGateway, want: f64) -> f64 {
    gauge_becomes(gw, "gateway_connections_parked", want).await
}

/// Reads responses (see [`read_responses`]), bounded in time. (Boxed:
/// its read buffer would be on the test's stack.)
async fn answers(s: &mut TcpStream, heads: &[bool]) -> Vec<(String, Vec<u8>)> {
    Box::pin(bounded(read_responses(s, heads))).await
}

/// Sends `GET /p` and reads its `ok`.
async fn served(s: &mut TcpStream) {
    s.write_all(GET).await.unwrap();
    let got = answers(s, &[false]).await;
    assert!(got[0].0.starts_with("HTTP/1.1 200") && got[0].1 == b"ok", "{got:?}");
}

/// A connection that was served once and is now parked (`base` more
/// parked than before it).
async fn parked_conn(gw: &TestGateway, base: f64) -> TcpStream {
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    served(&mut s).await;
    let now = parked_becomes(gw, base + 1.0).await;
    assert_eq!(now, base + 1.0, "the connection did not park");
    s
}

#[tokio::test]
async fn a_byte_then_a_stall_on_a_parked_connection_is_cut_at_the_header_read_timeout() {
    let _one = common::parked::one_at_a_time().await;
    let gw = gateway("header_read_timeout = \"1s\"\nidle_timeout = \"6s\"").await;
    let base = parked(&gw).await;
    let mut s = parked_conn(&gw, base).await;
    let before = rejected(&metrics_text(gw.admin.unwrap()).await, "", "header_timeout");
    let sent = Instant::now();
    s.write_all(b"G").await.unwrap();
    closed_within(&mut s, Duration::from_secs(4)).await.expect("a stalled head outlived its timeout");
    let took = sent.elapsed();
    assert!(took >= Duration::from_millis(990), "cut {took:?} after its first byte");
    let after = rejected(&metrics_text(gw.admin.unwrap()).await, "", "header_timeout");
    assert_eq!(after - before, 1.0, "the cut is a header_timeout");
    assert_eq!(parked(&gw).await, base);
}

#[tokio::test]
async fn a_parked_connection_wakes_to_a_pipelined_burst_and_a_split_body() {
    let _one = common::parked::one_at_a_time().await;
    let gw = gateway("idle_timeout = \"2s\"").await;
    let base = parked(&gw).await;
    let mut s = parked_conn(&gw, base).await;
    s.write_all(&GET.repeat(8)).await.unwrap();
    let got = answers(&mut s, &[false; 8]).await;
    assert!(got.iter().all(|(h, b)| h.starts_with("HTTP/1.1 200") && b == b"ok"), "{got:?}");
    assert_eq!(parked_becomes(&gw, base + 1.0).await, base + 1.0);
    // A body split across the wake (and across reads).
    s.write_all(b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhello").await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    s.write_all(b"world").await.unwrap();
    let got = answers(&mut s, &[false]).await;
    assert_eq!(got[0].1, b"helloworld", "{got:?}");
}

#[tokio::test]
async fn a_parked_connection_wakes_to_an_expect_and_to_an_upgrade_whose_tunnel_never_parks() {
    let _one = common::parked::one_at_a_time().await;
    let gw = gateway("idle_timeout = \"2s\"").await;
    let base = parked(&gw).await;
    let mut s = parked_conn(&gw, base).await;
    s.write_all(b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n").await.unwrap();
    let interim = answers(&mut s, &[false]).await;
    assert!(interim[0].0.starts_with("HTTP/1.1 100"), "{interim:?}");
    s.write_all(b"abcde").await.unwrap();
    let got = answers(&mut s, &[false]).await;
    assert_eq!(got[0].1, b"abcde", "{got:?}");
    assert_eq!(parked_becomes(&gw, base + 1.0).await, base + 1.0);
    s.write_all(b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: echo\r\n\r\n").await.unwrap();
    let head = answers(&mut s, &[true]).await;
    assert!(head[0].0.starts_with("HTTP/1.1 101"), "{head:?}");
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert_eq!(parked(&gw).await, base, "a tunnel parked");
    s.write_all(b"ping").await.unwrap();
    let mut echo = [0u8; 4];
    bounded(s.read_exact(&mut echo)).await.unwrap();
    assert_eq!(&echo, b"ping");
}

#[tokio::test]
async fn a_half_close_or_a_reset_ends_a_parked_connection_and_frees_its_count() {
    let _one = common::parked::one_at_a_time().await;
    let gw = gateway("idle_timeout = \"10s\"").await;
    let base = parked(&gw).await;
    let active = gauge(&gw, "gateway_connections_active").await;
    let mut s = parked_conn(&gw, base).await;
    s.shutdown().await.unwrap();
    closed_within(&mut s, Duration::from_secs(2)).await.expect("a half-closed parked connection stayed open");
    assert_eq!(parked_becomes(&gw, base).await, base);
    let s = parked_conn(&gw, base).await;
    // A reset: SO_LINGER 0, then close.
    let s = s.into_std().unwrap();
    socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO)).unwrap();
    drop(s);
    assert_eq!(parked_becomes(&gw, base).await, base, "a reset parked connection stayed counted");
    assert_eq!(gauge_becomes(&gw, "gateway_connections_active", active).await, active);
}

#[tokio::test]
async fn many_connections_park_and_wake_in_rounds_and_leave_nothing_behind() {
    let _one = common::parked::one_at_a_time().await;
    const CONNS: usize = 200;
    // Room for exactly the connections: a slot a parked or closed one kept
    // would leave one of them unserved.
    let gw = gateway(&format!("idle_timeout = \"2s\"\nmax_connections = {CONNS}")).await;
    let base = parked(&gw).await;
    let active = gauge(&gw, "gateway_connections_active").await;
    let mut conns = Vec::new();
    for round in 0..3 {
        conns = match round {
            0 => served_many(&gw, CONNS).await,
            _ => serve_each(conns).await,
        };
        let now = parked_becomes(&gw, base + CONNS as f64).await;
        assert_eq!(now, base + CONNS as f64, "round {round}");
    }
    assert_eq!(gauge(&gw, "gateway_connections_active").await, active + CONNS as f64);
    drop(conns);
    assert_eq!(parked_becomes(&gw, base).await, base);
    assert_eq!(gauge_becomes(&gw, "gateway_connections_active", active).await, active);
    // Every slot is free again.
    let mut again = Vec::new();
    for _ in 0..CONNS {
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(GET).await.unwrap();
        again.push(s);
    }
    for s in &mut again {
        assert_eq!(answers(s, &[false]).await[0].1, b"ok");
    }
}

#[tokio::test]
async fn parked_connections_hold_their_slots_and_a_closed_one_frees_its_own() {
    let _one = common::parked::one_at_a_time().await;
    let gw = gateway("idle_timeout = \"5s\"\nmax_connections = 2").await;
    let base = parked(&gw).await;
    let first = parked_conn(&gw, base).await;
    let _second = parked_conn(&gw, base + 1.0).await;
    let mut third = TcpStream::connect(gw.addr).await.unwrap();
    third.write_all(GET).await.unwrap();
    let r = read_for(&mut third, Duration::from_millis(600)).await;
    assert!(r.text.is_empty() && !r.closed, "served past the cap of 2: {:?}", r.text);
    drop(first);
    let got = answers(&mut third, &[false]).await;
    assert_eq!(got[0].1, b"ok", "the closed parked connection kept its slot");
    // A parked connection closed at its idle timeout frees its slot too.
    drop(third);
    let mut fourth = TcpStream::connect(gw.addr).await.unwrap();
    served(&mut fourth).await;
    let mut fifth = TcpStream::connect(gw.addr).await.unwrap();
    fifth.write_all(GET).await.unwrap();
    let got = answers(&mut fifth, &[false]).await;
    assert_eq!(got[0].1, b"ok", "the parked connection's idle timeout did not free its slot");
}

#[tokio::test]
async fn a_shutdown_closes_parked_connections_at_once_and_serves_busy_and_begun_ones() {
    let _one = common::parked::one_at_a_time().await;
    let mut gw = gateway("idle_timeout = \"30s\"\nshutdown_timeout = \"8s\"").await;
    let base = parked(&gw).await;
    let mut parked_one = parked_conn(&gw, base).await;
    let mut busy = TcpStream::connect(gw.addr).await.unwrap();
    busy.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut begun = TcpStream::connect(gw.addr).await.unwrap();
    served(&mut begun).await;
    begun.write_all(b"GET /p HTTP/1.1\r\n").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    gw.shutdown();
    let took = closed_within(&mut parked_one, Duration::from_secs(2)).await.expect("a parked connection stayed open");
    assert!(took < Duration::from_millis(700), "closed {took:?} after the shutdown began");
    let got = answers(&mut busy, &[false]).await;
    assert_eq!(got[0].1, b"slow", "the request in flight was not finished");
    begun.write_all(b"Host: x\r\n\r\n").await.unwrap();
    let got = answers(&mut begun, &[false]).await;
    assert_eq!(got[0].1, b"ok", "a head begun before the shutdown was not served");
    tokio::time::timeout(Duration::from_secs(4), &mut gw.task).await.expect("the gateway waited").unwrap();
}

#[tokio::test]
async fn admin_and_http2_connections_never_park_and_keep_serving() {
    let _one = common::parked::one_at_a_time().await;
    let gw = gateway("idle_timeout = \"2s\"").await;
    let base = parked(&gw).await;
    let mut admin = TcpStream::connect(gw.admin.unwrap()).await.unwrap();
    let metrics = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";
    admin.write_all(metrics).await.unwrap();
    answers(&mut admin, &[false]).await;
    let (mut h2, _conn) = common::h2_client(gw.addr).await;
    let get = || http::Request::get(format!("http://{}/p", gw.addr)).body(common::full("")).unwrap();
    assert_eq!(h2.send_request(get()).await.unwrap().status(), 200);
    tokio::time::sleep(Duration::from_millis(1700)).await;
    assert_eq!(parked(&gw).await, base, "an admin or HTTP/2 connection parked");
    admin.write_all(metrics).await.unwrap();
    let got = answers(&mut admin, &[false]).await;
    assert!(got[0].0.starts_with("HTTP/1.1 200"), "{got:?}");
    assert_eq!(h2.send_request(get()).await.unwrap().status(), 200);
}

#[tokio::test]
async fn tls_connections_never_park_and_keep_serving() {
    let _one = common::parked::one_at_a_time().await;
    let pki = common::pki::Pki::new();
    pki.issue("server", &["localhost"], false);
    let (up, _) = common::counting_upstream().await;
    let toml = format!(
        "[server]\nidle_timeout = \"2s\"\n[server.tls]\ncert = \"server.pem\"\nkey = \"server.key\"\n\
         [metrics]\nlisten = \"127.0.0.1:0\"\n\
         [upstreams.p]\nurl = \"http://{}\"\n[[routes]]\nname = \"p\"\nprefix = \"/p\"\nupstream = \"p\"\n",
        up.addr
    );
    let gw = TestGateway::start(common::config(&toml, pki.dir.path())).await;
    let base = parked(&gw).await;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(pki.roots())
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = TcpStream::connect(gw.addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)).connect(name, tcp).await.unwrap();
    tls_served(&mut tls).await;
    tokio::time::sleep(Duration::from_millis(1700)).await;
    assert_eq!(parked(&gw).await, base, "a TLS connection parked");
    tls_served(&mut tls).await;
}

async fn tls_served(tls: &mut tokio_rustls::client::TlsStream<TcpStream>) {
    tls.write_all(GET).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.ends_with(b"ok") {
        let n = bounded(tls.read(&mut buf)).await.unwrap();
        assert!(n > 0, "closed: {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
}

/// Requests that arrive as the listener asks their connections to park
/// (those asked and not yet polled find their socket readable, and keep
/// their task): each is answered. As the first of many connections asked
/// at once have parked, every connection sends its next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_racing_the_ask_to_park_are_all_answered() {
    let _one = common::parked::one_at_a_time().await;
    let gw = gateway("idle_timeout = \"30s\"").await;
    let base = parked(&gw).await;
    let mut conns = served_many(&gw, 1000).await;
    for _ in 0..3 {
        first_parked(base);
        conns = serve_each(conns).await;
    }
    drop(conns);
    assert_eq!(parked_becomes(&gw, base).await, base);
}

/// Waits until a connection has parked (more than `base` parked), watching
/// from outside the runtime's workers, which are busy parking the rest.
fn first_parked(base: f64) {
    let exporter = gateway::metrics::install();
    tokio::task::block_in_place(|| {
        while sample(&exporter.render(), "gateway_connections_parked", &[]).unwrap_or(0.0) <= base {
            std::thread::sleep(Duration::from_micros(200));
        }
    });
}

/// Connections the listener asked to park just as a shutdown begins (their
/// park refused, the listener closing): each goes back to its idle wait and
/// closes, as an idle connection does at a shutdown, instead of waiting for
/// a request until the shutdown timeout. The moment is hit by chance (as
/// the first asked have parked, the shutdown begins; those still to be
/// polled find the listener closing): three gateways, each with many
/// connections asked at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_asked_to_park_as_a_shutdown_begins_close_at_once() {
    let _one = common::parked::one_at_a_time().await;
    for round in 0..3 {
        let mut gw = gateway("idle_timeout = \"30s\"\nshutdown_timeout = \"8s\"").await;
        let conns = served_many(&gw, 1000).await;
        first_parked(sample(&gateway::metrics::install().render(), "gateway_connections_parked", &[]).unwrap_or(0.0));
        gw.shutdown();
        let waits: Vec<_> = conns
            .into_iter()
            .map(|mut s| tokio::spawn(async move { closed_within(&mut s, Duration::from_secs(2)).await.is_none() }))
            .collect();
        let mut open = 0;
        for w in waits {
            open += usize::from(w.await.unwrap());
        }
        assert_eq!(open, 0, "round {round}: connections still open 2 s after the shutdown began");
        tokio::time::timeout(Duration::from_secs(2), &mut gw.task).await.expect("the gateway waited").unwrap();
    }
}

/// Each connection served one more request, all at about the same time.
async fn serve_each(conns: Vec<TcpStream>) -> Vec<TcpStream> {
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut s| {
            tokio::spawn(async move {
                served(&mut s).await;
                s
            })
        })
        .collect();
    let mut served = Vec::new();
    for t in tasks {
        served.push(t.await.expect("a request went unanswered"));
    }
    served
}

/// `n` connections, each served one request at about the same time.
async fn served_many(gw: &TestGateway, n: usize) -> Vec<TcpStream> {
    let mut conns = Vec::new();
    for _ in 0..n {
        conns.push(TcpStream::connect(gw.addr).await.unwrap());
    }
    serve_each(conns).await
}
