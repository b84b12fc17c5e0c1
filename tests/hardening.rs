//! Hostile clients, limits and misbehaving upstreams: each gets the right
//! status within its bound, is counted, is never forwarded when ambiguous, and
//! leaves the gateway serving its healthy routes.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http::{Request, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::test]
async fn hostile_requests_get_4xx_and_are_never_forwarded() {
    let (up, seen) = counting_upstream().await;
    let gw = TestGateway::from_toml(&proxy_toml(up.addr, "hostile", "", "")).await;
    let cases: &[(&str, &[u8], u16)] = &[
        ("malformed request line", b"GET /hostile HTTP/9.9 extra\r\nHost: x\r\n\r\n", 400),
        ("space in header name", b"GET /hostile HTTP/1.1\r\nHost: x\r\nBad Header: 1\r\n\r\n", 400),
        ("control char in header name", b"GET /hostile HTTP/1.1\r\nHost: x\r\nX-\x01: 1\r\n\r\n", 400),
        ("invalid percent-encoding", b"GET /hostile/%zz HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        ("absolute-form target", b"GET http://evil.example/hostile HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        ("CONNECT", b"CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n", 400),
        ("HTTP/1.0 without Host", b"GET /hostile HTTP/1.0\r\n\r\n", 400),
        ("HTTP/1.1 without Host", b"GET /hostile HTTP/1.1\r\n\r\n", 400),
        ("two Host headers", b"GET /hostile HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
        (
            "two Content-Lengths",
            b"POST /hostile HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nabcde",
            400,
        ),
        (
            "obfuscated Transfer-Encoding",
            b"POST /hostile HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\nabcd",
            400,
        ),
        (
            "Transfer-Encoding not ending in chunked",
            b"POST /hostile HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\nabcd",
            400,
        ),
        (
            "space before colon",
            b"POST /hostile HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
            400,
        ),
        ("signed Content-Length", b"POST /hostile HTTP/1.1\r\nHost: x\r\nContent-Length: +4\r\n\r\nabcd", 400),
    ];
    for (what, bytes, status) in cases {
        let r = raw(gw.addr, bytes, Duration::from_secs(5)).await;
        assert_eq!(r.status(), *status, "{what}: {}", r.text);
        assert!(r.closed, "{what}: the connection must be closed after refusing ambiguous input");
    }
    assert_eq!(seen.load(Ordering::SeqCst), 0, "nothing hostile may reach the upstream");
    let m = metrics_text(gw.addr).await;
    // Percent-encoding, absolute-form, no Host (twice), two Hosts; CONNECT's
    // authority-form target matches no route.
    assert_eq!(rejected(&m, "hostile", "bad_request"), 5.0, "{m}");
    assert!(rejected(&m, "unmatched", "bad_request") >= 1.0, "{m}");
    assert!(rejected(&m, "", "malformed") >= 1.0);
    still_serving(&gw).await;
}

/// hyper does not let a request with both Content-Length and
/// Transfer-Encoding reach the service with both: it drops Content-Length,
/// frames the body by Transfer-Encoding alone and closes the connection after
/// the response (RFC 9112 §6.1 allows exactly this). What matters for
/// smuggling is that the upstream never sees the ambiguous pair and that no
/// byte after the chunked body is read as another request.
#[tokio::test]
async fn content_length_with_transfer_encoding_is_reframed_and_the_connection_closed() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    let up = TestUpstream::start(move |req: Request<hyper::body::Incoming>| {
        let s = s.clone();
        async move {
            let has_cl = req.headers().contains_key("content-length");
            let body = http_body_util::BodyExt::collect(req.into_body()).await.unwrap().to_bytes();
            s.lock().unwrap().push((has_cl, body));
            Response::new(full("ok"))
        }
    })
    .await;
    let gw = TestGateway::from_toml(&proxy_toml(up.addr, "clte", "", "")).await;
    // Content-Length claims 4 bytes; the chunked body is "abc"; what follows
    // would be a smuggled request if the framing were read by Content-Length.
    let r = raw(
        gw.addr,
        b"POST /clte HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET /clte/smuggled HTTP/1.1\r\nHost: x\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(r.text.matches("HTTP/1.1").count(), 1, "exactly one response: {}", r.text);
    assert!(r.text.to_ascii_lowercase().contains("connection: close"), "{}", r.text);
    assert!(r.closed);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "the trailing request must not be forwarded");
    assert_eq!(seen[0], (false, Bytes::from_static(b"abc")));
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order() {
    let (up, seen) = counting_upstream().await;
    let gw = TestGateway::from_toml(&proxy_toml(up.addr, "pipe", "", "")).await;
    let r = raw(
        gw.addr,
        b"GET /pipe/1 HTTP/1.1\r\nHost: x\r\n\r\nGET /alive HTTP/1.1\r\nHost: x\r\n\r\nGET /pipe/3 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(r.text.matches("HTTP/1.1 200 OK").count(), 3, "{}", r.text);
    let (first, rest) = r.text.split_once("alive").expect("the second answer is the health route's");
    assert!(first.contains("ok") && rest.contains("ok"), "{}", r.text);
    assert_eq!(seen.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn expect_100_continue_gets_an_interim_response_then_forwards() {
    let (up, _) = counting_upstream().await;
    let gw = TestGateway::from_toml(&proxy_toml(up.addr, "expect", "", "")).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(b"POST /expect HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        .await
        .unwrap();
    let interim = read_for(&mut s, Duration::from_millis(1500)).await;
    assert!(interim.text.starts_with("HTTP/1.1 100 Continue"), "{}", interim.text);
    s.write_all(b"hello").await.unwrap();
    let r = read_for(&mut s, Duration::from_millis(1500)).await;
    assert!(r.text.starts_with("HTTP/1.1 200") && r.text.ends_with("hello"), "{}", r.text);
}

#[tokio::test]
async fn oversized_head_is_431_and_long_target_is_414() {
    let (up, seen) = counting_upstream().await;
    let gw =
        TestGateway::from_toml(&proxy_toml(up.addr, "sizes", "", "max_header_size = \"16KiB\"\nmax_uri_length = 2048"))
            .await;
    let big_header = format!("GET /sizes HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "a".repeat(20_000));
    let r = raw(gw.addr, big_header.as_bytes(), Duration::from_secs(5)).await;
    assert_eq!(r.status(), 431, "{}", r.text);
    assert!(r.closed);
    let long = format!("GET /sizes/{} HTTP/1.1\r\nHost: x\r\n\r\n", "b".repeat(4000));
    let r = raw(gw.addr, long.as_bytes(), Duration::from_secs(1)).await;
    assert_eq!(r.status(), 414, "{}", r.text);
    assert_eq!(seen.load(Ordering::SeqCst), 0);
    let m = metrics_text(gw.addr).await;
    assert_eq!(rejected(&m, "sizes", "uri_too_long"), 1.0);
    assert!(rejected(&m, "", "header_too_large") >= 1.0);
    still_serving(&gw).await;
}

#[tokio::test]
async fn body_limit_is_413_on_declared_or_streamed_length() {
    let (up, seen) = counting_upstream().await;
    let gw = TestGateway::from_toml(&proxy_toml(up.addr, "bodycap", "max_body = \"1KiB\"", "")).await;
    // Declared too large: answered at once, without waiting for the body.
    let started = Instant::now();
    let r =
        raw(gw.addr, b"POST /bodycap HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n", Duration::from_secs(3))
            .await;
    assert_eq!(r.status(), 413, "{}", r.text);
    assert!(r.closed && started.elapsed() < Duration::from_secs(2));
    assert_eq!(seen.load(Ordering::SeqCst), 0);
    // Streamed (chunked) past the limit: cut, 413.
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(b"POST /bodycap HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n").await.unwrap();
    for _ in 0..4 {
        s.write_all(format!("200\r\n{}\r\n", "z".repeat(512)).as_bytes()).await.unwrap();
    }
    let r = read_for(&mut s, Duration::from_secs(3)).await;
    assert_eq!(r.status(), 413, "{}", r.text);
    // Within the limit it passes.
    let (parts, body) = send(Request::post(gw.url("/bodycap")).body(full("x".repeat(1000))).unwrap()).await;
    assert_eq!((parts.status.as_u16(), body.len()), (200, 1000));
    let m = metrics_text(gw.addr).await;
    assert_eq!(rejected(&m, "bodycap", "body_too_large"), 2.0);
    still_serving(&gw).await;
}

#[tokio::test]
async fn max_concurrent_sheds_load_with_503_and_leaves_other_routes_alone() {
    let up = TestUpstream::start(|_req| async {
        tokio::time::sleep(Duration::from_millis(800)).await;
        Response::new(full("slow"))
    })
    .await;
    let gw = TestGateway::from_toml(&proxy_toml(up.addr, "shed", "max_concurrent = 2", "")).await;
    let url = gw.url("/shed");
    let slow: Vec<_> = (0..2).map(|_| tokio::spawn(get_status(url.clone()))).collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    for _ in 0..3 {
        let started = Instant::now();
        let (parts, _) = get(&url).await;
        assert_eq!(parts.status, 503);
        assert_eq!(parts.headers["retry-after"], "1");
        assert!(started.elapsed() < Duration::from_millis(500), "shedding must not queue");
    }
    still_serving(&gw).await;
    for s in slow {
        assert_eq!(s.await.unwrap(), 200);
    }
    // The slots are free again.
    assert_eq!(get(&url).await.0.status, 200);
    let m = metrics_text(gw.addr).await;
    assert_eq!(rejected(&m, "shed", "max_concurrent"), 3.0);
}

async fn get_status(url: String) -> u16 {
    get(&url).await.0.status.as_u16()
}

#[tokio::test]
async fn stalled_request_body_is_cut_with_408() {
    let (up, _) = counting_upstream().await;
    let gw = TestGateway::from_toml(&proxy_toml(up.addr, "stallin", "body_timeout = \"300ms\"", "")).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(b"POST /stallin HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly-some").await.unwrap();
    let started = Instant::now();
    let r = read_for(&mut s, Duration::from_secs(5)).await;
    assert_eq!(r.status(), 408, "{}", r.text);
    assert!(started.elapsed() < Duration::from_millis(300 + 1500), "took {:?}", started.elapsed());
    let m = metrics_text(gw.addr).await;
    assert_eq!(rejected(&m, "stallin", "body_timeout"), 1.0);
    still_serving(&gw).await;
}

#[tokio::test]
async fn stalled_response_body_is_cut_and_counted() {
    let addr = raw_upstream(|mut s| async move {
        let mut buf = [0u8; 4096];
        let _ = s.read(&mut buf).await;
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\npartial").await;
        tokio::time::sleep(Duration::from_secs(30)).await;
    })
    .await;
    let gw = TestGateway::from_toml(&proxy_toml(addr, "stallout", "body_timeout = \"300ms\"", "")).await;
    let started = Instant::now();
    let r = raw(gw.addr, b"GET /stallout HTTP/1.1\r\nHost: x\r\n\r\n", Duration::from_secs(5)).await;
    assert_eq!(r.status(), 200);
    assert!(r.closed, "the cut response must end with the connection closed");
    assert!(r.text.ends_with("partial"), "no more than the upstream sent: {}", r.text);
    assert!(started.elapsed() < Duration::from_millis(300 + 1500));
    let m = metrics_text(gw.addr).await;
    assert_eq!(
        sample(&m, "gateway_upstream_errors_total", &[("upstream", "stallout"), ("kind", "body_timeout")]),
        Some(1.0)
    );
    still_serving(&gw).await;
}

#[tokio::test]
async fn slowloris_is_cut_off_at_the_header_read_timeout() {
    let (up, seen) = counting_upstream().await;
    let gw = TestGateway::from_toml(&proxy_toml(
        up.addr,
        "slowloris",
        "",
        "header_read_timeout = \"300ms\"\nidle_timeout = \"300ms\"",
    ))
    .await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    let started = Instant::now();
    let mut closed = false;
    // One byte every 100 ms: the head never completes.
    for b in b"GET /slowloris HTTP/1.1\r\nHost: x\r\nX-Trickle: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" {
        if s.write_all(&[*b]).await.is_err() {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        if started.elapsed() > Duration::from_secs(3) {
            break;
        }
    }
    if !closed {
        closed = read_for(&mut s, Duration::from_secs(2)).await.closed;
    }
    assert!(closed, "a trickled head must be cut off");
    assert!(started.elapsed() < Duration::from_millis(300 + 2500), "took {:?}", started.elapsed());
    assert_eq!(seen.load(Ordering::SeqCst), 0);
    let m = metrics_text(gw.addr).await;
    let trickled = rejected(&m, "", "header_timeout");
    assert!(trickled >= 1.0, "{m}");

    // A keep-alive connection that simply stays idle is closed at the idle
    // timeout, and that is housekeeping, not a rejection.
    let mut idle = TcpStream::connect(gw.addr).await.unwrap();
    idle.write_all(b"GET /alive HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let r = read_for(&mut idle, Duration::from_secs(3)).await;
    assert!(r.text.starts_with("HTTP/1.1 200") && r.closed, "idle keep-alive must be closed: {}", r.text);
    let m = metrics_text(gw.addr).await;
    assert_eq!(rejected(&m, "", "header_timeout"), trickled, "an idle keep-alive close is not a rejection");
    still_serving(&gw).await;
}

#[tokio::test]
async fn upstream_closing_before_the_head_is_502_reset() {
    let (addr, accepted) = slamming_upstream().await;
    let gw = TestGateway::from_toml(&proxy_toml(addr, "slam", "", "")).await;
    let started = Instant::now();
    let (parts, body) = send(Request::post(gw.url("/slam")).body(full("x")).unwrap()).await;
    assert_eq!(parts.status, 502);
    assert!(body.starts_with(b"bad gateway: upstream closed"), "{body:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    // A GET on a connection that was just opened is not retried either: only
    // a pooled connection can be stale (tests/proxy.rs covers that retry).
    assert_eq!(get(&gw.url("/slam")).await.0.status, 502);
    assert_eq!(accepted.load(Ordering::SeqCst), 2, "a fresh connection's failure must not be retried");
    let m = metrics_text(gw.addr).await;
    assert_eq!(sample(&m, "gateway_upstream_errors_total", &[("upstream", "slam"), ("kind", "reset")]), Some(2.0));
    assert_eq!(sample(&m, "gateway_upstream_retries_total", &[("upstream", "slam")]), Some(0.0));
    still_serving(&gw).await;
}

#[tokio::test]
async fn refused_upstream_fails_within_the_connect_timeout() {
    let addr = refused_addr().await;
    let gw = TestGateway::from_toml(&proxy_toml(addr, "norefuse", "timeout = \"10s\"", "")).await;
    let started = Instant::now();
    assert_eq!(get(&gw.url("/norefuse")).await.0.status, 502);
    assert!(started.elapsed() < Duration::from_secs(1), "took {:?}", started.elapsed());
    still_serving(&gw).await;
}
