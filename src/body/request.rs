//! A client's request body on its way upstream: counted against the route's
//! `max_body` as it streams, cut if it stalls past `body_timeout`, and read
//! ahead before the request takes an upstream slot.
//!
//! Read-ahead (`request_buffer`, per route): up to that many bytes of the
//! body are read before the request is admitted, so a client that trickles
//! its body (or never finishes it) holds no `max_requests` slot, no queue
//! place and no upstream connection meanwhile; nginx buffers request bodies
//! for the same reason. A body that ends within the buffer goes upstream
//! whole; a longer one takes its slot once its first `request_buffer` bytes
//! are in, and the rest streams. What all requests hold read ahead at once
//! is bounded by `server.request_buffer_total` ([`ReadAhead`]): past it,
//! bodies stream as they arrive (they take their slot at once).
//!
//! [`BodyState`] is what the proxy learns from the body: why it failed, and
//! whether the gateway was waiting for the client when time ran out. Both
//! decide that a failure is the client's, never the endpoint's.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use super::Incoming;
use bytes::Bytes;
use http::HeaderName;
use http_body::{Frame, SizeHint};

use super::copy::{BodyCopy, Share};
use super::{BodyIdle, BoxError, IdleTimer};
use crate::error::GatewayError;

/// A request body grew past the route's limit.
#[derive(Debug, thiserror::Error)]
#[error("request body larger than {0} bytes")]
pub struct BodyTooLarge(pub u64);

/// The client's request body failed (usually: it disconnected).
#[derive(Debug, thiserror::Error)]
pub enum ClientBodyFailed {
    #[error("client body: {0}")]
    Read(BoxError),
    /// An HTTP/2 client reset its stream before END_STREAM. hyper ends the
    /// body cleanly for a reset with NO_ERROR or CANCEL (it reads that as an
    /// early response), which would let a cut upload pass as complete.
    #[error("client reset its stream before the end of the body")]
    Reset,
}

impl ClientBodyFailed {
    /// Whether the client left (see [`crate::error::client_gone`]) rather
    /// than sent a body HTTP does not frame.
    pub fn client_gone(&self) -> bool {
        match self {
            ClientBodyFailed::Read(e) => crate::error::client_gone(&**e),
            ClientBodyFailed::Reset => true,
        }
    }
}

/// How a client's request body failed.
#[derive(Debug, Clone)]
pub enum ClientFault {
    TooLarge(u64),
    Idle(Duration),
    Failed(String),
    /// Its connection or stream ended mid-body.
    Left(String),
}

impl ClientFault {
    /// The client's answer: its own fault, never the upstream's.
    pub fn to_error(&self) -> GatewayError {
        match self {
            ClientFault::TooLarge(limit) => GatewayError::BodyTooLarge { limit: *limit },
            ClientFault::Idle(after) => GatewayError::BodyTimeout { after: *after },
            ClientFault::Failed(why) => GatewayError::ClientBody(why.clone()),
            ClientFault::Left(why) => GatewayError::ClientLeft(why.clone()),
        }
    }
}

/// What the proxy learns from a request body while it streams.
#[derive(Debug)]
pub struct BodyState {
    /// Why the body failed. An HTTP/2 upstream connection turns a body
    /// error into a stream reset, which says nothing of whose fault it was.
    fault: OnceLock<ClientFault>,
    /// The body's last poll found nothing from the client yet: the gateway
    /// is waiting for the client, not for the upstream to take bytes.
    waiting: AtomicBool,
    /// The whole body has arrived.
    complete: AtomicBool,
    /// When the client last sent body bytes (or the body started), in
    /// milliseconds since `started`.
    progress_ms: AtomicU64,
    started: tokio::time::Instant,
}

impl BodyState {
    fn new() -> Self {
        BodyState {
            fault: OnceLock::new(),
            waiting: AtomicBool::new(false),
            complete: AtomicBool::new(false),
            progress_ms: AtomicU64::new(0),
            started: tokio::time::Instant::now(),
        }
    }

    /// Why the body failed, if it did.
    pub fn fault(&self) -> Option<&ClientFault> {
        self.fault.get()
    }

    /// Whether the gateway is still waiting for the client's body: it has
    /// not all arrived, and its last poll was for bytes the client has not
    /// sent (not for room the upstream has not made).
    pub fn awaiting_client(&self) -> bool {
        !self.complete.load(Ordering::Relaxed) && self.waiting.load(Ordering::Relaxed)
    }

