//! The gateway's own HTTP/1.1 client for upstreams.
//!
//! Hand-written because hyper's client keeps, for every upstream
//! connection, a task of its own, a 32-slot request channel (its block
//! allocated per connection, and a second one after 32 requests) and 8 KiB+
//! read and write buffers for the connection's whole life: most of the 37
//! KiB of memory a client + upstream connection pair cost against nginx's
//! 10 (issue 27's figures, `benches/memory`). The upstream side's work is
//! the simple one: one request at a time, to an upstream we chose.
//!
//! So here a connection carries one exchange at a time, driven by the
//! request's own task: `client` writes the request head and streams its
//! body (within the send timeout `io` enforces) while it reads the
//! response head, and `body` reads the response body as frames (`decode`)
//! and, at its clean end, gives the connection back to its pool. Buffers
//! exist only while an exchange uses them; a connection waiting for its
//! response or idle in the pool is its socket and a few flags. Heads are
//! parsed by `httparse` (`head`), never by hand. HTTP/2 upstreams stay on
//! hyper's client.
//!
//! Where it decides differently from hyper's client, on purpose (each
//! safer; `tests/h1_differential.rs` checks the rest is the same):
//! - Content-Length beside Transfer-Encoding never leaves the connection
//!   reusable, even on a response without a body (RFC 9112 §6.1).
//! - A transfer coding other than one `chunked` is refused (a 502, as
//!   nginx answers): hyper's client passes the body on still in `gzip`,
//!   or framed by the close after another coding, and with the hop-by-hop
//!   `Transfer-Encoding` gone the client would take it for plain bytes.
//! - A `Content-Length` repeated, or listed, with one value is passed on as
//!   that one value (RFC 9110 §8.6); hyper passes the list.
//! - A chunk-size line is at most 4 KiB (hyper bounds only the
//!   extensions, 16 KiB over a body).
//! - An upstream that answers before the whole request body is sent gets
//!   the rest while the response body is read; if the response ends first,
//!   the connection is reset, not kept busy for an upload nobody waits for.
//!   Either way the connection is never reused (hyper's client pools it
//!   once the body is written): nothing says the upstream read that body,
//!   and left unread it would be the next request (issue 36).
//! - A bodiless answer (HEAD, 101, 204, 304) whose `Content-Length` is no
//!   length, or lists lengths that disagree, is refused (a 502, as on a
//!   GET's answer; RFC 9110 §8.6): hyper passes it on.
//! - A body broken at its start, in what came with the head or in one
//!   more read tried at once (a first chunk-size line that is not one, a
//!   close before the first byte), fails the exchange (a 502), while
//!   nothing of the answer has reached the client; hyper gives the head
//!   and fails the body.
//! - A pooled connection the upstream closed is noticed when it is taken
//!   or when the reaper passes (no task reads it meanwhile).

mod body;
mod client;
pub(crate) mod decode;
mod head;
mod seen;

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub use body::ResponseBody;
pub use client::{Encoded, send, send_encoded};
pub(crate) use head::Framing;
pub use head::{MAX_HEAD, MAX_HEADERS, request_of};
pub use seen::content_length;

use super::io::UpstreamIo;
use crate::body::BoxError;

/// How an exchange or a response body failed.
#[derive(Debug)]
pub struct Error {
    kind: Kind,
    source: Option<BoxError>,
    /// A stale connection's request, kept to be sent again.
    kept: Option<Kept>,
}

