//! A hostile client against the HTTP/1 listener: raw sockets on loopback,
//! each test bounded in time. Every case checks the status, whether the
//! connection is closed, what reached the upstream (byte for byte, from a
//! raw upstream that records heads) and that the gateway keeps serving.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

type Seen = Arc<Mutex<Vec<(Vec<u8>, Vec<u8>)>>>;

/// An upstream that records every request (head, Content-Length body) and
/// answers after `delay` with `200` and a body of `size` bytes (`ok` for 0).
async fn recording_upstream(delay: Duration, size: usize) -> (SocketAddr, Seen) {
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let addr = raw_upstream(move |mut s: TcpStream| {
        let log = log.clone();
        async move {
            let mut got = Vec::new();
            let mut buf = vec![0u8; 65536];
            loop {
                while let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head: Vec<u8> = got[..end + 4].to_vec();
                    let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
                    let length = text
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length: ").map(|v| v.trim().parse::<usize>().unwrap()))
                        .unwrap_or(0);
                    while got.len() < end + 4 + length {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                    let body = got[end + 4..end + 4 + length].to_vec();
                    got.drain(..end + 4 + length);
                    log.lock().unwrap().push((head, body));
                    tokio::time::sleep(delay).await;
                    let payload = if size == 0 { b"ok".to_vec() } else { vec![b'z'; size] };
                    let mut answer =
                        format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", payload.len()).into_bytes();
                    if !text.starts_with("head ") {
                        answer.extend_from_slice(&payload);
                    }
                    if s.write_all(&answer).await.is_err() {
                        return;
                    }
                }
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
        }
    })
    .await;
    (addr, seen)
}

fn request_lines(seen: &Seen) -> Vec<String> {
    seen.lock().unwrap().iter().map(|(h, _)| request_line(h)).collect()
}

fn field(head: &[u8], name: &str) -> Vec<Vec<u8>> {
    let prefix = format!("{name}: ").into_bytes();
    field_lines(head).into_iter().filter_map(|l| l.strip_prefix(prefix.as_slice()).map(<[u8]>::to_vec)).collect()
}

/// RFC 9112 §3.2: "A server MUST respond with a 400 (Bad Request) status
/// code to any HTTP/1.1 request message that ... contains ... a Host header
/// field with an invalid field value." Host = uri-host [ ":" port ]
/// (RFC 9110 §7.2): no userinfo, no path, no spaces, no second port, a
/// port of digits only, brackets only around an IP literal: the shape is
/// checked, not only the bytes.
#[tokio::test]
async fn a_host_with_userinfo_a_path_or_junk_is_400_and_never_forwarded() {
    bounded(async {
        let (up, seen) = recording_upstream(Duration::ZERO, 0).await;
        let gw = TestGateway::from_toml(&proxy_toml(up, "d", "", "")).await;
        let mut wrong = Vec::new();
        // A percent-encoded name would choose an any-host route while an
        // upstream that decodes it reads a host a `hosts` route guards.
        let hosts =
            ["user:pw@evil.example", "evil.example/x", "a b", "h?x", "h:80:80", "h:port", "[::1", "::1", "h]:80"];
        for host in hosts.into_iter().chain(["%61dmin.example", "admin%2Eexample", "[::1%25lo]"]) {
            let req = format!("GET /d/h HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
            let r = raw(gw.addr, req.as_bytes(), Duration::from_secs(2)).await;
            if r.status() != 400 {
                wrong.push((host, r.status()));
            }
        }
        let forwarded: Vec<Vec<Vec<u8>>> = seen.lock().unwrap().iter().map(|(h, _)| field(h, "host")).collect();
        let forwarded: Vec<String> =
            forwarded.iter().flatten().map(|v| String::from_utf8_lossy(v).into_owned()).collect();
        assert_eq!(wrong, vec![], "invalid Hosts not refused with 400; forwarded upstream as {forwarded:?}");
        still_serving(&gw).await;
    })
    .await;
}

/// A head may carry up to 100 fields (hyper's count, as documented beside
/// `max_header_size`), however small: the 100th is served, a 101st is 431.
#[tokio::test]
async fn a_head_of_100_fields_is_served_and_101_is_431() {
    bounded(async {
        let (up, seen) = recording_upstream(Duration::ZERO, 0).await;
        let gw = TestGateway::from_toml(&proxy_toml(up, "d", "", "")).await;
        let head_of = |fields: usize| {
            let mut req = b"GET /d/many HTTP/1.1\r\nHost: h\r\nConnection: close\r\n".to_vec();
            for i in 0..fields - 2 {
                req.extend_from_slice(format!("x-{i}: \r\n").as_bytes());
            }
            req.extend_from_slice(b"\r\n");
            req
        };
        let r = raw(gw.addr, &head_of(100), Duration::from_secs(2)).await;
        assert_eq!(r.status(), 200, "100 fields: {}", r.text.lines().next().unwrap_or(""));
        assert_eq!(field(&seen.lock().unwrap()[0].0, "x-97"), vec![Vec::<u8>::new()], "empty values are forwarded");
        let r = raw(gw.addr, &head_of(101), Duration::from_secs(2)).await;
        assert_eq!(r.status(), 431, "101 fields: {}", r.text.lines().next().unwrap_or(""));
        assert_eq!(seen.lock().unwrap().len(), 1, "the refused head was not forwarded");
        still_serving(&gw).await;
    })
    .await;
}

/// A head of exactly max_header_size is served; one byte more is 431 and
/// the connection closed; a single 60 KiB value under the 64 KiB default
/// arrives whole.
#[tokio::test]
async fn heads_at_max_header_size_and_one_over() {
    bounded(async {
        let (up, seen) = recording_upstream(Duration::ZERO, 0).await;
        let gw = TestGateway::from_toml(&proxy_toml(up, "d", "", "max_header_size = \"8KiB\"")).await;
        let head_of = |total: usize| {
            let start = "GET /d/max HTTP/1.1\r\nHost: h\r\nX-Pad: ";
            let end = "\r\nConnection: close\r\n\r\n";
            let pad = total - start.len() - end.len();
            format!("{start}{}{end}", "p".repeat(pad))
        };
        let exact = head_of(8192);
        assert_eq!(exact.len(), 8192);
        let r = raw(gw.addr, exact.as_bytes(), Duration::from_secs(2)).await;
        assert_eq!(r.status(), 200, "exactly max_header_size: {}", r.text.lines().next().unwrap_or(""));
        let over = head_of(8193);
        let r = raw(gw.addr, over.as_bytes(), Duration::from_secs(2)).await;
        assert_eq!(r.status(), 431, "one byte over: {}", r.text.lines().next().unwrap_or(""));
        assert!(r.closed);
        assert_eq!(seen.lock().unwrap().len(), 1);
        still_serving(&gw).await;

        // The default 64 KiB: one 60 KiB value, then a small request on the
        // same connection (the copy block is reused after a large head).
        let (up, seen) = recording_upstream(Duration::ZERO, 0).await;
        let gw = TestGateway::from_toml(&proxy_toml(up, "d", "", "")).await;
        let big: Vec<u8> = (0..60 * 1024).map(|i| b'a' + (i % 26) as u8).collect();
        let mut req = b"GET /d/big HTTP/1.1\r\nHost: h\r\nX-Big: ".to_vec();
        req.extend_from_slice(&big);
        req.extend_from_slice(b"\r\n\r\nGET /d/after HTTP/1.1\r\nHost: h\r\nX-After: tail\r\n\r\n");
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(&req).await.unwrap();
        let got = read_responses(&mut s, &[false, false]).await;
        assert!(got.iter().all(|(h, _)| h.starts_with("HTTP/1.1 200")), "{got:?}");
        let seen = seen.lock().unwrap();
        assert_eq!(field(&seen[0].0, "x-big"), vec![big]);
        assert_eq!(field(&seen[1].0, "x-after"), vec![b"tail".to_vec()]);
    })
    .await;
}

/// Values sized so that their copies cross the per-thread 4 KiB block at
/// every possible spot (src/listener/detach.rs), pipelined on one
/// connection and spread over two: each reaches the upstream intact.
#[tokio::test]
async fn values_straddling_the_copy_block_arrive_intact() {
    bounded(async {
        let (up, seen) = recording_upstream(Duration::ZERO, 0).await;
        let gw = TestGateway::from_toml(&proxy_toml(up, "d", "", "")).await;
        let sizes = [1usize, 1000, 3000, 95, 4095, 4096, 4097, 0, 2048, 2047, 4000, 120];
        let value = |i: usize, n: usize| -> Vec<u8> { (0..n).map(|k| b'A' + ((i + k) % 26) as u8).collect() };
        let mut a = TcpStream::connect(gw.addr).await.unwrap();
        let mut b = TcpStream::connect(gw.addr).await.unwrap();
        for (i, n) in sizes.iter().enumerate() {
            let mut req = format!("GET /d/{i} HTTP/1.1\r\nHost: h\r\nX-V: ").into_bytes();
            req.extend_from_slice(&value(i, *n));
            req.extend_from_slice(format!("\r\nX-I: {i}\r\n\r\n").as_bytes());
            let s = if i % 3 == 0 { &mut b } else { &mut a };
            s.write_all(&req).await.unwrap();
        }
        let on_a = sizes.len() - sizes.len().div_ceil(3);
        let got_a = read_responses(&mut a, &vec![false; on_a]).await;
        let got_b = read_responses(&mut b, &vec![false; sizes.len() - on_a]).await;
        assert!(got_a.iter().chain(&got_b).all(|(h, _)| h.starts_with("HTTP/1.1 200")));
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), sizes.len());
        for (head, _) in seen.iter() {
            let i: usize = String::from_utf8(field(head, "x-i").pop().unwrap()).unwrap().parse().unwrap();
            assert_eq!(request_line(head), format!("GET /d/{i} HTTP/1.1"));
            assert_eq!(field(head, "x-v"), vec![value(i, sizes[i])], "request {i}");
        }
    })
    .await;
}

