//! The upstream's response body on its way to the client. What it reads
//! from and holds until it is complete (the response as its connection
//! delivers it, that connection, its lease on the upstream) belongs to
//! `upstream` and is named here only by what it does ([`Held`]), so this
//! module names nothing above itself.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use metrics::Counter;

use super::{BodyIdle, BoxError, IdleTimer};

/// What an upstream response body reads from and holds until it is
/// complete: the frames as they arrive, its connection (back to the pool
/// after the last byte, closed otherwise) and whatever else must last as
/// long as the body (dropped with it).
pub trait Held: Send + Unpin {
    /// The next frame of the body, as [`http_body::Body::poll_frame`].
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>>;
    /// As [`http_body::Body::is_end_stream`].
    fn is_end_stream(&self) -> bool;
    /// As [`http_body::Body::size_hint`].
    fn size_hint(&self) -> SizeHint;
    /// The whole body has arrived: the connection goes back to the pool,
    /// or is closed cleanly when it may not be reused. Called at most once.
    fn complete(&mut self, reusable: bool);
    /// The body failed or stalled: the connection is dropped (reset), never
    /// reused. Called at most once, and never after `complete`.
    fn fail(&mut self);
}

/// An upstream response body: what [`Held`] reads, passed through as it
/// arrives, cut with an error if the upstream fails or stalls mid-body.
///
/// `H` is last and may be unsized: the body is boxed as
/// `Box<UpstreamBody<dyn Held>>`, one allocation with the held state in it.
pub struct UpstreamBody<H: ?Sized + Held> {
    /// Whether the connection may go back to the pool once the body is
    /// complete (otherwise it is closed cleanly).
    reusable: bool,
    /// The gateway sets request IDs: the upstream's `X-Request-Id` in the
    /// trailers is dropped, as the one in its head is replaced.
    request_ids: bool,
    /// The connection is still held: neither completed nor failed yet.
    open: bool,
    idle: IdleTimer,
    /// `gateway_upstream_errors_total{kind="body"}`.
    failed: Counter,
    /// `gateway_upstream_errors_total{kind="body_timeout"}`.
    stalled: Counter,
    held: H,
}

impl<H: Held> UpstreamBody<H> {
    /// `failed` and `stalled` count a body cut by an upstream error and by
    /// `idle_timeout`; `request_ids`: the gateway sets request IDs (see the
    /// field of that name).
    pub fn new(
        held: H,
        (reusable, request_ids): (bool, bool),
        idle_timeout: Duration,
        failed: Counter,
        stalled: Counter,
    ) -> Self {
        let idle = IdleTimer::new(idle_timeout);
        let mut body = UpstreamBody { reusable, request_ids, open: true, idle, failed, stalled, held };
        body.release_if_done(false);
        body
    }
}

impl<H: ?Sized + Held> UpstreamBody<H> {
    /// Gives the connection back once the whole body has arrived (`ended`:
    /// the body just reported its end).
    fn release_if_done(&mut self, ended: bool) {
        if self.open && (ended || self.held.is_end_stream()) {
            self.open = false;
            self.held.complete(self.reusable);
        }
    }

    fn fail(&mut self) {
        if self.open {
            self.open = false;
            self.held.fail();
        }
    }
}

impl<H: ?Sized + Held> http_body::Body for UpstreamBody<H> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match this.held.poll_frame(cx) {
            Poll::Ready(Some(Err(e))) => {
                this.fail();
                this.failed.increment(1);
                tracing::warn!(error = %e, "upstream body failed mid-transfer; cutting the response");
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(mut other) => {
                this.idle.progress();
                // What a trailer section may not carry is not passed on:
                // neither hyper's decoders nor its HTTP/2 server leave it
                // out, and a connection-specific field in it reset an HTTP/2
                // client's stream after the whole body.
                if let Some(Ok(frame)) = &mut other
                    && let Some(trailers) = frame.trailers_mut()
                {
                    crate::headers::strip_forbidden_trailers(trailers);
                    if this.request_ids {
                        trailers.remove(crate::headers::X_REQUEST_ID);
                    }
                }
                this.release_if_done(other.is_none());
                Poll::Ready(other)
            }
            Poll::Pending if this.idle.expired(cx) => {
                this.fail();
                this.stalled.increment(1);
                let e = BodyIdle(this.idle.after());
                tracing::warn!(error = %e, "upstream body stalled; cutting the response");
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.held.size_hint()
    }
}

impl<H: ?Sized + Held> Drop for UpstreamBody<H> {
    /// A body dropped after its last byte (hyper stops polling a body that
    /// says it has ended) still frees its connection for reuse; one dropped
    /// before that leaves it to `H`'s own drop (a reset).
    fn drop(&mut self) {
        self.release_if_done(false);
    }
}
