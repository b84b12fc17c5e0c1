//! The watchdog that closes a connection when it has waited too long for
//! what it is waiting for (see the parent module).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Sleep;

use super::{ConnState, Expired};

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

/// Resolves when the connection has been waiting too long for what it is
/// waiting for. Polled after the connection in the same task, so it sees
/// the state the connection just left behind.
pub struct Watchdog {
    state: Arc<ConnState>,
    sleep: Pin<Box<Sleep>>,
    /// The deadline `sleep` is set to, in the state's milliseconds.
    armed: u64,
    /// Set once a graceful shutdown started: when, and how long it may take
    /// once no request is in flight any more.
    grace: Option<(u64, u64)>,
    /// The grace counts from the start of the shutdown, requests in flight
    /// or not (see [`Watchdog::cut_after`]).
    hard: bool,
    /// A busy HTTP/2 connection is looked at now and then: its streams run
    /// in other tasks, whose changes need not wake this one.
    rechecking: bool,
    /// Whether `sleep` was polled since it was last armed, with the task's
    /// cooperative budget left: it then holds this task's waker (a watchdog
    /// lives in one connection's task), and until it fires another poll
    /// changes nothing.
    polled: bool,
}

impl Watchdog {
    pub fn new(state: Arc<ConnState>) -> Self {
        let armed = 1 + state.timeouts.header_read.as_millis() as u64;
        let sleep = Box::pin(tokio::time::sleep_until(state.at(armed)));
        Watchdog { state, sleep, armed, grace: None, hard: false, rechecking: false, polled: false }
    }

    /// The timeouts it enforces.
    pub fn timeouts(&self) -> Timeouts {
        *self.state.timeouts
    }

    /// A graceful shutdown has begun. Requests still in flight, and any that
    /// the client started before it learnt of the shutdown, are served; once
    /// none is left, the connection gets `grace` to close before it is cut.
    pub fn closing(&mut self, grace: Duration) {
        if self.grace.is_none() {
            self.grace = Some((self.state.now(), grace.as_millis() as u64));
        }
    }

    /// A graceful shutdown has begun that must end within `grace` whatever
    /// is in flight: a client that keeps opening streams, or never
    /// acknowledges the shutdown's PING, is cut then.
    pub fn cut_after(&mut self, grace: Duration) {
        self.closing(grace);
        self.hard = true;
    }

    /// The next deadline and what expires then, given the closing state.
    fn next(&self) -> Option<(u64, Expired)> {
        let next = self.state.next_deadline(&self.state.timeouts);
        let Some((started, grace)) = self.grace else {
            return next;
        };
        // Once closing, the idle and header deadlines have done their part;
        // a stalled send still ends it, and so does the grace once idle.
        let send = next.filter(|(_, why)| *why == Expired::SendTimeout);
        let over = match self.hard {
            true => started + grace,
            false if self.state.in_flight.load(Relaxed) > 0 => return send,
            false => started.max(self.state.idle_since.load(Relaxed)) + grace,
        };
        match send {
            Some((at, why)) if at < over => Some((at, why)),
            _ => Some((over, Expired::GraceOver)),
        }
    }

    /// How often a busy HTTP/2 connection is looked at: a stalled stream is
    /// noticed within a quarter of the send timeout of its deadline.
    fn recheck_every(&self) -> u64 {
        (self.state.timeouts.send.min(self.state.timeouts.idle).as_millis() as u64 / 4).max(1)
    }

    fn arm(&mut self, at: u64) {
        self.armed = at;
        self.polled = false;
        self.sleep.as_mut().reset(self.state.at(at));
    }
}

impl Future for Watchdog {
    type Output = Expired;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Expired> {
        let this = self.get_mut();
        if let Some(why) = this.state.asked() {
            return Poll::Ready(why);
        }
        loop {
            let next = this.next();
            let http2 = this.state.http2.get().is_some();
            if next.is_some() {
                this.rechecking = false;
            } else if !this.rechecking && http2 {
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
            // Polled on every wake of the connection's task: most of them
            // are for its exchanges, and a timer's poll is not free.
            if this.polled && !this.sleep.is_elapsed() {
                return Poll::Pending;
            }
            // A poll without the task's cooperative budget is refused before
            // it reaches the timer (not started, if this is its first poll;
            // not holding this task's waker, if it fired since): only a poll
            // with budget left counts as polled.
            let budget = tokio::task::coop::has_budget_remaining();
            if this.sleep.as_mut().poll(cx).is_pending() {
                this.polled = budget;
                return Poll::Pending;
            }
            // The timer fired: expire, or look again later.
            let now = this.state.now();
            match next {
                Some((at, why)) if at <= now => return Poll::Ready(why),
                Some((at, _)) => this.arm(at),
                None if http2 => {
                    // Busy HTTP/2: is a stream waiting on a full window?
                    let send = this.state.timeouts.send.as_millis() as u64;
                    match this.state.oldest_waiting() {
                        Some(since) if since + send <= now => return Poll::Ready(Expired::SendTimeout),
                        Some(since) => this.arm((since + send).min(now + this.recheck_every())),
                        None => this.arm(now + this.recheck_every()),
                    }
                }
                None => this.arm(now + this.recheck_every()),
            }
        }
    }
}