/// A client that sends the first bytes of its next head while a slow
/// bodiless request is in flight, then stops, is cut at the header timeout
/// once that request is answered, not held for the idle timeout. (Bytes of
/// the next head that come in the same read as the request's own head, or
/// behind a request body, cannot be told apart from it by hyper's
/// connection: the idle timeout bounds those; the own connection's case is
/// in `tests/h1_idle_busy.rs`.)
#[tokio::test]
async fn a_partial_head_sent_while_a_request_is_in_flight_is_cut_at_the_header_timeout() {
    bounded(async {
        let (up, _) = recording_upstream(Duration::from_millis(500), 0).await;
        let gw =
            TestGateway::from_toml(&proxy_toml(up, "d", "", "header_read_timeout = \"300ms\"\nidle_timeout = \"6s\""))
                .await;
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(b"GET /d/slow HTTP/1.1\r\nHost: h\r\n\r\n").await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        s.write_all(b"GET /d/next HTTP/1.1\r\nHo").await.unwrap();
        let got = read_responses(&mut s, &[false]).await;
        assert!(got[0].0.starts_with("HTTP/1.1 200"), "{got:?}");
        let took = closed_within(&mut s, Duration::from_secs(8)).await.expect("never closed");
        assert!(took < Duration::from_millis(300 + 2000), "a half-sent head was held open for {took:?}");
    })
    .await;
}

