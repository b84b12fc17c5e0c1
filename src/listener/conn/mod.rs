//! One client connection's clock: what it is doing (waiting for its first
//! request head, serving requests, idle between them, blocked sending) and
//! the watchdog that closes it when it has done that for too long.
//!
//! hyper's own HTTP/1 header timer starts when it begins waiting for a head,
//! so it also cuts idle keep-alive connections at the header timeout, and it
//! does not cover the `auto` builder's version detection or HTTP/2 at all;
//! and when a client stops reading, hyper stops polling the response body, so
//! no timer inside the body fires. The watchdog runs beside hyper's
//! connection future in the connection's task instead, reading a few atomics
//! that the connection's I/O ([`super::io::ClientIo`]), the service and the
//! response body ([`ConnBody`]) keep up to date. Times are milliseconds since
//! the connection was accepted, plus one, so that 0 means "not set".
//!
//! HTTP/2 needs two more things. Its streams run in tasks of their own, and
//! a stream whose client leaves its window full simply stops being polled,
//! while the connection may go on writing other streams or PING acks; so
//! each HTTP/2 response body keeps its own "handed out data at" cell, which
//! the watchdog scans now and then. And a response whose last frame has left
//! its body may still be draining through flow control, so an HTTP/2
//! connection counts as idle only from its last write.

use std::pin::Pin;
use std::sync::atomic::{
    AtomicBool, AtomicU8, AtomicU32, AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http::HeaderValue;
use http_body::{Frame, SizeHint};
use tokio::time::Instant;

use crate::access::AccessLine;
use crate::body::{Body, BoxError};
use crate::request::Peer;
use crate::upstream::tunnel::Tunnel;
pub use watchdog::{Timeouts, Watchdog};

mod watchdog;

/// Why the watchdog ended (or started ending) a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// No complete request head in time: closed at once, counted.
    HeaderTimeout,
    /// No request in flight for the idle timeout: shut down gracefully.
    Idle,
    /// An HTTP/2 answer asked for the connection to end (see
    /// [`InFlight::close_http2`]): shut down gracefully, and closed after a
    /// short grace whatever the client does.
    Asked,
    /// An HTTP/2 client reset too many streams before their answer (see
    /// [`EARLY_RESETS_FROM`]): shut down gracefully, the streams in flight
    /// served.
    Resets,
    /// The client accepted no bytes for the send timeout: closed, counted.
    SendTimeout,
    /// A graceful shutdown took longer than its grace: closed.
    GraceOver,
}

/// What a connection is doing, shared by its I/O, its requests and its
/// watchdog.
pub struct ConnState {
    /// Who is on the other end.
    pub peer: Peer,
    /// The client's port (see `h1::park`: where a parked connection keeps it).
    pub port: u16,
    /// What its watchdog enforces, its listener's. (Here rather than in
    /// the watchdog: the watchdog is in every connection's task future;
    /// shared, not copied: an idle connection's state is most of what it
    /// holds.)
    timeouts: Arc<Timeouts>,
    accepted: Instant,
    /// Requests whose response body has not been dropped yet.
    in_flight: AtomicU32,
    /// Requests started on this connection.
    requests: AtomicU64,
    /// When `in_flight` last dropped to zero.
    idle_since: AtomicU64,
    /// When the first byte of a not yet complete HTTP/1 head arrived.
    head_started: AtomicU64,
    /// The HTTP/1 request in flight came without a body.
    bodiless: AtomicBool,
    /// Bytes arrived while a bodiless HTTP/1 request was in flight: the
    /// start of a pipelined head, timed from when that request is done.
    head_behind: AtomicBool,
    /// Since when a write to the client has been pending.
    write_blocked: AtomicU64,
    /// What only HTTP/2 needs, made at the first stream (boxed: every
    /// HTTP/1 connection holds the cell, and its state stays within the
    /// allocator size class the park test names).
    http2: OnceLock<Box<Http2Only>>,
    /// A response that may pass [`crate::net::NOTSENT_LOWAT`] has started.
    large_response: AtomicBool,
    /// The tunnel a `101` response opened, run once hyper hands the
    /// connection over. (Boxed: rare, and every connection holds the cell.)
    tunnel: Mutex<Option<Box<Tunnel>>>,
    /// Set once `tunnel` has been: see [`ConnState::take_tunnel`].
    tunnelled: AtomicBool,
    /// An own HTTP/1.1 connection that may park (see `h1::park`): whether
    /// it waits for its next request with nothing of it read (`IDLE`),
    /// whether its listener asked it to park (`PARK`), whether it has
    /// (`PARKED`), and (`OUT`) whether its listener left it out of its
    /// looks (busy or parked at one of them).
    park: AtomicU8,
    /// Its task, while it waits so, for the listener to wake.
    park_waker: AtomicWaker,
}

