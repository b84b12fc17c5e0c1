//! The gateway's own client-facing HTTP/2 connection (`server.http2 =
//! "gateway"`, on the h2 crate) against hyper's: the 1xx answers hyper's
//! cannot send, `Expect: 100-continue`, a client's reset, and the
//! settings both announce. The rest of the HTTP/2 suite runs against it
//! with `GATEWAY__SERVER__HTTP2=gateway` (see `.ci/run`).

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::{TestGateway, bounded, proxy_toml};
use gateway::config::Http2Server;
use http::{Request, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A gateway with the given HTTP/2 connection in front of `up`.
async fn gateway(up: std::net::SocketAddr, http2: Http2Server) -> TestGateway {
    let mut config = common::config(&proxy_toml(up, "d", "", ""), Path::new(env!("CARGO_MANIFEST_DIR")));
    config.server.http2 = http2;
    TestGateway::start(config).await
}

/// Sends `req` with the h2 crate (prior knowledge); the interim answers
/// that came before the final one, the final one, and its body.
async fn exchange(gw: &TestGateway, req: Request<()>) -> (Vec<Response<()>>, Response<()>, Bytes) {
    let (mut client, _ping) = common::raw_h2(gw.addr, 65_535).await;
    let (mut answer, _) = client.send_request(req, true).unwrap();
    let interims = interims(&mut answer).await;
    let response = answer.await.unwrap();
    let (head, mut body) = response.into_parts();
    let mut got = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        got.extend_from_slice(&chunk);
    }
    (interims, Response::from_parts(head, ()), Bytes::from(got))
}

/// The interim answers at the front of the stream, until the final one.
async fn interims(answer: &mut h2::client::ResponseFuture) -> Vec<Response<()>> {
    let mut got = Vec::new();
    while let Some(interim) = std::future::poll_fn(|cx| answer.poll_informational(cx)).await {
        got.push(interim.unwrap());
    }
    got
}

fn get(gw: &TestGateway, path: &str) -> Request<()> {
    Request::get(format!("http://{}{path}", gw.addr)).body(()).unwrap()
}

/// An upstream's 103 Early Hints (with its `Link` field) and 102 reach an
/// HTTP/2 client before the answer with the gateway's own connection (RFC
/// 9110 §15.2), without their connection-specific fields. hyper's server
/// connection cannot send a 1xx: with it they are dropped.
#[tokio::test]
async fn early_hints_reach_an_http2_client_before_the_answer() {
    let up = common::raw_upstream(|mut s: TcpStream| async move {
        while common::read_head(&mut s).await.is_some() {
            let hints = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\nConnection: x\r\nX: y\r\n\r\n";
            let _ = s.write_all(hints).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            let _ = s.write_all(b"HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
        }
    })
    .await;
    for http2 in [Http2Server::Gateway, Http2Server::Hyper] {
        let gw = gateway(up, http2).await;
        let (interims, answer, body) = bounded(exchange(&gw, get(&gw, "/d/x"))).await;
        assert_eq!((answer.status().as_u16(), &body[..]), (200, &b"ok"[..]));
        let statuses: Vec<u16> = interims.iter().map(|i| i.status().as_u16()).collect();
        match http2 {
            Http2Server::Gateway => {
                assert_eq!(statuses, [103, 102]);
                let hints = interims[0].headers();
                assert_eq!(hints.get("link").unwrap(), "</style.css>; rel=preload");
                // `X` is named by `Connection`: the upstream connection's own.
                assert!(hints.get("x").is_none() && hints.get("connection").is_none(), "{hints:?}");
            }
            Http2Server::Hyper => assert!(statuses.is_empty(), "{statuses:?}"),
        }
    }
}

/// A client that sends `Expect: 100-continue` and waits for the 100
/// before its body gets it once the body is asked for, as on the own
/// HTTP/1.1 connection; the upstream's own 100 (the gateway's
/// expectation) is not forwarded.
#[tokio::test]
async fn an_http2_client_that_expects_100_continue_gets_it() {
    let up = common::raw_upstream(|mut s: TcpStream| async move {
        let Some(head) = common::read_head(&mut s).await else { return };
        let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
        if text.contains("expect: 100-continue") {
            let _ = s.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await;
        }
        let mut body = head[head.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4..].to_vec();
        let mut buf = [0u8; 1024];
        while !body.ends_with(b"0\r\n\r\n") && !body.ends_with(b"hello") {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => body.extend_from_slice(&buf[..n]),
            }
        }
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nyes").await;
    })
    .await;
    let gw = gateway(up, Http2Server::Gateway).await;
    let (mut client, _ping) = common::raw_h2(gw.addr, 65_535).await;
    let req = Request::post(format!("http://{}/d/up", gw.addr))
        .header("expect", "100-continue")
        .header("content-length", "5")
        .body(())
        .unwrap();
    let (mut answer, mut body) = client.send_request(req, false).unwrap();
    let first = bounded(interims_until_one(&mut answer)).await;
    assert_eq!(first.status().as_u16(), 100);
    body.send_data(Bytes::from_static(b"hello"), true).unwrap();
    let rest = bounded(interims(&mut answer)).await;
    assert!(rest.is_empty(), "one 100, the gateway's: {rest:?}");
    let response = bounded(answer).await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
}

