//! The gateway's own client-facing HTTP/1.1 connection (`server.http1 =
//! "gateway"`) against hyper's: the same byte streams (valid, malformed,
//! request-smuggling classics, pipelined, split at every byte or at random
//! places) sent to a gateway of each kind must lead to the same decision:
//! the same requests reaching the upstream, the same statuses back, and
//! the connection closed or kept alike.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::{TestGateway, TestUpstream, full, proxy_toml};
use gateway::config::Http1Server;
use http::{Request, Response};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// What the upstream saw, one line per request.
type Seen = Arc<Mutex<Vec<String>>>;

/// A gateway with the given HTTP/1.1 connection in front of an upstream
/// that notes every request it gets.
async fn gateway(http1: Http1Server) -> (TestGateway, Seen) {
    let seen: Seen = Arc::default();
    let noted = seen.clone();
    let up = TestUpstream::start(move |req: Request<hyper::body::Incoming>| {
        let noted = noted.clone();
        async move {
            let (parts, body) = req.into_parts();
            let body = http_body_util::BodyExt::collect(body).await;
            let (trailers, body) = match body {
                Ok(b) => (b.trailers().map(|t| format!("{t:?}")).unwrap_or_default(), b.to_bytes()),
                Err(e) => (format!("failed: {e}"), Bytes::new()),
            };
            let field = |n: &str| parts.headers.get(n).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
            let line = format!(
                "{} {} cl={:?} te={:?} x={:?} body={:?} trailers={}",
                parts.method,
                parts.uri,
                field("content-length"),
                field("transfer-encoding"),
                field("x"),
                body,
                trailers
            );
            noted.lock().unwrap().push(line);
            Response::new(full("ok"))
        }
    })
    .await;
    let toml = proxy_toml(up.addr, "d", "", "max_header_size = \"8KiB\"");
    let mut config = common::config(&toml, Path::new(env!("CARGO_MANIFEST_DIR")));
    config.server.http1 = http1;
    (TestGateway::start(config).await, seen)
}

/// The decision a gateway made on a byte stream.
#[derive(Debug, PartialEq)]
struct Decision {
    statuses: Vec<u16>,
    closed: bool,
    upstream: Vec<String>,
}

/// How long a decision is read for after the last byte is sent, unless
/// the gateway closes first; and how long when the two sides differed.
const QUIET: Duration = Duration::from_millis(300);
const LATE: Duration = Duration::from_secs(2);

