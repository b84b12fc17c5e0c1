//! A client's request body on the gateway's own HTTP/2 connection
//! (`listener::h2`): the h2 crate's receive stream, read as hyper's HTTP/2
//! server reads it (flow-control window given back as data is taken, a
//! reset with NO_ERROR ending the body early rather than failing it).

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Frame, SizeHint};

use super::BoxError;

/// Run when the body is first asked for: sends the `100 Continue` a
/// client that sent `Expect: 100-continue` waits for.
pub type OnFirstPoll = Box<dyn FnOnce() + Send + Sync>;

/// A request body read from an HTTP/2 stream.
pub struct H2Body {
    recv: ::h2::RecvStream,
    /// What is left of the declared length, if one was declared.
    left: Option<u64>,
    data_done: bool,
    /// See [`OnFirstPoll`].
    first_poll: Option<OnFirstPoll>,
}

impl H2Body {
    /// `length`: the request's `Content-Length`.
    pub fn new(recv: ::h2::RecvStream, length: Option<u64>, first_poll: Option<OnFirstPoll>) -> Self {
        // A stream already at its end has no body, whatever it declared.
        let left = if recv.is_end_stream() { Some(0) } else { length };
        let first_poll = first_poll.filter(|_| !recv.is_end_stream());
        H2Body { recv, left, data_done: false, first_poll }
    }
}

/// A reset with NO_ERROR asks for the body no further: an early answer
/// (RFC 9113 §8.1), not a failure.
fn ended_early(e: &::h2::Error) -> bool {
    e.reason() == Some(::h2::Reason::NO_ERROR)
}

impl http_body::Body for H2Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(first_poll) = this.first_poll.take() {
            first_poll();
        }
        if !this.data_done {
            match ready!(this.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    let _ = this.recv.flow_control().release_capacity(data.len());
                    if let Some(left) = &mut this.left {
                        *left = left.saturating_sub(data.len() as u64);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(e)) if ended_early(&e) => return Poll::Ready(None),
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                None => this.data_done = true,
            }
        }
        match ready!(this.recv.poll_trailers(cx)) {
            Ok(trailers) => Poll::Ready(trailers.map(|t| Ok(Frame::trailers(t)))),
            Err(e) if ended_early(&e) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(e.into()))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.recv.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        match self.left {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}