/// [`ConnState::http2`].
#[derive(Debug, Default)]
struct Http2Only {
    /// When bytes were last written to the client.
    last_write: AtomicU64,
    /// Each response body's cell: when it last handed out data that has
    /// not been taken further yet (0: none waiting).
    streams: Mutex<Vec<Weak<AtomicU64>>>,
    /// An answer asked for the connection to end (see [`InFlight::close_http2`]).
    close_asked: AtomicBool,
    /// Streams started, those reset before their answer, whether that
    /// ended the connection, and whether the watchdog has yet to see it.
    streams_started: AtomicU32,
    early_resets: AtomicU32,
    reset_out: AtomicBool,
    resets_asked: AtomicBool,
}

/// An HTTP/2 connection with at least this many streams, more than half
/// reset by the client before their answer, or with [`EARLY_RESETS_MAX`]
/// such resets whatever else it sent, is shut down (GOAWAY): the h2 crate
/// counts only streams reset before they are accepted, and each reset
/// later cost an upstream request (and connection). Envoy's premature-reset
/// check has this shape (`premature_reset_total_stream_count`, 500).
pub const EARLY_RESETS_FROM: u32 = 100;
pub const EARLY_RESETS_MAX: u32 = 500;

/// [`ConnState::park`]'s states.
const BUSY: u8 = 0;
const IDLE: u8 = 1;
const PARK: u8 = 2;
const PARKED: u8 = 3;
const OUT: u8 = 0x80;

impl ConnState {
    pub fn new(peer: Peer, port: u16, timeouts: Arc<Timeouts>) -> Self {
        ConnState {
            peer,
            port,
            timeouts,
            accepted: Instant::now(),
            in_flight: AtomicU32::new(0),
            requests: AtomicU64::new(0),
            idle_since: AtomicU64::new(1),
            head_started: AtomicU64::new(0),
            bodiless: AtomicBool::new(false),
            head_behind: AtomicBool::new(false),
            write_blocked: AtomicU64::new(0),
            http2: OnceLock::new(),
            large_response: AtomicBool::new(false),
            tunnel: Mutex::new(None),
            tunnelled: AtomicBool::new(false),
            park: AtomicU8::new(BUSY),
            park_waker: AtomicWaker::new(),
        }
    }

    /// Milliseconds since the connection was accepted, plus one.
    fn now(&self) -> u64 {
        self.ms_at(Instant::now())
    }

