//! One HTTP/2 stream: the request handed to the app, the 1xx heads that
//! come before its answer forwarded, the client's reset watched for.

use std::future::Future;
use std::pin::pin;
use std::task::Poll;

use bytes::Bytes;
use h2::RecvStream;
use h2::server::SendResponse;
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};

use super::Streams;
use crate::body::{H2Body, Incoming, OnFirstPoll};
use crate::listener::conn::ConnBody;
use crate::request::Interims;
use crate::upstream::h1::{MAX_HEADERS, content_length};

/// What a server answers to `Expect: 100-continue` when the body is first
/// asked for, as an upstream's interim head would come.
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// Answers one stream: the app's answer, then its body.
pub(super) async fn serve(streams: Streams, req: Request<RecvStream>, mut reply: SendResponse<Bytes>) {
    let interims = Interims::default();
    let (req, _held) = request(req, &interims);
    let bodiless = http_body::Body::is_end_stream(req.body());
    let in_flight = streams.state.request_started(true, bodiless);
    let request_ids = streams.app.config().server.request_id;
    // Boxed: inline, the app's future would be copied with the stream's
    // whenever that is moved, as in its spawn (see benches/README.md,
    // Decisions).
    let answer = Box::pin(super::super::answer(streams.app, streams.kind, req, in_flight, false));
    if let Some(response) = wait(answer, &interims, &mut reply, request_ids).await {
        super::send::respond(response, reply).await;
    }
}

/// The app's request for an h2 request: its body the stream's, the
/// stream's interim heads in its extensions for the upstream to fill.
/// A `CONNECT` gets an empty body; its stream is returned, held until the
/// answer is sent (dropping it would not end the stream any sooner).
fn request(req: Request<RecvStream>, interims: &Interims) -> (Request<Incoming>, Option<RecvStream>) {
    let (mut parts, recv) = req.into_parts();
    parts.extensions.insert(interims.clone());
    if parts.method == Method::CONNECT {
        return (Request::from_parts(parts, Incoming::Empty), Some(recv));
    }
    let length = content_length(&parts.headers).ok().flatten();
    let expects = parts.headers.get(header::EXPECT).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let first_poll = expects.then(|| {
        let interims = interims.clone();
        Box::new(move || interims.push(Bytes::from_static(CONTINUE))) as OnFirstPoll
    });
    let body = H2Body::new(recv, length, first_poll);
    (Request::from_parts(parts, Incoming::H2(body)), None)
}

/// Interim answers forwarded on one stream at most: h2 queues a HEADERS
/// frame for each outside flow control, so an upstream's endless 1xx held
/// for a client that does not read would grow the gateway without end.
const MAX_INTERIMS: usize = 16;

/// Waits for the answer, sending each interim head that comes before it
/// (the first [`MAX_INTERIMS`] of them);
/// `None` when the client reset the stream (or the connection failed)
/// first, and the app's future is dropped.
async fn wait<F: Future<Output = Response<ConnBody>>>(
    answer: F,
    interims: &Interims,
    reply: &mut SendResponse<Bytes>,
    request_ids: bool,
) -> Option<Response<ConnBody>> {
    let mut answer = pin!(answer);
    let mut left = MAX_INTERIMS;
    std::future::poll_fn(|cx| {
        loop {
            if let Poll::Ready(response) = answer.as_mut().poll(cx) {
                // Those that came with the answer's head go first.
                while let Some(raw) = interims.take() {
                    forward(&raw, reply, &mut left, request_ids);
                }
                return Poll::Ready(Some(response));
            }
            if let Poll::Ready(raw) = interims.poll_next(cx) {
                forward(&raw, reply, &mut left, request_ids);
                continue;
            }
            if let Poll::Ready(reset) = reply.poll_reset(cx) {
                tracing::debug!(reset = ?reset, "client reset its stream before the answer");
                return Poll::Ready(None);
            }
            return Poll::Pending;
        }
    })
    .await
}

/// Sends the interim head `raw` (as the upstream sent it) to the client,
/// while `left` allows; `request_ids`: see [`crate::headers::interim::strip`].
fn forward(raw: &[u8], reply: &mut SendResponse<Bytes>, left: &mut usize, request_ids: bool) {
    if *left == 0 {
        return;
    }
    let Some(head) = informational(raw, request_ids) else { return };
    *left -= 1;
    if let Err(e) = reply.send_informational(head) {
        tracing::debug!(error = %e, "cannot send an interim answer");
    }
}

/// A 1xx head from the upstream (`raw`, as it came) as an HTTP/2 client
/// gets it: the status, and the fields but the connection-specific ones
/// and those its `Connection` field names (RFC 9113 §8.2.2). `None` if `raw` is not such a head, or is a 101,
/// which HTTP/2 has no use for.
fn informational(raw: &[u8], request_ids: bool) -> Option<Response<()>> {
    let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut storage);
    let Ok(httparse::Status::Complete(_)) = parsed.parse(raw) else { return None };
    let status = StatusCode::from_u16(parsed.code?).ok()?;
    if !status.is_informational() || status == StatusCode::SWITCHING_PROTOCOLS {
        return None;
    }
    let mut head = Response::new(());
    *head.status_mut() = status;
    for f in parsed.headers.iter() {
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(f.name.as_bytes()), HeaderValue::from_bytes(f.value)) {
            head.headers_mut().append(name, value);
        }
    }
    crate::headers::interim::strip(head.headers_mut(), request_ids);
    Some(head)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interim_heads_as_an_http2_client_gets_them() {
        type Case = (&'static str, Option<(u16, &'static [&'static str])>);
        let cases: &[Case] = &[
            (
                "HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n",
                Some((103, &["link: </style.css>; rel=preload"])),
            ),
            ("HTTP/1.1 102 Processing\r\n\r\n", Some((102, &[]))),
            ("HTTP/1.1 100 Continue\r\n\r\n", Some((100, &[]))),
            (
                "HTTP/1.1 103 Early Hints\r\nConnection: x\r\nKeep-Alive: 5\r\nLink: <a>\r\nLink: <b>\r\n\r\n",
                Some((103, &["link: <a>", "link: <b>"])),
            ),
            (
                "HTTP/1.1 103 Early Hints\r\nConnection: X-Hint\r\nX-Hint: 1\r\nTE: trailers\r\nLink: <a>\r\n\r\n",
                Some((103, &["link: <a>"])),
            ),
            ("HTTP/1.1 103 Early Hints\r\nContent-Length: 10\r\nLink: <a>\r\n\r\n", Some((103, &["link: <a>"]))),
            // The gateway's ID comes with the answer; the upstream's goes nowhere.
            ("HTTP/1.1 103 Early Hints\r\nX-Request-Id: up\r\nLink: <a>\r\n\r\n", Some((103, &["link: <a>"]))),
            ("HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n", None),
            ("HTTP/1.1 200 OK\r\n\r\n", None),
            ("HTTP/1.1 103 Early", None),
            ("garbage\r\n\r\n", None),
        ];
        for (raw, want) in cases {
            let got = informational(raw.as_bytes(), true).map(|h| {
                let fields: Vec<String> =
                    h.headers().iter().map(|(n, v)| format!("{n}: {}", v.to_str().unwrap())).collect();
                (h.status().as_u16(), fields)
            });
            let want = want.map(|(s, f)| (s, f.iter().map(|s| s.to_string()).collect::<Vec<_>>()));
            assert_eq!(got, want, "{raw:?}");
        }
    }
}
