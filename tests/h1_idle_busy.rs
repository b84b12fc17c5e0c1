//! A hostile review, by raw sockets, of the own client-facing HTTP/1.1
//! connection's split between waiting for a request (idle, holding no
//! buffer) and serving one (busy): timeouts, shutdowns and request bodies
//! across that boundary, each case run against hyper's connection too.
//! Each test is bounded in time.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::{TestGateway, bounded};
use gateway::config::Http1Server;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

const MODES: [Http1Server; 2] = [Http1Server::Hyper, Http1Server::Gateway];

/// How long a client waits for an answer that must come.
const WAIT: Duration = Duration::from_secs(5);

/// What the upstream saw: one line per request body, `path body`.
type Seen = Arc<Mutex<Vec<String>>>;

/// A gateway with the given HTTP/1.1 connection and one route `/r` to
/// `up` (`protocol`, e.g. `h2c`), with extra `[server]` and route keys.
async fn gateway(mode: Http1Server, up: SocketAddr, upstream: &str, server: &str, route: &str) -> TestGateway {
    let toml = format!(
        "[server]\n{server}\n[upstreams.r]\nurl = \"http://{up}\"\n{upstream}\n\
         [[routes]]\nname = \"r\"\nprefix = \"/r\"\nupstream = \"r\"\n{route}\n"
    );
    let mut config = common::config(&toml, Path::new(env!("CARGO_MANIFEST_DIR")));
    config.server.http1 = mode;
    TestGateway::start(config).await
}

/// An HTTP/2 (prior knowledge) upstream granting each stream a window of
/// 5 bytes. `/r/early` is answered at once, before its body is read; that
/// body is read from 400 ms on. Every other request is answered with its
/// body once it has all come. Each body read is noted in `seen` (`error`
/// for one that failed).
async fn h2_upstream() -> (SocketAddr, Seen) {
    let seen: Seen = Arc::default();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let noted = seen.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let noted = noted.clone();
            tokio::spawn(async move {
                let builder = h2::server::Builder::new().initial_window_size(5).clone();
                let Ok(mut conn) = builder.handshake::<_, Bytes>(tcp).await else { return };
                while let Some(Ok((req, respond))) = conn.accept().await {
                    tokio::spawn(h2_exchange(req, respond, noted.clone()));
                }
            });
        }
    });
    (addr, seen)
}

