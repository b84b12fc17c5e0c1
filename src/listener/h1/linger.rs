//! A lingering close, as nginx's `lingering_close`: a connection answered
//! before its request body was read (a route that never reads it, a 413,
//! an early answer from the upstream) closes while its client may still
//! be sending that body. Closed at once, a socket with bytes unread is
//! reset, and a client still writing then gets the reset instead of the
//! answer already sent (curl: "Connection reset by peer"). So once the
//! answer is written and the write side shut, what the client sends is
//! read and dropped until it closes its side, falls silent, or the
//! bounds below are reached; only then is the socket closed.
//!
//! Only that path lingers: a connection that closes between requests, or
//! whose request body is all read, closes as before.

use std::io;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::AsyncWrite;
use tokio::time::Instant;

use super::guard::{Signals, guard};
use super::wire::{ClientStream, Shared};

/// Bytes read at most: past them the client is cut off, as it would be
/// without a lingering close, and a fast client costs no more than this.
const MOST_BYTES: u64 = 64 << 20;

/// How long a lingering close lasts at most (nginx's `lingering_time`),
/// and how long the client may stay silent in it (nginx's
/// `lingering_timeout`); neither longer than the idle timeout, which
/// bounds a connection with no request in flight.
const MOST_TIME: Duration = Duration::from_secs(30);
const SILENCE: Duration = Duration::from_secs(5);

/// Bytes read at a time, into a buffer on the stack of each poll: the
/// connection's task keeps no room for them.
const CHUNK: usize = 8 * 1024;

/// Closes the connection's write side (a TLS close_notify, a FIN), then
/// lingers if the client may still be sending its request body.
pub(super) async fn close(wire: &Shared, s: &mut Signals<'_, '_>) {
    let shut = std::future::poll_fn(|cx| std::pin::Pin::new(&mut wire.lock().io).poll_shutdown(cx));
    if let Ok(Ok(())) = guard(std::pin::pin!(shut), s).await {
        linger(wire, s).await;
    }
}

/// After the answer, with the write side shut: lingers if the client may
/// still be sending its request body, beside the watchdog and the
/// shutdown signals. Not while a request body still held elsewhere reads
/// the socket. A graceful shutdown lets it go on, as it lets a request
/// finish: closed then, the socket would be reset and the end of the
/// answer still in its send queue lost; the shutdown timeout (or a second
/// signal) ends it.
async fn linger(wire: &Shared, s: &mut Signals<'_, '_>) {
    if !wire.alone() || !wire.lock().body_coming() {
        return;
    }
    // Not flagged idle (the exchange before it cleared the flag), so a
    // graceful shutdown's signal does not end it (see `guard`).
    let idle = s.watchdog.timeouts().idle;
    let _ = guard(std::pin::pin!(discard(wire, SILENCE.min(idle), MOST_TIME.min(idle))), s).await;
}

/// Reads and drops what the client sends until it closes its side, an
/// error, `silence` without a byte, `most` in all, or [`MOST_BYTES`].
async fn discard(wire: &Shared, silence: Duration, most: Duration) {
    let end = Instant::now() + most;
    let mut heard = Instant::now();
    let mut read = 0u64;
    let mut timer = std::pin::pin!(tokio::time::sleep_until((heard + silence).min(end)));
    let ended = std::future::poll_fn(|cx| {
        let mut buf = [0u8; CHUNK];
        loop {
            match poll_drop(&wire.lock().io, &mut buf, cx) {
                Poll::Ready(Ok(0)) => return Poll::Ready("the client's end"),
                Poll::Ready(Err(_)) => return Poll::Ready("an error"),
                Poll::Ready(Ok(n)) => {
                    read += n as u64;
                    heard = Instant::now();
                    if read >= MOST_BYTES {
                        return Poll::Ready("its most bytes");
                    }
                    continue;
                }
                Poll::Pending => {}
            }
            // Moved later only when it fires: a read costs no timer reset.
            ready!(timer.as_mut().poll(cx));
            let at = (heard + silence).min(end);
            if at <= Instant::now() {
                return Poll::Ready(if at == end { "its most time" } else { "the client's silence" });
            }
            timer.as_mut().reset(at);
        }
    })
    .await;
    tracing::debug!(bytes = read, ended_by = ended, "lingering close over");
}

/// Reads what the socket holds into `buf`, to drop it: from the TCP
/// socket itself, under TLS too (after its close_notify nothing the
/// client sends is read, so its records need no decrypting).
fn poll_drop(io: &ClientStream, buf: &mut [u8], cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
    let tcp = match io {
        ClientStream::Plain(io) => io.stream(),
        ClientStream::Tls(tls) => tls.get_ref().0.stream(),
    };
    loop {
        ready!(tcp.poll_read_ready(cx))?;
        match tcp.try_read(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            read => return Poll::Ready(read),
        }
    }
}
