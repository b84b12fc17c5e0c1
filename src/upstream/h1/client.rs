//! One exchange on one connection: the request written (its head, then its
//! body as it streams in, framed by length or in chunks) while the
//! response head is read. An upstream may answer before the whole request
//! body is sent (an early error, or an echo that streams back as it
//! reads): the rest of the body then goes on alongside the response body
//! (see [`super::ResponseBody`]), and the connection is not reused, even
//! when all of the body gets written: nothing says the upstream read it
//! (RFC 9110 §10.1.1 lets it answer first and leave the body unread), and
//! an unread body on a pooled connection would be the next request.

use std::io;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName};
use http::{Method, Request, Response};
use tokio::io::AsyncWrite;

use super::Error;
use super::body::ResponseBody;
use super::decode::Decoder;
use super::head::{self, Framing, Head, Parsed, SendFraming};
use crate::headers::Stamp;
use crate::request::{InterimSink, Interims};
use crate::upstream::io::UpstreamIo;
use crate::upstream::pool::{Conn, SendBody};

/// Bytes read at a time into a buffer on the stack when the exchange's
/// read buffer has no room: a connection waiting for its response holds
/// no buffer of its own.
const READ: usize = 8192;
/// Encoded request bytes gathered before a write (the head with a small
/// body goes in one).
const COALESCE: usize = 16 * 1024;
/// A data frame up to this size is copied beside its framing; a larger one
/// is written from its own buffer.
const COPY_UP_TO: usize = 8192;

/// Sends `req` on `conn` and reads the response head (skipping 1xx other
/// than 101). The response's body reads on from the connection and gives
/// it back to its pool at its end.
pub async fn send(conn: Conn, req: Request<SendBody>) -> Result<Response<ResponseBody>, Error> {
    send_encoded(conn, Encoded::of(req, &Stamp::default(), true, None)).await
}

/// A request encoded for an HTTP/1.1 connection, not sent yet.
pub struct Encoded<'a> {
    sending: Option<Sending>,
    head_request: bool,
    /// Where 1xx heads go, when the client's connection forwards them.
    interims: Option<InterimSink<'a>>,
}

impl<'a> Encoded<'a> {
    /// `req` encoded, with the fields it is stamped with; its [`Interims`]
    /// taken along when `interims` says the client's connection may have
    /// put one there, else the client connection's queue, `connection`, if
    /// any.
    pub fn of(
        mut req: Request<SendBody>,
        stamp: &Stamp,
        interims: bool,
        connection: Option<&'a OnceLock<Interims>>,
    ) -> Self {
        let interims = interims.then(|| InterimSink::of(&mut req, connection)).flatten();
        let (sending, head_request) = Sending::new(req, stamp);
        Encoded { sending, head_request, interims }
    }

    /// `req` encoded and, if `keep` and it is bodiless, its bytes kept to
    /// be sent again (on a new connection, after a pooled one turned out
    /// stale): they are written from where they lie, not taken off as they
    /// go, and handed back with a stale connection's error (see
    /// [`Error::take_kept`]). A second handle on them instead cost every
    /// such request a shared header allocated and freed.
    pub fn keeping(
        req: Request<SendBody>,
        stamp: &Stamp,
        keep: bool,
        interims: bool,
        connection: Option<&'a OnceLock<Interims>>,
    ) -> Self {
        let mut encoded = Encoded::of(req, stamp, interims, connection);
        if let Some(s) = encoded.sending.as_mut().filter(|s| keep && s.body.is_none()) {
            s.keep = true;
        }
        encoded
    }

    /// The request [`Encoded::keeping`] kept, to be sent again.
    pub fn again(bytes: BytesMut) -> Self {
        let head_request = bytes.starts_with(b"HEAD ");
        let sending = Sending {
            out: bytes,
            written: 0,
            keep: false,
            big: Bytes::new(),
            crlf: 0,
            body: None,
            framing: SendFraming::Length(0),
            left: 0,
        };
        Encoded { sending: Some(sending), head_request, interims: None }
    }
}