/// Sends `bytes` in the pieces `cuts` makes (positions), then reads until
/// the gateway closes or `wait` passes.
async fn decide(gw: &(TestGateway, Seen), bytes: &[u8], cuts: &[usize], wait: Duration) -> Decision {
    gw.1.lock().unwrap().clear();
    let mut s = TcpStream::connect(gw.0.addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    let mut from = 0;
    for &cut in cuts.iter().chain(std::iter::once(&bytes.len())) {
        if cut <= from || cut > bytes.len() {
            continue;
        }
        if s.write_all(&bytes[from..cut]).await.is_err() {
            break;
        }
        from = cut;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let raw = common::read_for(&mut s, wait).await;
    let statuses = raw
        .text
        .split("HTTP/1.")
        .skip(1)
        .filter_map(|rest| rest.get(2..5).and_then(|code| code.parse().ok()))
        .collect();
    let upstream = std::mem::take(&mut *gw.1.lock().unwrap());
    Decision { statuses, closed: raw.closed, upstream }
}

/// Byte streams each side must decide alike.
fn streams() -> Vec<Vec<u8>> {
    let s = |t: &str| t.as_bytes().to_vec();
    let many: String = (0..101).map(|i| format!("x{i}: y\r\n")).collect();
    vec![
        s("GET /d/a HTTP/1.1\r\nHost: x\r\n\r\n"),
        s("GET /d/a HTTP/1.0\r\n\r\n"),
        s("GET /d/a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"),
        s("GET /d/a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        s("HEAD /d/h HTTP/1.1\r\nHost: x\r\n\r\n"),
        s("POST /d/p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"),
        s(
            "POST /d/c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTrailer: x-t\r\n\r\n5;e=1\r\nhello\r\n0\r\nx-t: 1\r\n\r\n",
        ),
        s(
            "GET /d/1 HTTP/1.1\r\nHost: x\r\n\r\nGET /d/2 HTTP/1.1\r\nHost: x\r\n\r\nPOST /d/3 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi",
        ),
        s("PUT /d/e HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc"),
        s("GET http://x/d/abs HTTP/1.1\r\nHost: x\r\n\r\n"),
        // Smuggling classics.
        s(
            "POST /d/s HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /d/smuggled HTTP/1.1\r\nHost: x\r\n\r\n",
        ),
        s(
            "POST /d/s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\nGET /d/smuggled HTTP/1.1\r\nHost: x\r\n\r\n",
        ),
        s("POST /d/s HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nhello"),
        s("POST /d/s HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello"),
        s("POST /d/s HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 5\r\n\r\nhello"),
        s("POST /d/s HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\nhello"),
        s("POST /d/s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
        s("POST /d/s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
        s("POST /d/s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
        s("POST /d/s HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
        s("GET /d/f HTTP/1.1\r\nHost: x\r\nX: a\r\n b\r\n\r\n"),
        s("GET /d/lf HTTP/1.1\nHost: x\nX: lf\n\n"),
        s("GET /d/sp HTTP/1.1\r\nHost : x\r\n\r\n"),
        s("GET /d/nul HTTP/1.1\r\nHost: x\r\nX: a\0b\r\n\r\n"),
        s(
            "POST /d/big HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFFFF\r\nhello\r\n0\r\n\r\n",
        ),
        s("POST /d/bad HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5x\r\nhello\r\n0\r\n\r\n"),
        s("POST /d/lfchunk HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n"),
        s("POST /d/short HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhello"),
        s("G@T /d/m HTTP/1.1\r\nHost: x\r\n\r\n"),
        s("GET /d/a b HTTP/1.1\r\nHost: x\r\n\r\n"),
        s("GET /d/v HTTP/2.0\r\nHost: x\r\n\r\n"),
        s("GET /d/v HTTP/1.1\r\nHost: x\r\n"),
        s("\r\n\r\nGET /d/lead HTTP/1.1\r\nHost: x\r\n\r\n"),
        format!("GET /d/many HTTP/1.1\r\nHost: x\r\n{many}\r\n").into_bytes(),
        format!("GET /d/long HTTP/1.1\r\nHost: x\r\nX: {}\r\n\r\n", "a".repeat(9000)).into_bytes(),
        format!("GET /d/{} HTTP/1.1\r\nHost: x\r\n\r\n", "u".repeat(7000)).into_bytes(),
    ]
}

/// Each side's decision on `bytes` cut at `cuts`; read again for longer
/// when they differ, so that an answer a loaded machine is late with is
/// not taken for another decision.
async fn both(
    sides: (&(TestGateway, Seen), &(TestGateway, Seen)),
    bytes: &[u8],
    cuts: &[usize],
) -> (Decision, Decision) {
    let (hyper_side, own) = sides;
    let (a, b) = tokio::join!(decide(hyper_side, bytes, cuts, QUIET), decide(own, bytes, cuts, QUIET));
    if a == b {
        return (a, b);
    }
    tokio::join!(decide(hyper_side, bytes, cuts, LATE), decide(own, bytes, cuts, LATE))
}

#[tokio::test]
async fn the_own_connection_decides_as_hyper_does() {
    let (hyper_side, own) = tokio::join!(gateway(Http1Server::Hyper), gateway(Http1Server::Gateway));
    for bytes in streams() {
        let (a, b) = both((&hyper_side, &own), &bytes, &[]).await;
        assert_eq!(b, a, "{:?}", String::from_utf8_lossy(&bytes));
    }
}

/// Heads and bodies split at every byte, and at random places (a seeded,
/// bounded run), decide as when they come whole.
#[tokio::test]
async fn pieces_decide_as_the_whole() {
    let (hyper_side, own) = tokio::join!(gateway(Http1Server::Hyper), gateway(Http1Server::Gateway));
    let chosen = [0, 5, 6, 7, 10, 11];
    let all = streams();
    for &i in &chosen {
        let bytes = &all[i];
        let every: Vec<usize> = (1..bytes.len()).collect();
        let whole = decide(&hyper_side, bytes, &[], QUIET).await;
        let (a, b) = both((&hyper_side, &own), bytes, &every).await;
        let whole = if a == whole { whole } else { decide(&hyper_side, bytes, &[], LATE).await };
        assert_eq!((&a, &b), (&whole, &whole), "{:?} split at every byte", String::from_utf8_lossy(bytes));
    }
    let mut rng = fastrand::Rng::with_seed(38);
    for _ in 0..12 {
        let bytes = &all[chosen[rng.usize(..chosen.len())]];
        let mut cuts: Vec<usize> = (0..rng.usize(1..6)).map(|_| rng.usize(1..bytes.len())).collect();
        cuts.sort_unstable();
        let (a, b) = both((&hyper_side, &own), bytes, &cuts).await;
        assert_eq!(b, a, "{:?} cut at {cuts:?}", String::from_utf8_lossy(bytes));
    }
}

/// An upstream's 103 Early Hints reach an HTTP/1.1 client before the
/// answer with the gateway's own connection (RFC 9110 §15.2), without its
/// hop-by-hop fields and those its `Connection` names; an HTTP/1.0 client gets none. hyper's server
/// connection cannot send a 1xx: with it the 103 is dropped.
#[tokio::test]
async fn early_hints_reach_an_http11_client_before_the_answer() {
    let up = common::raw_upstream(|mut s: TcpStream| async move {
        while common::read_head(&mut s).await.is_some() {
            let hints = b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\nConnection: x\r\nX: y\r\n\r\n";
            let _ = s.write_all(hints).await;
            tokio::time::sleep(Duration::from_millis(150)).await;
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
        }
    })
    .await;
    for http1 in [Http1Server::Gateway, Http1Server::Hyper] {
        let mut config = common::config(&proxy_toml(up, "d", "", ""), Path::new(env!("CARGO_MANIFEST_DIR")));
        config.server.http1 = http1;
        let gw = TestGateway::start(config).await;
        let got = common::raw(gw.addr, b"GET /d/x HTTP/1.1\r\nHost: x\r\n\r\n", Duration::from_millis(500)).await;
        let answer = got.text.find("HTTP/1.1 200 OK\r\n").expect("the answer");
        match http1 {
            Http1Server::Gateway => {
                assert!(got.text.starts_with("HTTP/1.1 103 Early Hints\r\n"), "{}", got.text);
                let hints = &got.text[..answer];
                assert!(hints.contains("link: </s.css>; rel=preload\r\n"), "{hints}");
                assert!(!hints.contains("connection"), "hop-by-hop fields stay behind: {hints}");
                assert!(!hints.contains("x: y"), "so do the fields Connection names (RFC 9110 §7.6.1): {hints}");
            }
            Http1Server::Hyper => assert_eq!(answer, 0, "{}", got.text),
        }
        let old = common::raw(gw.addr, b"GET /d/x HTTP/1.0\r\nHost: x\r\n\r\n", Duration::from_millis(500)).await;
        assert!(old.text.starts_with("HTTP/1.0 200 OK\r\n"), "no 1xx to HTTP/1.0: {}", old.text);
    }
}

/// The own connection keeps one 1xx queue for all its requests: the 103
/// an upstream sends to an HTTP/1.0 request, which gets none, is not
/// forwarded ahead of the next request's answer either.
#[tokio::test]
async fn early_hints_to_an_http10_request_do_not_reach_the_next_answer() {
    let up = common::raw_upstream(|mut s: TcpStream| async move {
        while common::read_head(&mut s).await.is_some() {
            let _ = s.write_all(b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n").await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
        }
    })
    .await;
    let mut config = common::config(&proxy_toml(up, "d", "", ""), Path::new(env!("CARGO_MANIFEST_DIR")));
    config.server.http1 = Http1Server::Gateway;
    let gw = TestGateway::start(config).await;
    let requests = b"GET /d/1 HTTP/1.1\r\nHost: x\r\n\r\n\
        GET /d/2 HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n\r\n\
        GET /d/3 HTTP/1.1\r\nHost: x\r\n\r\n";
    let got = common::raw(gw.addr, requests, Duration::from_millis(1500)).await;
    // (A body, `ok`, runs into the next status line.)
    let heads: Vec<&str> = got.text.split("HTTP/").skip(1).map(|h| h.lines().next().unwrap_or_default()).collect();
    assert_eq!(
        heads,
        ["1.1 103 Early Hints", "1.1 200 OK", "1.0 200 OK", "1.1 103 Early Hints", "1.1 200 OK"],
        "{}",
        got.text
    );
}

/// A 1xx goes to the client as it comes, not with the answer: the
/// upstream here sends its 200 only once the client has read the 103, on
/// a connection's first request and on a later one. (The connection's
/// queue is made at the first 1xx, in the request's future, which the
/// connection polls before it looks for the queue.)
#[tokio::test]
async fn early_hints_go_out_before_the_upstream_answers() {
    use tokio::io::AsyncReadExt;
    let read_103 = Arc::new(tokio::sync::Notify::new());
    let told = read_103.clone();
    let up = common::raw_upstream(move |mut s: TcpStream| {
        let told = told.clone();
        async move {
            while common::read_head(&mut s).await.is_some() {
                let _ = s.write_all(b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n").await;
                told.notified().await;
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
            }
        }
    })
    .await;
    let mut config = common::config(&proxy_toml(up, "d", "", ""), Path::new(env!("CARGO_MANIFEST_DIR")));
    config.server.http1 = Http1Server::Gateway;
    let gw = TestGateway::start(config).await;
    let mut c = TcpStream::connect(gw.addr).await.unwrap();
    let mut got = Vec::new();
    for round in 0..2 {
        c.write_all(b"GET /d/x HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let seen = tokio::time::timeout(Duration::from_secs(5), async {
            while !String::from_utf8_lossy(&got).contains("rel=preload\r\n\r\n") {
                let mut buf = [0u8; 1024];
                let n = c.read(&mut buf).await.unwrap();
                assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
                got.extend_from_slice(&buf[..n]);
            }
        })
        .await;
        let text = String::from_utf8_lossy(&got).into_owned();
        assert!(seen.is_ok(), "round {round}: no 103 before the answer: {text:?}");
        assert!(text.starts_with("HTTP/1.1 103 Early Hints\r\n"), "round {round}: {text}");
        read_103.notify_one();
        while !String::from_utf8_lossy(&got).ends_with("\r\n\r\nok") {
            let mut buf = [0u8; 1024];
            let n = c.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
        assert!(String::from_utf8_lossy(&got).contains("HTTP/1.1 200 OK\r\n"), "round {round}");
        got.clear();
    }
}

/// An upstream's `X-Request-Id` in a 1xx head and in its trailers follows
/// the final head's rule: with `server.request_id` on (the default) the
/// gateway's ID is the answer's one and the upstream's goes nowhere; off,
/// the upstream's passes everywhere. Before, the 1xx and the trailers
/// carried the upstream's own beside the gateway's in the final head.
#[tokio::test]
async fn an_upstreams_request_id_in_a_1xx_or_trailers_follows_the_final_heads_rule() {
    let up = common::raw_upstream(|mut s: TcpStream| async move {
        while common::read_head(&mut s).await.is_some() {
            let _ = s.write_all(b"HTTP/1.1 103 Early Hints\r\nLink: <a>\r\nX-Request-Id: up-103\r\n\r\n").await;
            let answer = b"HTTP/1.1 200 OK\r\nx-request-id: up-head\r\ntrailer: x-request-id, x-sum\r\ntransfer-encoding: chunked\r\n\r\n\
                2\r\nok\r\n0\r\nx-request-id: up-trailer\r\nx-sum: 1\r\n\r\n";
            let _ = s.write_all(answer).await;
        }
    })
    .await;
    for request_id in [true, false] {
        let mut config = common::config(&proxy_toml(up, "d", "", ""), Path::new(env!("CARGO_MANIFEST_DIR")));
        (config.server.http1, config.server.request_id) = (Http1Server::Gateway, request_id);
        let gw = TestGateway::start(config).await;
        let ask = b"GET /d/x HTTP/1.1\r\nHost: x\r\nTE: trailers\r\nX-Request-Id: client-1\r\n\r\n";
        let got = common::raw(gw.addr, ask, Duration::from_millis(500)).await.text.to_ascii_lowercase();
        let answer = got.find("http/1.1 200 ok\r\n").expect("the answer");
        let body = answer + got[answer..].find("\r\n\r\n").expect("its head");
        let (hints, head, trailers) = (&got[..answer], &got[answer..body], &got[body..]);
        assert!(hints.starts_with("http/1.1 103 early hints\r\n") && hints.contains("link: <a>"), "{got}");
        assert!(trailers.contains("x-sum: 1"), "{got}");
        if request_id {
            assert!(!hints.contains("x-request-id"), "{got}");
            assert!(!trailers.contains("x-request-id"), "{got}");
            assert_eq!(head.matches("\r\nx-request-id:").count(), 1, "{got}");
            assert!(head.contains("x-request-id: client-1\r\n"), "{got}");
        } else {
            assert!(hints.contains("x-request-id: up-103\r\n"), "{got}");
            assert!(trailers.contains("x-request-id: up-trailer\r\n"), "{got}");
            assert!(head.contains("x-request-id: up-head\r\n"), "{got}");
        }
    }
}
