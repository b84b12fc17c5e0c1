//! What the upstream's response body ([`crate::body::UpstreamBody`]) reads
//! from and holds until it is complete: the response as received
//! ([`Received`]: over HTTP/1.1 from its own connection, which goes back
//! to the pool after the last byte; over HTTP/2 hyper's stream) and its
//! [`Lease`] on the upstream.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use metrics::Gauge;

use super::admission::Slot;
use super::endpoint::Attempt;
use super::h1::ResponseBody;
use crate::body::{BoxError, Held};

/// What a response body holds until it is complete: the endpoint attempt
/// (in flight, for balancing), the upstream slot (`max_requests`) and its
/// place in the in-flight gauge.
pub struct Lease {
    _attempt: Attempt,
    _slot: Option<Slot>,
    _in_flight: InFlight,
}

impl Lease {
    pub fn new(attempt: Attempt, slot: Option<Slot>, in_flight: InFlight) -> Self {
        Lease { _attempt: attempt, _slot: slot, _in_flight: in_flight }
    }
}

/// One request in the upstream's in-flight gauge, until dropped.
pub struct InFlight(Gauge);

impl InFlight {
    pub fn new(gauge: &Gauge) -> Self {
        gauge.increment(1.0);
        InFlight(gauge.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// A response body as the upstream's connection delivers it.
pub enum Received {
    /// The gateway's own HTTP/1.1 client (see `h1`).
    Http1(ResponseBody),
    /// hyper's HTTP/2 client.
    Http2(Incoming),
}

impl http_body::Body for Received {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            Received::Http1(b) => b.poll_frame(cx),
            Received::Http2(b) => Pin::new(b).poll_frame(cx).map(|o| o.map(|r| r.map_err(Into::into))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Received::Http1(b) => b.is_end_stream(),
            Received::Http2(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Received::Http1(b) => b.size_hint(),
            Received::Http2(b) => b.size_hint(),
        }
    }
}

/// What an upstream's response body reads from and holds (see [`Held`]):
/// the body as received (an HTTP/1.1 one with its connection, until it is
/// complete) and its [`Lease`] until the body is dropped. A connection
/// dropped before the body is complete is aborted (see
/// [`super::pool::Conn`]).
pub struct Leased {
    pub body: Received,
    pub lease: Lease,
}

impl Held for Leased {
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        http_body::Body::poll_frame(Pin::new(&mut self.body), cx)
    }

    fn is_end_stream(&self) -> bool {
        http_body::Body::is_end_stream(&self.body)
    }

    fn size_hint(&self) -> SizeHint {
        http_body::Body::size_hint(&self.body)
    }

    fn complete(&mut self, reusable: bool) {
        if let Received::Http1(b) = &mut self.body {
            b.finish(reusable);
        }
    }

    fn fail(&mut self) {
        if let Received::Http1(b) = &mut self.body {
            b.fail();
        }
    }
}
