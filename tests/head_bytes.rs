//! Request heads as they reach the upstream: each HTTP/1 request's target
//! and values are copied out of the connection's read buffer into a block
//! shared by the thread's connections (src/listener/detach.rs), and must
//! arrive byte for byte, in order, never mixed with another request's.
//! Loopback only, each test bounded in time.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An upstream that records every request head's raw bytes and answers
/// `200 ok` (no body to a HEAD), keeping the connection.
async fn recording_upstream() -> (SocketAddr, Arc<Mutex<Vec<Vec<u8>>>>) {
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    let addr = raw_upstream(move |mut s: TcpStream| {
        let seen = seen.clone();
        async move {
            let mut got = Vec::new();
            let mut buf = [0u8; 65536];
            loop {
                while let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head: Vec<u8> = got.drain(..end + 4).collect();
                    let is_head = head.starts_with(b"HEAD ");
                    seen.lock().unwrap().push(head);
                    let answer: &[u8] = if is_head {
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"
                    } else {
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                    };
                    if s.write_all(answer).await.is_err() {
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
    (addr, heads)
}

/// The field lines a raw client head sends, with names lowercased, as the
/// gateway writes them.
fn lowered(fields: &[(&str, &[u8])]) -> Vec<Vec<u8>> {
    fields
        .iter()
        .map(|(n, v)| {
            let mut l = n.to_ascii_lowercase().into_bytes();
            l.extend_from_slice(b": ");
            l.extend_from_slice(v);
            l
        })
        .collect()
}

fn raw_head(method: &str, target: &str, version: &str, fields: &[(&str, &[u8])]) -> Vec<u8> {
    let mut h = format!("{method} {target} {version}\r\n").into_bytes();
    for (n, v) in fields {
        h.extend_from_slice(n.as_bytes());
        h.extend_from_slice(b": ");
        h.extend_from_slice(v);
        h.extend_from_slice(b"\r\n");
    }
    h.extend_from_slice(b"\r\n");
    h
}

/// Pipelined in one write: values with obs-text, tabs, empty values,
/// repeated names, one longer than the 4 KiB block, many fields, a head
/// near max_header_size; HTTP/1.0; an absolute-form target. The upstream
/// sees every client value byte for byte, in order, and the target.
#[tokio::test]
async fn pipelined_heads_reach_the_upstream_byte_for_byte() {
    bounded(async {
        let (up, heads) = recording_upstream().await;
        let gw = TestGateway::from_toml(&proxy_toml(up, "d", "", "max_header_size = \"24KiB\"")).await;
        let long = vec![b'L'; 5000];
        let near: Vec<(String, Vec<u8>)> =
            (0..90).map(|i| (format!("X-Near-{i}"), vec![b'a' + (i % 26) as u8; 240])).collect();
        let near: Vec<(&str, &[u8])> = near.iter().map(|(n, v)| (n.as_str(), v.as_slice())).collect();
        let a: Vec<(&str, &[u8])> = vec![
            ("Host", b"h"),
            ("X-Latin", b"caf\xe9 \x80\xff"),
            ("X-Tab", b"a\tb\t c"),
            ("X-Empty", b""),
            ("X-Rep", b"1"),
            ("X-Other", b"o"),
            ("X-Rep", b"2"),
            ("X-Long", &long),
            ("X-Rep", b"3"),
        ];
        let mut b: Vec<(&str, &[u8])> = vec![("Host", b"h")];
        b.extend(near.iter().cloned());
        let c: Vec<(&str, &[u8])> = vec![("Host", b"h"), ("X-C", b"\xc3\xa9t\xc3\xa9")];
        let mut bytes = raw_head("GET", "/d/a?x=1&y=%20&z", "HTTP/1.1", &a);
        bytes.extend(raw_head("HEAD", "/d/b;p?q", "HTTP/1.1", &b));
        bytes.extend(raw_head("GET", "http://h/d/c?abs=1", "HTTP/1.1", &c));
        assert!(raw_head("HEAD", "/d/b;p?q", "HTTP/1.1", &b).len() > 20_000);
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(&bytes).await.unwrap();
        let got = read_responses(&mut s, &[false, true, false]).await;
        for (head, _) in &got[..2] {
            assert!(head.starts_with("HTTP/1.1 200"), "{got:?}");
        }
        // An absolute-form target is refused (src/limits.rs), as before.
        assert!(got[2].0.starts_with("HTTP/1.1 400"), "{got:?}");
        // HTTP/1.0 on a connection of its own.
        let ten: Vec<(&str, &[u8])> = vec![("Host", b"h"), ("X-Ten", b"10 \xfe")];
        let r = raw(gw.addr, &raw_head("GET", "/d/ten", "HTTP/1.0", &ten), Duration::from_secs(2)).await;
        assert_eq!(r.status(), 200, "{}", r.text);
        let heads = heads.lock().unwrap();
        assert_eq!(heads.len(), 3);
        let sent = [("GET /d/a?x=1&y=%20&z HTTP/1.1", &a), ("HEAD /d/b;p?q HTTP/1.1", &b)];
        for (i, (line, fields)) in sent.iter().enumerate() {
            assert_eq!(request_line(&heads[i]), *line);
            let seen = field_lines(&heads[i]);
            let want: Vec<Vec<u8>> = lowered(&fields[1..]);
            let kept: Vec<Vec<u8>> = seen.iter().filter(|l| want.contains(l)).cloned().collect();
            // The gateway groups repeated names (HeaderMap); compare as the
            // map orders them.
            let mut grouped = want.clone();
            grouped.sort_by_key(|l| {
                let name = l.split(|b| *b == b':').next().unwrap().to_vec();
                want.iter().position(|w| w.starts_with(&name) && w[name.len()] == b':').unwrap()
            });
            assert_eq!(kept, grouped, "request {i}: every value byte for byte");
        }
        assert_eq!(request_line(&heads[2]), "GET /d/ten HTTP/1.1");
        assert!(field_lines(&heads[2]).contains(&b"x-ten: 10 \xfe".to_vec()));
    })
    .await;
}

/// `OPTIONS *`, CONNECT and requests with bodies (Content-Length and
/// chunked) on one connection: sane answers, the bodies and values as
/// sent, and the gateway still serving.
#[tokio::test]
async fn odd_targets_and_bodies_pass_as_before() {
    bounded(async {
        let up = TestUpstream::start(|req: Request<Incoming>| async move {
            let mut echo = format!("{} {}|", req.method(), req.uri()).into_bytes();
            for (n, v) in req.headers() {
                if ["x-a", "x-b", "x-c"].contains(&n.as_str()) {
                    echo.extend_from_slice(n.as_str().as_bytes());
                    echo.push(b'=');
                    echo.extend_from_slice(v.as_bytes());
                    echo.push(b'|');
                }
            }
            let body = req.into_body().collect().await.unwrap().to_bytes();
            echo.extend_from_slice(&body);
            Response::new(full(echo))
        })
        .await;
        let gw = TestGateway::from_toml(&proxy_toml(up.addr, "o", "", "")).await;
        let r = raw(gw.addr, b"OPTIONS * HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", Duration::from_secs(2)).await;
        assert!(r.status() >= 200 && r.status() < 500, "OPTIONS *: {}", r.text);
        let r = raw(gw.addr, b"CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\nConnection: close\r\n\r\n", Duration::from_secs(2))
            .await;
        assert!(r.status() >= 400, "CONNECT: {}", r.text);
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(
            b"POST /o/cl HTTP/1.1\r\nHost: h\r\nX-A: \xe9\tz\r\nContent-Length: 5\r\n\r\nhello\
              POST /o/ch HTTP/1.1\r\nHost: h\r\nX-B: b\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n\
              GET /o/last HTTP/1.1\r\nHost: h\r\nX-C: \r\n\r\n",
        )
        .await
        .unwrap();
        let got = read_responses(&mut s, &[false, false, false]).await;
        assert_eq!(got[0].1, b"POST /o/cl|x-a=\xe9\tz|hello".to_vec(), "{:?}", String::from_utf8_lossy(&got[0].1));
        assert_eq!(got[1].1, b"POST /o/ch|x-b=b|abcde".to_vec(), "{:?}", String::from_utf8_lossy(&got[1].1));
        assert_eq!(got[2].1, b"GET /o/last|x-c=|".to_vec(), "{:?}", String::from_utf8_lossy(&got[2].1));
        still_serving(&gw).await;
    })
    .await;
}

/// Many connections at once, each pipelining requests with values of its
/// own (the per-thread block is shared by all of them): every upstream
/// request carries exactly its own values.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_heads_never_mix() {
    bounded(async {
        let up = TestUpstream::start(|req: Request<Incoming>| async move {
            let mut echo = req.uri().path().as_bytes().to_vec();
            for v in req.headers().get_all("x-v") {
                echo.push(b'|');
                echo.extend_from_slice(v.as_bytes());
            }
            if let Some(t) = req.headers().get("x-t") {
                echo.push(b'#');
                echo.extend_from_slice(t.as_bytes());
            }
            Response::new(full(echo))
        })
        .await;
        let gw = TestGateway::from_toml(&proxy_toml(up.addr, "m", "", "")).await;
        let addr = gw.addr;
        let tasks: Vec<_> = (0..32)
            .map(|c| {
                tokio::spawn(async move {
                    let mut s = TcpStream::connect(addr).await.unwrap();
                    for round in 0..10 {
                        let mut bytes = Vec::new();
                        let mut want = Vec::new();
                        for k in 0..5 {
                            let tag = format!("{c}-{round}-{k}");
                            let pad = "p".repeat((c * 97 + round * 31 + k * 13) % 900);
                            bytes.extend(
                                format!(
                                    "GET /m/{tag} HTTP/1.1\r\nHost: h\r\nX-V: {tag}a{pad}\r\nX-T: {tag}\r\nX-V: {tag}b\r\n\r\n"
                                )
                                .into_bytes(),
                            );
                            want.push(format!("/m/{tag}|{tag}a{pad}|{tag}b#{tag}").into_bytes());
                        }
                        s.write_all(&bytes).await.unwrap();
                        let got = read_responses(&mut s, &[false; 5]).await;
                        for (k, (_, body)) in got.into_iter().enumerate() {
                            assert_eq!(body, want[k], "{}", String::from_utf8_lossy(&body));
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await;
}
