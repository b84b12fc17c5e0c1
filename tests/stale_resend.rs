//! The resend after a stale pooled connection when the resend itself
//! cannot connect: the head kept for it is made a request again and
//! retried on another endpoint.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::Request;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An upstream that answers `ok` (no body to a HEAD) on kept-alive
/// connections, and records
/// each request head, until it is stopped: then it no longer accepts
/// connections (a new one is refused), and resets an open one as soon as
/// it has read a head (a process going down).
struct Stoppable {
    addr: SocketAddr,
    stop: tokio_util::sync::CancellationToken,
    heads: Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
}

async fn stoppable_upstream() -> Stoppable {
    let listener = gateway::net::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, heads) = (tokio_util::sync::CancellationToken::new(), Arc::new(std::sync::Mutex::new(Vec::new())));
    let (token, seen) = (stop.clone(), heads.clone());
    tokio::spawn(async move {
        loop {
            let mut s = tokio::select! {
                accepted = listener.accept() => match accepted { Ok((s, _)) => s, Err(_) => return },
                // The listener is dropped: connecting is refused.
                _ = token.cancelled() => return,
            };
            let (token, seen) = (token.clone(), seen.clone());
            tokio::spawn(async move {
                while let Some(head) = read_head(&mut s).await {
                    let bodiless = head.starts_with(b"HEAD ");
                    seen.lock().unwrap().push(head);
                    if token.is_cancelled() {
                        let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
                        return;
                    }
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    if s.write_all(if bodiless { &answer[..answer.len() - 2] } else { answer }).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Stoppable { addr, stop, heads }
}

/// A request whose pooled connection turns out stale, and whose resend
/// cannot connect (the endpoint is gone), is retried on another endpoint
/// as it was: the head kept for the resend is made a request again.
#[tokio::test]
async fn a_stale_resend_that_cannot_connect_is_retried_elsewhere_whole() {
    let (a, b) = (stoppable_upstream().await, stoppable_upstream().await);
    let toml = endpoints_toml("gone", &[a.addr, b.addr], "balance = \"round_robin\"", "retries = 1");
    let gw = TestGateway::from_toml(&toml).await;
    // One idle pooled connection to each endpoint.
    for _ in 0..2 {
        assert_eq!(get(&gw.url("/gone/warm")).await.0.status, 200);
    }
    assert_eq!((a.heads.lock().unwrap().len(), b.heads.lock().unwrap().len()), (1, 1));
    a.stop.cancel();
    // Round robin: one of the two goes to A's pooled connection first.
    for i in 0..2 {
        let req = Request::get(gw.url(&format!("/gone/probe/{i}?q=1")))
            .header("x-probe", format!("p{i}"))
            .header("cookie", "c=1")
            .body(full(Bytes::new()))
            .unwrap();
        let (parts, body) = send(req).await;
        assert_eq!((parts.status.as_u16(), &body[..]), (200, &b"ok"[..]), "probe {i}");
    }
    let at_a: Vec<String> =
        a.heads.lock().unwrap().drain(1..).map(|h| String::from_utf8_lossy(&h).into_owned()).collect();
    assert_eq!(at_a.len(), 1, "one probe went to the stale connection: {at_a:?}");
    let probe = at_a[0].lines().next().unwrap().split(' ').nth(1).unwrap().to_owned();
    let at_b: Vec<String> = b.heads.lock().unwrap().iter().map(|h| String::from_utf8_lossy(h).into_owned()).collect();
    let again = at_b.iter().find(|h| h.contains(&probe)).expect("the probe A reset reached B");
    let header = |head: &str, name: &str| {
        head.lines()
            .find_map(|l| l.split_once(": ").filter(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.to_owned()))
    };
    for name in ["x-probe", "cookie", "x-request-id", "x-forwarded-for", "host"] {
        assert_eq!(header(again, name), header(&at_a[0], name), "{name} as first sent");
    }
    assert!(header(again, "x-probe").is_some());
}

/// Two endpoints, one pooled connection to each, then A goes down: of two
/// requests made by `send_one`, one lands on A's stale connection, whose
/// resend cannot connect and is parsed back and retried on B. Returns the
/// head A saw and the head B saw for it.
async fn stale_then_elsewhere<F, Fut>(name: &str, send_one: F) -> (Vec<u8>, Vec<u8>)
where
    F: Fn(TestGatewayRef, usize) -> Fut,
    Fut: std::future::Future<Output = u16>,
{
    let (a, b) = (stoppable_upstream().await, stoppable_upstream().await);
    let toml = endpoints_toml(name, &[a.addr, b.addr], "balance = \"round_robin\"", "retries = 1");
    let gw = TestGateway::from_toml(&toml).await;
    for _ in 0..2 {
        assert_eq!(get(&gw.url(&format!("/{name}/warm"))).await.0.status, 200);
    }
    a.stop.cancel();
    let r = TestGatewayRef { addr: gw.addr, name: name.to_owned() };
    for i in 0..2 {
        assert_eq!(send_one(r.clone(), i).await, 200, "probe {i}");
    }
    let at_a: Vec<Vec<u8>> = a.heads.lock().unwrap().drain(1..).collect();
    assert_eq!(at_a.len(), 1, "one probe went to A's stale connection");
    let line = request_line(&at_a[0]);
    let at_b = b.heads.lock().unwrap();
    let again = at_b.iter().find(|h| request_line(h) == line).expect("the probe A reset reached B").clone();
    (at_a[0].clone(), again)
}

#[derive(Clone)]
struct TestGatewayRef {
    addr: SocketAddr,
    name: String,
}

/// Everything but Host, as first sent, in order: repeated fields, a query,
/// credentials, a HEAD.
#[tokio::test]
async fn a_parsed_back_resend_is_the_head_first_sent() {
    bounded(async {
        for method in ["GET", "HEAD"] {
            let (first, again) = stale_then_elsewhere(&format!("pb{}", method.len()), |gw, i| async move {
                let head = format!(
                    "{method} /{}/p/{i}?q=1&r=%20&s HTTP/1.1\r\nHost: example.test\r\nX-Rep: 1\r\nAuthorization: Bearer t\r\n\
                     X-Rep: 2\r\nCookie: a=1\r\nCookie: b=2\r\nX-Empty:\r\nX-Tab: a\tb\r\nX-Latin: caf\u{e9}\r\n\
                     Accept: */*\r\nConnection: close\r\n\r\n",
                    gw.name
                );
                let mut s = TcpStream::connect(gw.addr).await.unwrap();
                s.write_all(head.as_bytes()).await.unwrap();
                read_responses(&mut s, &[method == "HEAD"]).await[0].0[9..12].parse().unwrap()
            })
            .await;
            assert_eq!(request_line(&first), request_line(&again));
            assert_eq!(field_lines(&first), field_lines(&again), "{method}: the fields as first sent");
        }
    })
    .await;
}

/// A HEAD whose pooled connection was stale, resent on a new connection
/// from its kept bytes: still read as a HEAD's answer (no body awaited),
/// and the connection after it is in step.
#[tokio::test]
async fn a_head_resent_from_its_bytes_is_answered_as_a_head() {
    bounded(async {
        let heads = Arc::new(Mutex::new(Vec::<(usize, usize, String)>::new()));
        let log = heads.clone();
        let (addr, accepted) = common::scripted::scripted(move |conn, nth, head| {
            log.lock().unwrap().push((conn, nth, head.to_owned()));
            if conn == 0 && nth == 1 {
                // Closed under the second request: stale.
                return common::scripted::Answer { pieces: vec![], close: true };
            }
            if head.starts_with("HEAD ") {
                common::scripted::answer(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n")
            } else {
                common::scripted::answer(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
            }
        })
        .await;
        let gw = common::scripted::route_to(addr, "headresend", "").await;
        assert_eq!(get(&gw.url("/h/warm")).await.0.status, 200);
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(b"HEAD /h/x?y=1 HTTP/1.1\r\nHost: h\r\nCookie: c=1\r\n\r\nGET /h/next HTTP/1.1\r\nHost: h\r\n\r\n")
            .await
            .unwrap();
        let got = read_responses(&mut s, &[true, false]).await;
        assert!(got[0].0.starts_with("HTTP/1.1 200"), "{got:?}");
        assert!(got[1].0.starts_with("HTTP/1.1 200") && got[1].1 == b"hello", "{got:?}");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        let heads = heads.lock().unwrap();
        let stale = &heads.iter().find(|(c, n, _)| (*c, *n) == (0, 1)).unwrap().2;
        let resent = &heads.iter().find(|(c, n, _)| (*c, *n) == (1, 0)).unwrap().2;
        assert_eq!(stale, resent, "resent byte for byte");
    })
    .await;
}

/// A pooled connection the upstream half-closes while the gateway is still
/// writing a large request head to it (the upstream reads a little, sends
/// its FIN and reads no more): found stale by the read side, before the
/// write is done, and the request is resent whole on a new connection, as
/// one whose write finished or failed is.
#[tokio::test]
async fn a_stale_connection_found_while_the_head_is_still_written_is_resent() {
    bounded(async {
        // A small receive buffer, so the large head's write waits.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(16).unwrap();
        let addr = listener.local_addr().unwrap();
        // Per connection, the length of each whole head read.
        let heads = Arc::new(Mutex::new(Vec::<(usize, usize)>::new()));
        let log = heads.clone();
        tokio::spawn(async move {
            for conn in 0.. {
                let Ok((mut s, _)) = listener.accept().await else { return };
                let log = log.clone();
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    for nth in 0.. {
                        if (conn, nth) == (0, 1) {
                            let _ = s.read(&mut [0u8; 100]).await;
                            let _ = s.shutdown().await;
                            tokio::time::sleep(Duration::from_secs(8)).await;
                            return;
                        }
                        let (mut buf, mut from) = (vec![0u8; 1 << 20], 0);
                        let end = loop {
                            if let Some(at) = seen[from..].windows(4).position(|w| w == b"\r\n\r\n") {
                                break from + at;
                            }
                            // A head's end is looked for in what comes next.
                            from = seen.len().saturating_sub(3);
                            match s.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => seen.extend_from_slice(&buf[..n]),
                            }
                        };
                        seen.drain(..end + 4);
                        log.lock().unwrap().push((conn, end));
                        if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let gw = TestGateway::from_toml(&format!(
            "[server]\nmax_header_size = \"16MiB\"\n[upstreams.half]\nurl = \"http://{addr}\"\n\
             [[routes]]\nname = \"half\"\nprefix = \"/half\"\nupstream = \"half\"\n"
        ))
        .await;
        assert_eq!(get(&gw.url("/half/warm")).await.0.status, 200);
        let big =
            format!("GET /half/big HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\nConnection: close\r\n\r\n", "b".repeat(7 << 20));
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        let (mut r, mut w) = s.split();
        let (wrote, got) = tokio::join!(w.write_all(big.as_bytes()), async {
            let mut got = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(8), r.read_to_end(&mut got)).await;
            got
        });
        wrote.unwrap();
        assert!(got.starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&got[..got.len().min(200)]));
        let heads = heads.lock().unwrap();
        assert_eq!(heads.len(), 2, "the warm-up, then the resend: {heads:?}");
        assert!(heads[1].0 == 1 && heads[1].1 > 7 << 20, "resent whole on a new connection: {heads:?}");
    })
    .await;
}
