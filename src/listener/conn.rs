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

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::body::{Body, BoxError};
use crate::server::Peer;

/// The timeouts a connection's watchdog enforces.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// For a request head, from the connection's start (first request) or
    /// from the head's first byte (later HTTP/1 requests).
    pub header_read: Duration,
    /// With no request in flight.
    pub idle: Duration,
    /// With a response waiting for the client to accept bytes.
    pub send: Duration,
}

/// Why the watchdog ended (or started ending) a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// No complete request head in time: closed at once, counted.
    HeaderTimeout,
    /// No request in flight for the idle timeout: shut down gracefully.
    Idle,
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
    accepted: Instant,
    /// Requests whose response body has not been dropped yet.
    in_flight: AtomicU32,
    /// Requests started on this connection.
    requests: AtomicU64,
    /// When `in_flight` last dropped to zero.
    idle_since: AtomicU64,
    /// When the first byte of a not yet complete HTTP/1 head arrived.
    head_started: AtomicU64,
    /// Since when a write to the client has been pending.
    write_blocked: AtomicU64,
    /// When bytes were last written to the client (HTTP/2 only).
    last_write: AtomicU64,
    /// HTTP/2 response bodies that handed out data that was not yet taken
    /// further (flow control: the client's window is full).
    owed: AtomicU32,
    /// When `owed` last rose from zero.
    owed_since: AtomicU64,
    http2: AtomicBool,
}

impl ConnState {
    pub fn new(peer: Peer) -> Self {
        ConnState {
            peer,
            accepted: Instant::now(),
            in_flight: AtomicU32::new(0),
            requests: AtomicU64::new(0),
            idle_since: AtomicU64::new(1),
            head_started: AtomicU64::new(0),
            write_blocked: AtomicU64::new(0),
            last_write: AtomicU64::new(0),
            owed: AtomicU32::new(0),
            owed_since: AtomicU64::new(0),
            http2: AtomicBool::new(false),
        }
    }

    /// Milliseconds since the connection was accepted, plus one.
    fn now(&self) -> u64 {
        self.accepted.elapsed().as_millis() as u64 + 1
    }

    fn at(&self, ms: u64) -> Instant {
        self.accepted + Duration::from_millis(ms.saturating_sub(1))
    }

    /// A request head arrived: the connection is busy until the guard (the
    /// response body's) drops.
    pub fn request_started(self: &Arc<Self>, http2: bool) -> InFlight {
        self.in_flight.fetch_add(1, Relaxed);
        self.requests.fetch_add(1, Relaxed);
        self.head_started.store(0, Relaxed);
        if http2 && !self.http2.load(Relaxed) {
            self.http2.store(true, Relaxed);
        }
        InFlight { state: self.clone(), http2, owed: false }
    }

    /// The I/O read bytes.
    pub(super) fn read_bytes(&self) {
        if self.in_flight.load(Relaxed) == 0 && self.head_started.load(Relaxed) == 0 {
            self.head_started.store(self.now(), Relaxed);
        }
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
        if self.http2.load(Relaxed) {
            self.last_write.store(self.now(), Relaxed);
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
        let http2 = self.http2.load(Relaxed);
        if self.in_flight.load(Relaxed) == 0 {
            let head_started = self.head_started.load(Relaxed);
            if self.requests.load(Relaxed) == 0 {
                consider(1 + ms(t.header_read), Expired::HeaderTimeout);
            } else if !http2 && head_started != 0 {
                consider(head_started + ms(t.header_read), Expired::HeaderTimeout);
            } else {
                consider(self.idle_since.load(Relaxed) + ms(t.idle), Expired::Idle);
            }
        } else if http2 && self.owed.load(Relaxed) > 0 {
            let since = self.owed_since.load(Relaxed).max(self.last_write.load(Relaxed));
            consider(since + ms(t.send), Expired::SendTimeout);
        }
        next
    }
}

/// Marks a request in flight on its connection until dropped; carried by the
/// response body, so a response still being sent keeps the connection busy.
pub struct InFlight {
    state: Arc<ConnState>,
    http2: bool,
    /// This body handed out data not yet taken further (HTTP/2 only).
    owed: bool,
}

impl InFlight {
    /// The connection's peer.
    pub fn peer(&self) -> &Peer {
        &self.state.peer
    }

