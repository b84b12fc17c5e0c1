//! A response body read from its connection ([`ResponseBody`]): frames as
//! they arrive, the rest of an early-answered request body sent alongside,
//! and at the clean end the connection back to its pool (or closed, when
//! its framing or the upstream says it may not carry another request).

use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Frame, SizeHint};

use super::Upgraded;
use super::client::{Sending, poll_fill};
use super::decode::{Decoder, Step};
use super::head::Framing;
use crate::body::BoxError;
use crate::upstream::pool::Conn;

/// An upstream's response body over HTTP/1.1.
pub struct ResponseBody {
    /// The connection, until the body is complete or failed.
    conn: Option<Conn>,
    /// Bytes read past the head and not yet passed on.
    rx: BytesMut,
    decoder: Decoder,
    /// The request body still going out: the upstream answered before it
    /// was all sent.
    sending: Option<Box<Sending>>,
    /// Sending the request failed or stopped: the connection is reset at
    /// the end, never reused (the upstream did not get the whole request).
    unfinished: bool,
    /// The response lets the connection carry another request.
    keep_alive: bool,
    /// A 101: the connection is the tunnel's.
    upgrade: bool,
    /// A frame was returned since the last wait, or there was no wait yet
    /// (the head itself may still sit unsent in the server's buffer).
    yielded: bool,
    /// A failure found right after a frame, reported on the next poll.
    deferred: Option<BoxError>,
}

impl ResponseBody {
    pub(super) fn new(
        conn: Conn,
        rx: BytesMut,
        framing: Framing,
        keep_alive: bool,
        sending: Option<Box<Sending>>,
        unfinished: bool,
        upgrade: bool,
    ) -> Self {
        let decoder = Decoder::new(framing);
        let (yielded, deferred) = (true, None);
        ResponseBody { conn: Some(conn), rx, decoder, sending, unfinished, keep_alive, upgrade, yielded, deferred }
    }

    /// After a 101: the connection, with the bytes read past its head.
    pub fn into_upgraded(mut self) -> Option<Upgraded> {
        let conn = self.conn.take().filter(|_| self.upgrade)?;
        Some(Upgraded { io: conn.into_io(), read: std::mem::take(&mut self.rx).freeze() })
    }

    /// The next frame, sending more of the request body on the way. A
    /// failure found right after a frame, or at the first poll, is
    /// reported on the next poll (after a wake-up): hyper's server stops at
    /// a body error at once, and the head and data buffered before it would
    /// never reach the client, which would see no response at all instead
    /// of a cut one. (A body broken in the bytes that came with the head
    /// fails the exchange instead, see `client::check_body_start`.)
    pub fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(e) = self.deferred.take() {
            return Poll::Ready(Some(Err(e)));
        }
        match self.poll_next(cx) {
            Poll::Ready(Some(Err(e))) if self.yielded => {
                (self.yielded, self.deferred) = (false, Some(e));
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Poll::Pending => {
                self.yielded = false;
                Poll::Pending
            }
            polled => {
                self.yielded = true;
                polled
            }
        }
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let (Some(s), Some(conn)) = (self.sending.as_mut(), self.conn.as_mut()) {
            match s.poll_send(conn.io_mut(), cx) {
                Poll::Ready(Ok(())) => self.sending = None,
                Poll::Ready(Err(e)) => {
                    (self.sending, self.unfinished) = (None, true);
                    // The client's body failed: the upstream's answer to a
                    // request it never got whole is cut too.
                    if e.is_body() {
                        return Poll::Ready(Some(Err(e.into())));
                    }
                    tracing::debug!(error = %e, "upstream stopped taking the request body after answering");
                }
                Poll::Pending => {}
            }
        }
        loop {
            match self.decoder.step(&mut self.rx) {
                Ok(Step::Frame(frame)) => return Poll::Ready(Some(Ok(frame))),
                Ok(Step::End) => return Poll::Ready(None),
                Ok(Step::More) => {}
                Err(e) => return Poll::Ready(Some(Err(e.into()))),
            }
            let Some(conn) = self.conn.as_mut() else { return Poll::Ready(None) };
            match std::task::ready!(poll_fill(conn.io_mut(), &mut self.rx, cx)) {
                Ok(0) => {
                    return match self.decoder.eof() {
                        Ok(_) => Poll::Ready(None),
                        Err(e) => Poll::Ready(Some(Err(e.into()))),
                    };
                }
                Ok(_) => {}
                Err(e) => return Poll::Ready(Some(Err(super::Error::io(e).into()))),
            }
        }
    }

    pub fn is_end_stream(&self) -> bool {
        self.decoder.is_done()
    }

    pub fn size_hint(&self) -> SizeHint {
        match self.decoder {
            Decoder::Done => SizeHint::with_exact(0),
            Decoder::Length(n) => SizeHint::with_exact(n),
            _ => SizeHint::default(),
        }
    }

    /// The body has all arrived: the connection goes back to its pool when
    /// everything allows it (`reusable`: the proxy's own rules too), is
    /// closed cleanly when the exchange was whole, or reset when the
    /// upstream never got the whole request.
    pub fn finish(&mut self, reusable: bool) {
        let Some(conn) = self.conn.take() else { return };
        let whole = self.sending.take().is_none() && !self.unfinished;
        // Bytes past the response's end were never asked for.
        let clean = self.rx.is_empty();
        self.rx = BytesMut::new();
        match (whole, reusable && self.keep_alive && clean && !self.upgrade) {
            (true, true) => conn.release(),
            (true, false) => conn.close(),
            (false, _) => drop(conn),
        }
    }

    /// Whether, the body having ended, [`ResponseBody::finish`] would give
    /// the connection back to its pool and the pool would take it again
    /// (no close or stray bytes since). For the differential test against
    /// hyper's client, which looks at this without a pool.
    pub fn reusable(&mut self) -> bool {
        let whole = self.sending.is_none() && !self.unfinished && self.decoder.is_done();
        let decided = whole && self.keep_alive && self.rx.is_empty() && !self.upgrade;
        decided && self.conn.as_mut().is_some_and(|c| !c.io_mut().is_stale())
    }

    /// The body failed or stalled: the connection is reset.
    pub fn fail(&mut self) {
        self.conn = None;
        self.sending = None;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    use super::*;
    use crate::upstream::connect::Stream;
    use crate::upstream::io::UpstreamIo;

    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A body that fails at its first poll says so one poll later, after a
    /// wake-up: hyper's server has the head buffered and sends it only when
    /// the body waits, so an error at once would close the client's
    /// connection with no answer at all.
    #[tokio::test]
    async fn a_failure_at_the_first_poll_waits_one_poll() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tcp = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let conn = Conn::unpooled(UpstreamIo::new(Stream::Tcp(tcp), false));
        let rx = BytesMut::from(&b"zz\r\n"[..]);
        let mut body = ResponseBody::new(conn, rx, Framing::Chunked, true, None, false, false);
        let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
        let waker = wakes.clone().into();
        let cx = &mut Context::from_waker(&waker);
        assert!(body.poll_frame(cx).is_pending());
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "woken to report it");
        assert!(matches!(body.poll_frame(cx), Poll::Ready(Some(Err(_)))));
    }
}
