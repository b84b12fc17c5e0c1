//! Differential test of the gateway's own HTTP/1.1 upstream client
//! (src/upstream/h1/) against hyper's: proptest builds upstream response
//! byte streams (heads valid and not, every framing, lies about lengths,
//! broken chunks, stray bytes, closes), each is served to both clients
//! over a real socket, and both must come to the same decision: status,
//! headers, body bytes and trailers, whether the connection could be
//! reused, and the class of error (the upstream's protocol error, or a
//! reset). The deviations chosen on purpose (see src/upstream/h1/mod.rs)
//! are either outside what is generated here or checked as deviations: a
//! transfer coding other than one `chunked` and a bodiless answer's
//! `Content-Length` that is no length are the own client's protocol error
//! where hyper gives a response; a body broken at its start may fail the
//! own client's exchange where hyper gives the head and fails the body.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request};
use http_body_util::{BodyExt, Either, Empty};
use hyper_util::rt::TokioIo;
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use gateway::upstream::connect::Stream;
use gateway::upstream::h1;
use gateway::upstream::io::UpstreamIo;
use gateway::upstream::pool::{Conn, SendBody};

/// Header or trailer fields, in order.
type Fields = Vec<(String, Vec<u8>)>;

/// What a client made of a response.
#[derive(Debug, PartialEq)]
enum Decision {
    /// Still waiting after [`PATIENCE`] (a body that ends only at a close
    /// that never comes).
    Waiting,
    /// No response head: the upstream's protocol error, or a reset.
    Failed(&'static str),
    Response {
        status: u16,
        headers: Fields,
        /// The body and its trailers, or that it failed.
        body: Result<(Vec<u8>, Fields), ()>,
        reusable: bool,
    },
}

fn fields(h: &HeaderMap) -> Fields {
    h.iter().map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec())).collect()
}

/// Serves `wire` (in `pieces`) to the first request on one connection,
/// then closes or waits for the client to leave.
async fn upstream(wire: Vec<u8>, pieces: usize, close: bool) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        let size = wire.len().div_ceil(pieces.max(1)).max(1);
        for piece in wire.chunks(size) {
            if s.write_all(piece).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if !close {
            let _ = s.read(&mut buf).await;
        }
    });
    addr
}

fn request(method: &Method) -> Request<SendBody> {
    Request::builder().method(method.clone()).uri("/").header("host", "x").body(Either::Right(Empty::new())).unwrap()
}

/// How long after a body's end a connection is looked at for a close or
/// stray bytes (hyper's connection task reads them on its own).
const SETTLE: Duration = Duration::from_millis(30);

/// How long a client may take over one response.
const PATIENCE: Duration = Duration::from_millis(500);

async fn own(addr: SocketAddr, method: &Method) -> Decision {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut conn = Conn::unpooled(UpstreamIo::new(Stream::Tcp(tcp), false));
    conn.prepare(Duration::from_secs(5), false);
    let response = match h1::send(conn, request(method)).await {
        Ok(r) => r,
        Err(e) => return Decision::Failed(if e.is_parse() { "protocol" } else { "reset" }),
    };
    let status = response.status().as_u16();
    let headers = fields(response.headers());
    let mut body = response.into_body();
    let (mut data, mut trailers, mut failed) = (Vec::new(), Vec::new(), false);
    loop {
        match std::future::poll_fn(|cx| body.poll_frame(cx)).await {
            None => break,
            Some(Err(_)) => {
                failed = true;
                break;
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(d) => data.extend_from_slice(&d),
                Err(f) => trailers = f.into_trailers().map(|t| fields(&t)).unwrap_or_default(),
            },
        }
    }
    tokio::time::sleep(SETTLE).await;
    let reusable = !failed && body.reusable();
    Decision::Response { status, headers, body: if failed { Err(()) } else { Ok((data, trailers)) }, reusable }
}

async fn hyper_client(addr: SocketAddr, method: &Method) -> Decision {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(tcp)).await.unwrap();
    let task = tokio::spawn(connection);
    let req = Request::builder().method(method.clone()).uri("/").header("host", "x").body(Empty::new()).unwrap();
    let response = match sender.send_request(req).await {
        Ok(r) => r,
        Err(e) => {
            let protocol = e.is_parse() || e.is_parse_status() || e.is_parse_too_large();
            task.abort();
            return Decision::Failed(if protocol { "protocol" } else { "reset" });
        }
    };
    let status = response.status().as_u16();
    let headers = fields(response.headers());
    // The gateway's own rule on top of hyper's (upstream/proxy.rs
    // `prepare_response`): Content-Length beside a body not framed by it.
    let ambiguous = http_body::Body::size_hint(response.body()).exact().is_none()
        && response.headers().contains_key(http::header::CONTENT_LENGTH);
    let body = response.into_body().collect().await;
    tokio::time::sleep(SETTLE).await;
    let reusable = body.is_ok() && !ambiguous && !sender.is_closed() && sender.is_ready();
    task.abort();
    let body = body.map(|c| (c.trailers().map(fields).unwrap_or_default(), c.to_bytes().to_vec()));
    Decision::Response { status, headers, body: body.map(|(t, d)| (d, t)).map_err(|_| ()), reusable }
}