    /// `at` in the connection's milliseconds (see [`ConnState::now`]).
    fn ms_at(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.accepted).as_millis() as u64 + 1
    }

    fn at(&self, ms: u64) -> Instant {
        self.accepted + Duration::from_millis(ms.saturating_sub(1))
    }

    /// A request head arrived (`bodiless`: with no body to follow it): the
    /// connection is busy until the guard (the response body's) drops.
    pub fn request_started(self: &Arc<Self>, http2: bool, bodiless: bool) -> InFlight {
        self.in_flight.fetch_add(1, Relaxed);
        self.requests.fetch_add(1, Relaxed);
        self.head_started.store(0, Relaxed);
        self.bodiless.store(bodiless && !http2, Relaxed);
        self.head_behind.store(false, Relaxed);
        let waiting_since = http2.then(|| {
            let cell = Arc::new(AtomicU64::new(0));
            let only = self.http2.get_or_init(Box::default);
            only.streams_started.fetch_add(1, Relaxed);
            let mut streams = only.streams.lock().expect("streams lock");
            streams.retain(|s| s.strong_count() > 0);
            streams.push(Arc::downgrade(&cell));
            cell
        });
        InFlight { state: self.clone(), waiting_since, answered: false }
    }

    /// An HTTP/2 stream ended before its answer (see [`EARLY_RESETS_FROM`]).
    fn early_reset(&self) {
        let Some(only) = self.http2.get() else { return };
        let early = only.early_resets.fetch_add(1, Relaxed) + 1;
        let started = only.streams_started.load(Relaxed);
        let most = started >= EARLY_RESETS_FROM && early * 2 > started;
        if (most || early >= EARLY_RESETS_MAX) && !only.reset_out.swap(true, Relaxed) {
            only.resets_asked.store(true, Relaxed);
            crate::metrics::rejected("", "stream_resets");
            tracing::debug!(client = %self.peer.ip, early, started, "HTTP/2 client reset most streams before their answer");
        }
    }

    /// Keeps the tunnel of a `101` response for when the switch is done.
    pub fn upgraded(&self, tunnel: Tunnel) {
        *self.tunnel.lock().expect("tunnel lock") = Some(Box::new(tunnel));
        self.tunnelled.store(true, Release);
    }

    /// The tunnel to run, if the connection switched protocols. Looked
    /// for after every exchange: the flag spares the lock (a locked
    /// instruction each way, see benches/README.md, "Locked instructions").
    pub fn take_tunnel(&self) -> Option<Box<Tunnel>> {
        if !self.tunnelled.load(Acquire) {
            return None;
        }
        self.tunnel.lock().expect("tunnel lock").take()
    }

    /// Whether an answer asked for the (HTTP/2) connection to end, or its
    /// early resets did, once each.
    fn asked(&self) -> Option<Expired> {
        let only = self.http2.get()?;
        let once = |flag: &AtomicBool| flag.load(Relaxed) && flag.swap(false, Relaxed);
        [(&only.close_asked, Expired::Asked), (&only.resets_asked, Expired::Resets)]
            .into_iter()
            .find_map(|(flag, why)| once(flag).then_some(why))
    }

    /// The longest-waiting HTTP/2 body's hand-out time, if any is waiting.
    fn oldest_waiting(&self) -> Option<u64> {
        let streams = self.http2.get()?.streams.lock().expect("streams lock");
        streams.iter().filter_map(Weak::upgrade).map(|c| c.load(Relaxed)).filter(|&t| t != 0).min()
    }

    /// Whether a response that may pass [`crate::net::NOTSENT_LOWAT`] has started.
    pub(super) fn has_large_response(&self) -> bool {
        self.large_response.load(Relaxed)
    }

    /// Whether the client has sent anything since its last request began
    /// (before the first: anything at all).
    pub(super) fn has_sent(&self) -> bool {
        self.head_started.load(Relaxed) != 0
    }

    /// The I/O read bytes.
    pub(super) fn read_bytes(&self) {
        if self.in_flight.load(Relaxed) == 0 {
            if self.head_started.load(Relaxed) == 0 {
                self.head_started.store(self.now(), Relaxed);
            }
        } else if self.bodiless.load(Relaxed) && !self.head_behind.load(Relaxed) {
            // Not the request's body: the next head, pipelined. (After a
            // body, what follows it cannot be told apart here: the idle
            // timeout bounds it, unless the connection, knowing where the
            // body ended, says so: `head_waiting`.)
            self.head_behind.store(true, Relaxed);
        }
    }

    /// Bytes of the next HTTP/1 head, read before the request in flight
    /// was done (behind its body, or with its head), wait with none in
    /// flight now: the header read timeout runs from here, as for bytes
    /// arriving now.
    pub(super) fn head_waiting(&self) {
        self.read_bytes();
    }

    /// The connection waits for its next request with nothing of it read,
    /// and may park; `true` if its listener had left it out of its looks
    /// (it is to be watched again, see [`ConnState::unlist`]).
    pub(super) fn set_idle(&self) -> bool {
        self.park.swap(IDLE, Relaxed) & OUT != 0
    }

    /// The connection no longer waits idle. (Its listener leaves an idle
    /// connection in its looks, so it is still in them.)
    pub(super) fn set_busy(&self) {
        self.park.store(BUSY, Relaxed);
    }

    /// Whether the listener asked the idle connection to park; if not, the
    /// task polling is woken when it does.
    pub(super) fn asked_to_park(&self, cx: &Context<'_>) -> bool {
        self.park_waker.register(cx.waker());
        self.park.load(Relaxed) == PARK
    }

    /// Asks the connection to park if it has been idle for `after` at
    /// `now`.
    pub(super) fn ask_to_park(&self, now: Instant, after: Duration) {
        // Busy and parked connections, most of them, are passed over first.
        if self.park.load(Relaxed) != IDLE || self.in_flight.load(Relaxed) != 0 {
            return;
        }
        let idle_for = self.ms_at(now).saturating_sub(self.idle_since.load(Relaxed));
        if idle_for >= after.as_millis() as u64 && self.park.compare_exchange(IDLE, PARK, Relaxed, Relaxed).is_ok() {
            self.park_waker.wake();
        }
    }

    /// Its task has ended: the connection is parked (still left out of
    /// its listener's looks if it was).
    pub(super) fn set_parked(&self) {
        let _ = self.park.fetch_update(Relaxed, Relaxed, |s| Some(s & OUT | PARKED));
    }

    /// For its listener's look: whether to leave the connection out of its
    /// looks (`true`): it is busy or parked, and nothing is to be asked of
    /// it until it waits idle ([`ConnState::set_idle`]) or wakes
    /// ([`ConnState::unpark`]) again, which watch it again. One atomic step
    /// against each of those: exactly one of the two sees the other's
    /// change, so the connection is listed once, never twice or not at all.
    pub(super) fn unlist(&self) -> bool {
        let s = self.park.load(Relaxed);
        (s == BUSY || s == PARKED) && self.park.compare_exchange(s, s | OUT, Relaxed, Relaxed).is_ok()
    }

    /// Its task runs again; `true` if its listener had left it out of its
    /// looks (it is to be watched again).
    pub(super) fn unpark(&self) -> bool {
        self.park.swap(BUSY, Relaxed) & OUT != 0
    }

    /// Forgets the task that waited (it ends: the connection parks).
    pub(super) fn forget_park_waker(&self) {
        drop(self.park_waker.take());
    }

    /// Idle (no request in flight) for the idle timeout.
    pub(super) fn idle_expired(&self, now: Instant) -> bool {
        let idle = self.timeouts.idle.as_millis() as u64;
        self.in_flight.load(Relaxed) == 0 && self.idle_since.load(Relaxed) + idle <= self.ms_at(now)
    }

    /// A write to the client could not proceed.
    pub(super) fn write_pending(&self) {
        if self.write_blocked.load(Relaxed) == 0 {
            self.write_blocked.store(self.now(), Relaxed);
        }
    }

    /// Bytes were written to the client.
    pub(super) fn wrote(&self) {
        if self.write_blocked.load(Relaxed) != 0 {
            self.write_blocked.store(0, Relaxed);
        }
        if let Some(only) = self.http2.get() {
            only.last_write.store(self.now(), Relaxed);
        }
    }

    /// When the connection next needs the watchdog, and what will have
    /// expired then; `None` when nothing can expire in the current state.
    /// Reads no clock.
    fn next_deadline(&self, t: &Timeouts) -> Option<(u64, Expired)> {
        let ms = |d: Duration| d.as_millis() as u64;
        let mut next: Option<(u64, Expired)> = None;
        let mut consider = |at: u64, why: Expired| {
            if next.is_none_or(|(n, _)| at < n) {
                next = Some((at, why));
            }
        };
        let blocked = self.write_blocked.load(Relaxed);
        if blocked != 0 {
            consider(blocked + ms(t.send), Expired::SendTimeout);
        }
        let http2 = self.http2.get();
        if self.in_flight.load(Relaxed) == 0 {
            let head_started = self.head_started.load(Relaxed);
            if self.requests.load(Relaxed) == 0 {
                consider(1 + ms(t.header_read), Expired::HeaderTimeout);
            } else if http2.is_none() && head_started != 0 {
                consider(head_started + ms(t.header_read), Expired::HeaderTimeout);
            } else {
                // HTTP/2: a finished response may still be draining through
                // flow control; idle counts from the last write, but no
                // later than the send timeout after the last stream, as the
                // answers to a client's PINGs are writes too.
                let since = self.idle_since.load(Relaxed);
                let last_write = http2.map_or(0, |only| only.last_write.load(Relaxed)).min(since + ms(t.send));
                consider(since.max(last_write) + ms(t.idle), Expired::Idle);
            }
        }
        next
    }
}

