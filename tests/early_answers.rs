//! Upstreams that answer before they have read a request's body (a 417 to
//! `Expect`): whose answer a client gets, and whether the upstream
//! connection is used again.
//! Each test runs real sockets on 127.0.0.1 against raw upstreams that
//! parse request heads as a careless server does, so that any byte the
//! gateway leaves unread on a pooled connection becomes the next request.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::scripted::route_to as gateway;
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The body of a raw response (what follows its head).
fn body_of(r: &Raw) -> &str {
    r.text.split_once("\r\n\r\n").map_or("", |(_, b)| b)
}

/// A GET of `/h` with `Connection: close`: what came back.
async fn get(gw: &TestGateway) -> Raw {
    raw(gw.addr, b"GET /h HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", Duration::from_secs(3)).await
}

/// An upstream that answers a request carrying `Expect` with 417 at once,
/// without reading its body, and keeps the connection (as servers that
/// take the expectation for a promise that the body will not follow do);
/// it reads the body of any other request (by its `Content-Length`) and
/// answers 200 with the request line as the body. Every head it parsed is
/// kept, in order.
async fn expect_refusing_upstream() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    let addr = raw_upstream(move |mut s| {
        let seen = seen.clone();
        async move {
            let (mut got, mut buf) = (Vec::new(), vec![0u8; 65536]);
            loop {
                let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                    continue;
                };
                let head = String::from_utf8_lossy(&got[..end]).into_owned();
                got.drain(..end + 4);
                seen.lock().unwrap().push(head.clone());
                let lower = head.to_ascii_lowercase();
                let answer = if lower.lines().any(|l| l.starts_with("expect:")) {
                    b"HTTP/1.1 417 Expectation Failed\r\nContent-Length: 0\r\n\r\n".to_vec()
                } else {
                    let length: usize = lower
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    while got.len() < length {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                    got.drain(..length);
                    let line = head.lines().next().unwrap_or("");
                    format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{line}", line.len()).into_bytes()
                };
                if s.write_all(&answer).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    (addr, heads)
}

/// Client A's upload: a request head, then (after the gateway's `100
/// Continue`, when the head asks for one) a body that is the start of
/// another request; the answer A gets.
async fn upload(gw: &TestGateway, version: &str, expect: bool, body: &str) -> Raw {
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    let expect = if expect { "Expect: 100-continue\r\n" } else { "" };
    let head =
        format!("POST /h {version}\r\nHost: t\r\n{expect}Content-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    s.write_all(head.as_bytes()).await.unwrap();
    if !expect.is_empty() && version == "HTTP/1.1" {
        let got = bounded(read_head(&mut s)).await.expect("a 100 Continue");
        assert!(got.starts_with(b"HTTP/1.1 100 Continue\r\n\r\n"), "{:?}", String::from_utf8_lossy(&got));
        assert_eq!(got.len(), 25, "only the interim answer before the body");
    }
    s.write_all(body.as_bytes()).await.unwrap();
    read_for(&mut s, Duration::from_secs(3)).await
}

/// Issue 36's attack: client A's upload with `Expect: 100-continue` is
/// refused by the upstream (417) without its body being read; the body,
/// the start of a request for `/smuggled-by-A`, must never become the
/// request client B's answer comes from. The gateway answers the
/// expectation itself (its `100 Continue` comes before the body) and never
/// sends `Expect` upstream, so the upstream reads the body and answers it.
#[tokio::test]
async fn an_upload_with_expect_never_answers_another_client() {
    let (addr, heads) = expect_refusing_upstream().await;
    let gw = gateway(addr, "anuploadwithexpectneveranswers", "").await;
    for _ in 0..3 {
        let a = upload(&gw, "HTTP/1.1", true, "GET /smuggled-by-A HTTP/1.1\r\nX-Ignore: ").await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let b = get(&gw).await;
        assert_eq!((b.status(), body_of(&b)), (200, "GET /h HTTP/1.1"), "B got: {:?}", b.text);
        assert_eq!((a.status(), body_of(&a)), (200, "POST /h HTTP/1.1"), "A got: {:?}", a.text);
    }
    let heads = heads.lock().unwrap();
    assert!(heads.iter().all(|h| !h.to_ascii_lowercase().contains("\nexpect:")), "Expect sent upstream: {heads:?}");
    assert!(heads.iter().all(|h| !h.contains("/smuggled-by-A")), "a body read as a request: {heads:?}");
}

/// An HTTP/1.0 client's `Expect` is ignored (RFC 9110 §10.1.1): no `100
/// Continue` goes to it, nothing of it goes upstream, and its body is
/// forwarded as any other.
#[tokio::test]
async fn an_http_1_0_clients_expect_is_ignored() {
    let (addr, heads) = expect_refusing_upstream().await;
    let gw = gateway(addr, "anhttp10clientsexpectisignored", "").await;
    let a = upload(&gw, "HTTP/1.0", true, "hello").await;
    assert!(a.text.starts_with("HTTP/1.0 200 OK\r\n") || a.text.starts_with("HTTP/1.1 200 OK\r\n"), "{:?}", a.text);
    assert!(!a.text.contains(" 100 "), "{:?}", a.text);
    assert_eq!(body_of(&a), "POST /h HTTP/1.1");
    let heads = heads.lock().unwrap();
    assert!(heads.iter().all(|h| !h.to_ascii_lowercase().contains("\nexpect:")), "Expect sent upstream: {heads:?}");
}
