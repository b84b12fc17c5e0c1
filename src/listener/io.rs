//! A client connection's socket, reporting to the connection's
//! [`ConnState`] when bytes arrive and when writes block or make progress.
//! The watchdog turns that into the header, idle and send timeouts.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::conn::ConnState;

/// The accepted socket with its connection's state.
pub struct ClientIo {
    inner: TcpStream,
    state: Arc<ConnState>,
    /// [`crate::net::NOTSENT_LOWAT`] is set on the socket.
    limits_unsent: bool,
}

impl ClientIo {
    pub fn new(inner: TcpStream, state: Arc<ConnState>) -> Self {
        ClientIo { inner, state, limits_unsent: false }
    }

    /// The socket, to peek at.
    pub fn stream(&self) -> &TcpStream {
        &self.inner
    }

    fn before_write(&mut self) {
        if !self.limits_unsent && self.state.has_large_response() {
            self.limits_unsent = true;
            crate::net::limit_unsent(&self.inner);
        }
    }

    fn after_write(&self, poll: &Poll<io::Result<usize>>) {
        match poll {
            Poll::Ready(Ok(n)) if *n > 0 => self.state.wrote(),
            Poll::Pending => self.state.write_pending(),
            _ => {}
        }
    }
}

impl AsyncRead for ClientIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.state.read_bytes();
        }
        poll
    }
}

impl AsyncWrite for ClientIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.before_write();
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.after_write(&poll);
        poll
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.before_write();
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.after_write(&poll);
        poll
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