/// A request's bytes (see [`Encoded::keeping`]); its `Debug` gives only
/// their length, since they may hold credentials.
struct Kept(BytesMut);

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kept({} bytes)", self.0.len())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The response head broke the protocol.
    Parse(&'static str),
    /// The response head was larger than [`MAX_HEAD`] or had more than
    /// [`MAX_HEADERS`] fields.
    TooLarge,
    /// The connection ended before a whole response head.
    Incomplete,
    /// The connection ended before the body's framing did.
    IncompleteBody,
    /// The response body's chunked framing was broken.
    BodyParse(&'static str),
    /// Reading or writing the socket failed.
    Io,
    /// The request body failed (the client's, or its length was wrong).
    Body,
}

impl Error {
    fn parse(why: &'static str) -> Error {
        Error { kind: Kind::Parse(why), source: None, kept: None }
    }

    fn too_large() -> Error {
        Error { kind: Kind::TooLarge, source: None, kept: None }
    }

    fn incomplete() -> Error {
        Error { kind: Kind::Incomplete, source: None, kept: None }
    }

    fn incomplete_body() -> Error {
        Error { kind: Kind::IncompleteBody, source: None, kept: None }
    }

    fn body_parse(why: &'static str) -> Error {
        Error { kind: Kind::BodyParse(why), source: None, kept: None }
    }

    fn io(e: io::Error) -> Error {
        Error { kind: Kind::Io, source: Some(Box::new(e)), kept: None }
    }

    fn body(e: BoxError) -> Error {
        Error { kind: Kind::Body, source: Some(e), kept: None }
    }

    /// The request's bytes, if they were kept and the connection turned
    /// out stale: anything else does not resend them.
    fn keeping(mut self, kept: Option<BytesMut>) -> Error {
        if self.is_stale() {
            self.kept = kept.map(Kept);
        }
        self
    }

    /// The kept request of a stale connection's error, to be sent again.
    pub fn take_kept(&mut self) -> Option<BytesMut> {
        self.kept.take().map(|k| k.0)
    }

    /// The upstream's response broke the protocol (a 502 of kind
    /// `protocol`, as hyper's parse errors): its head, or its body's
    /// framing before any of the answer went on.
    pub fn is_parse(&self) -> bool {
        matches!(self.kind, Kind::Parse(_) | Kind::TooLarge | Kind::BodyParse(_))
    }

    /// The request body failed: the client's fault, or the gateway's.
    pub fn is_body(&self) -> bool {
        self.kind == Kind::Body
    }

    /// On a pooled connection, before any response: the connection went
    /// bad while idle (closed under the request, or stray bytes on it). The
    /// exchange keeps no request to resend once bytes that begin an answer
    /// came (`client::exchange`): the upstream read the request, and a
    /// resend would run it twice (nginx passes no `invalid_header` on by
    /// default either).
    pub fn is_stale(&self) -> bool {
        match self.kind {
            Kind::Incomplete | Kind::Parse(_) | Kind::TooLarge => true,
            Kind::Io => self.io_kind().is_some_and(|k| {
                matches!(
                    k,
                    io::ErrorKind::ConnectionReset
                        | io::ErrorKind::BrokenPipe
                        | io::ErrorKind::ConnectionAborted
                        // rustls: a TLS upstream closed without close_notify.
                        | io::ErrorKind::UnexpectedEof
                )
            }),
            _ => false,
        }
    }

    fn io_kind(&self) -> Option<io::ErrorKind> {
        self.source.as_ref()?.downcast_ref::<io::Error>().map(io::Error::kind)
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            Kind::Parse(why) => write!(f, "invalid HTTP response head: {why}"),
            Kind::TooLarge => write!(f, "response head too large"),
            Kind::Incomplete => write!(f, "connection closed before message completed"),
            Kind::IncompleteBody => write!(f, "end of file before message length reached"),
            Kind::BodyParse(why) => write!(f, "invalid response body: {why}"),
            Kind::Io => write!(f, "upstream connection error"),
            Kind::Body => write!(f, "request body failed"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// An upstream connection after a 101: its socket, with whatever the
/// upstream sent after the 101's head read first.
pub struct Upgraded {
    io: UpstreamIo,
    read: Bytes,
}

impl Upgraded {
    /// The socket, for the tunnel to set its timeouts.
    pub fn io_mut(&mut self) -> &mut UpstreamIo {
        &mut self.io
    }
}

impl AsyncRead for Upgraded {
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

impl AsyncWrite for Upgraded {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A stale connection's error carries its request to be resent, and
    /// only such an error does; its `Debug` never shows the request's
    /// bytes (they may hold credentials).
    #[test]
    fn only_a_stale_error_keeps_the_request_and_never_shows_it() {
        let request = || Some(BytesMut::from(&b"GET / HTTP/1.1\r\nauthorization: Bearer secret\r\n\r\n"[..]));
        let mut stale = Error::incomplete().keeping(request());
        assert!(!format!("{stale:?}").contains("secret"), "{stale:?}");
        assert_eq!(stale.take_kept(), request());
        assert_eq!(stale.take_kept(), None, "taken once");
        let mut body = Error::incomplete_body().keeping(request());
        assert_eq!(body.take_kept(), None, "not a stale connection's error");
    }
}
