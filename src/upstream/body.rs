//! The upstream's response body on its way to the client, and what it
//! holds until it is complete: its connection (back to the pool after the
//! last byte, closed otherwise) and its [`Lease`] on the upstream.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use metrics::{Counter, Gauge};

use super::admission::Slot;
use super::endpoint::Attempt;
use super::pool::Conn;
use crate::body::{BodyIdle, BoxError, IdleTimer};

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

/// An upstream response body on its way to the client. Its connection goes
/// back to the pool once the body is complete, and is closed otherwise.
pub struct UpstreamBody {
    inner: Incoming,
    conn: Option<Conn>,
    /// Whether the connection may go back to the pool once the body is
    /// complete (otherwise it is closed cleanly).
    reusable: bool,
    /// Held until the body is done: the endpoint's and upstream's in-flight
    /// counts and the `max_requests` slot.
    _lease: Lease,
    idle: IdleTimer,
    /// `gateway_upstream_errors_total{kind="body"}`.
    failed: Counter,
    /// `gateway_upstream_errors_total{kind="body_timeout"}`.
    stalled: Counter,
}

impl UpstreamBody {
    pub fn new(
        inner: Incoming,
        conn: Option<Conn>,
        reusable: bool,
        lease: Lease,
        idle_timeout: Duration,
        failed: Counter,
        stalled: Counter,
    ) -> Self {
        let idle = IdleTimer::new(idle_timeout);
        let mut body = UpstreamBody { inner, conn, reusable, _lease: lease, idle, failed, stalled };
        body.release_if_done(false);
        body
    }

    /// Returns the connection to the pool once the whole body has arrived
    /// (`ended`: the body just reported its end). A connection dropped
    /// before that is aborted (see [`Conn`]).
    fn release_if_done(&mut self, ended: bool) {
        if (ended || http_body::Body::is_end_stream(&self.inner))
            && let Some(conn) = self.conn.take()
        {
            if self.reusable { conn.release() } else { conn.close() }
        }
    }
}

impl http_body::Body for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match http_body::Body::poll_frame(Pin::new(&mut self.inner), cx) {
            Poll::Ready(Some(Err(e))) => {
                self.conn = None;
                self.failed.increment(1);
                tracing::warn!(error = %e, "upstream body failed mid-transfer; cutting the response");
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(other) => {
                self.idle.progress();
                self.release_if_done(other.is_none());
                Poll::Ready(other.map(|r| r.map_err(Into::into)))
            }
            Poll::Pending if self.idle.expired(cx) => {
                self.conn = None;
                self.stalled.increment(1);
                let e = BodyIdle(self.idle.after());
                tracing::warn!(error = %e, "upstream body stalled; cutting the response");
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        http_body::Body::is_end_stream(&self.inner)
    }

    fn size_hint(&self) -> SizeHint {
        http_body::Body::size_hint(&self.inner)
    }
}

impl Drop for UpstreamBody {
    /// A body dropped after its last byte (hyper stops polling a body that
    /// says it has ended) still frees its connection for reuse.
    fn drop(&mut self) {
        self.release_if_done(false);
    }
}
