//! A client connection's socket, reporting to the connection's
//! [`ConnState`] when bytes arrive and when writes block or make progress.
//! The watchdog turns that into the header, idle and send timeouts.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::Http;
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

    /// The socket, to wait on for readiness.
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

/// HTTP/2's connection preface (RFC 9113 §3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Bytes read at a time into a buffer on the stack when the read buffer
/// has no room (a connection waiting for bytes holds no buffer of its
/// own): by [`first_bytes`] and the own HTTP/1.1 connection.
pub(super) const READ: usize = 4096;

/// What a plain connection speaks, from its first bytes, read (and given
/// to the connection that serves it): [`Http::One`] as soon as they
/// differ from HTTP/2's preface, [`Http::Two`] on the whole preface;
/// `None` if the stream ends (or fails) before either.
///
/// Read, not peeked: a peek left the bytes for hyper but cost one more
/// `recv` for every connection, the HTTP/1.1 connection's own first read
/// being a second one (nginx reads a new connection's first bytes once).
/// Not hyper-util's `auto` connection for every connection either: it
/// reads the first bytes itself and puts them in front of the socket for
/// hyper's HTTP/1 connection, whose read buffer then grows for the
/// connection's life (see benches/README.md, Decisions).
pub(super) async fn first_bytes(io: &mut ClientIo) -> Option<(Http, BytesMut)> {
    let mut rx = BytesMut::new();
    loop {
        let n = std::future::poll_fn(|cx| crate::net::poll_fill::<READ, _>(io, &mut rx, cx)).await.ok()?;
        if n == 0 {
            return None;
        }
        let seen = rx.len().min(H2_PREFACE.len());
        if rx[..seen] != H2_PREFACE[..seen] {
            return Some((Http::One, rx));
        }
        if seen == H2_PREFACE.len() {
            return Some((Http::Two, rx));
        }
    }
}

/// A byte stream with the bytes [`first_bytes`] read from it put back in
/// front, for hyper's connections and the own HTTP/2 one; writes pass
/// through. Hand-written: hyper-util's equivalent is private to it.
pub struct Rewind<I> {
    first: Bytes,
    inner: I,
}

impl<I> Rewind<I> {
    pub fn new(first: Bytes, inner: I) -> Self {
        Rewind { first, inner }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Rewind<I> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.first.is_empty() {
            return Pin::new(&mut self.inner).poll_read(cx, buf);
        }
        let n = self.first.len().min(buf.remaining());
        buf.put_slice(&self.first[..n]);
        self.first.advance(n);
        if self.first.is_empty() {
            // Its allocation let go once all read.
            self.first = Bytes::new();
        }
        Poll::Ready(Ok(()))
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Rewind<I> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The bytes read first come back first, in reads of any size, then
    /// the stream's own; writes reach the stream.
    #[tokio::test]
    async fn rewind_reads_the_first_bytes_then_the_stream() {
        let (mut near, far) = tokio::io::duplex(64);
        let mut io = Rewind::new(Bytes::from_static(b"hello "), far);
        near.write_all(b"world").await.unwrap();
        drop(near.shutdown().await);
        let mut small = [0u8; 4];
        assert_eq!(io.read(&mut small).await.unwrap(), 4);
        assert_eq!(&small, b"hell");
        let mut rest = Vec::new();
        io.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"o world");
        io.write_all(b"back").await.unwrap();
        let mut got = [0u8; 4];
        near.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"back");
    }
}