/// Marks a request in flight on its connection until dropped; carried by the
/// response body, so a response still being sent keeps the connection busy.
pub struct InFlight {
    state: Arc<ConnState>,
    /// HTTP/2: when this body last handed out data not yet taken further.
    waiting_since: Option<Arc<AtomicU64>>,
    /// The request was answered (its response body holds this mark).
    answered: bool,
}

impl InFlight {
    /// The connection's peer.
    pub fn peer(&self) -> &Peer {
        &self.state.peer
    }

    /// See [`ConnState::upgraded`].
    pub fn upgraded(&self, tunnel: Tunnel) {
        self.state.upgraded(tunnel);
    }

    /// On HTTP/2, has the connection shut down gracefully (GOAWAY) once the
    /// watchdog next looks: HTTP/2 has no `Connection: close`, and a refused
    /// admin client kept connected would hold a slot of a small cap.
    pub fn close_http2(&self) {
        if let Some(only) = self.state.http2.get() {
            only.close_asked.store(true, Relaxed);
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.waiting_since.is_some() && !self.answered {
            self.state.early_reset();
        }
        if self.state.in_flight.fetch_sub(1, Relaxed) == 1 {
            let now = self.state.now();
            self.state.idle_since.store(now, Relaxed);
            if self.state.head_behind.swap(false, Relaxed) && self.state.head_started.load(Relaxed) == 0 {
                self.state.head_started.store(now, Relaxed);
            }
        }
    }
}

/// A response body on a client connection: the gateway's [`Body`] with the
/// request's [`InFlight`] mark.
pub struct ConnBody {
    inner: Body,
    in_flight: InFlight,
    /// The request's access log line, written when the body is done.
    access: Option<Box<AccessLine>>,
    /// The request ID for the head, when the connection writes it itself
    /// rather than find it in the map (see `listener::answer`).
    pub id: Option<HeaderValue>,
}

impl ConnBody {
    pub fn new(inner: Body, mut in_flight: InFlight, access: Option<Box<AccessLine>>) -> Self {
        in_flight.answered = true;
        let large = http_body::Body::size_hint(&inner).upper().is_none_or(|n| n > u64::from(crate::net::NOTSENT_LOWAT));
        if large && !in_flight.state.has_large_response() {
            in_flight.state.large_response.store(true, Relaxed);
        }
        ConnBody { inner, in_flight, access, id: None }
    }
}

impl Drop for ConnBody {
    fn drop(&mut self) {
        if let Some(line) = &self.access {
            line.write();
        }
    }
}

impl http_body::Body for ConnBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_frame(cx);
        if let (Some(line), Poll::Ready(Some(Ok(frame)))) = (&mut this.access, &poll)
            && let Some(data) = frame.data_ref()
        {
            line.bytes_out += data.len() as u64;
        }
        if let Some(cell) = &this.in_flight.waiting_since {
            // Polled again: what it handed out last time was taken. Handing
            // out data: waiting until the next poll.
            let handed_data = matches!(&poll, Poll::Ready(Some(Ok(f))) if f.is_data());
            cell.store(if handed_data { this.in_flight.state.now() } else { 0 }, Relaxed);
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests;
