//! The response body type: one enum over every way the gateway answers, so the
//! hot path needs no boxing.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::Stream;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use metrics::Counter;
use tokio::io::Take;
use tokio_util::io::ReaderStream;

/// Errors a body can end with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A response body.
pub enum Body {
    /// A body known in full (fixed responses, cached files, errors).
    Full(Option<Bytes>),
    /// An upstream's body, streamed through as it arrives. If the upstream
    /// fails mid-body the error propagates, so hyper cuts the client's
    /// response short instead of passing it off as complete.
    Upstream { inner: Incoming, errors: Counter },
    /// A file (or a range of one) too large for the cache, read in chunks.
    File(ReaderStream<Take<tokio::fs::File>>),
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
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut *self {
            Body::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Body::Upstream { inner, errors } => match Pin::new(inner).poll_frame(cx) {
                Poll::Ready(Some(Err(e))) => {
                    errors.increment(1);
                    tracing::warn!(error = %e, "upstream body failed mid-transfer; cutting the response");
                    Poll::Ready(Some(Err(e.into())))
                }
                other => other.map_err(Into::into),
            },
            Body::File(stream) => Pin::new(stream)
                .poll_next(cx)
                .map(|o| o.map(|r| r.map(Frame::data).map_err(Into::into))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Full(b) => b.is_none(),
            Body::Upstream { inner, .. } => inner.is_end_stream(),
            Body::File(_) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Body::Upstream { inner, .. } => inner.size_hint(),
            Body::File(_) => SizeHint::default(),
        }
    }
}