async fn h2_exchange(req: http::Request<h2::RecvStream>, mut respond: h2::server::SendResponse<Bytes>, seen: Seen) {
    let path = req.uri().path().to_owned();
    let mut body = req.into_body();
    let answer = |b: Bytes| {
        let head = http::Response::builder().header("content-length", b.len()).body(()).unwrap();
        (head, b)
    };
    let early = path == "/r/early";
    let mut stream = None;
    if early {
        let (head, b) = answer(Bytes::from_static(b"early"));
        let mut s = respond.send_response(head, false).unwrap();
        let _ = s.send_data(b, true);
        stream = Some(s);
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let mut got = Vec::new();
    let read = loop {
        match body.data().await {
            None => break Ok(()),
            Some(Ok(chunk)) => {
                let _ = body.flow_control().release_capacity(chunk.len());
                got.extend_from_slice(&chunk);
            }
            Some(Err(e)) => break Err(e),
        }
    };
    let text = match read {
        Ok(()) => String::from_utf8_lossy(&got).into_owned(),
        Err(_) => "error".to_owned(),
    };
    seen.lock().unwrap().push(format!("{path} {text}"));
    if !early {
        let (head, b) = answer(Bytes::from(got));
        if let Ok(mut s) = respond.send_response(head, false) {
            let _ = s.send_data(b, true);
        }
    }
    drop(stream);
}

/// An upstream that answers before it reads the request body holds that
/// body while its HTTP/2 stream waits for window (5 bytes: it takes two
/// chunks, then waits), the body's last `chunks` already read into the
/// connection's buffer; then the client's next request begins (`next`),
/// or the connection waits for one. The first body as the upstream reads
/// it from 400 ms on; the next request must get its own body.
async fn a_held_body(mode: Http1Server, chunks: &[&str], next: bool) -> String {
    let (up, seen) = h2_upstream().await;
    let gw = gateway(mode, up, "protocol = \"h2c\"", "", "request_buffer = 0").await;
    // The upstream connection made, its settings (the small window) known.
    let warm = common::raw(gw.addr, b"GET /r/warm HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", WAIT);
    assert_eq!(bounded(warm).await.status(), 200, "{mode:?}");
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    let body: String = chunks.iter().map(|c| format!("{:x}\r\n{c}\r\n", c.len())).collect();
    let mut first = format!("POST /r/early HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{body}0\r\n\r\n");
    if next {
        first += "POST /r/next HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\n";
    }
    s.write_all(first.as_bytes()).await.unwrap();
    let answers = bounded(common::read_responses(&mut s, &[false])).await;
    assert_eq!(answers[0].1, b"early", "{mode:?}: {answers:?}");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let noted = || seen.lock().unwrap().clone();
    if next {
        s.write_all(b"SECOND").await.unwrap();
        let answers = tokio::time::timeout(WAIT, common::read_responses(&mut s, &[false])).await;
        let answers =
            answers.unwrap_or_else(|_| panic!("{mode:?}: the next request unanswered; upstream saw {:?}", noted()));
        assert_eq!(answers[0].1, b"SECOND", "{mode:?}: {answers:?}; upstream saw {:?}", noted());
    }
    bounded(async {
        loop {
            if let Some(l) = noted().into_iter().find_map(|l| l.strip_prefix("/r/early ").map(str::to_owned)) {
                return l;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

/// A body's last chunk, left in the buffer when the connection went on to
/// the next head (or to wait for one), is the body's: whoever holds the
/// body after its exchange never reads the next request's bytes, nor gets
/// a clean end short of that chunk (an error is all it can get, the chunk
/// having been skipped). hyper's connection reads no further request
/// until the first body has been read.
#[tokio::test]
async fn a_body_held_past_its_answer_never_reads_what_follows_it() {
    for (mode, next) in [(Http1Server::Hyper, true), (Http1Server::Gateway, true), (Http1Server::Gateway, false)] {
        let got = a_held_body(mode, &["AAAAA", "BBBBB", "CCCCC"], next).await;
        assert!(["AAAAABBBBBCCCCC", "error"].contains(&got.as_str()), "{mode:?}, next {next}: {got:?}");
    }
}

/// The same with only the body's end left in the buffer (none of its
/// data): the upstream gets the whole body, ended cleanly.
#[tokio::test]
async fn a_body_held_past_its_answer_gets_its_end() {
    for mode in MODES {
        assert_eq!(a_held_body(mode, &["AAAAA", "BBBBB"], true).await, "AAAAABBBBB", "{mode:?}");
    }
}

/// A gateway with the given HTTP/1.1 connection in front of an upstream
/// that answers `ok`.
async fn plain(mode: Http1Server, server: &str) -> TestGateway {
    let (up, _) = common::counting_upstream().await;
    let gw = gateway(mode, up.addr, "", server, "").await;
    std::mem::forget(up);
    gw
}

/// Sends `head` in two pieces with a graceful shutdown of the gateway
/// between them (after `before`, answered first on the same connection):
/// what came back, and whether the gateway closed.
async fn shutdown_mid_head(mode: Http1Server, before: &str, head: &str, cut: usize) -> common::Raw {
    let mut gw = plain(mode, "").await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    if !before.is_empty() {
        s.write_all(before.as_bytes()).await.unwrap();
        let answered = bounded(common::read_responses(&mut s, &[false])).await;
        assert!(answered[0].0.starts_with("HTTP/1.1 200"), "{mode:?}: {answered:?}");
    }
    s.write_all(&head.as_bytes()[..cut]).await.unwrap();
    // Read by the gateway, then the shutdown reaches the connection.
    tokio::time::sleep(Duration::from_millis(300)).await;
    gw.shutdown();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = s.write_all(&head.as_bytes()[cut..]).await;
    common::read_for(&mut s, WAIT).await
}

/// A graceful shutdown closes a connection that waits for a request, but
/// serves (with `Connection: close`) one whose head has begun to arrive:
/// the client sent it before it could learn of the shutdown. hyper's
/// connection does so for a connection's first request.
#[tokio::test]
async fn a_head_begun_before_a_shutdown_is_served_and_the_connection_closed() {
    let head = "GET /r/a HTTP/1.1\r\nHost: x\r\n\r\n";
    for mode in MODES {
        let r = shutdown_mid_head(mode, "", head, 20).await;
        assert!(r.text.starts_with("HTTP/1.1 200"), "{mode:?}: {:?}", r.text);
        assert!(r.text.to_ascii_lowercase().contains("connection: close"), "{mode:?}: {:?}", r.text);
        assert!(r.closed, "{mode:?}: left open after the last answer");
    }
    // A later request on the connection (hyper's closes it unanswered).
    let r = shutdown_mid_head(Http1Server::Gateway, head, head, 20).await;
    assert!(r.text.starts_with("HTTP/1.1 200") && r.closed, "{:?}", r.text);
    // A head begun that never ends holds the drain no longer than the
    // header read timeout (the shutdown timeout is 30 s).
    let mut gw = plain(Http1Server::Gateway, "header_read_timeout = \"1s\"").await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(&head.as_bytes()[..20]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    gw.shutdown();
    assert!(common::closed_within(&mut s, WAIT).await.is_some(), "a stalled head held past the header timeout");
    bounded(gw.task).await.unwrap();
    // Nothing of a next head read yet: closed, unanswered.
    for mode in MODES {
        let r = shutdown_mid_head(mode, head, head, 0).await;
        assert!(r.closed && r.text.is_empty(), "{mode:?}: {:?}", r.text);
    }
}

/// The first bytes of a next head that came behind a request's body (or
/// in the same read as a bodiless request's head) are timed, once that
/// request is answered, by the header read timeout, not held for the idle
/// timeout: the own connection knows where the body ended. (hyper's
/// connection cannot tell them from the body: the idle timeout bounds
/// those, see `tests/listener_attack.rs`.)
#[tokio::test]
async fn a_partial_head_read_behind_a_request_is_cut_at_the_header_timeout() {
    let server = "header_read_timeout = \"1s\"\nidle_timeout = \"60s\"";
    let gw = plain(Http1Server::Gateway, server).await;
    let first = [
        "POST /r/a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi",
        "POST /r/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
        "GET /r/a HTTP/1.1\r\nHost: x\r\n\r\n",
    ];
    for first in first {
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(format!("{first}GET /r/next HTTP/1.1\r\nHo").as_bytes()).await.unwrap();
        let answered = bounded(common::read_responses(&mut s, &[false])).await;
        assert!(answered[0].0.starts_with("HTTP/1.1 200"), "{answered:?}");
        let closed = common::closed_within(&mut s, Duration::from_secs(15)).await;
        assert!(closed.is_some(), "{first:?}: a half head behind it held open past 15 s (the idle timeout is 60 s)");
    }
}

/// Empty lines after a request (an old client's CRLF after a POST body;
/// RFC 9112 §2.2 asks a server to ignore them) are no next head: the
/// connection waits for one under the idle timeout, as with hyper's.
#[tokio::test]
async fn an_empty_line_after_a_body_is_no_head_begun() {
    for mode in MODES {
        let gw = plain(mode, "header_read_timeout = \"1s\"\nidle_timeout = \"60s\"").await;
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(b"POST /r/a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi\r\n").await.unwrap();
        let answered = bounded(common::read_responses(&mut s, &[false])).await;
        assert!(answered[0].0.starts_with("HTTP/1.1 200"), "{mode:?}: {answered:?}");
        // Past the header read timeout, the connection still serves.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let _ = s.write_all(b"GET /r/b HTTP/1.1\r\nHost: x\r\n\r\n").await;
        let r = common::read_for(&mut s, Duration::from_secs(1)).await;
        assert!(r.text.starts_with("HTTP/1.1 200"), "{mode:?}: {:?}", r.text);
    }
}
