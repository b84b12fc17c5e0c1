//! Upstreams that answer before they have read a request's body (a 417 to
//! `Expect`, an early 401 or 413), bodiless answers whose `Content-Length`
//! is not a length, and bodies that fail before their first byte: whose
//! answer a client gets, and whether the upstream connection is used again.
//! Each test runs real sockets on 127.0.0.1 against raw upstreams that
//! parse request heads as a careless server does, so that any byte the
//! gateway leaves unread on a pooled connection becomes the next request.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::scripted::{Answer, answer, route_to as gateway, scripted, then};
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

/// An upstream that answers a request head at once, with the answer's
/// body after `pause_ms` (its head reaches the client while the client is
/// still uploading), and never reads a body; it parses whatever follows a
/// head as the next request: one that names `/smuggled` (a body the
/// gateway forwarded after that early answer) is answered `SMUGGLED`, a
/// real `GET /h` `fresh`, and any other bytes `junk` after a second.
async fn early_answering_upstream(status: &str) -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    let early = format!("HTTP/1.1 {status}\r\nContent-Length: 4\r\n\r\n");
    scripted(move |_, _, head| {
        if head.starts_with("POST ") {
            then(answer(early.as_bytes()), 300, b"nope")
        } else if head.contains("/smuggled") {
            answer(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nSMUGGLED")
        } else if head.starts_with("GET /h ") {
            answer(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh")
        } else {
            then(answer(b""), 1000, b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\njunk")
        }
    })
    .await
}

/// Client A's upload, `head` first; the rest, `rest`, once the answer's
/// head has come back. The answer A gets.
async fn upload_after_the_answer(gw: &TestGateway, head: &str, rest: &str) -> Raw {
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    let got = bounded(read_head(&mut s)).await.expect("an answer's head");
    s.write_all(rest.as_bytes()).await.unwrap();
    let mut r = read_for(&mut s, Duration::from_secs(3)).await;
    r.text = String::from_utf8_lossy(&got).into_owned() + &r.text;
    r
}

/// Client A's upload answered early with `status` (an early answering
/// upstream behind a gateway named `name` that streams bodies at once):
/// `head` first, `rest` once the answer's head is back. Then client B's
/// GET, which must get its own answer on a connection of its own.
async fn early_answer_then_another_client(name: &str, status: &str, head: &str, rest: &str) {
    let (addr, accepted) = early_answering_upstream(status).await;
    let gw = gateway(addr, name, "request_buffer = \"0\"").await;
    let a = upload_after_the_answer(&gw, head, rest).await;
    assert_eq!((a.status(), body_of(&a)), (status[..3].parse().unwrap(), "nope"), "{:?}", a.text);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let b = get(&gw).await;
    assert_eq!((b.status(), body_of(&b)), (200, "fresh"), "B got: {:?}", b.text);
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

/// A 413 that arrives while a length-framed upload is still coming, its
/// own body a little later: the upload, written on after the answer,
/// ends before the answer does, and that connection (whose upstream never
/// read the body) must not carry client B's request after it.
#[tokio::test]
async fn a_connection_answered_before_its_upload_ended_is_not_reused() {
    let body = "GET /smuggled HTTP/1.1\r\nX-Ignore: ";
    let head = format!("POST /h HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    early_answer_then_another_client("aconnectionansweredbeforeitsupload", "413 Content Too Large", &head, body).await;
}

/// The same with a 401 to a chunked upload.
#[tokio::test]
async fn a_chunked_upload_answered_401_early_leaves_no_bytes_for_the_next_request() {
    let head = "POST /h HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nfirst\r\n";
    early_answer_then_another_client("achunkeduploadanswered401early", "401 Unauthorized", head, "0\r\n\r\n").await;
}

/// A client that stops sending its body after the upstream answered: the
/// answer reaches it whole, and the connection (its upload unfinished) is
/// not the next request's.
#[tokio::test]
async fn an_upload_the_client_stops_leaves_its_connection_unused() {
    let (addr, accepted) = early_answering_upstream("200 OK").await;
    let gw = gateway(addr, "anuploadtheclientstopsleaves", "request_buffer = \"0\"\nbody_timeout = \"5s\"").await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(b"POST /h HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\nGET /smuggled HTTP/1.1\r\n").await.unwrap();
    let a = read_for(&mut s, Duration::from_secs(1)).await;
    assert_eq!((a.status(), body_of(&a)), (200, "nope"), "{:?}", a.text);
    let b = get(&gw).await;
    assert_eq!((b.status(), body_of(&b)), (200, "fresh"), "B got: {:?}", b.text);
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    drop(s);
}

/// A HEAD answer whose `Content-Length` is no length (RFC 9110 §8.6: a
/// sender must not forward it) is a 502, as the same head to a GET is, and
/// so are a 204's and a 304's; none of their connections is used again.
#[tokio::test]
async fn an_invalid_content_length_on_a_bodiless_answer_is_502() {
    let values = ["abc", "-1", "5, 6", "5\r\nContent-Length: 6", "", "99999999999999999999"];
    for (i, value) in values.into_iter().enumerate() {
        let (addr, accepted) = scripted(move |_, _, head| {
            let status = match head.split(' ').nth(1) {
                _ if head.starts_with("POST ") => return answer(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext"),
                Some("/h/204") => "204 No Content",
                Some("/h/304") => "304 Not Modified",
                _ => "200 OK",
            };
            answer(format!("HTTP/1.1 {status}\r\nContent-Length: {value}\r\n\r\n").as_bytes())
        })
        .await;
        let gw = gateway(addr, &format!("aninvalidcontentlengthonabodiless{i}"), "").await;
        let asked = [("HEAD", "/h"), ("GET", "/h"), ("GET", "/h/204"), ("GET", "/h/304")];
        for (method, path) in asked {
            let req = format!("{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
            let r = raw(gw.addr, req.as_bytes(), Duration::from_secs(3)).await;
            assert_eq!(r.status(), 502, "{method} {path} answered Content-Length: {value:?}: {:?}", r.text);
        }
        let post = b"POST /h HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        let r = raw(gw.addr, post, Duration::from_secs(3)).await;
        assert_eq!((r.status(), body_of(&r)), (200, "next"), "{:?}", r.text);
        assert_eq!(accepted.load(Ordering::SeqCst), 5, "Content-Length: {value:?}: a connection was used again");
    }
}

/// A body whose first bytes, read with the head, are already broken (a
/// chunk-size line that is not one) is a 502 with nothing of the answer
/// sent, not a connection closed without a word.
#[tokio::test]
async fn a_body_broken_before_its_first_byte_is_502() {
    let wires: [&[u8]; 3] = [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\n",
    ];
    for (i, wire) in wires.into_iter().enumerate() {
        let (addr, _) = scripted(move |_, _, _| answer(wire)).await;
        let name = format!("abodybrokenbeforeitsfirstbyte{i}");
        let gw = gateway(addr, &name, "").await;
        let r = get(&gw).await;
        assert_eq!(r.status(), 502, "{:?}: {:?}", String::from_utf8_lossy(wire), r.text);
        let m = metrics_text(gw.addr).await;
        let protocol = sample(&m, "gateway_upstream_errors_total", &[("upstream", &name), ("kind", "protocol")]);
        assert_eq!(protocol, Some(1.0), "{m}");
    }
}

/// A head followed at once by the close, before the body its length
/// promised: a 502 when the close is read with the head, else the head
/// and a cut; never a connection closed with no answer at all.
#[tokio::test]
async fn a_close_before_a_bodys_first_byte_is_never_an_empty_reply() {
    let (addr, _) =
        scripted(|_, _, _| Answer { close: true, ..answer(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n") }).await;
    let gw = gateway(addr, "aclosebeforeabodysfirstbyteisnev", "").await;
    for _ in 0..5 {
        let r = get(&gw).await;
        assert!(r.status() == 502 || r.text.starts_with("HTTP/1.1 200 OK\r\n"), "{:?}", r.text);
    }
}

/// A broken chunk-size line that comes after the head was sent on: the
/// client gets the head and then the cut (as for any body that fails
/// midway), never a connection closed with no answer at all.
#[tokio::test]
async fn a_body_broken_after_a_pause_cuts_an_answer_already_sent() {
    let (addr, _) = scripted(|_, _, _| {
        then(answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"), 200, b"zz\r\nhello\r\n0\r\n\r\n")
    })
    .await;
    let gw = gateway(addr, "abodybrokenafterapausecutsananswe", "").await;
    let r = get(&gw).await;
    assert!(r.text.starts_with("HTTP/1.1 200 OK\r\n") && r.closed, "{:?}", r.text);
    assert!(!r.text.ends_with("0\r\n\r\n"), "a cut body that looks complete: {:?}", r.text);
}
