//! The connection's socket and what has been read from it, shared by the
//! connection (heads, responses) and the request body of the request in
//! flight ([`WireBody`], which reads and decodes its own bytes as the
//! gateway polls it), behind one lock that is never held across a wait.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker, ready};

use bytes::{Buf, Bytes, BytesMut};
use http_body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::server::TlsStream;

use crate::body::BoxError;
use crate::listener::io::ClientIo;
use crate::upstream::h1::decode::{Decoder, Step};

use crate::listener::io::READ;

/// What a server answers to `Expect: 100-continue` when the body is first
/// asked for (RFC 9110 §10.1.1).
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// The client's byte stream, plain or TLS.
pub enum ClientStream {
    Plain(ClientIo),
    Tls(Box<TlsStream<ClientIo>>),
}

impl AsyncRead for ClientStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(io) => Pin::new(io).poll_read(cx, buf),
            ClientStream::Tls(io) => Pin::new(&mut **io).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ClientStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientStream::Plain(io) => Pin::new(io).poll_write(cx, buf),
            ClientStream::Tls(io) => Pin::new(&mut **io).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(io) => Pin::new(io).poll_flush(cx),
            ClientStream::Tls(io) => Pin::new(&mut **io).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(io) => Pin::new(io).poll_shutdown(cx),
            ClientStream::Tls(io) => Pin::new(&mut **io).poll_shutdown(cx),
        }
    }
}

/// The socket, the bytes read and not yet taken, and the request body's
/// decoding.
pub struct Wire {
    pub io: ClientStream,
    pub rx: BytesMut,
    pub decoder: Decoder,
    /// Bytes of the `100 Continue` written, while it is owed before the
    /// body is read. (A byte: every parked connection holds the wire.)
    continue_at: Option<u8>,
    /// The connection's task, waiting for the body to end to watch the
    /// socket for a client that leaves.
    watcher: Option<Waker>,
    /// The client closed its side.
    pub eof: bool,
    /// Which request's body `decoder` decodes, counted up as each request
    /// begins and as each exchange ends: a body still held once its
    /// exchange is over (an HTTP/2 upstream's stream, sending what it was
    /// given as its window opens) must not read what comes after it.
    body: u32,
    /// The last body whose exchange ended with none of it skipped: the
    /// end is all that is left for whoever still holds it.
    whole: u32,
    /// The current body was dropped before its end: nobody reads it now.
    dropped: bool,
}

/// The wire, shared by the connection and the request body in flight.
#[derive(Clone)]
pub struct Shared(Arc<Mutex<Wire>>);

impl Shared {
    /// The wire of `io`, whose bytes `rx` were read already.
    pub fn new(io: ClientStream, rx: BytesMut) -> Shared {
        let wire = Wire {
            io,
            rx,
            decoder: Decoder::Done,
            continue_at: None,
            watcher: None,
            eof: false,
            body: 0,
            whole: 0,
            dropped: false,
        };
        Shared(Arc::new(Mutex::new(wire)))
    }

    pub fn lock(&self) -> MutexGuard<'_, Wire> {
        self.0.lock().expect("wire lock")
    }

    /// Whether nothing else holds the wire (no request body still held
    /// elsewhere, which may read the socket).
    pub fn alone(&self) -> bool {
        Arc::strong_count(&self.0) == 1
    }

    /// The socket and the bytes read past the last head, once nothing else
    /// holds the wire (for a tunnel).
    pub fn into_parts(self) -> Option<(ClientStream, Bytes)> {
        let wire = Arc::into_inner(self.0)?.into_inner().ok()?;
        Some((wire.io, wire.rx.freeze()))
    }
}

impl Wire {
    /// A new request's body begins: `continue_owed` when the client waits
    /// for a `100 Continue` before sending it. Returns the number its
    /// [`WireBody`] reads by.
    pub fn begin_body(&mut self, decoder: Decoder, continue_owed: bool) -> u32 {
        self.decoder = decoder;
        self.continue_at = continue_owed.then_some(0);
        self.dropped = false;
        self.body = self.body.wrapping_add(1);
        self.body
    }