fn status_line() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "HTTP/1.1 200 OK",
        "HTTP/1.0 200 OK",
        "HTTP/1.1 204 No Content",
        "HTTP/1.1 304 Not Modified",
        "HTTP/1.1 404 Nope",
        "HTTP/1.1 200",
        "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK",
        "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 201 Made",
        "HTTP/1.1 999 Odd",
        "HTTP/1.1 099 Low",
        "HTTP/1.1 20 OK",
        "HTTP/2.0 200 OK",
        "HTTP/1.1  200 OK",
        "http/1.1 200 OK",
    ])
}

fn header_line() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "Content-Length: 5",
        "Content-Length: 0",
        "Content-Length: 3",
        "Content-Length: 5, 5",
        "Content-Length: 5,6",
        "Content-Length: +5",
        "Content-Length: 5x",
        "Content-Length: 18446744073709551615",
        "Transfer-Encoding: chunked",
        "Transfer-Encoding: gzip",
        "Transfer-Encoding: gzip, chunked",
        "Transfer-Encoding: chunked, gzip",
        "Transfer-Encoding: CHUNKED",
        "Connection: close",
        "Connection: keep-alive",
        "Connection: Keep-Alive, foo",
        "X-A: b",
        "X-A: two words\t",
        "X-Fold: a\r\n b",
        "X-Nul: a\0b",
        "X-Sp : a",
        "Bad\x01: x",
        "X-Empty:",
        ": nameless",
        "X-Obs: caf\u{e9}",
        "X-Bare: lf\nX-B: c",
    ])
}

fn body() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "",
        "hello",
        "hel",
        "helloEXTRA",
        "5\r\nhello\r\n0\r\n\r\n",
        "5;ext=1\r\nhello\r\n0\r\nx-t: 1\r\nx-u: 2\r\n\r\n",
        "5 ;a\r\nhello\r\n0\r\n\r\n",
        "3\r\nabcdef\r\n0\r\n\r\n",
        "zz\r\nhello\r\n0\r\n\r\n",
        "0x5\r\nhello\r\n0\r\n\r\n",
        "5\nhello\r\n0\r\n\r\n",
        "5\r\nhel",
        "5\r\nhello\r\n0\r\n\r\nEXTRA",
        "5\r\nhello\r\n0\r\nx-t: a\r\n b\r\n\r\n",
        "5\r\nhello\r\n0\r\n\rX",
        "00005\r\nhello\r\n0000\r\n\r\n",
        "5\r\nhello\r\n0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
    ])
}

/// A response on the wire, perhaps cut short at `cut` (a fraction of its
/// length, 1.0 for whole).
fn wire() -> impl Strategy<Value = (Vec<u8>, bool)> {
    (status_line(), prop::collection::vec(header_line(), 0..4), body(), prop::option::of(0.0f64..1.0), any::<bool>())
        .prop_map(|(status, headers, body, cut, close)| {
            let mut w = format!("{status}\r\n").into_bytes();
            for h in headers {
                w.extend_from_slice(h.as_bytes());
                w.extend_from_slice(b"\r\n");
            }
            w.extend_from_slice(b"\r\n");
            w.extend_from_slice(body.as_bytes());
            if let Some(cut) = cut {
                w.truncate((w.len() as f64 * cut) as usize);
            }
            (w, close || cut.is_some())
        })
}

/// The wire from the final head on (past any 1xx heads).
fn final_head(mut wire: &[u8]) -> &[u8] {
    while wire.starts_with(b"HTTP/1.1 1") {
        match wire.windows(4).position(|w| w == b"\r\n\r\n") {
            Some(end) => wire = &wire[end + 4..],
            None => break,
        }
    }
    wire
}

/// The final head's status code and the list items of its fields named
/// `name` (any case), trimmed; `None` while the head is not whole.
fn final_items(wire: &[u8], name: &str) -> Option<(u16, Vec<String>)> {
    let wire = final_head(wire);
    let end = wire.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&wire[..end]).to_string();
    let mut lines = head.split("\r\n");
    let code = lines.next().and_then(|l| l.get(9..12)).and_then(|c| c.parse().ok()).unwrap_or(0);
    let items = lines
        .filter_map(|l| l.split_once(':'))
        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
        .flat_map(|(_, v)| v.split(',').map(|i| i.trim().to_owned()).collect::<Vec<_>>())
        .collect();
    Some((code, items))
}

/// Whether the final head frames a body with transfer codings other than
/// one `chunked`, which the own client refuses (src/upstream/h1/head.rs
/// `framing`) where hyper relays the body still coded, or framed by the
/// close.
fn coding_refused(wire: &[u8], head_request: bool) -> bool {
    let Some((code, items)) = final_items(wire, "transfer-encoding") else { return false };
    if head_request || code < 200 || code == 204 || code == 304 {
        return false;
    }
    let codings: Vec<String> = items.into_iter().map(|c| c.to_ascii_lowercase()).filter(|c| !c.is_empty()).collect();
    !codings.is_empty() && codings != ["chunked"]
}

