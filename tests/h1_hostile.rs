//! A hostile review of the gateway's own client-facing HTTP/1.1 connection
//! (`server.http1 = "gateway"`) by raw sockets, each case run against a
//! gateway with hyper's connection too: where ours does worse (unsafe,
//! unbounded, hangs, a wrong status, a desync) or differs in a way a
//! client notices, it is a defect. Each test is bounded in time.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::{TestGateway, TestUpstream, full, proxy_toml};
use gateway::config::Http1Server;
use http::{Request, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What the upstream saw, one line per request.
type Seen = Arc<Mutex<Vec<String>>>;

struct Gw {
    gw: TestGateway,
    seen: Seen,
}

/// Counts, when dropped, an upstream answer dropped.
struct Dropped(Arc<AtomicUsize>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A gateway with the given HTTP/1.1 connection in front of an upstream
/// that notes every request (and its body).
async fn gateway(http1: Http1Server, extra_server: &str) -> Gw {
    let seen: Seen = Arc::default();
    let noted = seen.clone();
    let up = TestUpstream::start(move |req: Request<hyper::body::Incoming>| {
        let noted = noted.clone();
        async move {
            let (parts, body) = req.into_parts();
            let line = format!(
                "{} {} host={:?}",
                parts.method,
                parts.uri,
                parts.headers.get_all("host").iter().collect::<Vec<_>>()
            );
            noted.lock().unwrap().push(line);
            let body = http_body_util::BodyExt::collect(body).await;
            let body = match body {
                Ok(b) => b.to_bytes(),
                Err(e) => Bytes::from(format!("failed: {e}")),
            };
            noted.lock().unwrap().push(format!("  body={body:?}"));
            if parts.uri.path() == "/d/big" {
                return Response::new(full(vec![b'z'; 4 << 20]));
            }
            Response::new(full("ok"))
        }
    })
    .await;
    let toml = proxy_toml(up.addr, "d", "", &format!("max_header_size = \"8KiB\"\n{extra_server}"));
    let mut config = common::config(&toml, Path::new(env!("CARGO_MANIFEST_DIR")));
    config.server.http1 = http1;
    Gw { gw: TestGateway::start(config).await, seen }
}

/// The decision a gateway made on a byte stream.
#[derive(Debug, PartialEq)]
struct Decision {
    statuses: Vec<String>,
    closed: bool,
    upstream: Vec<String>,
}

async fn decide(gw: &Gw, bytes: &[u8], wait: Duration) -> Decision {
    gw.seen.lock().unwrap().clear();
    let mut s = TcpStream::connect(gw.gw.addr).await.unwrap();
    let _ = s.write_all(bytes).await;
    let raw = common::read_for(&mut s, wait).await;
    let statuses =
        raw.text.split("HTTP/1.").skip(1).map(|rest| rest.get(..14).unwrap_or(rest).replace("\r\n", "|")).collect();
    let upstream = std::mem::take(&mut *gw.seen.lock().unwrap());
    Decision { statuses, closed: raw.closed, upstream }
}

fn streams() -> Vec<Vec<u8>> {
    let s = |t: &str| t.as_bytes().to_vec();
    vec![
        // A TLS ClientHello's first bytes on the plain port: no line end.
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03".to_vec(),
        s("CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\nGET /d/after HTTP/1.1\r\nHost: x\r\n\r\n"),
        s("OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n"),
        s("GET example.com:80 HTTP/1.1\r\nHost: x\r\n\r\n"),
        s("GET http://other/d/abs HTTP/1.1\r\nHost: x\r\n\r\n"),
        s("GET /d/nohost HTTP/1.1\r\n\r\n"),
        s("GET /d/twohost HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n"),
        s("GET /d/under HTTP/1.1\r\nHost: x\r\nX_Y: 1\r\n\r\n"),
        format!(
            "POST /d/ext HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;{}\r\nhello\r\n0\r\n\r\n",
            "e".repeat(20000)
        )
        .into_bytes(),
        s(
            "POST /d/tfold HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nx: a\r\n b\r\n\r\n",
        ),
        s("GET /d/cr HTTP/1.1\r\nHost: x\r\nX: a\rb\r\n\r\n"),
        s("GET /d/lfline HTTP/1.1\nHost: x\r\n\r\n"),
        s("GET  /d/twospace HTTP/1.1\r\nHost: x\r\n\r\n"),
        s("GET /d/lowver http/1.1\r\nHost: x\r\n\r\n"),
        s("GET /d/tab HTTP/1.1\r\nHost: x\r\nX\t: a\r\n\r\n"),
        s("GET /d/ws HTTP/1.1\r\nHost: x\r\nX:   spaced   \r\n\r\n"),
        s("GET /d/g1 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET /d/g2 HTTP/1.1\r\nHost: x\r\n\r\n"),
        s(
            "GET /d/k1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /d/k2 HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /d/k3 HTTP/1.0\r\n\r\nGET /d/k4 HTTP/1.0\r\n\r\n",
        ),
        s(
            "GET /d/c1 HTTP/1.1\r\nHost: x\r\n\r\nGET /d/c2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\nGET /d/c3 HTTP/1.1\r\nHost: x\r\n\r\n",
        ),
        s("POST /d/e0 HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n"),
        s("POST /d/e10 HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi"),
        s("POST /d/enobody HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n"),
        s("POST /d/eother HTTP/1.1\r\nHost: x\r\nExpect: 200-ok\r\nContent-Length: 2\r\n\r\nhi"),
        s("GET /d/up HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n\x01\x05hello"),
        s("HEAD /d/h1 HTTP/1.1\r\nHost: x\r\n\r\nGET /d/h2 HTTP/1.1\r\nHost: x\r\n\r\n"),
        s("HEAD /d/big HTTP/1.1\r\nHost: x\r\n\r\n"),
        s(
            "POST /d/tr HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\nx-a: 1\r\nx-b: 2\r\n\r\nGET /d/after HTTP/1.1\r\nHost: x\r\n\r\n",
        ),
        format!("GET /d/{} HTTP/1.1\r\nHost: x\r\n\r\n", "u".repeat(9000)).into_bytes(),
        format!(
            "GET /d/manysmall HTTP/1.1\r\nHost: x\r\n{}\r\n",
            (0..99).map(|i| format!("a{i}:\r\n")).collect::<String>()
        )
        .into_bytes(),
        s("GET /d/nul\0 HTTP/1.1\r\nHost: x\r\n\r\n"),
        s("GET /d/a HTTP/1.1\r\nHost: x\r\n\r\n\r\n\r\nGET /d/b HTTP/1.1\r\nHost: x\r\n\r\n"),
        s(
            "POST /d/te HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
        ),
        s("POST /d/tecase HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: CHUNKED\r\n\r\n2\r\nhi\r\n0\r\n\r\n"),
        s("POST /d/tesp HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:  chunked \r\n\r\n2\r\nhi\r\n0\r\n\r\n"),
        s("POST /d/clsp HTTP/1.1\r\nHost: x\r\nContent-Length:  2 \r\n\r\nhi"),
        s("POST /d/cl0 HTTP/1.1\r\nHost: x\r\nContent-Length: 002\r\n\r\nhi"),
        s("GET /d/vt HTTP/1.1\r\nHost: x\r\nX: a\x0bb\r\n\r\n"),
        s("GET /d/del HTTP/1.1\r\nHost: x\r\nX: a\x7fb\r\n\r\n"),
        s("GET /d/utf HTTP/1.1\r\nHost: x\r\nX: caf\u{e9}\r\n\r\n"),
        s("GET /d/pct%00 HTTP/1.1\r\nHost: x\r\n\r\n"),
        s("GET /d/frag#x HTTP/1.1\r\nHost: x\r\n\r\n"),
        s("GET d/rel HTTP/1.1\r\nHost: x\r\n\r\n"),
        s("POST /d/negchunk HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\nhi\r\n0\r\n\r\n"),
        s("POST /d/chunkws HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2 \r\nhi\r\n0\r\n\r\n"),
        s("POST /d/chunkmissingcrlf HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhiXX0\r\n\r\n"),
        format!(
            "POST /d/ext10k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;{}\r\nhello\r\n0\r\n\r\n",
            "e".repeat(3000)
        )
        .into_bytes(),
        format!(
            "POST /d/ext3x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{}0\r\n\r\n",
            format!("1;{}\r\nh\r\n", "e".repeat(3000)).repeat(7)
        )
        .into_bytes(),
        format!(
            "POST /d/tr10k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nx: {}\r\n\r\n",
            "t".repeat(10000)
        )
        .into_bytes(),
        format!(
            "POST /d/tr20k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nx: {}\r\n\r\n",
            "t".repeat(20000)
        )
        .into_bytes(),
        format!(
            "POST /d/trmany HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n{}\r\n",
            (0..150).map(|i| format!("t{i}: v\r\n")).collect::<String>()
        )
        .into_bytes(),
        s("POST /d/trbad HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nx y: 1\r\n\r\n"),
        s("GET /d/sp HTTP/1.1 \r\nHost: x\r\n\r\n"),
        s("GET /d/9 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n"),
        s(
            "POST /d/clte10 HTTP/1.0\r\nHost: x\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nhiGET /d/next HTTP/1.0\r\nHost: x\r\n\r\n",
        ),
        s("POST /d/chunk0x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\nhi\r\n0\r\n\r\n"),
    ]
}

/// Byte streams beyond `tests/h1_server.rs`'s (targets, hosts, chunk
/// extensions and trailers at their bounds, obs-fold, bare CR, NUL and
/// other control bytes, pipelines with bodies on GET, HTTP/1.0
/// keep-alive, `Connection: close` mid-pipeline, `Expect` variants,
/// upgrades refused with bytes behind the head, HEAD, over-long and
/// many-field heads) are decided alike by both connections.
#[tokio::test]
async fn more_streams_decide_as_with_hyper() {
    let (h, o) = tokio::join!(gateway(Http1Server::Hyper, ""), gateway(Http1Server::Gateway, ""));
    for bytes in streams() {
        let w = Duration::from_millis(400);
        let (a, b) = tokio::join!(decide(&h, &bytes, w), decide(&o, &bytes, w));
        assert_eq!(b, a, "{:?}", String::from_utf8_lossy(&bytes[..bytes.len().min(80)]));
    }
}

/// A gateway of the given kind with one route, `/r`, to `up`.
async fn routed(up: std::net::SocketAddr, mode: Http1Server, extra_server: &str) -> TestGateway {
    let toml = format!(
        "[server]\n{extra_server}\n[upstreams.r]\nurl = \"http://{up}\"\n[[routes]]\nname = \"r\"\nprefix = \"/r\"\nupstream = \"r\"\n"
    );
    let mut config = common::config(&toml, Path::new(env!("CARGO_MANIFEST_DIR")));
    config.server.http1 = mode;
    TestGateway::start(config).await
}

/// hyper's connection writes a response's trailer fields only to a client
/// that sent `TE: trailers`; so does ours.
#[tokio::test]
async fn trailer_fields_reach_only_a_client_that_asked_for_them() {
    let (up, _) = common::scripted::scripted(|_, _, _| {
        common::scripted::answer(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: x-sum\r\n\r\n2\r\nhi\r\n0\r\nx-sum: 9\r\n\r\n",
        )
    })
    .await;
    for mode in [Http1Server::Hyper, Http1Server::Gateway] {
        let gw = routed(up, mode, "").await;
        let asked = [
            ("", false),
            ("TE: trailers\r\n", true),
            ("TE: deflate\r\nTE: x, Trailers\r\n", true),
            ("TE: deflate\r\n", false),
        ];
        for (te, want) in asked {
            let req = format!("GET /r/t HTTP/1.1\r\nHost: h\r\n{te}Connection: close\r\n\r\n");
            let r = common::bounded(common::raw(gw.addr, req.as_bytes(), Duration::from_secs(3))).await;
            assert!(r.text.ends_with("0\r\n\r\n") || r.text.ends_with("x-sum: 9\r\n\r\n"), "{mode:?}: {:?}", r.text);
            assert_eq!(r.text.contains("x-sum: 9"), want, "{mode:?} {te:?}: {:?}", r.text);
        }
    }
}

/// A client that leaves while a streamed answer waits for its next bytes
/// (a long poll, an event stream) is noticed, as hyper's connection
/// notices it, and the upstream's answer dropped; not held until the
/// upstream sends again.
#[tokio::test]
async fn a_client_that_leaves_mid_answer_is_noticed_while_the_upstream_is_silent() {
    use futures_util::StreamExt;
    let dropped = Arc::new(AtomicUsize::new(0));
    let counted = dropped.clone();
    let up = TestUpstream::start(move |_req: Request<hyper::body::Incoming>| {
        let guard = Dropped(counted.clone());
        async move {
            let first =
                futures_util::stream::once(async { Ok(hyper::body::Frame::data(Bytes::from_static(b"first"))) });
            let frames = first.chain(futures_util::stream::pending()).map(move |f| {
                let _held = &guard;
                f
            });
            Response::new(http_body_util::BodyExt::boxed(http_body_util::StreamBody::new(frames)))
        }
    })
    .await;
    for mode in [Http1Server::Hyper, Http1Server::Gateway] {
        let gw = routed(up.addr, mode, "").await;
        let before = dropped.load(Ordering::SeqCst);
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(b"GET /r/events HTTP/1.1\r\nHost: h\r\n\r\n").await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        while !String::from_utf8_lossy(&got).contains("first") {
            let n = common::bounded(s.read(&mut buf)).await.unwrap();
            assert!(n > 0, "{mode:?} closed early");
            got.extend_from_slice(&buf[..n]);
        }
        drop(s);
        let noticed = common::bounded(async {
            for _ in 0..40 {
                if dropped.load(Ordering::SeqCst) > before {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            false
        })
        .await;
        assert!(noticed, "{mode:?}: the upstream's answer was still held 2 s after the client left");
    }
}

/// A request answered (here a 404) before its body came, a body nobody
/// reads (its client waits for `100 Continue`, or the app dropped it): the
/// connection does not wait for that body, and its answer says so with
/// `Connection: close` (RFC 9110 §10.1.1, RFC 9112 §9.6; for HTTP/1.0, no
/// `keep-alive`). A body already in with the head is read, and the
/// connection kept: the request behind it is answered.
#[tokio::test]
async fn an_answer_before_its_body_says_whether_the_connection_closes() {
    let o = gateway(Http1Server::Gateway, "").await;
    let next = "GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n";
    // (version and fields, body and what follows, closes)
    let cases: [(&str, String, bool); 8] = [
        ("HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 5", String::new(), true),
        ("HTTP/1.1\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked", String::new(), true),
        // No `Expect`: the 404 drops the body unread.
        ("HTTP/1.1\r\nContent-Length: 5", String::new(), true),
        ("HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: 5", String::new(), true),
        // The body came with the head, chunked or not: nothing is left
        // unread, and the next request is answered.
        ("HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 5", format!("hello{next}"), false),
        (
            "HTTP/1.1\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked",
            format!("5\r\nhello\r\n0\r\n\r\n{next}"),
            false,
        ),
        ("HTTP/1.1\r\nContent-Length: 5", format!("hello{next}"), false),
        // A body of nothing leaves nothing to wait for.
        ("HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 0", next.to_owned(), false),
    ];
    for (fields, rest, closes) in cases {
        let head = format!("POST /nowhere {fields}\r\nHost: x\r\n\r\n{rest}");
        let got = common::raw(o.gw.addr, head.as_bytes(), Duration::from_millis(500)).await;
        let text = got.text.to_ascii_lowercase();
        let case = format!("{fields:?} {rest:?}: {:?}", got.text);
        assert_eq!(got.status(), 404, "{case}");
        assert!(!got.text.contains(" 100 "), "{case}");
        assert_eq!(text.contains("\r\nconnection: close\r\n"), closes && fields.starts_with("HTTP/1.1"), "{case}");
        assert!(!(closes && text.contains("\r\nconnection: keep-alive\r\n")), "{case}");
        assert_eq!(got.closed, closes, "{case}");
        let answers = got.text.matches(" 404 ").count();
        assert_eq!(answers, if closes { 1 } else { 2 }, "{case}");
    }
}

/// A client that closes its side once answered sees the gateway close its
/// own: the end of the stream, not a reset (the own connection, having
/// read the client's FIN, closes a plain socket without a `shutdown`
/// first, which must not turn into an abort).
#[tokio::test]
async fn a_client_that_closes_its_side_gets_a_fin_back() {
    for mode in [Http1Server::Hyper, Http1Server::Gateway] {
        let gw = gateway(mode, "").await;
        let mut s = TcpStream::connect(gw.gw.addr).await.unwrap();
        s.write_all(b"GET /d/a HTTP/1.1\r\nHost: h\r\n\r\n").await.unwrap();
        let mut got = Vec::new();
        while !got.ends_with(b"\r\n\r\nok") {
            let mut buf = [0u8; 1024];
            let n = common::bounded(s.read(&mut buf)).await.unwrap();
            assert!(n > 0, "{mode:?}: closed before its answer: {:?}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
        s.shutdown().await.unwrap();
        let mut rest = Vec::new();
        let end = common::bounded(s.read_to_end(&mut rest)).await;
        assert!(matches!(end, Ok(0)), "{mode:?}: {end:?} after the answer, not the end of the stream");
    }
}