/// The first interim answer, waiting for it.
async fn interims_until_one(answer: &mut h2::client::ResponseFuture) -> Response<()> {
    std::future::poll_fn(|cx| answer.poll_informational(cx)).await.expect("an interim answer").unwrap()
}

/// A client that resets its stream while the upstream has not answered
/// has its request dropped: the upstream's connection is closed.
#[tokio::test]
async fn a_client_reset_drops_the_request_in_flight() {
    let dropped = Arc::new(AtomicBool::new(false));
    let noted = dropped.clone();
    let up = common::raw_upstream(move |mut s: TcpStream| {
        let noted = noted.clone();
        async move {
            if common::read_head(&mut s).await.is_some()
                && common::closed_within(&mut s, Duration::from_secs(5)).await.is_some()
            {
                noted.store(true, Ordering::SeqCst);
            }
        }
    })
    .await;
    for http2 in [Http2Server::Gateway, Http2Server::Hyper] {
        dropped.store(false, Ordering::SeqCst);
        let gw = gateway(up, http2).await;
        let (mut client, _ping) = common::raw_h2(gw.addr, 65_535).await;
        let (answer, mut stream) = client.send_request(get(&gw, "/d/slow"), true).unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        stream.send_reset(h2::Reason::CANCEL);
        drop(answer);
        bounded(async {
            while !dropped.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    }
}

/// A large answer passes whole through a client's small window, given
/// back as it reads, and a trailer section follows the body.
#[tokio::test]
async fn a_large_answer_flows_through_a_small_window_with_its_trailers() {
    let up = common::raw_upstream(|mut s: TcpStream| async move {
        while common::read_head(&mut s).await.is_some() {
            let mut out = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-sum\r\n\r\n".to_vec();
            for _ in 0..64 {
                out.extend_from_slice(format!("{:x}\r\n", 16 * 1024).as_bytes());
                out.extend_from_slice(&[b'a'; 16 * 1024]);
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"0\r\nx-sum: 42\r\n\r\n");
            let _ = s.write_all(&out).await;
        }
    })
    .await;
    for http2 in [Http2Server::Gateway, Http2Server::Hyper] {
        let gw = gateway(up, http2).await;
        let (mut client, _ping) = common::raw_h2(gw.addr, 65_535).await;
        let req = Request::get(format!("http://{}/d/big", gw.addr)).header("te", "trailers").body(()).unwrap();
        let (answer, _) = client.send_request(req, true).unwrap();
        let (n, trailers) = bounded(async {
            let mut body = answer.await.unwrap().into_body();
            let mut n = 0;
            while let Some(chunk) = body.data().await {
                let chunk = chunk.unwrap();
                n += chunk.len();
                let _ = body.flow_control().release_capacity(chunk.len());
            }
            (n, body.trailers().await.unwrap())
        })
        .await;
        assert_eq!(n, 64 * 16 * 1024, "{http2:?}");
        assert_eq!(trailers.and_then(|t| t.get("x-sum").cloned()).unwrap(), "42", "{http2:?}");
    }
}

/// A shutdown sends GOAWAY: the stream in flight gets its whole answer,
/// then the connection closes.
#[tokio::test]
async fn a_shutdown_finishes_the_stream_in_flight_then_closes() {
    let up = common::raw_upstream(|mut s: TcpStream| async move {
        while common::read_head(&mut s).await.is_some() {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\ndone").await;
        }
    })
    .await;
    for http2 in [Http2Server::Gateway, Http2Server::Hyper] {
        let mut gw = gateway(up, http2).await;
        let tcp = TcpStream::connect(gw.addr).await.unwrap();
        let (client, connection) = h2::client::handshake(tcp).await.unwrap();
        let connection = tokio::spawn(connection);
        let mut client = client.ready().await.unwrap();
        let (answer, _) = client.send_request(get(&gw, "/d/slow"), true).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        gw.shutdown();
        let body = bounded(async {
            let mut body = answer.await.unwrap().into_body();
            let mut got = Vec::new();
            while let Some(chunk) = body.data().await {
                got.extend_from_slice(&chunk.unwrap());
            }
            got
        })
        .await;
        assert_eq!(body, b"done", "{http2:?}");
        let _ = bounded(connection).await.unwrap();
        let again = client.send_request(get(&gw, "/d/x"), true);
        assert!(again.is_err(), "no new stream after GOAWAY ({http2:?})");
    }
}

/// An answer cut short upstream is cut short to the client: the bytes
/// that came, then the stream reset, alike on both connections.
#[tokio::test]
async fn an_answer_cut_upstream_resets_the_stream() {
    let up = common::raw_upstream(|mut s: TcpStream| async move {
        if common::read_head(&mut s).await.is_some() {
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabcd").await;
        }
    })
    .await;
    let mut seen = Vec::new();
    for http2 in [Http2Server::Gateway, Http2Server::Hyper] {
        let gw = gateway(up, http2).await;
        let (mut client, _ping) = common::raw_h2(gw.addr, 65_535).await;
        let (answer, _) = client.send_request(get(&gw, "/d/cut"), true).unwrap();
        let (got, reason) = bounded(async {
            let mut body = answer.await.unwrap().into_body();
            let mut got = Vec::new();
            loop {
                match body.data().await {
                    Some(Ok(chunk)) => got.extend_from_slice(&chunk),
                    Some(Err(e)) => break (got, e.reason()),
                    None => break (got, None),
                }
            }
        })
        .await;
        assert_eq!(got, b"abcd", "{http2:?}");
        seen.push(reason);
    }
    assert!(seen[0].is_some(), "the stream is reset, not ended: {seen:?}");
    assert_eq!(seen[0], seen[1], "the same reset as hyper's");
}

/// `server.http2` takes `hyper` or `gateway`.
#[test]
fn server_http2_is_checked_at_load() {
    use gateway::config::{self, Source};
    let load = |v: &str| {
        let text = format!("[server]\nhttp2 = \"{v}\"\n");
        config::load(&Source::Inline { text, base_dir: ".".into() })
    };
    // The environment's override wins over the file's key.
    if std::env::var_os("GATEWAY__SERVER__HTTP2").is_some() {
        return;
    }
    assert_eq!(load("gateway").unwrap().server.http2, Http2Server::Gateway);
    assert_eq!(load("hyper").unwrap().server.http2, Http2Server::Hyper);
    let e = load("h2o").unwrap_err().to_string();
    assert!(e.contains("server.http2") && e.contains("\"hyper\" or \"gateway\""), "{e}");
}

/// Opens streams to an upstream that never answers, each reset by the
/// client once the upstream has its request, `reset(i)` saying which, and
/// with `padded` an answered request before each; the number sent (of at
/// most `most`) before the connection refused another.
async fn resetting_client(
    gw: &TestGateway,
    asked: &AtomicUsize,
    (most, padded): (usize, bool),
    reset: impl Fn(usize) -> bool,
) -> usize {
    let (mut client, _ping) = common::raw_h2(gw.addr, 65_535).await;
    let mut held = Vec::new();
    for i in 0..most {
        if padded {
            let Ok(Ok(ready)) = tokio::time::timeout(Duration::from_secs(5), client.ready()).await else { return i };
            client = ready;
            let Ok((answer, _)) = client.send_request(get(gw, "/fast"), true) else { return i };
            let Ok(Ok(answer)) = tokio::time::timeout(Duration::from_secs(5), answer).await else { return i };
            assert_eq!(answer.status(), 200);
        }
        let Ok(ready) = tokio::time::timeout(Duration::from_secs(5), client.ready()).await else { return i };
        let Ok(ready) = ready else { return i };
        client = ready;
        let before = asked.load(Ordering::SeqCst);
        let Ok((answer, mut stream)) = client.send_request(get(gw, "/d/hold"), true) else { return i };
        let arrived = async {
            while asked.load(Ordering::SeqCst) == before {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        };
        if tokio::time::timeout(Duration::from_secs(5), arrived).await.is_err() {
            return i;
        }
        if reset(i) {
            stream.send_reset(h2::Reason::CANCEL);
        } else {
            held.push((answer, stream));
        }
    }
    most
}

/// A client that resets most of its streams after the gateway has sent
/// them upstream (each one an upstream request, and over HTTP/1.1 the
/// upstream connection it was on) has its connection shut down once 100
/// streams have started (`EARLY_RESETS_FROM`), and so does one that keeps
/// the share at half with an answered request before each reset, at 500
/// resets (`EARLY_RESETS_MAX`); the h2 crate counts only streams reset
/// before they are accepted. One that resets a third of them keeps it.
/// An upstream that answers `GET /d/fast` at once and holds any other
/// request until the gateway closes its connection, counting those.
async fn holding_upstream() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let asked = Arc::new(AtomicUsize::new(0));
    let seen = asked.clone();
    let up = common::raw_upstream(move |mut s: TcpStream| {
        let seen = seen.clone();
        async move {
            while let Some(head) = common::read_head(&mut s).await {
                if head.starts_with(b"GET /d/fast") {
                    let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
                    continue;
                }
                seen.fetch_add(1, Ordering::SeqCst);
                let _ = common::closed_within(&mut s, Duration::from_secs(20)).await;
                return;
            }
        }
    })
    .await;
    (up, asked)
}

/// Held by the two tests that shut connections down for resets: both add to
/// the process's one `gateway_rejected_total{reason="stream_resets"}`, which
/// the first reads before and after.
static RESETTING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn a_client_resetting_most_streams_after_they_went_upstream_is_shut_down() {
    let _serial = RESETTING.lock().await;
    let (up, asked) = holding_upstream().await;
    bounded(async {
        for http2 in [Http2Server::Gateway, Http2Server::Hyper] {
            let gw = gateway(up, http2).await;
            let counted = || async {
                let text = common::metrics_text(gw.addr).await;
                common::sample(&text, "gateway_rejected_total", &[("route", ""), ("reason", "stream_resets")])
                    .unwrap_or(0.0)
            };
            let some = resetting_client(&gw, &asked, (150, false), |i| i % 3 == 0).await;
            assert_eq!(some, 150, "{http2:?}: a client resetting a third of its streams was shut down");
            let before = counted().await;
            let most = resetting_client(&gw, &asked, (150, false), |_| true).await;
            assert!((100..=110).contains(&most), "{http2:?}: {most} streams sent upstream and reset");
            assert_eq!(counted().await, before + 1.0, "{http2:?}");
        }
    })
    .await;
}

/// A client that keeps its share of early resets at half, with an answered
/// request before each reset, has its connection shut down at 500 resets
/// (`EARLY_RESETS_MAX`). (Bounded by a minute: a thousand streams, each
/// reset one an upstream connection, take seconds in a debug build.)
#[tokio::test]
async fn a_client_padding_its_resets_with_answered_requests_is_shut_down() {
    let _serial = RESETTING.lock().await;
    let (up, asked) = holding_upstream().await;
    let within = async {
        for http2 in [Http2Server::Gateway, Http2Server::Hyper] {
            let toml = proxy_toml(up, "d", "", "")
                + "[[routes]]\nname = \"fast\"\nprefix = \"/fast\"\nrespond = { status = 200 }\n";
            let mut config = common::config(&toml, Path::new(env!("CARGO_MANIFEST_DIR")));
            config.server.http2 = http2;
            let gw = TestGateway::start(config).await;
            let padded = resetting_client(&gw, &asked, (600, true), |_| true).await;
            assert!((500..=510).contains(&padded), "{http2:?}: {padded} resets between answered requests");
        }
    };
    tokio::time::timeout(Duration::from_secs(60), within).await.expect("test took too long");
}

/// Sends `req` with `body` on a new HTTP/2 connection; the answer's status
/// (`None` for a reset stream or a refused request).
async fn status_of(gw: &TestGateway, req: Request<()>, body: &'static [u8]) -> Option<u16> {
    let (mut client, _ping) = common::raw_h2(gw.addr, 65_535).await;
    let (answer, mut stream) = client.send_request(req, body.is_empty()).ok()?;
    if !body.is_empty() {
        stream.send_data(Bytes::from_static(body), true).ok()?;
    }
    Some(answer.await.ok()?.status().as_u16())
}

/// An HTTP/2 request's fields are held to the limits an HTTP/1.1 head is:
/// two `content-length` fields of one value reach the upstream as one
/// (RFC 9110 §8.6; the own HTTP/1.1 connection does the same), two that
/// differ never reach it (400), and more than 100 fields are refused with
/// 431 as they are in HTTP/1.1 (`max_header_size` bounds only their bytes).
#[tokio::test]
async fn an_http2_request_is_held_to_an_http1_heads_field_rules() {
    let heads = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = heads.clone();
    let up = common::raw_upstream(move |mut s: TcpStream| {
        let seen = seen.clone();
        async move {
            while let Some(head) = common::read_head(&mut s).await {
                let text = String::from_utf8_lossy(&head).to_lowercase();
                seen.lock().unwrap().push(text.clone());
                // The body's bytes that came with the head, then the rest.
                let after = text.split_once("\r\n\r\n").map_or(0, |(_, b)| b.len());
                let mut rest = vec![0u8; 5usize.saturating_sub(after)];
                if text.contains("content-length: 5") && s.read_exact(&mut rest).await.is_err() {
                    return;
                }
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
            }
        }
    })
    .await;
    bounded(async {
        for http2 in [Http2Server::Gateway, Http2Server::Hyper] {
            let gw = gateway(up, http2).await;
            let post = |lengths: &[&str]| {
                let mut req = Request::post(format!("http://{}/d/post", gw.addr));
                for l in lengths {
                    req = req.header("content-length", *l);
                }
                req.body(()).unwrap()
            };
            heads.lock().unwrap().clear();
            assert_eq!(status_of(&gw, post(&["5", "5"]), b"hello").await, Some(200), "{http2:?}");
            let got = heads.lock().unwrap().clone();
            assert_eq!(got.len(), 1, "{http2:?}: {got:?}");
            assert_eq!(got[0].matches("content-length:").count(), 1, "{http2:?}: {}", got[0]);
            heads.lock().unwrap().clear();
            let differing = status_of(&gw, post(&["5", "6"]), b"hello").await;
            assert!(matches!(differing, None | Some(400)), "{http2:?}: {differing:?}");
            assert!(heads.lock().unwrap().is_empty(), "{http2:?}: {:?}", heads.lock().unwrap());
            let many = |n: usize| {
                let mut req = Request::get(format!("http://{}/d/many", gw.addr));
                for i in 0..n {
                    req = req.header(format!("x-f{i}"), "v");
                }
                req.body(()).unwrap()
            };
            assert_eq!(status_of(&gw, many(99), b"").await, Some(200), "{http2:?}");
            assert_eq!(status_of(&gw, many(101), b"").await, Some(431), "{http2:?}");
        }
    })
    .await;
}