/// Whether the final head is a bodiless answer (to HEAD, or 204 or 304)
/// with a `Content-Length` that is no length (RFC 9110 §8.6: digits only,
/// every value and list item the same number), which the own client
/// refuses (src/upstream/h1/head.rs `framing`) where hyper passes it on.
fn bad_bodiless_length(wire: &[u8], head_request: bool) -> bool {
    let Some((code, items)) = final_items(wire, "content-length") else { return false };
    if !(head_request || code == 204 || code == 304) {
        return false;
    }
    let lengths: Vec<Option<u64>> =
        items.iter().map(|i| i.bytes().all(|b| b.is_ascii_digit()).then(|| i.parse().ok()).flatten()).collect();
    lengths.iter().any(|n| n.is_none() || *n != lengths[0])
}

/// hyper's headers with a repeated or list-valued `Content-Length` of one
/// value made that one value, where the first line was, as the own client
/// passes it on (RFC 9110 §8.6); beside `Transfer-Encoding` (which frames
/// the body instead) it is left as it came.
fn one_content_length(headers: &mut Fields) {
    if headers.iter().any(|(n, _)| n == "transfer-encoding") {
        return;
    }
    let lengths: Vec<usize> = (0..headers.len()).filter(|&i| headers[i].0 == "content-length").collect();
    let values: Vec<Vec<u8>> = lengths
        .iter()
        .flat_map(|&i| headers[i].1.split(|&b| b == b',').map(|v| v.trim_ascii().to_vec()).collect::<Vec<_>>())
        .collect();
    let number = |v: &Vec<u8>| !v.is_empty() && v.iter().all(u8::is_ascii_digit);
    if values.len() < 2 || values.iter().any(|v| *v != values[0] || !number(v)) {
        return;
    }
    headers[lengths[0]].1 = values[0].clone();
    for &i in lengths[1..].iter().rev() {
        headers.remove(i);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn the_own_client_decides_as_hyper_does((wire, close) in wire(), head in any::<bool>(), pieces in 1usize..4) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let method = if head { Method::HEAD } else { Method::GET };
        let (ours, theirs) = rt.block_on(async {
            let a = upstream(wire.clone(), pieces, close).await;
            let b = upstream(wire.clone(), pieces, close).await;
            let own = async { tokio::time::timeout(PATIENCE, own(a, &method)).await.unwrap_or(Decision::Waiting) };
            let theirs =
                async { tokio::time::timeout(PATIENCE, hyper_client(b, &method)).await.unwrap_or(Decision::Waiting) };
            tokio::join!(own, theirs)
        });
        // A head broken before it is complete and then closed: each client
        // parses once a head looks complete, so what it makes of the close
        // (a reset, or the protocol error it parsed) depends on how the
        // bytes were split. Both are 502s.
        let unfinished_head = !final_head(&wire).windows(4).any(|w| w == b"\r\n\r\n");
        if unfinished_head && matches!((&ours, &theirs), (Decision::Failed(_), Decision::Failed(_))) {
            return Ok(());
        }
        // A transfer coding other than one `chunked`: the own client
        // refuses the response (a 502), as nginx does.
        if coding_refused(&wire, head) {
            prop_assert_eq!(&ours, &Decision::Failed("protocol"), "{:?}", String::from_utf8_lossy(&wire));
            return Ok(());
        }
        // A bodiless answer whose Content-Length is no length: the own
        // client refuses it (a 502), hyper passes it on.
        if bad_bodiless_length(&wire, head) && matches!(theirs, Decision::Response { .. }) {
            prop_assert_eq!(&ours, &Decision::Failed("protocol"), "{:?}", String::from_utf8_lossy(&wire));
            return Ok(());
        }
        // A body broken at its start (a first chunk-size line that is not
        // one, a close before the first byte): when the own client sees it
        // before handing the head on, its exchange fails, where hyper's
        // body fails after the head.
        if let (Decision::Failed("protocol" | "reset"), Decision::Response { body: Err(()), .. }) = (&ours, &theirs) {
            return Ok(());
        }
        // Content-Length beside Transfer-Encoding: the own client never
        // reuses the connection (RFC 9112 §6.1), even when the response has
        // no body to frame (HEAD, 204, 304), where the gateway's rule over
        // hyper's client looked only at a body's framing.
        let (mut ours, mut theirs) = (ours, theirs);
        if let (Decision::Response { .. }, Decision::Response { headers, .. }) = (&ours, &mut theirs) {
            one_content_length(headers);
        }
        if let (Decision::Response { headers, reusable: mine, .. }, Decision::Response { reusable: true, .. }) =
            (&mut ours, &theirs)
        {
            let has = |n: &str| headers.iter().any(|(h, _)| h == n);
            if !*mine && has("content-length") && has("transfer-encoding") {
                *mine = true;
            }
        }
        prop_assert_eq!(ours, theirs, "{} {:?}", method, String::from_utf8_lossy(&wire));
    }
}
