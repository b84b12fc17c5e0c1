//! Upstreams that lie or break HTTP/1.1 on purpose, against the gateway's
//! own upstream client (src/upstream/h1/): lengths that lie, broken
//! chunks, obs-fold, NUL and bad bytes in heads, heads too large, slow
//! drips, early closes, and bytes nobody asked for. Each test names the
//! check it exercises; with that check removed, the test fails.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::scripted::{Answer, answer, route_to as gateway, scripted};
use common::*;
use http::Request;
use http_body_util::BodyExt;

fn once(bytes: &[u8], close: bool) -> Answer {
    Answer { close, ..answer(bytes) }
}

/// An upstream that answers every request head with `script`; counts the
/// connections it accepted.
async fn hostile(script: Answer) -> (SocketAddr, Arc<AtomicUsize>) {
    scripted(move |_, _, _| script.clone()).await
}

/// The status and, when it came whole, the body a GET of `/h` gets; a
/// response cut before its head reached the client is status 0.
async fn fetch(gw: &TestGateway) -> (u16, Result<Bytes, String>) {
    let resp = match client().request(Request::get(gw.url("/h")).body(full(Bytes::new())).unwrap()).await {
        Ok(resp) => resp,
        Err(e) => return (0, Err(e.to_string())),
    };
    let status = resp.status().as_u16();
    (status, resp.into_body().collect().await.map(|c| c.to_bytes()).map_err(|e| e.to_string()))
}

/// A cut response: its head went out and then its body failed, or the
/// gateway gave up before the head left (the upstream failed at once).
fn cut(got: &(u16, Result<Bytes, String>)) -> bool {
    matches!(got, (0 | 200, Err(_)))
}

async fn errors(gw: &TestGateway, name: &str, kind: &str) -> Option<f64> {
    sample(&metrics_text(gw.addr).await, "gateway_upstream_errors_total", &[("upstream", name), ("kind", kind)])
}