/// [`send`] of a request already encoded. An `async move` block, not an
/// `async fn`: the latter moves its arguments into locals of its own on
/// its first poll, a copy of the connection and the request's bytes.
pub fn send_encoded<'a>(
    mut conn: Conn,
    encoded: Encoded<'a>,
) -> impl Future<Output = Result<Response<ResponseBody>, Error>> + 'a {
    let Encoded { mut sending, head_request, interims } = encoded;
    async move {
        let mut rx = BytesMut::new();
        let (mut unfinished, mut scanned, mut kept, mut answered) = (false, 0, None, false);
        let head = std::future::poll_fn(|cx| {
            let rx = (&mut rx, &mut scanned, &mut answered);
            let sending = (&mut sending, &mut kept);
            poll_head(&mut conn, sending, &mut unfinished, rx, (head_request, interims.as_ref()), cx)
        })
        .await;
        let head = match head {
            Ok(head) => head,
            // A stale connection found on the read side while the request is
            // still being written (the upstream closed it, or sent stray bytes,
            // as it went out): its bytes are whole in `sending`, kept too. Not
            // when an answer began (a 1xx, bytes that start a status line,
            // whatever broke after them): the upstream read the request, and
            // a resend would run it twice.
            Err(e) if answered => return Err(e),
            Err(e) => return Err(e.keeping(kept.or_else(|| sending.and_then(Sending::kept)))),
        };
        // Answered: no resend will want the kept bytes.
        if let Some(kept) = kept {
            crate::net::give_back(kept);
        }
        Ok(respond(head, conn, rx, sending.map(Box::new), unfinished))
    }
}

/// Whether `rx` holds the start of a status line (`HTTP/`, or as much of
/// it as came): an answer, not stray bytes left on an idle connection.
fn began_an_answer(rx: &[u8]) -> bool {
    let n = rx.len().min(5);
    n > 0 && rx[..n] == b"HTTP/"[..n]
}

/// The response for the client, its body reading on from `conn`.
fn respond(
    head: Head,
    conn: Conn,
    rx: BytesMut,
    sending: Option<Box<Sending>>,
    unfinished: bool,
) -> Response<ResponseBody> {
    let Head { status, version, headers, reason, framing, keep_alive } = head;
    // Answered before the whole request was written: never pooled.
    let keep_alive = keep_alive && sending.is_none();
    let upgrade = status == http::StatusCode::SWITCHING_PROTOCOLS;
    let body = ResponseBody::new(conn, rx, framing, keep_alive, sending, unfinished, upgrade);
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.version_mut() = version;
    *response.headers_mut() = headers;
    if let Some(reason) = reason.and_then(|r| hyper::ext::ReasonPhrase::try_from(r).ok()) {
        response.extensions_mut().insert(reason);
    }
    response
}

