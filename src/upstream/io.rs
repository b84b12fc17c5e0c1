//! An upstream connection's socket as hyper sees it ([`UpstreamIo`]): a
//! write that makes no progress for the exchange's body timeout fails (an
//! upstream that stopped reading a request body cannot pin the
//! connection), and a connection dropped in the middle of an exchange is
//! closed with a TCP reset, so an upstream that was still receiving a
//! request body sees an aborted message, never a shorter body that looks
//! complete.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::connect::Stream;

/// What a connection's socket and its [`Conn`](super::pool::Conn) share.
pub struct IoShared {
    /// No exchange is under way: a close is a clean one (FIN, not RST).
    pub clean: AtomicBool,
    /// The current exchange's send timeout, in milliseconds (0: none yet).
    pub send_timeout_ms: AtomicU64,
    /// A request body that may pass [`crate::net::NOTSENT_LOWAT`] is
    /// being sent: limit the unsent bytes before writing it, as on client
    /// sockets, so write progress shows every 64 KiB the upstream reads.
    pub large_request: AtomicBool,
}

/// A write to the upstream made no progress for the exchange's body timeout:
/// the upstream stopped reading the request body.
#[derive(Debug, thiserror::Error)]
#[error("upstream accepted no request body bytes for {}", humantime::format_duration(*.0))]
pub struct SendStalled(pub Duration);

/// An upstream connection's socket: fails writes that stall past the send
/// timeout, and resets the connection when dropped mid-exchange.
pub struct UpstreamIo {
    inner: Stream,
    shared: Arc<IoShared>,
    /// Created the first time a write has to wait.
    stall: Option<Pin<Box<Sleep>>>,
    /// A write is waiting and `stall` is set for it.
    stalled: bool,
    /// [`crate::net::NOTSENT_LOWAT`] is set on the socket.
    limits_unsent: bool,
}

impl IoShared {
    /// `clean`: closing is clean from the start (a shared HTTP/2
    /// connection, whose requests end with their own stream's reset).
    pub fn new(clean: bool) -> Self {
        IoShared {
            clean: AtomicBool::new(clean),
            send_timeout_ms: AtomicU64::new(0),
            large_request: AtomicBool::new(false),
        }
    }
}

impl UpstreamIo {
    pub fn new(inner: Stream, shared: Arc<IoShared>) -> Self {
        UpstreamIo { inner, shared, stall: None, stalled: false, limits_unsent: false }
    }

    fn check_stall(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        match poll {
            Poll::Pending => {
                let ms = self.shared.send_timeout_ms.load(Relaxed);
                if ms == 0 {
                    return Poll::Pending;
                }
                let after = Duration::from_millis(ms);
                let sleep = self.stall.get_or_insert_with(|| Box::pin(tokio::time::sleep(after)));
                if !self.stalled {
                    self.stalled = true;
                    sleep.as_mut().reset(Instant::now() + after);
                }
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, SendStalled(after)))),
                    Poll::Pending => Poll::Pending,
                }
            }
            ready => {
                self.stalled = false;
                ready
            }
        }
    }
}

impl Drop for UpstreamIo {
    fn drop(&mut self) {
        if !self.shared.clean.load(Relaxed)
            && let Some(tcp) = self.inner.tcp()
        {
            // SO_LINGER 0: close() sends RST, not FIN. (A Unix socket has no
            // reset: its peer reads the end of the stream, before the end
            // its message's framing declared.)
            let _ = socket2::SockRef::from(tcp).set_linger(Some(Duration::ZERO));
        }
    }
}

impl AsyncRead for UpstreamIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for UpstreamIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if !self.limits_unsent && self.shared.large_request.load(Relaxed) {
            self.limits_unsent = true;
            if let Some(tcp) = self.inner.tcp() {
                crate::net::limit_unsent(tcp);
            }
        }
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.check_stall(cx, poll)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.shared.clean.load(Relaxed) {
            // hyper shuts the write side down when it gives up on an
            // exchange (a failed request body, say): a FIN there would let
            // the upstream read a clean end before the reset that follows
            // on drop. Skip it; the drop resets.
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