    /// Before an answer's head: a request body that nobody reads any more
    /// (dropped before its end, or its client still waits for `100
    /// Continue`) is drained now of what is in, and `Some(whether it is
    /// all in)` says whether the connection can go on after the answer;
    /// not all in, it closes rather than wait for bytes the client may
    /// never send, and the answer says so (RFC 9110 §10.1.1, RFC 9112
    /// §9.6). `None`: a body still read, or none left, is decided after
    /// the answer ([`Wire::body_drained`]).
    pub fn settle_unread(&mut self) -> Option<bool> {
        let unread = self.continue_at == Some(0) || self.dropped;
        (unread && !self.decoder.is_done()).then(|| self.body_drained())
    }

    /// Between requests, an empty read buffer is given back; returns
    /// whether it was empty (no pipelined request waits in it). Empty
    /// lines are no request (RFC 9112 §2.2: a server ignores them before
    /// a request line), and go first.
    pub fn release_buffer(&mut self) -> bool {
        loop {
            let blank = match &self.rx[..] {
                [b'\r', b'\n', ..] => 2,
                [b'\n', ..] => 1,
                _ => break,
            };
            self.rx.advance(blank);
        }
        if !self.rx.is_empty() {
            return false;
        }
        if self.rx.capacity() > 0 {
            self.rx = BytesMut::new();
        }
        true
    }

    /// Lets go of what an idle connection about to park need not keep:
    /// the task that last watched for the body's end (it ends), and the
    /// read buffer if it is empty (it still shares its allocation with
    /// the last head's bytes, which the next read would not reuse).
    pub fn shed(&mut self) {
        self.watcher = None;
        if self.rx.is_empty() {
            self.rx = BytesMut::new();
        }
    }

    /// Reads more bytes into `rx` (see [`poll_fill`]), noting the end.
    pub fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let n = ready!(crate::net::poll_fill::<READ, _>(&mut self.io, &mut self.rx, cx))?;
        if n == 0 {
            self.eof = true;
        }
        Poll::Ready(Ok(n))
    }

    /// As the connection closes: whether the client may still be sending
    /// the request body (not all of it read or in, its stream not ended),
    /// for a lingering close to read and drop; the bytes read are let go.
    pub fn body_coming(&mut self) -> bool {
        let coming = !self.eof && !self.decoder.is_done() && !self.body_drained();
        self.rx = BytesMut::new();
        coming
    }

    /// A plain socket read to its end (the client closed its side): the
    /// kernel holds nothing unread, so closing it sends a FIN, not a reset.
    pub fn client_closed_plain(&self) -> bool {
        self.eof && matches!(self.io, ClientStream::Plain(_))
    }

    /// Writes `buf` from `at` on, as far as the socket takes it.
    pub fn poll_write_all(&mut self, buf: &[u8], at: &mut usize, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while *at < buf.len() {
            match ready!(Pin::new(&mut self.io).poll_write(cx, &buf[*at..]))? {
                0 => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                n => *at += n,
            }
        }
        Poll::Ready(Ok(()))
    }

    /// While the request is in flight: resolves when the client closed its
    /// side (`true`) or sent more (`false`, left in `rx`); waits while the
    /// body is still being read, for the body to wake it at its end.
    pub fn poll_watch(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<bool>> {
        if !self.decoder.is_done() {
            self.watcher = Some(cx.waker().clone());
            return Poll::Pending;
        }
        if !self.rx.is_empty() || self.eof {
            return Poll::Ready(Ok(self.eof));
        }
        Poll::Ready(Ok(ready!(self.poll_fill(cx))? == 0))
    }

    /// Decodes the body's next frame, reading as needed.
    fn poll_body(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(at) = self.continue_at.as_mut() {
            let mut written = usize::from(*at);
            let polled = self.poll_write_continue(&mut written, cx);
            self.continue_at = Some(written as u8);
            if let Err(e) = ready!(polled) {
                return Poll::Ready(Some(Err(e.into())));
            }
            self.continue_at = None;
        }
        loop {
            match self.decoder.step(&mut self.rx) {
                Ok(Step::Frame(frame)) => return Poll::Ready(Some(Ok(frame))),
                Ok(Step::End) => {
                    self.body_ended();
                    return Poll::Ready(None);
                }
                Ok(Step::More) => {}
                Err(e) => return Poll::Ready(Some(Err(e.into()))),
            }
            match ready!(self.poll_fill(cx)) {
                Ok(0) => {
                    // The client's stream ended mid-body: it left.
                    return match self.decoder.eof() {
                        Ok(_) => Poll::Ready(None),
                        Err(e) => Poll::Ready(Some(Err(io::Error::new(io::ErrorKind::UnexpectedEof, e).into()))),
                    };
                }
                Ok(_) => {}
                Err(e) => return Poll::Ready(Some(Err(e.into()))),
            }
        }
    }

    /// Whether the `100 Continue` is written in part: nothing else may be
    /// written after it.
    pub fn continue_half_written(&self) -> bool {
        self.continue_at.is_some_and(|at| at > 0)
    }

    fn poll_write_continue(&mut self, at: &mut usize, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_write_all(CONTINUE, at, cx))?;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn body_ended(&mut self) {
        if let Some(w) = self.watcher.take() {
            w.wake();
        }
    }

    /// After the response: whether the request body has all been read, or
    /// its rest is already in (hyper's `poll_drain_or_close_read` tries as
    /// much before it gives the connection up). If so, the body is over:
    /// whoever still holds it gets its end if nothing was skipped here,
    /// else an error; never a clean end short of its bytes, nor the next
    /// request's.
    pub fn body_drained(&mut self) -> bool {
        self.continue_at = None;
        let mut whole = true;
        while !self.decoder.is_done() {
            match self.decoder.step(&mut self.rx) {
                Ok(Step::Frame(_)) => whole = false,
                Ok(Step::End) => break,
                Ok(Step::More) | Err(_) => return false,
            }
        }
        if whole {
            self.whole = self.body;
        }
        self.body = self.body.wrapping_add(1);
        true
    }
}