    fn set_owed(&mut self, owed: bool) {
        if owed == self.owed {
            return;
        }
        self.owed = owed;
        if owed {
            if self.state.owed.fetch_add(1, Relaxed) == 0 {
                self.state.owed_since.store(self.state.now(), Relaxed);
            }
        } else {
            self.state.owed.fetch_sub(1, Relaxed);
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.set_owed(false);
        if self.state.in_flight.fetch_sub(1, Relaxed) == 1 {
            self.state.idle_since.store(self.state.now(), Relaxed);
        }
    }
}

/// A response body on a client connection: the gateway's [`Body`] with the
/// request's [`InFlight`] mark.
pub struct ConnBody {
    inner: Body,
    in_flight: InFlight,
}

impl ConnBody {
    pub fn new(inner: Body, in_flight: InFlight) -> Self {
        ConnBody { inner, in_flight }
    }
}

impl http_body::Body for ConnBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_frame(cx);
        if this.in_flight.http2 {
            // Polled again: what it handed out last time was taken. Handing
            // out data: owed until the next poll.
            let handed_data = matches!(&poll, Poll::Ready(Some(Ok(f))) if f.is_data());
            this.in_flight.set_owed(handed_data);
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

/// Resolves when the connection has been waiting too long for what it is
/// waiting for. Polled after the connection in the same task, so it sees
/// the state the connection just left behind.
pub struct Watchdog {
    state: Arc<ConnState>,
    timeouts: Timeouts,
    sleep: Pin<Box<Sleep>>,
    /// The deadline `sleep` is set to, in the state's milliseconds.
    armed: u64,
    /// Set once a graceful shutdown started: the deadline for it to finish.
    grace_until: Option<u64>,
    /// An HTTP/2 connection is busy and the watchdog looks again now and
    /// then: its streams run in other tasks, whose changes (a body that
    /// stops being taken) need not wake this one.
    rechecking: bool,
}

impl Watchdog {
    pub fn new(state: Arc<ConnState>, timeouts: Timeouts) -> Self {
        let armed = 1 + timeouts.header_read.as_millis() as u64;
        let sleep = Box::pin(tokio::time::sleep_until(state.at(armed)));
        Watchdog { state, timeouts, sleep, armed, grace_until: None, rechecking: false }
    }

    /// A graceful shutdown has begun; give it `grace` before closing hard.
    pub fn closing(&mut self, grace: Duration) {
        if self.grace_until.is_none() {
            self.grace_until = Some(self.state.now() + grace.as_millis() as u64);
        }
    }
}

impl Future for Watchdog {
    type Output = Expired;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Expired> {
        let this = self.get_mut();
        loop {
            let mut next = this.state.next_deadline(&this.timeouts);
            if let Some(grace) = this.grace_until {
                // Once closing, only a stalled send or the grace can end it;
                // idle and header deadlines have done their part.
                next = match next {
                    Some((at, Expired::SendTimeout)) if at < grace => Some((at, Expired::SendTimeout)),
                    _ => Some((grace, Expired::GraceOver)),
                };
            }
            if next.is_some() {
                this.rechecking = false;
            } else if !this.rechecking && this.state.http2.load(Relaxed) {
                this.rechecking = true;
                let at = this.state.now() + this.recheck_every();
                if at < this.armed {
                    this.arm(at);
                }
            }
            // Re-arm only when the deadline moved earlier: one that moved
            // later (the usual case, as requests come and go) is caught when
            // the timer fires early and the loop looks again. That keeps the
            // clock and the timer wheel off the per-request path.
            if let Some((at, why)) = next
                && at < this.armed
            {
                if at <= this.state.now() {
                    return Poll::Ready(why);
                }
                this.arm(at);
            }
            if this.sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // The timer fired: expire, or look again later.
            let now = this.state.now();
            match next {
                Some((at, why)) if at <= now => return Poll::Ready(why),
                Some((at, _)) => this.arm(at),
                None => this.arm(now + this.recheck_every()),
            }
        }
    }
}

impl Watchdog {
    /// How often a busy HTTP/2 connection is looked at: a stall is noticed
    /// within a quarter of the send timeout of expiring.
    fn recheck_every(&self) -> u64 {
        (self.timeouts.send.min(self.timeouts.idle).as_millis() as u64 / 4).max(1)
    }

    fn arm(&mut self, at: u64) {
        self.armed = at;
        self.sleep.as_mut().reset(self.state.at(at));
    }
}
