//! An answer on an HTTP/2 stream: its head as hyper's server sends it
//! (connection-specific fields dropped, `date` and `content-length` added
//! where missing), then its body through the stream's flow control, one
//! frame of the body in hand at a time, trailers last.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{Reason, SendStream};
use http::Response;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http_body::Body as _;

use crate::body::BoxError;
use crate::listener::conn::ConnBody;

/// Sends `response` on the stream `reply` answers.
pub(super) async fn respond(response: Response<ConnBody>, mut reply: SendResponse<Bytes>) {
    let (mut parts, body) = response.into_parts();
    strip_connection_fields(&mut parts.headers);
    if !parts.headers.contains_key(header::DATE)
        && let Ok(date) = super::super::h1::with_date(|t| HeaderValue::from_maybe_shared(t.clone()))
    {
        parts.headers.insert(header::DATE, date);
    }
    let end = body.is_end_stream();
    if let (false, Some(n)) = (end, body.size_hint().exact()) {
        parts.headers.entry(header::CONTENT_LENGTH).or_insert_with(|| HeaderValue::from(n));
    }
    let tx = match reply.send_response(Response::from_parts(parts, ()), end) {
        Ok(tx) => tx,
        Err(e) => {
            tracing::debug!(error = %e, "cannot send the answer's head");
            reply.send_reset(Reason::INTERNAL_ERROR);
            return;
        }
    };
    if end {
        return;
    }
    let mut pipe = Pipe { body, tx, waiting: None };
    if let Err(e) = std::future::poll_fn(|cx| pipe.poll(cx)).await {
        tracing::debug!(error = %e, "answer's body not sent whole");
    }
}

/// Fields HTTP/2 forbids (RFC 9113 §8.2.2), as hyper's server drops them.
const CONNECTION_SPECIFIC: [HeaderName; 5] = [
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::TE,
];

/// Drops the connection-specific fields, and those `Connection` names.
fn strip_connection_fields(headers: &mut HeaderMap) {
    for name in &CONNECTION_SPECIFIC {
        headers.remove(name);
    }
    if let Some(listed) = headers.remove(header::CONNECTION)
        && let Ok(listed) = listed.to_str()
    {
        for name in listed.split(',') {
            headers.remove(name.trim());
        }
    }
}

/// A body on its way into a stream, after hyper's `PipeToSendStream`.
struct Pipe {
    body: ConnBody,
    tx: SendStream<Bytes>,
    /// The frame in hand, waiting for window, and whether it is the last.
    waiting: Option<(Bytes, bool)>,
}

impl Pipe {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        loop {
            if let Poll::Ready(reset) = self.tx.poll_reset(cx) {
                let e: h2::Error = match reset {
                    Ok(reason) => reason.into(),
                    Err(e) => e,
                };
                return Poll::Ready(Err(e.into()));
            }
            if self.waiting.is_some() {
                ready!(self.poll_window(cx))?;
                let (data, last) = self.waiting.take().expect("checked");
                self.tx.send_data(data, last)?;
                if last {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            match ready!(Pin::new(&mut self.body).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        let last = self.body.is_end_stream();
                        if data.is_empty() {
                            // Needs no window: sent at once, so an empty
                            // last frame still ends the stream.
                            self.tx.send_data(data, last)?;
                            if last {
                                return Poll::Ready(Ok(()));
                            }
                            continue;
                        }
                        // A claim on the window, not the whole frame's: h2
                        // raises it to what is buffered as it sends.
                        self.tx.reserve_capacity(1);
                        self.waiting = Some((data, last));
                    }
                    Err(frame) => {
                        if let Ok(trailers) = frame.into_trailers() {
                            self.tx.reserve_capacity(0);
                            self.tx.send_trailers(trailers)?;
                            return Poll::Ready(Ok(()));
                        }
                    }
                },
                Some(Err(e)) => {
                    self.tx.send_reset(reason_of(&*e));
                    return Poll::Ready(Err(e));
                }
                None => {
                    self.tx.send_data(Bytes::new(), true)?;
                    return Poll::Ready(Ok(()));
                }
            }
        }
    }

    /// Ready once the stream has window for the frame in hand.
    fn poll_window(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        while self.tx.capacity() == 0 {
            match ready!(self.tx.poll_capacity(cx)) {
                Some(Ok(0)) => {}
                Some(Ok(_)) => break,
                Some(Err(e)) => return Poll::Ready(Err(e.into())),
                None => return Poll::Ready(Err("send stream capacity unexpectedly closed".into())),
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// The reset a failed body ends its stream with: the h2 reason among its
/// causes, else INTERNAL_ERROR, as hyper's server chooses.
fn reason_of(e: &(dyn std::error::Error + 'static)) -> Reason {
    crate::error::find_source::<h2::Error>(e).and_then(h2::Error::reason).unwrap_or(Reason::INTERNAL_ERROR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_specific_fields_are_dropped() {
        let mut h = HeaderMap::new();
        for (n, v) in [
            ("connection", "x-hop, close"),
            ("x-hop", "1"),
            ("keep-alive", "5"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "h2c"),
            ("te", "trailers"),
            ("proxy-connection", "x"),
            ("x-kept", "2"),
        ] {
            h.append(HeaderName::from_static(n), HeaderValue::from_static(v));
        }
        strip_connection_fields(&mut h);
        let left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["x-kept"]);
    }

    #[test]
    fn a_failed_body_resets_with_its_h2_reason() {
        let calm: BoxError = Box::new(h2::Error::from(Reason::ENHANCE_YOUR_CALM));
        assert_eq!(reason_of(&*calm), Reason::ENHANCE_YOUR_CALM);
        let other: BoxError = "broken".into();
        assert_eq!(reason_of(&*other), Reason::INTERNAL_ERROR);
    }
}