/// RFC 9112 §9.6: a server that receives "close" MUST initiate a close
/// after its response and MUST NOT process further requests on it.
#[tokio::test]
async fn nothing_after_connection_close_is_processed() {
    bounded(async {
        let (up, seen) = recording_upstream(Duration::ZERO, 0).await;
        let gw = TestGateway::from_toml(&proxy_toml(up, "d", "", "")).await;
        let r = raw(
            gw.addr,
            b"GET /d/1 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\nGET /d/2 HTTP/1.1\r\nHost: h\r\n\r\nPOST /d/3 HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n",
            Duration::from_secs(2),
        )
        .await;
        assert_eq!(r.text.matches("HTTP/1.1 ").count(), 1, "{}", r.text);
        assert!(r.closed);
        // HTTP/1.0 without keep-alive: the same.
        let r = raw(gw.addr, b"GET /d/4 HTTP/1.0\r\nHost: h\r\n\r\nGET /d/5 HTTP/1.0\r\nHost: h\r\n\r\n", Duration::from_secs(2))
            .await;
        assert_eq!(r.text.matches("HTTP/1.").count(), 1, "{}", r.text);
        assert!(r.closed);
        assert_eq!(request_lines(&seen), vec!["GET /d/1 HTTP/1.1", "GET /d/4 HTTP/1.1"]);
    })
    .await;
}