/// Check: a Content-Length body cut by a close is an error
/// (`Decoder::eof`), never a shorter body that looks complete.
#[tokio::test]
async fn a_length_that_lies_short_cuts_the_response() {
    let (addr, _) = hostile(once(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", true)).await;
    let gw = gateway(addr, "alengththatliesshortcutstherespon", "").await;
    let got = fetch(&gw).await;
    assert!(cut(&got), "a cut body must not look complete: {got:?}");
    assert_eq!(errors(&gw, "alengththatliesshortcutstherespon", "body").await, Some(1.0));
}

/// Check: bytes past the declared length (a second, unasked-for response
/// in the same read) mean the connection is not reused
/// (`ResponseBody::finish`, `rx.is_empty()`).
#[tokio::test]
async fn bytes_past_the_declared_length_close_the_connection() {
    let smuggled = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcHTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsmuggl";
    let (addr, accepted) = hostile(once(smuggled, false)).await;
    let gw = gateway(addr, "bytespastthedeclaredlengthclosethe", "").await;
    for _ in 0..2 {
        assert_eq!(fetch(&gw).await, (200, Ok(Bytes::from_static(b"abc"))));
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 2, "a connection that sent more than it said was reused");
}

/// Check: an idle pooled connection that became readable (the upstream
/// sent a response nobody asked for) is dropped before reuse
/// (`UpstreamIo::is_stale` in `Pool::take_idle`).
#[tokio::test]
async fn a_response_sent_to_an_idle_connection_is_never_taken_for_the_next_one() {
    let script = Answer {
        pieces: vec![
            (Duration::ZERO, b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc".to_vec()),
            (Duration::from_millis(50), b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsmuggl".to_vec()),
        ],
        close: false,
    };
    let (addr, accepted) = hostile(script).await;
    let gw = gateway(addr, "aresponsesenttoanidleconnectionis", "").await;
    assert_eq!(fetch(&gw).await, (200, Ok(Bytes::from_static(b"abc"))));
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A POST is never resent: only the check keeps it off the poisoned one.
    let resp = client().request(Request::post(gw.url("/h")).body(full("x")).unwrap()).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.into_body().collect().await.unwrap().to_bytes(), "abc");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

/// Check: a chunk-size line longer than `MAX_CHUNK_LINE` is refused
/// (`decode::line`), not buffered without end: a 502 when it is read
/// with the head (`client::check_body_start`), else a cut.
#[tokio::test]
async fn a_chunk_size_line_without_end_is_cut() {
    let mut wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;".to_vec();
    wire.extend(std::iter::repeat_n(b'e', 8000));
    wire.extend_from_slice(b"\r\nhello\r\n0\r\n\r\n");
    let (addr, _) = hostile(once(&wire, false)).await;
    let gw = gateway(addr, "achunksizelinewithoutendiscut", "").await;
    let got = fetch(&gw).await;
    assert!(cut(&got) || got.0 == 502, "{got:?}");
}

/// Check: a chunk's data must end with CRLF (`Chunk::DataEnd`): a chunk
/// longer than its size line said is not read on as the next size line
/// (here the two bytes past it would swallow the check, and "5" start a
/// chunk the upstream smuggled in).
#[tokio::test]
async fn a_chunk_longer_than_its_size_is_cut() {
    let wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcde5\r\nhello\r\n0\r\n\r\n";
    let (addr, _) = hostile(once(wire, false)).await;
    let gw = gateway(addr, "achunklongerthanitssizeiscut", "").await;
    let got = fetch(&gw).await;
    assert!(cut(&got), "{got:?}");
}

/// Check: conflicting Content-Length values are refused
/// (`head::content_length`).
#[tokio::test]
async fn conflicting_lengths_are_502() {
    let (addr, _) =
        hostile(once(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 30\r\n\r\nabc", false)).await;
    let gw = gateway(addr, "conflictinglengthsare502", "").await;
    assert_eq!(fetch(&gw).await.0, 502);
    assert_eq!(errors(&gw, "conflictinglengthsare502", "protocol").await, Some(1.0));
}

/// Check: Transfer-Encoding in an HTTP/1.0 response is refused
/// (`head::framing`): an HTTP/1.0 peer cannot mean chunked.
#[tokio::test]
async fn transfer_encoding_in_http_1_0_is_502() {
    let (addr, _) =
        hostile(once(b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", true)).await;
    let gw = gateway(addr, "transferencodinginhttp10is502", "").await;
    assert_eq!(fetch(&gw).await.0, 502);
}

/// Checks: httparse's own (obs-fold, NUL and other control bytes, a space
/// before the colon): each head is refused as the upstream's protocol error.
#[tokio::test]
async fn obs_fold_nul_and_bad_bytes_in_a_head_are_502() {
    let heads: [&[u8]; 4] = [
        b"HTTP/1.1 200 OK\r\nX-A: one\r\n two\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-A: o\0ne\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-A : one\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX\x01A: one\r\nContent-Length: 0\r\n\r\n",
    ];
    for (i, head) in heads.into_iter().enumerate() {
        let (addr, _) = hostile(once(head, false)).await;
        let gw = gateway(addr, "obsfoldnulandbadbytesinaheadare", "").await;
        assert_eq!(fetch(&gw).await.0, 502, "{:?}", String::from_utf8_lossy(head));
        assert_eq!(errors(&gw, "obsfoldnulandbadbytesinaheadare", "protocol").await, Some(i as f64 + 1.0));
    }
}

/// Check: a head past `MAX_HEAD` is refused at once (`head::parse`), not
/// read until the route's timeout.
#[tokio::test]
async fn a_head_without_end_is_502_at_once() {
    let mut wire = b"HTTP/1.1 200 OK\r\nX-Long: ".to_vec();
    wire.extend(std::iter::repeat_n(b'a', 600 * 1024));
    let (addr, _) = hostile(once(&wire, false)).await;
    let gw = gateway(addr, "aheadwithoutendis502atonce", "timeout = \"10s\"").await;
    // 502 (the head limit), not the route timeout's 504.
    assert_eq!(fetch(&gw).await.0, 502);
    assert_eq!(errors(&gw, "aheadwithoutendis502atonce", "protocol").await, Some(1.0));
}

/// Check: more than `MAX_HEADERS` fields are refused (httparse's
/// `TooManyHeaders`).
#[tokio::test]
async fn too_many_header_fields_are_502() {
    let mut wire = b"HTTP/1.1 200 OK\r\n".to_vec();
    for i in 0..150 {
        wire.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
    }
    wire.extend_from_slice(b"Content-Length: 0\r\n\r\n");
    let (addr, _) = hostile(once(&wire, false)).await;
    let gw = gateway(addr, "toomanyheaderfieldsare502", "").await;
    assert_eq!(fetch(&gw).await.0, 502);
}

/// Check: a head that arrives a byte at a time is parsed once whole
/// (`Parsed::Partial`), and 1xx before it are skipped (`Parsed::Interim`).
#[tokio::test]
async fn a_head_dripped_a_byte_at_a_time_after_interim_responses_is_read() {
    let wire = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    let pieces = wire.iter().map(|b| (Duration::from_millis(2), vec![*b])).collect();
    let (addr, accepted) = hostile(Answer { pieces, close: false }).await;
    let gw = gateway(addr, "aheaddrippedabyteatatimeafterin", "timeout = \"10s\"").await;
    for _ in 0..2 {
        assert_eq!(fetch(&gw).await, (200, Ok(Bytes::from_static(b"ok"))));
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "a whole exchange keeps its connection");
}

/// Check: a body that drips slower than the body timeout is cut
/// (`UpstreamBody`'s idle timer over the own client's body).
#[tokio::test]
async fn a_body_dripping_past_the_body_timeout_is_cut() {
    let script = Answer {
        pieces: vec![
            (Duration::ZERO, b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nab".to_vec()),
            (Duration::from_millis(800), b"cd".to_vec()),
        ],
        close: false,
    };
    let (addr, _) = hostile(script).await;
    let gw = gateway(addr, "abodydrippingpastthebodytimeoutis", "body_timeout = \"200ms\"").await;
    let got = fetch(&gw).await;
    assert!(cut(&got), "{got:?}");
    assert_eq!(errors(&gw, "abodydrippingpastthebodytimeoutis", "body_timeout").await, Some(1.0));
}

/// Check: a close in the middle of the head is the upstream's reset
/// (`Error::incomplete`), a 502.
#[tokio::test]
async fn an_early_close_in_the_head_is_502_reset() {
    let (addr, _) = hostile(once(b"HTTP/1.1 200 OK\r\nContent-Le", true)).await;
    let gw = gateway(addr, "anearlycloseintheheadis502reset", "").await;
    assert_eq!(fetch(&gw).await.0, 502);
    assert_eq!(errors(&gw, "anearlycloseintheheadis502reset", "reset").await, Some(1.0));
}

/// Check: a close in the middle of a chunked body is an error
/// (`Decoder::eof` for chunked).
#[tokio::test]
async fn an_early_close_in_a_chunked_body_cuts_the_response() {
    let (addr, _) = hostile(once(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel", true)).await;
    let gw = gateway(addr, "anearlycloseinachunkedbodycutsth", "").await;
    let got = fetch(&gw).await;
    assert!(cut(&got), "{got:?}");
}

/// Check: a body delimited by the close is whole at the close, and its
/// connection is never reused (`Framing::Close` in `head::parse`'s
/// `keep_alive`; behind it, the stale check finds the close too).
#[tokio::test]
async fn a_close_delimited_body_is_whole_and_its_connection_not_reused() {
    let (addr, accepted) = hostile(once(b"HTTP/1.1 200 OK\r\n\r\nuntil the end", true)).await;
    let gw = gateway(addr, "aclosedelimitedbodyiswholeandits", "").await;
    assert_eq!(fetch(&gw).await, (200, Ok(Bytes::from_static(b"until the end"))));
    // A POST (never resent): it must get a connection of its own.
    let resp = client().request(Request::post(gw.url("/h")).body(full("x")).unwrap()).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.into_body().collect().await.unwrap().to_bytes(), "until the end");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

/// Check: trailer sections are bounded (`MAX_TRAILERS`).
#[tokio::test]
async fn trailers_past_the_limit_cut_the_response() {
    let mut wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n".to_vec();
    for i in 0..40 {
        wire.extend_from_slice(format!("X-T{i}: {}\r\n", "v".repeat(1000)).as_bytes());
    }
    wire.extend_from_slice(b"\r\n");
    let (addr, _) = hostile(once(&wire, false)).await;
    let gw = gateway(addr, "trailerspastthelimitcuttheresponse", "").await;
    let got = fetch(&gw).await;
    assert!(cut(&got), "{got:?}");
}

/// Check: an answer begun on a pooled connection, then broken or cut (a
/// head that breaks the protocol, part of a head, a 1xx or a status line
/// and then the close), is not taken for a stale connection
/// (`Error::is_stale`, `client::exchange`): the upstream read the request
/// and answered it, so an idempotent request is not run twice without
/// `retries`.
#[tokio::test]
async fn an_answer_begun_on_a_pooled_connection_is_not_sent_again() {
    let cases: [(&[u8], bool); 4] = [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2, 5\r\n\r\nok", false),
        (b"HTTP/1.1 200 OK\r\nContent-Le", true),
        (b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n", true),
        (b"HTTP/1.1 200 OK\r\n", true),
    ];
    for (i, (second, close)) in cases.into_iter().enumerate() {
        let asked = Arc::new(AtomicUsize::new(0));
        let seen = asked.clone();
        let (addr, _) = scripted(move |_, n, head| {
            if head.starts_with("DELETE") {
                seen.fetch_add(1, Ordering::SeqCst);
            }
            match n {
                0 => answer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
                _ => once(second, close),
            }
        })
        .await;
        let gw = gateway(addr, &format!("anansweronapooledconnection{i}"), "").await;
        assert_eq!(fetch(&gw).await, (200, Ok(Bytes::from_static(b"ok"))));
        let resp = client().request(Request::delete(gw.url("/h")).body(full(Bytes::new())).unwrap()).await.unwrap();
        assert_eq!(resp.status(), 502, "case {i}");
        assert_eq!(asked.load(Ordering::SeqCst), 1, "case {i}: the DELETE reached the upstream twice");
    }
}