/// Pushes the request out as far as it goes, and reads until a response
/// head is in. A failed write ends the exchange unless the upstream's
/// answer is already readable (it answered, then stopped reading). `rx`
/// comes with how much of it was looked at for a head's end already.
/// The request's kept bytes (see [`Encoded::keeping`]) move to `kept`
/// when it is done with.
fn poll_head(
    conn: &mut Conn,
    (sending, kept): (&mut Option<Sending>, &mut Option<BytesMut>),
    unfinished: &mut bool,
    (rx, scanned, answered): (&mut BytesMut, &mut usize, &mut bool),
    (head_request, interims): (bool, Option<&InterimSink<'_>>),
    cx: &mut Context<'_>,
) -> Poll<Result<Head, Error>> {
    let mut failed = None;
    if let Some(s) = sending {
        match s.poll_send(conn.io_mut(), cx) {
            Poll::Ready(Ok(())) => *kept = sending.take().and_then(Sending::kept),
            Poll::Ready(Err(e)) if e.is_body() || stalled(&e) => return Poll::Ready(Err(e)),
            Poll::Ready(Err(e)) => {
                (*kept, *unfinished) = (sending.take().and_then(Sending::kept), true);
                failed = Some(e);
            }
            Poll::Pending => {}
        }
    }
    loop {
        // Parsed at the first read (most heads come whole in it), then
        // again only once the new bytes could end a head (or pass the
        // limit), as hyper does: parsing again on every read made an
        // upstream that drips an endless head cost time in the square of
        // its length.
        if !rx.is_empty() && (*scanned == 0 || may_end_head(rx, *scanned) || rx.len() >= head::MAX_HEAD) {
            *answered |= began_an_answer(rx);
            match head::parse(rx, head_request)? {
                Parsed::Head(head) => {
                    check_body_start(head.framing, conn.io_mut(), rx, cx)?;
                    return Poll::Ready(Ok(head));
                }
                Parsed::Interim(interim) => {
                    // A 100 answers the gateway's own expectation, if any.
                    if let Some(sink) = interims.filter(|_| interim.get(9..12) != Some(b"100")) {
                        sink.push(interim);
                    }
                    (*scanned, *answered) = (0, true);
                    continue;
                }
                Parsed::Partial => {}
            }
        }
        *scanned = rx.len();
        let read = match poll_fill(conn.io_mut(), rx, cx) {
            Poll::Pending if failed.is_some() => return Poll::Ready(Err(failed.expect("checked"))),
            Poll::Pending => return Poll::Pending,
            Poll::Ready(read) => read,
        };
        match (read, failed.take()) {
            (Ok(0), None) => return Poll::Ready(Err(Error::incomplete())),
            (Err(e), None) => return Poll::Ready(Err(Error::io(e))),
            (Ok(0) | Err(_), Some(e)) => return Poll::Ready(Err(e)),
            (Ok(_), still) => failed = still,
        }
    }
}

/// Before the head is handed on, while nothing of the answer has reached
/// the client: a body broken at its start (a first chunk-size line that is
/// not one, or the upstream's close before the first byte) fails the
/// exchange, a 502; found once the head has gone on, it could only cut the
/// answer. What came with the head is looked at, and when that is not
/// enough to tell, one more read is tried, never waited for (a streaming
/// answer's head is not held back for its body).
fn check_body_start(
    framing: Framing,
    io: &mut UpstreamIo,
    rx: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Result<(), Error> {
    let decoder = Decoder::new(framing);
    if !decoder.check_start(rx)? {
        return Ok(());
    }
    match poll_fill(io, rx, cx) {
        Poll::Ready(Ok(0)) => Err(Error::incomplete_body()),
        Poll::Ready(Ok(_)) => decoder.check_start(rx).map(drop),
        // A read that failed is the body's to report, as any after the head
        // (the exchange's failure would be taken for a stale connection's).
        Poll::Ready(Err(_)) | Poll::Pending => Ok(()),
    }
}

/// Whether `buf` may hold a head's end (an empty line, `\n\n` or
/// `\n\r\n`: httparse takes bare LFs too) in what came after its first
/// `scanned` bytes, which were looked at before.
fn may_end_head(buf: &[u8], scanned: usize) -> bool {
    let from = scanned.saturating_sub(2);
    // LFs found with memchr, each looked past: a byte-by-byte window over
    // the head cost every response more than its parse.
    memchr::memchr_iter(b'\n', &buf[from..]).any(|i| matches!(&buf[from + i + 1..], [b'\n', ..] | [b'\r', b'\n', ..]))
}

/// Whether a write failed because the upstream stopped reading for the
/// send timeout (see [`crate::upstream::io::SendStalled`]).
fn stalled(e: &Error) -> bool {
    e.io_kind() == Some(io::ErrorKind::TimedOut)
}

/// Reads as [`crate::net::poll_fill`] does, `READ` at a time.
pub(super) fn poll_fill(io: &mut UpstreamIo, rx: &mut BytesMut, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
    crate::net::poll_fill::<READ, _>(io, rx, cx)
}

/// The request on its way out.
pub(super) struct Sending {
    /// Encoded bytes: the head, chunk framing, small data; those from
    /// `written` on are not written yet.
    out: BytesMut,
    written: usize,
    /// `out` is the whole of a bodiless request, kept once written (see
    /// [`Encoded::keeping`]).
    keep: bool,
    /// A large data frame, written from its own buffer after `out`.
    big: Bytes,
    /// How much of a chunk's CRLF, after `big`, is still to be written.
    crlf: u8,
    /// The body, until it has ended.
    body: Option<SendBody>,
    framing: SendFraming,
    /// Length framing: bytes the body still owes.
    left: u64,
}

impl Sending {
    /// The request's head encoded (its header map freed here, before the
    /// exchange waits), and whether it is a HEAD request.
    fn new(req: Request<SendBody>, stamp: &Stamp) -> (Option<Sending>, bool) {
        let (parts, body) = req.into_parts();
        let mut out = crate::net::write_buffer(0);
        let framing = head::encode_request(&parts, stamp, &mut out);
        let left = match framing {
            SendFraming::Length(n) => n,
            SendFraming::Chunked(_) => 0,
        };
        let body = (!http_body::Body::is_end_stream(&body)).then_some(body);
        let mut sending = Sending { out, written: 0, keep: false, big: Bytes::new(), crlf: 0, body, framing, left };
        if sending.body.is_none() {
            // A bodiless request: any framing's end is written with the head.
            if let Err(e) = sending.end(None) {
                tracing::debug!(error = %e, "request framing");
            }
        }
        let head_request = parts.method == Method::HEAD;
        // Its fields are on the wire: the map goes to the next head parsed.
        crate::headers::spare::give_back(parts.headers);
        (Some(sending), head_request)
    }

    /// Writes what the body has ready; `Ready(Ok)` once all of the request
    /// is written and flushed.
    pub(super) fn poll_send(&mut self, io: &mut UpstreamIo, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        loop {
            let mut waiting = false;
            // Nothing is framed while a large frame or its tail is still
            // going: what is gathered goes out before them.
            while self.big.is_empty() && self.crlf == 0 && self.out.len() < COALESCE {
                let Some(body) = self.body.as_mut() else { break };
                match http_body::Body::poll_frame(Pin::new(body), cx) {
                    Poll::Pending => {
                        waiting = true;
                        break;
                    }
                    Poll::Ready(None) => self.end(None)?,
                    Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                        Ok(data) => self.data(data)?,
                        Err(frame) => self.end(frame.into_trailers().ok())?,
                    },
                    Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(Error::body(e))),
                }
            }
            ready!(self.poll_write(io, cx)).map_err(Error::io)?;
            if self.body.is_none() || waiting {
                ready!(Pin::new(&mut *io).poll_flush(cx)).map_err(Error::io)?;
                return if self.body.is_none() { Poll::Ready(Ok(())) } else { Poll::Pending };
            }
        }
    }

    /// Writes `out`, then `big`, then its CRLF.
    fn poll_write(&mut self, io: &mut UpstreamIo, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.out.len() {
            let n = ready!(Pin::new(&mut *io).poll_write(cx, &self.out[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        if !self.keep {
            // Written: the buffer is framed into again from its start.
            self.out.clear();
            self.written = 0;
        }
        while !self.big.is_empty() {
            let n = ready!(Pin::new(&mut *io).poll_write(cx, &self.big))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.big.advance(n);
        }
        while self.crlf > 0 {
            let n = ready!(Pin::new(&mut *io).poll_write(cx, &b"\r\n"[2 - usize::from(self.crlf)..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.crlf -= n as u8;
        }
        Poll::Ready(Ok(()))
    }

    /// The request's bytes, if they were to be kept; else its buffer goes
    /// back for the next head.
    fn kept(self) -> Option<BytesMut> {
        if self.keep {
            return Some(self.out);
        }
        crate::net::give_back(self.out);
        None
    }

    /// Frames one data frame of the body.
    fn data(&mut self, data: Bytes) -> Result<(), Error> {
        if data.is_empty() {
            return Ok(());
        }
        let chunked = matches!(self.framing, SendFraming::Chunked(_));
        if chunked {
            self.out.put_slice(format!("{:X}\r\n", data.len()).as_bytes());
        } else {
            self.left = self.left.checked_sub(data.len() as u64).ok_or_else(|| too_long("longer"))?;
        }
        let tail: &'static [u8] = if chunked { b"\r\n" } else { b"" };
        if data.len() <= COPY_UP_TO {
            self.out.put_slice(&data);
            self.out.put_slice(tail);
        } else {
            (self.big, self.crlf) = (data, tail.len() as u8);
        }
        Ok(())
    }

    /// The body ended (with `trailers`, perhaps): the chunked end, or a
    /// check that the declared length was met.
    fn end(&mut self, trailers: Option<HeaderMap>) -> Result<(), Error> {
        self.body = None;
        match &self.framing {
            SendFraming::Length(_) if self.left != 0 => Err(too_long("shorter")),
            SendFraming::Length(_) => Ok(()),
            SendFraming::Chunked(allowed) => {
                self.out.put_slice(b"0\r\n");
                if let Some(trailers) = trailers {
                    write_trailers(&trailers, allowed, &mut self.out);
                }
                self.out.put_slice(b"\r\n");
                Ok(())
            }
        }
    }
}

/// A request body whose length differs from its `Content-Length`.
fn too_long(how: &'static str) -> Error {
    Error::body(format!("request body {how} than its Content-Length").into())
}

/// Writes the trailer fields the request declared in `Trailer`, except
/// those a trailer may not carry (RFC 9110 §6.5.1), as hyper's client does.
fn write_trailers(trailers: &HeaderMap, allowed: &[HeaderName], out: &mut BytesMut) {
    for (name, value) in trailers {
        if allowed.contains(name) && !crate::headers::forbidden_in_trailers(name) {
            out.put_slice(name.as_str().as_bytes());
            out.put_slice(b": ");
            out.put_slice(value.as_bytes());
            out.put_slice(b"\r\n");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A head's end is found wherever the reads split it.
    #[test]
    fn a_head_end_is_found_across_reads() {
        let head = b"HTTP/1.1 200 OK\r\nA: b\r\n\r\n";
        for split in 0..=head.len() {
            let seen_end = may_end_head(&head[..split], 0) || may_end_head(head, split);
            assert!(seen_end, "split at {split}");
        }
        let bare = b"HTTP/1.1 200 OK\nA: b\n\n";
        for split in 0..=bare.len() {
            assert!(may_end_head(&bare[..split], 0) || may_end_head(bare, split), "bare LF, split at {split}");
        }
        // No empty line yet: not parsed.
        assert!(!may_end_head(b"HTTP/1.1 200 OK\r\nA: b\r\n", 0));
        assert!(!may_end_head(b"HTTP/1.1 200 OK\r\nA: b\r\n", 10));
    }
}
