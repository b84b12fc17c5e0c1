//! Message framing through the gateway: bodies of unknown length, bodies cut
//! by a vanished client, upstreams that lie about framing or status, request
//! bodies an upstream will not read, trailers both ways, and HTTP/2 → HTTP/1
//! header rules.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An upstream that answers with its view of the request: the method, the
/// body, the `te`, `cookie` and `content-length` headers, and the trailers.
async fn body_echo() -> TestUpstream {
    TestUpstream::start(|req: Request<Incoming>| async move {
        let (parts, body) = req.into_parts();
        let collected = body.collect().await.expect("the whole request body");
        let trailers = collected.trailers().cloned().unwrap_or_default();
        let body = collected.to_bytes();
        let header = |h: &HeaderMap, n: &str| {
            h.get_all(n).iter().map(|v| v.to_str().unwrap().to_owned()).collect::<Vec<_>>().join("|")
        };
        Response::new(full(format!(
            "method={} body={} te={} cookie={} cl={} trailer-x-sum={}",
            parts.method,
            String::from_utf8_lossy(&body),
            header(&parts.headers, "te"),
            header(&parts.headers, "cookie"),
            header(&parts.headers, "content-length"),
            header(&trailers, "x-sum"),
        )))
    })
    .await
}

fn route_toml(up: SocketAddr, name: &str, extra: &str) -> String {
    format!(
        "[upstreams.{name}]\nurl = \"http://{up}\"\n[[routes]]\nname = \"{name}\"\nprefix = \"/{name}\"\nupstream = \"{name}\"\n{extra}\n"
    )
}