/// A GET with a Content-Length body whose bytes look like a request: the
/// body is framed by its length and forwarded as a body; the pipelined
/// request after it is the second request, exactly once.
#[tokio::test]
async fn a_body_on_get_is_framed_and_not_a_smuggled_request() {
    bounded(async {
        let (up, seen) = recording_upstream(Duration::ZERO, 0).await;
        let gw = TestGateway::from_toml(&proxy_toml(up, "d", "", "")).await;
        let inner = b"GET /d/smuggled HTTP/1.1\r\nHost: h\r\n\r\n";
        let mut req = format!("GET /d/1 HTTP/1.1\r\nHost: h\r\nContent-Length: {}\r\n\r\n", inner.len()).into_bytes();
        req.extend_from_slice(inner);
        req.extend_from_slice(b"GET /d/2 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n");
        let r = raw(gw.addr, &req, Duration::from_secs(2)).await;
        assert_eq!(r.text.matches("HTTP/1.1 200").count(), 2, "{}", r.text);
        let seen = seen.lock().unwrap();
        let lines: Vec<String> = seen.iter().map(|(h, _)| request_line(h)).collect();
        assert_eq!(lines, vec!["GET /d/1 HTTP/1.1", "GET /d/2 HTTP/1.1"]);
        assert_eq!(seen[0].1, inner.to_vec(), "the body goes upstream as a body");
    })
    .await;
}

