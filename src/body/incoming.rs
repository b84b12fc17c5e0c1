//! A client's request body as the client connection hands it over: hyper's
//! (HTTP/2 with `server.http2 = "hyper"`, HTTP/1.1 with `server.http1 =
//! "hyper"`), the gateway's own HTTP/1.1 connection's (`listener::h1`),
//! named here by a trait so that this leaf knows nothing of the listener,
//! or an h2 crate stream's (the gateway's own HTTP/2 connection).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};

use super::BoxError;
use super::h2::H2Body;

/// A request body read from the client's connection.
pub enum Incoming {
    /// hyper's.
    Hyper(hyper::body::Incoming),
    /// None at all: a request without a body, on the own connection.
    Empty,
    /// The own HTTP/1.1 connection's: its bytes decoded as they are read.
    Own(Pin<Box<dyn http_body::Body<Data = Bytes, Error = BoxError> + Send + Sync>>),
    /// The own HTTP/2 connection's: an h2 crate stream.
    H2(H2Body),
}

impl From<hyper::body::Incoming> for Incoming {
    fn from(body: hyper::body::Incoming) -> Self {
        Incoming::Hyper(body)
    }
}

impl http_body::Body for Incoming {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            Incoming::Hyper(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            Incoming::Empty => Poll::Ready(None),
            Incoming::Own(b) => b.as_mut().poll_frame(cx),
            Incoming::H2(b) => Pin::new(b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Incoming::Hyper(b) => b.is_end_stream(),
            Incoming::Empty => true,
            Incoming::Own(b) => b.is_end_stream(),
            Incoming::H2(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Incoming::Hyper(b) => b.size_hint(),
            Incoming::Empty => SizeHint::with_exact(0),
            Incoming::Own(b) => b.size_hint(),
            Incoming::H2(b) => b.size_hint(),
        }
    }
}