/// A body of unknown length (no size hint), as a streaming client sends.
fn streamed(parts: &[&'static str]) -> TestBody {
    let frames = parts.iter().map(|p| Ok::<_, Box<dyn std::error::Error + Send + Sync>>(Frame::data(Bytes::from(*p))));
    StreamBody::new(futures_util::stream::iter(frames.collect::<Vec<_>>())).boxed()
}

#[tokio::test]
async fn get_bodies_of_unknown_length_are_forwarded_not_dropped() {
    let up = body_echo().await;
    let gw = TestGateway::from_toml(&route_toml(up.addr, "getbody", "")).await;
    // HTTP/1.1 chunked GET.
    let r = raw(
        gw.addr,
        b"GET /getbody HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        Duration::from_secs(3),
    )
    .await;
    assert_eq!(r.status(), 200, "{}", r.text);
    assert!(r.text.contains("method=GET body=hello "), "{}", r.text);
    // HTTP/2 GET with DATA frames and no content-length.
    let (mut h2, _conn) = h2_client(gw.addr).await;
    let resp = h2.send_request(Request::get(gw.url("/getbody")).body(streamed(&["wor", "ld"])).unwrap()).await.unwrap();
    let text = String::from_utf8(resp.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    assert!(text.contains("method=GET body=world "), "{text}");
}

/// What an upstream saw of one request body: the bytes after the head, and
/// how the connection ended.
#[derive(Debug, Default, Clone)]
struct Seen {
    body_bytes: usize,
    reset: bool,
    eof: bool,
}

#[tokio::test]
async fn a_client_that_vanishes_after_its_body_never_leaves_a_short_body_that_looks_complete() {
    const LEN: usize = 16 * 1024 * 1024;
    let seen = Arc::new(Mutex::new(Vec::<Seen>::new()));
    let s2 = seen.clone();
    // Reads the head, waits so the client can finish and go, then reads the
    // body slowly to the end or until the connection ends. Never answers.
    let addr = raw_upstream(move |mut s| {
        let seen = s2.clone();
        async move {
            let mut buf = vec![0u8; 65536];
            let mut got = Vec::new();
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            let head_end = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
            let mut view = Seen { body_bytes: got.len() - head_end, ..Seen::default() };
            tokio::time::sleep(Duration::from_millis(500)).await;
            while view.body_bytes < LEN {
                match s.read(&mut buf).await {
                    Ok(0) => {
                        view.eof = true;
                        break;
                    }
                    Err(e) => {
                        view.reset = e.kind() == std::io::ErrorKind::ConnectionReset;
                        break;
                    }
                    Ok(n) => view.body_bytes += n,
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            seen.lock().unwrap().push(view);
        }
    })
    .await;
    let gw = TestGateway::from_toml(&route_toml(addr, "vanish", "max_body = \"64MiB\"\ntimeout = \"30s\"")).await;
    for _ in 0..2 {
        let mut c = TcpStream::connect(gw.addr).await.unwrap();
        c.write_all(format!("POST /vanish HTTP/1.1\r\nHost: x\r\nContent-Length: {LEN}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        c.write_all(&vec![b'z'; LEN]).await.unwrap();
        drop(c);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.lock().unwrap().len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    for view in seen {
        assert!(
            view.body_bytes == LEN || view.reset,
            "the upstream saw {} of {LEN} bytes and a clean close: {view:?}",
            view.body_bytes
        );
    }
}

/// An upstream that answers every request with `response` and counts
/// connections.
async fn canned_upstream(response: &'static [u8]) -> (SocketAddr, Arc<Mutex<usize>>) {
    let accepted = Arc::new(Mutex::new(0));
    let a = accepted.clone();
    let addr = raw_upstream(move |mut s| {
        *a.lock().unwrap() += 1;
        async move {
            let mut buf = vec![0u8; 65536];
            let mut got = Vec::new();
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
                while let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                    got.drain(..end + 4);
                    if s.write_all(response).await.is_err() {
                        return;
                    }
                }
            }
        }
    })
    .await;
    (addr, accepted)
}

#[tokio::test]
async fn an_upstream_response_with_content_length_and_chunked_is_never_truncated() {
    let (addr, accepted) = canned_upstream(
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\na\r\n0123456789\r\n0\r\n\r\n",
    )
    .await;
    let gw = TestGateway::from_toml(&route_toml(addr, "clte", "")).await;
    let mut c = TcpStream::connect(gw.addr).await.unwrap();
    for _ in 0..2 {
        c.write_all(b"GET /clte HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let r = one_response(&mut c).await;
        let lower = r.text.to_ascii_lowercase();
        if r.status() == 200 {
            assert!(!lower.contains("content-length: 5"), "{}", r.text);
            assert!(lower.contains("transfer-encoding: chunked") && r.text.contains("0123456789"), "{}", r.text);
        } else {
            assert_eq!(r.status(), 502, "{}", r.text);
        }
    }
    // A connection whose framing was ambiguous is never reused.
    assert_eq!(*accepted.lock().unwrap(), 2);
}

#[tokio::test]
async fn upstream_statuses_outside_100_to_599_are_502_and_labels_stay_bounded() {
    let (odd, _) = canned_upstream(b"HTTP/1.1 999 Odd\r\nContent-Length: 2\r\n\r\nok").await;
    let (unregistered, _) = canned_upstream(b"HTTP/1.1 299 Fine\r\nContent-Length: 2\r\n\r\nok").await;
    let gw =
        TestGateway::from_toml(&format!("{}{}", route_toml(odd, "odd", ""), route_toml(unregistered, "unreg", "")))
            .await;
    for _ in 0..3 {
        assert_eq!(get(&gw.url("/odd")).await.0.status, 502);
        assert_eq!(get(&gw.url("/unreg")).await.0.status.as_u16(), 299);
    }
    let m = metrics_text(gw.addr).await;
    assert_eq!(sample(&m, "gateway_upstream_errors_total", &[("upstream", "odd"), ("kind", "protocol")]), Some(3.0));
    assert!(!m.contains("status=\"999\""), "{m}");
    assert!(!m.contains("status=\"299\""), "unregistered codes are labelled by class: {m}");
    assert_eq!(
        sample(&m, "http_server_requests_total", &[("route", "unreg"), ("method", "GET"), ("status", "2xx")]),
        Some(3.0)
    );
}

#[tokio::test]
async fn trailers_pass_both_ways_over_http1() {
    // The upstream declares and sends trailers when the request says it
    // accepts them, and reports the request's trailers.
    let up = TestUpstream::start(|req: Request<Incoming>| async move {
        let te = req.headers().get("te").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
        let collected = req.into_body().collect().await.unwrap();
        let got = collected.trailers().and_then(|t| t.get("x-sum")).map(|v| v.to_str().unwrap().to_owned());
        let mut trailers = HeaderMap::new();
        trailers.insert("x-checksum", "c0ffee".parse().unwrap());
        let frames = vec![
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(Frame::data(Bytes::from(format!(
                "te={te} request-trailer={}",
                got.unwrap_or_default()
            )))),
            Ok(Frame::trailers(trailers)),
        ];
        Response::builder()
            .header("trailer", "x-checksum")
            .body(StreamBody::new(futures_util::stream::iter(frames)).boxed())
            .unwrap()
    })
    .await;
    let gw = TestGateway::from_toml(&route_toml(up.addr, "trail", "")).await;
    let r = raw(
        gw.addr,
        b"POST /trail HTTP/1.1\r\nHost: x\r\nTE: trailers, deflate\r\nTrailer: x-sum\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\nx-sum: 42\r\n\r\n",
        Duration::from_secs(3),
    )
    .await;
    assert_eq!(r.status(), 200, "{}", r.text);
    assert!(r.text.contains("te=trailers request-trailer=42"), "{}", r.text);
    let lower = r.text.to_ascii_lowercase();
    assert!(lower.contains("trailer: x-checksum"), "{}", r.text);
    assert!(lower.contains("\r\n0\r\nx-checksum: c0ffee\r\n"), "the response trailer was lost: {}", r.text);
}

#[tokio::test]
async fn http2_cookie_fields_are_joined_for_an_http1_upstream() {
    let up = body_echo().await;
    let gw = TestGateway::from_toml(&route_toml(up.addr, "cookies", "")).await;
    let (mut h2, _conn) = h2_client(gw.addr).await;
    let req = Request::get(gw.url("/cookies"))
        .header("cookie", "a=1")
        .header("cookie", "b=2")
        .body(full(Bytes::new()))
        .unwrap();
    let resp = h2.send_request(req).await.unwrap();
    let text = String::from_utf8(resp.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    assert!(text.contains("cookie=a=1; b=2 "), "{text}");
}

/// An upstream that reads a request head (and a little body), answers it
/// with `early` if given, then reads nothing for `pause`; after that it
/// drains until its connection ends, and counts those ends. A gateway that
/// gave up on the connection during the pause has closed it by then.
async fn stops_reading_upstream(early: Option<&'static [u8]>, pause: Duration) -> (SocketAddr, Arc<Mutex<usize>>) {
    let closed = Arc::new(Mutex::new(0usize));
    let c2 = closed.clone();
    let addr = raw_upstream(move |mut s| {
        let closed = c2.clone();
        async move {
            let mut buf = vec![0u8; 4096];
            let _ = s.read(&mut buf).await;
            if let Some(answer) = early {
                let _ = s.write_all(answer).await;
            }
            tokio::time::sleep(pause).await;
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            *closed.lock().unwrap() += 1;
        }
    })
    .await;
    (addr, closed)
}

/// A 64 MiB upload: far more than the socket buffers hold.
fn big_upload() -> TestBody {
    let chunks = (0..1024)
        .map(|_| Ok::<_, Box<dyn std::error::Error + Send + Sync>>(Frame::data(Bytes::from(vec![b'y'; 65536]))));
    StreamBody::new(futures_util::stream::iter(chunks)).boxed()
}

async fn wait_closed(closed: &Mutex<usize>) {
    let deadline = Instant::now() + Duration::from_secs(8);
    while *closed.lock().unwrap() == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(*closed.lock().unwrap(), 1, "the upstream connection must be closed, not left pinned");
}

#[tokio::test]
async fn an_upstream_that_stops_reading_the_request_body_is_cut_at_the_body_timeout() {
    let (addr, closed) = stops_reading_upstream(None, Duration::from_secs(4)).await;
    let gw = TestGateway::from_toml(&route_toml(
        addr,
        "noreadup",
        "body_timeout = \"300ms\"\ntimeout = \"20s\"\nmax_body = \"256MiB\"",
    ))
    .await;
    let started = Instant::now();
    let resp = client().request(Request::post(gw.url("/noreadup")).body(big_upload()).unwrap()).await;
    let status = resp.map(|r| r.status().as_u16()).unwrap_or(0);
    assert_eq!(status, 504, "the upstream stopped reading: a gateway timeout");
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}, not the body timeout", started.elapsed());
    let m = metrics_text(gw.addr).await;
    assert_eq!(
        sample(&m, "gateway_upstream_errors_total", &[("upstream", "noreadup"), ("kind", "timeout")]),
        Some(1.0)
    );
    wait_closed(&closed).await;
}

#[tokio::test]
async fn an_early_answer_does_not_leave_the_upstream_connection_pinned_by_an_unread_body() {
    let early = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nearly";
    let (addr, closed) = stops_reading_upstream(Some(early), Duration::from_secs(3)).await;
    let gw =
        TestGateway::from_toml(&route_toml(addr, "earlyup", "body_timeout = \"300ms\"\nmax_body = \"256MiB\"")).await;
    let resp = client().request(Request::post(gw.url("/earlyup")).body(big_upload()).unwrap()).await.unwrap();
    assert_eq!(resp.status(), 200);
    drop(resp);
    wait_closed(&closed).await;
}

#[tokio::test]
async fn an_http2_upload_reset_by_the_client_never_looks_complete_upstream() {
    // Records everything it receives on each connection and how it ended.
    let seen = Arc::new(Mutex::new(Vec::<(Vec<u8>, bool)>::new()));
    let s2 = seen.clone();
    let addr = raw_upstream(move |mut s| {
        let seen = s2.clone();
        async move {
            let mut buf = vec![0u8; 65536];
            let mut got = Vec::new();
            let reset = loop {
                match s.read(&mut buf).await {
                    Ok(0) => break false,
                    Err(_) => break true,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            };
            seen.lock().unwrap().push((got, reset));
        }
    })
    .await;
    // Streamed, not read ahead: what the upstream sees of a cut upload.
    let gw = TestGateway::from_toml(&route_toml(addr, "h2reset", "timeout = \"10s\"\nrequest_buffer = \"0\"")).await;
    for reason in [h2::Reason::NO_ERROR, h2::Reason::CANCEL] {
        let (mut client, _ping) = raw_h2(gw.addr, 65535).await;
        let req = Request::post(gw.url("/h2reset")).body(()).unwrap();
        let (_resp, mut upload) = client.send_request(req, false).unwrap();
        upload.send_data(Bytes::from_static(b"partial-body"), false).unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        upload.send_reset(reason);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while seen.lock().unwrap().len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "both uploads reached the upstream and ended");
    for (bytes, reset) in seen {
        let text = String::from_utf8_lossy(&bytes).into_owned();
        assert!(text.contains("partial-body"), "{text}");
        assert!(!text.ends_with("\r\n0\r\n\r\n"), "an aborted upload was completed with the last chunk:\n{text}");
        assert!(reset, "the upstream connection must be reset, not closed cleanly:\n{text}");
    }
}

#[tokio::test]
async fn an_unsolicited_101_from_the_upstream_is_502() {
    let (addr, _) =
        canned_upstream(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n").await;
    let gw = TestGateway::from_toml(&route_toml(addr, "switch", "")).await;
    let mut c = TcpStream::connect(gw.addr).await.unwrap();
    c.write_all(b"GET /switch HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let r = one_response(&mut c).await;
    assert_eq!(r.status(), 502, "{}", r.text);
    // The client's connection is still usable.
    c.write_all(b"GET /switch HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    assert_eq!(one_response(&mut c).await.status(), 502);
    let (mut h2, _conn) = h2_client(gw.addr).await;
    let resp = h2.send_request(Request::get(gw.url("/switch")).body(full(Bytes::new())).unwrap()).await.unwrap();
    assert_eq!(resp.status(), 502);
}

#[tokio::test]
async fn a_pooled_connection_poisoned_by_a_bad_head_response_is_retried() {
    // Answers HEAD with a body it must not send (RFC 9110 §9.3.2), a moment
    // late, so that a reused connection reads it as the start of the next
    // response.
    let addr = raw_upstream(|mut s| async move {
        let mut buf = vec![0u8; 65536];
        let mut got = Vec::new();
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
            while let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                let head: Vec<u8> = got.drain(..end + 4).collect();
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n").await;
                if head.starts_with(b"HEAD") {
                    tokio::time::sleep(Duration::from_millis(30)).await;
                }
                let _ = s.write_all(b"hello").await;
            }
        }
    })
    .await;
    let gw = TestGateway::from_toml(&route_toml(addr, "poison", "")).await;
    let head = send(Request::head(gw.url("/poison")).body(full(Bytes::new())).unwrap()).await;
    assert_eq!(head.0.status, 200);
    let (parts, body) = get(&gw.url("/poison")).await;
    assert_eq!((parts.status.as_u16(), &body[..]), (200, &b"hello"[..]));
}
