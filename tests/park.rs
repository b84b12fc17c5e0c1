//! An own HTTP/1.1 connection idle for `server.park_after` parks: it gives
//! its task up and keeps its socket, its state and the small cell its
//! socket's readiness wakes (`gateway_connections_parked` counts them).
//! Parked, it still serves its next request, closes at its idle timeout
//! and at a shutdown.

mod common;

use std::time::Duration;

use common::{
    TestGateway, TestUpstream, closed_within, counting_upstream, full, metrics_text, proxy_toml, read_responses, sample,
};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const GET: &[u8] = b"GET /p HTTP/1.1\r\nHost: x\r\n\r\n";

async fn parked(gw: &TestGateway) -> f64 {
    sample(&metrics_text(gw.addr).await, "gateway_connections_parked", &[]).unwrap_or(0.0)
}

/// One request answered on `s`; when it was sent (the connection's idle
/// time starts after).
async fn served(s: &mut TcpStream) -> std::time::Instant {
    let sent = std::time::Instant::now();
    s.write_all(GET).await.unwrap();
    let (head, _) = read_responses(s, &[false]).await.remove(0);
    assert!(head.starts_with("HTTP/1.1 200"), "{head:?}");
    sent
}

/// A gateway whose connections park after 300 ms (the listener looks every
/// 150 ms).
async fn gateway(idle: &str) -> TestGateway {
    let (up, _) = counting_upstream().await;
    let server = format!("idle_timeout = \"{idle}\"\npark_after = \"300ms\"");
    let gw = TestGateway::from_toml(&proxy_toml(up.addr, "p", "", &server)).await;
    // The upstream lives as long as the process: the gateway's pool holds it.
    std::mem::forget(up);
    gw
}

#[tokio::test]
async fn a_parked_connection_serves_its_next_requests() {
    let _one = common::parked::one_at_a_time().await;
    let gw = gateway("10s").await;
    let base = parked(&gw).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    for round in 0..3 {
        served(&mut s).await;
        assert_eq!(parked(&gw).await - base, 0.0, "round {round}: parked while just served");
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(parked(&gw).await - base, 1.0, "round {round}: not parked after 600 ms idle");
    }
    // Its next request wakes it, and a request split across the wake is
    // whole.
    s.write_all(b"GET /p HTTP/1.1\r\n").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.write_all(b"Host: x\r\n\r\n").await.unwrap();
    let (head, _) = read_responses(&mut s, &[false]).await.remove(0);
    assert!(head.starts_with("HTTP/1.1 200"), "{head:?}");
    assert_eq!(parked(&gw).await - base, 0.0);
    // A client that closes a parked connection: its end is read, the
    // connection ends, and the count with it.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(parked(&gw).await - base, 1.0);
    drop(s);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(parked(&gw).await - base, 0.0);
}

#[tokio::test]
async fn a_parked_connection_closes_at_its_idle_timeout() {
    let _one = common::parked::one_at_a_time().await;
    let gw = gateway("2s").await;
    let base = parked(&gw).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    let idle_from = served(&mut s).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(parked(&gw).await - base, 1.0, "not parked after 600 ms of a 2 s idle timeout");
    let took = closed_within(&mut s, Duration::from_secs(5)).await.expect("a parked connection never closed");
    let idle = idle_from.elapsed();
    assert!(idle >= Duration::from_millis(1995), "closed after {idle:?} idle ({took:?} after parked)");
    assert_eq!(parked(&gw).await - base, 0.0);
}

/// `park_after = "0s"`: none parks.
#[tokio::test]
async fn park_after_zero_parks_none() {
    let _one = common::parked::one_at_a_time().await;
    let (up, _) = counting_upstream().await;
    let gw = TestGateway::from_toml(&proxy_toml(up.addr, "p", "", "park_after = \"0s\"")).await;
    let base = parked(&gw).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    served(&mut s).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(parked(&gw).await - base, 0.0);
    served(&mut s).await;
}

#[tokio::test]
async fn a_shutdown_closes_parked_connections_at_once() {
    let _one = common::parked::one_at_a_time().await;
    let mut gw = gateway("30s").await;
    let base = parked(&gw).await;
    let mut conns = Vec::new();
    for _ in 0..3 {
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        served(&mut s).await;
        conns.push(s);
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(parked(&gw).await - base, 3.0);
    gw.shutdown();
    for s in &mut conns {
        let took = closed_within(s, Duration::from_secs(3)).await.expect("a parked connection outlived the shutdown");
        assert!(took < Duration::from_secs(2), "closed {took:?} after the shutdown began");
    }
    tokio::time::timeout(Duration::from_secs(5), &mut gw.task).await.expect("the gateway waited").unwrap();
}

/// Waits up to 3 s for `n` more parked connections than `base`.
async fn parked_become(gw: &TestGateway, base: f64, n: f64) {
    for _ in 0..60 {
        if parked(gw).await - base == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("not {n} parked within 3 s (but {})", parked(gw).await - base);
}

/// The listener looks at its parked connections in the order they parked,
/// up to the first still waiting for its idle timeout: a connection parked
/// behind one that woke since (and parked again, behind it) still closes
/// at its idle timeout, and neither closes before its own.
#[tokio::test]
async fn a_connection_parked_behind_one_that_woke_closes_at_its_idle_timeout() {
    let _one = common::parked::one_at_a_time().await;
    let gw = gateway("2s").await;
    let base = parked(&gw).await;
    let mut first = TcpStream::connect(gw.addr).await.unwrap();
    served(&mut first).await;
    parked_become(&gw, base, 1.0).await;
    let mut behind = TcpStream::connect(gw.addr).await.unwrap();
    let behind_idle = served(&mut behind).await;
    parked_become(&gw, base, 2.0).await;
    // The first wakes, and parks again, now behind the other.
    let first_idle = served(&mut first).await;
    parked_become(&gw, base, 2.0).await;
    for (s, idle_from, which) in [(&mut behind, behind_idle, "behind"), (&mut first, first_idle, "woken")] {
        closed_within(s, Duration::from_secs(5)).await.unwrap_or_else(|| panic!("the {which} one never closed"));
        let idle = idle_from.elapsed();
        assert!(idle >= Duration::from_millis(1995), "the {which} one closed after {idle:?} idle");
    }
    assert_eq!(parked(&gw).await - base, 0.0);
}

/// A connection busy when the listener looks (its upstream answers after
/// 500 ms: three looks) is left out of the looks until it waits idle
/// again: it still parks after each answer.
#[tokio::test]
async fn a_connection_busy_across_looks_parks_after_its_answer() {
    let _one = common::parked::one_at_a_time().await;
    let up = TestUpstream::start(|_req: http::Request<hyper::body::Incoming>| async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        http::Response::new(full("ok"))
    })
    .await;
    let server = "idle_timeout = \"10s\"\npark_after = \"300ms\"";
    let gw = TestGateway::from_toml(&proxy_toml(up.addr, "p", "", server)).await;
    std::mem::forget(up);
    let base = parked(&gw).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    for _ in 0..2 {
        served(&mut s).await;
        parked_become(&gw, base, 1.0).await;
    }
    // Closed, and counted so, before the next test reads the gauge.
    drop(s);
    parked_become(&gw, base, 0.0).await;
}
