//! Body types: the response body (one enum over every way the gateway
//! answers) and the request body sent upstream (size limit and idle timeout
//! applied as it streams). A leaf: the upstream's own response body lives
//! with its connection in `upstream::body`, and comes here boxed.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::Stream;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use tokio::io::Take;
use tokio::time::{Instant, Sleep};
use tokio_util::io::ReaderStream;
use tower_http::compression::CompressionBody;

use crate::error::GatewayError;

/// Errors a body can end with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A response body.
pub enum Body {
    /// A body known in full (fixed responses, cached files, errors).
    Full(Option<Bytes>),
    /// An upstream's body, streamed through as it arrives. If the upstream
    /// fails or stalls mid-body the error propagates, so hyper cuts the
    /// client's response short instead of passing it off as complete.
    ///
    /// Boxed, like the file stream: a response is moved a dozen times on
    /// its way out, and inline it would double every `Response<Body>`'s
    /// size. A trait object, so that this module names nothing of the
    /// upstream's connection (see benches/README.md for its cost).
    Upstream(Pin<Box<dyn http_body::Body<Data = Bytes, Error = BoxError> + Send>>),
    /// A file (or a range of one) too large for the cache, read in chunks.
    File(Box<ReaderStream<Take<tokio::fs::File>>>),
    /// Any of the above through a route's compression layer.
    Compressed(Pin<Box<CompressionBody<Body>>>),
}

impl Body {
    /// An empty body.
    pub fn empty() -> Self {
        Body::Full(None)
    }

    /// A body of `bytes`.
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        let bytes = bytes.into();
        Body::Full((!bytes.is_empty()).then_some(bytes))
    }

    /// A body through tower-http's compression.
    pub fn compressed(body: CompressionBody<Body>) -> Self {
        Body::Compressed(Box::pin(body))
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut *self {
            Body::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Body::Upstream(b) => b.as_mut().poll_frame(cx),
            Body::File(stream) => {
                Pin::new(&mut **stream).poll_next(cx).map(|o| o.map(|r| r.map(Frame::data).map_err(Into::into)))
            }
            Body::Compressed(b) => b.as_mut().poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Full(b) => b.is_none(),
            Body::Upstream(b) => b.is_end_stream(),
            Body::File(_) => false,
            Body::Compressed(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Body::Upstream(b) => b.size_hint(),
            Body::File(_) => SizeHint::default(),
            Body::Compressed(b) => b.size_hint(),
        }
    }
}

/// Fires when a body makes no progress for a while. The timer is created
/// only the first time the body has to wait, so bodies that arrive whole
/// (most small responses) never allocate one.
pub struct IdleTimer {
    after: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl IdleTimer {
    pub fn new(after: Duration) -> Self {
        IdleTimer { after, sleep: None }
    }

    /// How long the body may make no progress.
    pub fn after(&self) -> Duration {
        self.after
    }

    /// The body made progress: restart the clock.
    pub fn progress(&mut self) {
        if let Some(sleep) = &mut self.sleep {
            sleep.as_mut().reset(Instant::now() + self.after);
        }
    }

    /// The body is waiting: true once it has waited `after` since the last
    /// progress.
    pub fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        let after = self.after;
        let sleep = self.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep(after)));
        sleep.as_mut().poll(cx).is_ready()
    }
}

/// A body made no progress within its idle timeout.
#[derive(Debug, thiserror::Error)]
#[error("body made no progress for {}", humantime::format_duration(*.0))]
pub struct BodyIdle(pub Duration);

/// A request body grew past the route's limit.
#[derive(Debug, thiserror::Error)]
#[error("request body larger than {0} bytes")]
pub struct BodyTooLarge(pub u64);

/// The client's request body failed (usually: it disconnected).
#[derive(Debug, thiserror::Error)]
pub enum ClientBodyFailed {
    #[error("client body: {0}")]
    Read(hyper::Error),
    /// An HTTP/2 client reset its stream before END_STREAM. hyper ends the
    /// body cleanly for a reset with NO_ERROR or CANCEL (it reads that as an
    /// early response), which would let a cut upload pass as complete.
    #[error("client reset its stream before the end of the body")]
    Reset,
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
    /// Why the body failed, for the proxy: an HTTP/2 upstream connection
    /// turns a body error into a stream reset, which says nothing of whose
    /// fault it was.
    fault: Arc<OnceLock<ClientFault>>,
}

/// How a client's request body failed.
#[derive(Debug, Clone)]
pub enum ClientFault {
    TooLarge(u64),
    Idle(Duration),
    Failed(String),
}

impl ClientFault {
    /// The client's answer: its own fault, never the upstream's.
    pub fn to_error(&self) -> GatewayError {
        match self {
            ClientFault::TooLarge(limit) => GatewayError::BodyTooLarge { limit: *limit },
            ClientFault::Idle(after) => GatewayError::BodyTimeout { after: *after },
            ClientFault::Failed(why) => GatewayError::ClientBody(why.clone()),
        }
    }
}

impl RequestBody {
    pub fn new(
        inner: Incoming,
        limit: u64,
        idle_timeout: Duration,
        http2: bool,
        counted: Option<Arc<AtomicU64>>,
    ) -> Self {
        let fault = Arc::default();
        RequestBody { inner, limit, seen: 0, idle: IdleTimer::new(idle_timeout), http2, counted, fault }
    }

    /// Where the body's failure is noted, if it fails.
    pub fn fault(&self) -> Arc<OnceLock<ClientFault>> {
        self.fault.clone()
    }

    fn failed(&self, fault: ClientFault, e: BoxError) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let _ = self.fault.set(fault);
        Poll::Ready(Some(Err(e)))
    }
}

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match http_body::Body::poll_frame(Pin::new(&mut this.inner), cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.seen += data.len() as u64;
                    if let Some(counted) = &this.counted {
                        counted.store(this.seen, Ordering::Relaxed);
                    }
                    if this.seen > this.limit {
                        return this.failed(ClientFault::TooLarge(this.limit), BodyTooLarge(this.limit).into());
                    }
                }
                this.idle.progress();
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                let e = ClientBodyFailed::Read(e);
                this.failed(ClientFault::Failed(e.to_string()), e.into())
            }
            Poll::Ready(None) if this.http2 && !http_body::Body::is_end_stream(&this.inner) => {
                let e = ClientBodyFailed::Reset;
                this.failed(ClientFault::Failed(e.to_string()), e.into())
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending if this.idle.expired(cx) => {
                let after = this.idle.after;
                this.failed(ClientFault::Idle(after), BodyIdle(after).into())
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