    /// [`BodyState::awaiting_client`], and the client has sent nothing for
    /// at least `quiet`: a client sending at full speed is often caught
    /// between two reads, which says nothing of whose fault a failure is.
    pub fn awaiting_quiet_client(&self, quiet: Duration) -> bool {
        let since = self.started.elapsed().as_millis() as u64;
        self.awaiting_client()
            && since.saturating_sub(self.progress_ms.load(Ordering::Relaxed)) >= quiet.as_millis() as u64
    }

    /// When the client's body was all in (to the millisecond), or `None`
    /// while some of it is still to come.
    pub fn completed_at(&self) -> Option<tokio::time::Instant> {
        let done = self.complete.load(Ordering::Relaxed);
        done.then(|| self.started + Duration::from_millis(self.progress_ms.load(Ordering::Relaxed)))
    }

    fn progressed(&self) {
        self.progress_ms.store(self.started.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

/// The bound on bytes read ahead by all requests at once
/// (`server.request_buffer_total`), counted as they arrive.
#[derive(Debug)]
pub struct ReadAhead {
    limit: usize,
    used: AtomicUsize,
}

impl ReadAhead {
    pub fn new(limit: usize) -> Self {
        ReadAhead { limit, used: AtomicUsize::new(0) }
    }

    /// Takes `n` bytes of the bound, if they fit.
    pub(super) fn take(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| used.checked_add(n).filter(|&u| u <= self.limit))
            .is_ok()
    }

    pub(super) fn give_back(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }
}

/// What a request body has read ahead and not yet passed on, with its
/// share of the [`ReadAhead`] bound. Kept in the body itself (the body is
/// boxed already), filled as frames arrive, so reading ahead can stop and
/// go on at any await without losing a frame.
#[derive(Default)]
struct Ahead {
    frames: VecDeque<Frame<Bytes>>,
    /// Data bytes held in `frames`.
    held: usize,
    /// Of them, the bytes taken from the bound (the last frame may be held
    /// past it, uncounted).
    counted: usize,
    bound: Option<Arc<ReadAhead>>,
    /// The bound ran out: the rest of the body streams.
    full: bool,
}

impl Ahead {
    fn push(&mut self, frame: Frame<Bytes>, bound: &Arc<ReadAhead>) {
        let n = frame.data_ref().map_or(0, Bytes::len);
        if bound.take(n) {
            self.counted += n;
            self.bound.get_or_insert_with(|| bound.clone());
        } else {
            self.full = true;
        }
        self.held += n;
        self.frames.push_back(frame);
    }

    fn pop(&mut self) -> Option<Frame<Bytes>> {
        let frame = self.frames.pop_front()?;
        let n = frame.data_ref().map_or(0, Bytes::len);
        self.held -= n;
        let back = n.min(self.counted);
        self.counted -= back;
        if let Some(bound) = &self.bound {
            bound.give_back(back);
        }
        Some(frame)
    }
}

impl Drop for Ahead {
    fn drop(&mut self) {
        if let Some(bound) = &self.bound {
            bound.give_back(self.counted);
        }
    }
}

/// A client's request body on its way upstream: counted against the
/// route's `max_body` as it streams, and cut if it stalls.
pub struct RequestBody {
    inner: Incoming,
    limit: u64,
    seen: u64,
    idle: IdleTimer,
    /// The body arrives over HTTP/2: its end must be END_STREAM, not a reset.
    http2: bool,
    /// Bytes read, for the access log (when it is on).
    counted: Option<Arc<AtomicU64>>,
    state: Arc<BodyState>,
    /// Frames read ahead (see [`RequestBody::read_ahead`]), passed on first.
    ahead: Ahead,
    /// Names removed from the body's trailers, in every spelling (see
    /// `ProxyTarget::guarded_trailers`).
    guarded: Arc<[HeaderName]>,
}

impl RequestBody {
    pub fn new(
        inner: Incoming,
        limit: u64,
        idle_timeout: Duration,
        http2: bool,
        counted: Option<Arc<AtomicU64>>,
        guarded: Arc<[HeaderName]>,
    ) -> Self {
        let (idle, state) = (IdleTimer::new(idle_timeout), Arc::new(BodyState::new()));
        RequestBody { inner, limit, seen: 0, idle, http2, counted, state, ahead: Ahead::default(), guarded }
    }

    /// What the body tells of itself as it streams.
    pub fn state(&self) -> Arc<BodyState> {
        self.state.clone()
    }

    /// Reads up to `up_to` bytes of the body ahead, within `bound`: returns
    /// once the body has ended, `up_to` bytes are in, or the bound is used
    /// up (the rest then streams). A client's failure on the way (too
    /// large, stalled past `body_timeout`, gone) is returned, and noted.
    /// Cancel-safe: dropped at an await, it loses nothing, and a later call
    /// goes on from there.
    pub async fn read_ahead(&mut self, up_to: usize, bound: &Arc<ReadAhead>) -> Result<(), ClientFault> {
        while self.ahead.held < up_to && !self.ahead.full && !http_body::Body::is_end_stream(&self.inner) {
            match std::future::poll_fn(|cx| self.poll_client(cx)).await {
                None => break,
                Some(Err(_)) => return Err(self.state.fault().cloned().expect("a failed poll notes its fault")),
                Some(Ok(frame)) => self.ahead.push(frame, bound),
            }
        }
        Ok(())
    }

    /// A copy of the body's data when all of it, at most `limit` bytes,
    /// was read ahead and `bound` has room to hold it a while longer (see
    /// [`super::copy`]); trailers are not copied.
    pub fn copy_whole(&self, limit: usize, bound: &Arc<ReadAhead>) -> Option<BodyCopy> {
        if !self.state.complete.load(Ordering::Relaxed) || self.ahead.held > limit {
            return None;
        }
        let share = match self.ahead.held {
            0 => None,
            n => Some(Share::take(bound, n)?),
        };
        let chunks = self.ahead.frames.iter().filter_map(|f| f.data_ref().cloned()).collect();
        Some(BodyCopy::new(chunks, share))
    }

    fn failed(&self, fault: ClientFault, e: BoxError) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let _ = self.state.fault.set(fault);
        Poll::Ready(Some(Err(e)))
    }

    /// The next frame from the client, with the limit and idle timeout
    /// applied.
    fn poll_client(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = http_body::Body::poll_frame(Pin::new(&mut self.inner), cx);
        self.state.waiting.store(polled.is_pending(), Ordering::Relaxed);
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.seen += data.len() as u64;
                    if let Some(counted) = &self.counted {
                        counted.store(self.seen, Ordering::Relaxed);
                    }
                    if self.seen > self.limit {
                        return self.failed(ClientFault::TooLarge(self.limit), BodyTooLarge(self.limit).into());
                    }
                }
                self.idle.progress();
                self.state.progressed();
                if http_body::Body::is_end_stream(&self.inner) {
                    self.state.complete.store(true, Ordering::Relaxed);
                }
                let frame = match frame.into_trailers() {
                    Ok(mut trailers) => {
                        for name in self.guarded.iter() {
                            trailers.remove(name);
                        }
                        crate::headers::remove_other_spellings(&mut trailers, self.guarded.iter(), false);
                        Frame::trailers(trailers)
                    }
                    Err(frame) => frame,
                };
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                let e = ClientBodyFailed::Read(e);
                let fault = if e.client_gone() { ClientFault::Left } else { ClientFault::Failed };
                self.failed(fault(e.to_string()), e.into())
            }
            Poll::Ready(None) if self.http2 && !http_body::Body::is_end_stream(&self.inner) => {
                let e = ClientBodyFailed::Reset;
                self.failed(ClientFault::Left(e.to_string()), e.into())
            }
            Poll::Ready(None) => {
                // The end came now (a chunked body's last chunk, an HTTP/2
                // empty END_STREAM), maybe long after the last data.
                self.state.progressed();
                self.state.complete.store(true, Ordering::Relaxed);
                Poll::Ready(None)
            }
            Poll::Pending if self.idle.expired(cx) => {
                let after = self.idle.after();
                self.failed(ClientFault::Idle(after), BodyIdle(after).into())
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(frame) = this.ahead.pop() {
            return Poll::Ready(Some(Ok(frame)));
        }
        this.poll_client(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.ahead.frames.is_empty() && http_body::Body::is_end_stream(&self.inner)
    }

    fn size_hint(&self) -> SizeHint {
        let inner = http_body::Body::size_hint(&self.inner);
        if self.ahead.frames.is_empty() {
            return inner;
        }
        let held = self.ahead.held as u64;
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + held);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + held);
        }
        hint
    }
}
