//! A copy of a request body for a route's mirror. The mirror decides to
//! copy a request before its body is read; the proxy reads the body ahead
//! (`request_buffer`) before the request takes an upstream slot, and only
//! then can the copy have it. [`WantsCopy`], put in the request's
//! extensions, carries the mirror's wish across: given a [`BodyCopy`] when
//! the whole body was read ahead, dropped (and the copy skipped) otherwise.
//!
//! The copy shares the body's bytes (no second allocation), but keeps them
//! alive after the request has sent them on, so it takes its own share of
//! `server.request_buffer_total` for as long as it is held: until the
//! shadow's connection has taken its last frame and dropped it, not until
//! the shadow answers (a slow shadow holds none of the bound).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};

use super::request::ReadAhead;

/// A share of [`ReadAhead`]'s bound, given back when dropped.
pub struct Share {
    bound: Arc<ReadAhead>,
    n: usize,
}

impl Share {
    /// `n` bytes of `bound`, if they fit.
    pub fn take(bound: &Arc<ReadAhead>, n: usize) -> Option<Share> {
        bound.take(n).then(|| Share { bound: bound.clone(), n })
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.bound.give_back(self.n);
    }
}

/// A whole request body's data, sent again as a body of its own.
#[derive(Default)]
pub struct BodyCopy {
    chunks: VecDeque<Bytes>,
    len: u64,
    _share: Option<Share>,
}

impl BodyCopy {
    /// A body of `chunks`, holding `share` while it lives.
    pub fn new(chunks: VecDeque<Bytes>, share: Option<Share>) -> BodyCopy {
        let len = chunks.iter().map(|c| c.len() as u64).sum();
        BodyCopy { chunks, len, _share: share }
    }

    /// The body's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl http_body::Body for BodyCopy {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.get_mut().chunks.pop_front().map(|c| Ok(Frame::data(c))))
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.chunks.iter().map(|c| c.len() as u64).sum())
    }
}

/// What wants a copy of the request's body once it is read ahead: called
/// at most once. In the request's extensions, which need `Clone`.
#[derive(Clone)]
pub struct WantsCopy(Arc<Mutex<Option<Give>>>);

type Give = Box<dyn FnOnce(BodyCopy) + Send>;

impl WantsCopy {
    pub fn new(give: impl FnOnce(BodyCopy) + Send + 'static) -> WantsCopy {
        WantsCopy(Arc::new(Mutex::new(Some(Box::new(give)))))
    }

    /// Hands the copy over (the first time only).
    pub fn give(&self, copy: BodyCopy) {
        let give = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(give) = give {
            give(copy);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body as _;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn a_copy_gives_its_bytes_and_its_share_back() {
        let bound = Arc::new(ReadAhead::new(10));
        let share = Share::take(&bound, 6).expect("fits");
        assert!(Share::take(&bound, 5).is_none(), "past the bound");
        let copy = BodyCopy::new(VecDeque::from([Bytes::from_static(b"abc"), Bytes::from_static(b"def")]), Some(share));
        assert_eq!((copy.len(), copy.size_hint().exact()), (6, Some(6)));
        assert_eq!(&copy.collect().await.unwrap().to_bytes()[..], b"abcdef");
        assert!(Share::take(&bound, 10).is_some(), "the share is back");
    }

    #[test]
    fn wants_copy_is_given_once() {
        let got = Arc::new(Mutex::new(0));
        let seen = got.clone();
        let wants = WantsCopy::new(move |c| *seen.lock().unwrap() += c.len());
        let other = wants.clone();
        wants.give(BodyCopy::new(VecDeque::from([Bytes::from_static(b"ab")]), None));
        other.give(BodyCopy::default());
        assert_eq!(*got.lock().unwrap(), 2);
    }
}