/// A request body read from the wire: the body numbered `body` (see
/// [`Wire::begin_body`]), until its exchange is over.
pub struct WireBody {
    wire: Shared,
    body: u32,
    /// It has ended (its last poll said so).
    ended: bool,
}

impl WireBody {
    pub fn new(wire: Shared, body: u32) -> WireBody {
        WireBody { wire, body, ended: false }
    }
}

/// Dropped before its end: the connection is told (see
/// [`Wire::settle_unread`]). Only if the wire is free at once: a drop
/// while it is held (never on this path, but a lock taken twice on one
/// thread would hang) leaves the body to be decided after the answer,
/// as it was before the connection could tell.
impl Drop for WireBody {
    fn drop(&mut self) {
        if !self.ended
            && let Ok(mut wire) = self.wire.0.try_lock()
            && wire.body == self.body
        {
            wire.dropped = true;
        }
    }
}

impl http_body::Body for WireBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        let mut wire = this.wire.lock();
        if wire.body != this.body {
            this.ended = wire.whole == this.body;
            return match this.ended {
                true => Poll::Ready(None),
                false => Poll::Ready(Some(Err("request body read after its exchange was over".into()))),
            };
        }
        let polled = wire.poll_body(cx);
        this.ended = matches!(polled, Poll::Ready(None));
        polled
    }

    fn is_end_stream(&self) -> bool {
        let wire = self.wire.lock();
        self.ended || wire.whole == self.body || (wire.body == self.body && wire.decoder.is_done())
    }

    fn size_hint(&self) -> SizeHint {
        let wire = self.wire.lock();
        match wire.decoder {
            _ if self.ended || wire.whole == self.body => SizeHint::with_exact(0),
            _ if wire.body != self.body => SizeHint::default(),
            Decoder::Done => SizeHint::with_exact(0),
            Decoder::Length(n) => SizeHint::with_exact(n),
            _ => SizeHint::default(),
        }
    }
}

/// The client's socket after a 101, with the bytes it sent past the
/// request read first.
pub struct Switched {
    pub io: ClientStream,
    pub read: Bytes,
}

impl AsyncRead for Switched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if !self.read.is_empty() {
            let n = self.read.len().min(buf.remaining());
            buf.put_slice(&self.read[..n]);
            self.read.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Switched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
