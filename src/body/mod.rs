//! Body types: the response body (one enum over every way the gateway
//! answers), in `upstream` the upstream's response body, and in `request`
//! the client's request body on its way upstream (size limit, idle
//! timeout, read-ahead). A leaf: what the upstream's body holds (its
//! connection, its lease) is `upstream`'s, named here by a trait.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tokio::time::{Instant, Sleep};
use tower_http::compression::CompressionBody;

mod copy;
mod file;
mod h2;
mod incoming;
mod request;
mod upstream;
pub use copy::{BodyCopy, WantsCopy};
pub use file::FileBody;
pub use h2::{H2Body, OnFirstPoll};
pub use incoming::Incoming;
pub use request::{BodyState, BodyTooLarge, ClientBodyFailed, ClientFault, ReadAhead, RequestBody};
pub use upstream::{Held, UpstreamBody};

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
    /// size.
    Upstream(Box<UpstreamBody<dyn Held>>),
    /// Another body streamed through as it arrives (a cache fill's copy of
    /// the upstream's), as a trait object.
    Streamed(Pin<Box<dyn http_body::Body<Data = Bytes, Error = BoxError> + Send>>),
    /// A file (or a range of one) too large for the cache, read in chunks.
    File(Box<FileBody>),
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
            Body::Upstream(b) => Pin::new(&mut **b).poll_frame(cx),
            Body::Streamed(b) => b.as_mut().poll_frame(cx),
            Body::File(file) => file.poll_frame(cx),
            Body::Compressed(b) => b.as_mut().poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Full(b) => b.is_none(),
            Body::Upstream(b) => b.is_end_stream(),
            Body::Streamed(b) => b.is_end_stream(),
            Body::File(file) => file.is_end_stream(),
            Body::Compressed(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Body::Upstream(b) => b.size_hint(),
            Body::Streamed(b) => b.size_hint(),
            Body::File(file) => file.size_hint(),
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
