//! An upstream connection's socket ([`UpstreamIo`]): a write that makes no
//! progress for the exchange's body timeout fails (an upstream that stopped
//! reading a request body cannot pin the connection), and a connection
//! dropped in the middle of an exchange is closed with a TCP reset, so an
//! upstream that was still receiving a request body sees an aborted
//! message, never a shorter body that looks complete.
//!
//! The HTTP/1.1 client (`h1`) owns its socket outright, so this state is
//! plain fields; an HTTP/2 connection (hyper's) is clean from the start and
//! never given a send timeout here (its streams have their own resets).

use std::future::Future;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::connect::Stream;

/// A write to the upstream made no progress for the exchange's body timeout:
/// the upstream stopped reading the request body.
#[derive(Debug, thiserror::Error)]
#[error("upstream accepted no request body bytes for {}", humantime::format_duration(*.0))]
pub struct SendStalled(pub Duration);

/// An upstream connection's socket: fails writes that stall past the send
/// timeout, and resets the connection when dropped mid-exchange.
pub struct UpstreamIo {
    inner: Stream,
    /// No exchange is under way: a close is a clean one (FIN, not RST).
    clean: bool,
    /// A request body that may pass [`crate::net::NOTSENT_LOWAT`] is being
    /// sent: limit the unsent bytes before writing it, as on client sockets,
    /// so write progress shows every 64 KiB the upstream reads.
    large_request: bool,
    /// [`crate::net::NOTSENT_LOWAT`] is set on the socket.
    limits_unsent: bool,
    /// A write is waiting and `stall` is set for it.
    stalled: bool,
    /// The current exchange's send timeout (`None`: writes may wait).
    send_timeout: Option<Duration>,
    /// Created the first time a write has to wait; dropped when the
    /// connection goes idle.
    stall: Option<Pin<Box<Sleep>>>,
}

impl UpstreamIo {
    /// `clean`: closing is clean from the start (a shared HTTP/2
    /// connection, whose requests end with their own stream's reset).
    pub fn new(inner: Stream, clean: bool) -> Self {
        UpstreamIo {
            inner,
            clean,
            large_request: false,
            limits_unsent: false,
            stalled: false,
            send_timeout: None,
            stall: None,
        }
    }

    /// An exchange starts: a drop from now on resets the connection, and
    /// writes fail after `send_timeout` without progress. `large_request`:
    /// the request body may be large (see [`UpstreamIo::large_request`]).
    pub fn begin(&mut self, send_timeout: Duration, large_request: bool) {
        self.clean = false;
        self.send_timeout = Some(send_timeout);
        self.large_request |= large_request;
    }

    /// The exchange is over: closing is clean again, and the stall timer
    /// (if one was made) is freed.
    pub fn finish(&mut self) {
        self.clean = true;
        self.stalled = false;
        self.send_timeout = None;
        self.stall = None;
    }

    /// The connection becomes a tunnel: writes fail after `idle` without
    /// progress, and it closes cleanly (FIN) when the tunnel ends.
    pub fn into_tunnel(&mut self, idle: Duration) {
        self.clean = true;
        self.send_timeout = Some(idle);
    }

    /// Whether an idle connection can no longer carry a request: the
    /// upstream closed it (end of stream, an error) or sent bytes nobody
    /// asked for. A connection with nothing to read is fine. Never waits
    /// (the check polls with a waker that does nothing).
    pub fn is_stale(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        let mut byte = [MaybeUninit::uninit(); 1];
        let mut buf = ReadBuf::uninit(&mut byte);
        Pin::new(&mut self.inner).poll_read(&mut cx, &mut buf).is_ready()
    }

    fn check_stall(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        match poll {
            Poll::Pending => {
                let Some(after) = self.send_timeout else { return Poll::Pending };
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
        if !self.clean
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
        if !self.limits_unsent && self.large_request {
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
        if !self.clean {
            // A FIN in the middle of an exchange would let the upstream read
            // a clean end before the reset that follows on drop. Skip it;
            // the drop resets.
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
