//! A client that leaves mid-upload (its connection closed, or its HTTP/2
//! stream cancelled) is counted and logged as 499, as one that leaves while
//! its answer is awaited (docs/operations.md), not as the 400 of a body
//! HTTP does not frame; on both HTTP/1.1 connections, with the body read
//! ahead (within `request_buffer`) or streamed to the upstream.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{TestGateway, TestUpstream, full, metrics_text, proxy_toml, sample};
use http::{Request, Response};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `http_server_requests_total` of `route` with `status`.
fn count(text: &str, route: &str, status: &str) -> f64 {
    sample(text, "http_server_requests_total", &[("route", route), ("status", status)]).unwrap_or(0.0)
}

/// An upstream that reads the whole body before it answers.
async fn reading_upstream() -> TestUpstream {
    TestUpstream::start(|req: Request<hyper::body::Incoming>| async move {
        let _ = req.into_body().collect().await;
        Response::new(full("read"))
    })
    .await
}

/// Waits (5 s at most) until `route` has counted a request with `status`;
/// returns the text of `/metrics` then.
async fn counted(gw: &TestGateway, route: &str, status: &str) -> String {
    for _ in 0..250 {
        let text = metrics_text(gw.addr).await;
        if count(&text, route, status) >= 1.0 {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    metrics_text(gw.addr).await
}

#[tokio::test]
async fn a_client_that_leaves_mid_upload_is_a_499() {
    let up = reading_upstream().await;
    for http1 in ["gateway", "hyper"] {
        // 1000 bytes are read ahead; 1 MiB is past request_buffer and streams.
        for (how, length) in [("ahead", 1000), ("streamed", 1 << 20)] {
            let route = format!("left_{how}_{http1}");
            let toml = proxy_toml(up.addr, &route, "", &format!("http1 = \"{http1}\""));
            let gw = TestGateway::from_toml(&toml).await;
            let mut s = TcpStream::connect(gw.addr).await.unwrap();
            let head = format!("POST /{route}/x HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n0123456789");
            s.write_all(head.as_bytes()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
            drop(s);
            let text = counted(&gw, &route, "499").await;
            assert_eq!(count(&text, &route, "499"), 1.0, "{route}");
            assert_eq!(count(&text, &route, "400"), 0.0, "{route}: counted as a bad request");
        }
    }
}

/// A body HTTP does not frame is still the client's 400.
#[tokio::test]
async fn a_malformed_body_is_still_a_400() {
    let up = reading_upstream().await;
    for http1 in ["gateway", "hyper"] {
        let route = format!("malformed_{http1}");
        let gw = TestGateway::from_toml(&proxy_toml(up.addr, &route, "", &format!("http1 = \"{http1}\""))).await;
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        let head = format!("POST /{route}/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n");
        s.write_all(head.as_bytes()).await.unwrap();
        let mut answer = vec![0u8; 64];
        let n = common::bounded(s.read(&mut answer)).await.unwrap();
        assert!(answer[..n].starts_with(b"HTTP/1.1 400"), "{route}: {:?}", String::from_utf8_lossy(&answer[..n]));
        let text = counted(&gw, &route, "400").await;
        assert_eq!((count(&text, &route, "400"), count(&text, &route, "499")), (1.0, 0.0), "{route}");
    }
}

/// An HTTP/2 client that cancels its stream mid-upload left too.
#[tokio::test]
async fn an_http2_stream_cancelled_mid_upload_is_a_499() {
    let up = reading_upstream().await;
    let route = "left_h2";
    let gw = TestGateway::from_toml(&proxy_toml(up.addr, route, "", "")).await;
    let (mut client, _ping) = common::raw_h2(gw.addr, 65_535).await;
    let req = Request::post(format!("http://x/{route}/x")).header("content-length", "1000").body(()).unwrap();
    let (_answer, mut body) = client.send_request(req, false).unwrap();
    body.send_data(Bytes::from_static(b"0123456789"), false).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    body.send_reset(h2::Reason::CANCEL);
    let text = counted(&gw, route, "499").await;
    assert_eq!((count(&text, route, "499"), count(&text, route, "400")), (1.0, 0.0));
}