/// Pipelining while an earlier, large answer is still being written: the
/// next head dribbles in byte by byte; both answers arrive whole, in order.
#[tokio::test]
async fn a_head_dribbled_byte_by_byte_behind_a_large_answer() {
    bounded(async {
        let (up, seen) = recording_upstream(Duration::from_millis(50), 512 * 1024).await;
        let gw = TestGateway::from_toml(&proxy_toml(up, "d", "", "")).await;
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(b"GET /d/big HTTP/1.1\r\nHost: h\r\n\r\n").await.unwrap();
        // Read a little of the first answer, so it is mid-write.
        let mut first = [0u8; 1024];
        let n = s.read(&mut first).await.unwrap();
        assert!(n > 0 && first.starts_with(b"HTTP/1.1 200"));
        for b in b"HEAD /d/second HTTP/1.1\r\nHost: h\r\nX-Drip: 1\r\n\r\n" {
            s.write_all(&[*b]).await.unwrap();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let mut rest = Vec::from(&first[..n]);
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut buf = vec![0u8; 65536];
        while rest.windows(4).filter(|w| *w == b"\r\n\r\n").count() < 2 {
            assert!(Instant::now() < deadline, "the second answer never came");
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed early");
            rest.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&rest);
        let body_end = rest.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4 + 512 * 1024;
        assert!(rest[body_end..].starts_with(b"HTTP/1.1 200"), "second answer right after the first's body");
        assert!(rest[..body_end].iter().skip(text.find("\r\n\r\n").unwrap() + 4).all(|b| *b == b'z'));
        let lines = request_lines(&seen);
        assert_eq!(lines, vec!["GET /d/big HTTP/1.1", "HEAD /d/second HTTP/1.1"]);
        assert_eq!(field(&seen.lock().unwrap()[1].0, "x-drip"), vec![b"1".to_vec()]);
    })
    .await;
}

/// A client that pipelines 1000 requests without reading: the gateway
/// stays responsive for others, and the client later gets all 1000
/// answers, in order.
#[tokio::test]
async fn a_thousand_pipelined_requests_never_read_until_the_end() {
    bounded(async {
        let (up, _) = recording_upstream(Duration::ZERO, 0).await;
        let gw = TestGateway::from_toml(&proxy_toml(up, "d", "", "")).await;
        let s = TcpStream::connect(gw.addr).await.unwrap();
        let (mut rd, mut wr) = s.into_split();
        let mut all = Vec::new();
        for i in 0..1000 {
            all.extend_from_slice(format!("GET /alive?{i} HTTP/1.1\r\nHost: h\r\n\r\n").as_bytes());
        }
        let writer = tokio::spawn(async move {
            wr.write_all(&all).await.unwrap();
            wr
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        still_serving(&gw).await;
        let _wr = writer.await.unwrap();
        let mut got = Vec::new();
        let mut buf = vec![0u8; 65536];
        while got.windows(5).filter(|w| *w == b"alive").count() < 1000 {
            let n = tokio::time::timeout(Duration::from_secs(3), rd.read(&mut buf))
                .await
                .expect("answers stalled")
                .unwrap();
            assert!(n > 0, "closed after {} answers", String::from_utf8_lossy(&got).matches("HTTP/1.1 200").count());
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(String::from_utf8_lossy(&got).matches("HTTP/1.1 200 OK").count(), 1000);
    })
    .await;
}

/// Bytes a head must not carry (RFC 9112 §2.2 bare CR, §5.2 obs-fold;
/// RFC 9110 §5.5 NUL; §5.1 a field name is a token; RFC 9112 §6.1
/// Transfer-Encoding in HTTP/1.0): 400, closed, never forwarded. Bare LF
/// line endings (RFC 9112 §2.2 MAY) are read and forwarded as CRLF.
#[tokio::test]
async fn forbidden_bytes_in_a_head_are_400_and_bare_lf_is_normalised() {
    bounded(async {
        let (up, seen) = recording_upstream(Duration::ZERO, 0).await;
        let gw = TestGateway::from_toml(&proxy_toml(up, "d", "", "")).await;
        let cases: &[(&str, &[u8])] = &[
            ("obs-fold", b"GET /d/x HTTP/1.1\r\nHost: h\r\nX-A: a\r\n b\r\n\r\n"),
            ("NUL in a value", b"GET /d/x HTTP/1.1\r\nHost: h\r\nX-A: a\x00b\r\n\r\n"),
            ("bare CR in a value", b"GET /d/x HTTP/1.1\r\nHost: h\r\nX-A: a\rb\r\n\r\n"),
            ("high byte in a name", b"GET /d/x HTTP/1.1\r\nHost: h\r\nX-\xe9: a\r\n\r\n"),
            ("empty name", b"GET /d/x HTTP/1.1\r\nHost: h\r\n: a\r\n\r\n"),
            ("HTTP/1.0 chunked", b"POST /d/x HTTP/1.0\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
            ("NUL in the target", b"GET /d/x\x00y HTTP/1.1\r\nHost: h\r\n\r\n"),
            ("space in the target", b"GET /d/x y HTTP/1.1\r\nHost: h\r\n\r\n"),
        ];
        for (what, bytes) in cases {
            let r = raw(gw.addr, bytes, Duration::from_secs(2)).await;
            assert_eq!(r.status(), 400, "{what}: {:?}", r.text.lines().next());
            assert!(r.closed, "{what}: closed");
        }
        assert_eq!(request_lines(&seen), Vec::<String>::new());
        let r = raw(
            gw.addr,
            b"GET /d/lf HTTP/1.1\nHost: h\nX-Under_Score: u\nConnection: close\n\n",
            Duration::from_secs(2),
        )
        .await;
        assert_eq!(r.status(), 200, "{}", r.text);
        let head = {
            let seen = seen.lock().unwrap();
            assert_eq!(seen.len(), 1);
            seen[0].0.clone()
        };
        assert!(!head.windows(2).any(|w| w[1] == b'\n' && w[0] != b'\r'), "CRLF upstream: {head:?}");
        assert_eq!(field(&head, "x-under_score"), vec![b"u".to_vec()]);
        still_serving(&gw).await;
    })
    .await;
}

/// max_uri_length: a target of exactly the limit is served, one byte more
/// is 414 (RFC 9110 §15.5.15), query included; nothing over it forwarded.
#[tokio::test]
async fn targets_at_max_uri_length_and_one_over() {
    bounded(async {
        let (up, seen) = recording_upstream(Duration::ZERO, 0).await;
        let gw = TestGateway::from_toml(&proxy_toml(up, "d", "", "max_uri_length = 64")).await;
        let at = format!("/d/?q={}", "a".repeat(64 - 6));
        let over = format!("{at}b");
        assert_eq!(at.len(), 64);
        let r = raw(
            gw.addr,
            format!("GET {at} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n").as_bytes(),
            Duration::from_secs(2),
        )
        .await;
        assert_eq!(r.status(), 200, "{}", r.text);
        let r = raw(
            gw.addr,
            format!("GET {over} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n").as_bytes(),
            Duration::from_secs(2),
        )
        .await;
        assert_eq!(r.status(), 414, "{}", r.text);
        assert_eq!(request_lines(&seen), vec![format!("GET {at} HTTP/1.1")]);
    })
    .await;
}

/// Dot segments, encoded dots and slashes, NUL and overlong UTF-8 escapes:
/// the upstream sees the normal form (dots removed after decoding, encoded
/// separators and non-unreserved escapes kept encoded, the query untouched).
/// A dot segment an encoded slash makes (`/d/%2F../x`, which an upstream
/// that decodes `%2F` reads as `/x`) is refused, never forwarded.
#[tokio::test]
async fn odd_paths_reach_the_upstream_normalised() {
    bounded(async {
        let (up, seen) = recording_upstream(Duration::ZERO, 0).await;
        let gw = TestGateway::from_toml(&proxy_toml(up, "d", "", "")).await;
        for split in ["/d/%2F../x", "/d/..%2F..%2Fetc"] {
            let sent = format!("GET {split} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n");
            let r = raw(gw.addr, sent.as_bytes(), Duration::from_secs(2)).await;
            assert_eq!(r.status(), 400, "{split}: {}", r.text);
        }
        let cases = [
            ("/d//a/./b/../c", "/d/a/c"),
            ("/d/a/%2e%2E/b", "/d/b"),
            ("/d/a%2Fb/c", "/d/a%2Fb/c"),
            ("/d/%00/%c0%ae%c0%ae/", "/d/%00/%C0%AE%C0%AE/"),
            ("/d/x?a=/../..&b=%2e", "/d/x?a=/../..&b=%2e"),
        ];
        for (sent, _) in cases {
            let r = raw(
                gw.addr,
                format!("GET {sent} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n").as_bytes(),
                Duration::from_secs(2),
            )
            .await;
            assert_eq!(r.status(), 200, "{sent}: {}", r.text);
        }
        let want: Vec<String> = cases.iter().map(|(_, w)| format!("GET {w} HTTP/1.1")).collect();
        assert_eq!(request_lines(&seen), want);
        for climb in ["/d/../../x", "/d/%2e%2e/%2e%2e/x"] {
            let r = raw(
                gw.addr,
                format!("GET {climb} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n").as_bytes(),
                Duration::from_secs(2),
            )
            .await;
            assert_eq!(r.status(), 400, "{climb}");
        }
        assert_eq!(seen.lock().unwrap().len(), cases.len());
    })
    .await;
}
