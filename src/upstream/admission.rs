//! `max_requests`: at most that many requests in flight to an upstream (all
//! endpoints together); past it, requests wait in a FIFO queue of `queue`
//! places for up to `queue_timeout`. This is what keeps a slow service with
//! a fixed number of workers from being handed more than it can take, while
//! the gateway answers the overflow at once instead of letting it pile up.
//!
//! tokio's semaphore is fair (first come, first served) and a waiter that is
//! dropped (its client went away) leaves the queue: the upstream never sees
//! that request.
//!
//! `max_requests = "auto"` sizes the same slots to a limit learned from the
//! upstream's latency (`adaptive`, fed by `learned`), and its queue turns
//! away, as CoDel would, requests that waited too long while it stands.
//!
//! A reload keeps an upstream's admission ([`Admission::reconfigure`]): the
//! requests in flight keep their slots and the queued ones their places, in
//! order, so a reload can never let more than `max_requests` through.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::{Gauge, Histogram, counter, gauge, histogram};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::adaptive::Gradient;
use super::learned::{Codel, INTERVAL, Learned, Ticket, target};
use crate::config::{Admission as AdmissionConfig, MaxRequests};
use crate::error::GatewayError;
use crate::metrics::{
    UPSTREAM_CONCURRENCY_LIMIT, UPSTREAM_MAX_REQUESTS, UPSTREAM_MIN_RTT, UPSTREAM_MIN_RTT_MEASURING,
    UPSTREAM_QUEUE_DEPTH, UPSTREAM_QUEUE_OVERLOADED, UPSTREAM_QUEUE_SIZE, UPSTREAM_QUEUE_SLOUGHED, UPSTREAM_QUEUE_WAIT,
};

/// A request's `max_requests` slot, given back when dropped, unless a lower
/// `max_requests` still has slots to take back (see
/// [`Admission::reconfigure`]).
pub struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    admission: Arc<Admission>,
    /// For a learned limit: when and under what load it was admitted (see
    /// `Learned::sample`).
    ticket: Option<Ticket>,
}

impl Slot {
    /// The upstream's answer came `took` after it was sent, at `now`: the
    /// typical time for admission after a wait, and a sample for a learned
    /// limit.
    pub fn observed(&self, took: Duration, now: Instant) {
        self.admission.observed(took, self.ticket, now);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.ticket.is_some() {
            self.admission.learned.released();
        }
        let owed = &self.admission.owed;
        if owed.load(Relaxed) > 0
            && owed.fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1)).is_ok()
            && let Some(permit) = self.permit.take()
        {
            permit.forget();
        }
    }
}

/// What a reload or a learned limit changes, under one lock.
struct State {
    config: AdmissionConfig,
    /// The limit the slots are sized to now.
    limit: usize,
    /// For `max_requests = "auto"`.
    gradient: Option<Gradient>,
    codel: Codel,
}

/// An upstream's slots and queue.
pub struct Admission {
    /// Slots a lower `max_requests` still has to take back from requests in
    /// flight, as they finish.
    owed: AtomicUsize,
    state: Mutex<State>,
    /// `config.queue`, read by every request that has to wait.
    queue: AtomicUsize,
    upstream: String,
    slots: Arc<Semaphore>,
    waiting: AtomicUsize,
    depth: Gauge,
    wait: Histogram,
    /// A moving average of the upstream's time to a response head, in
    /// microseconds (see [`Admission::observed`]).
    typical_us: AtomicU64,
    learned: Learned,
}

impl Admission {
    pub fn new(config: AdmissionConfig, upstream: &str) -> Self {
        gauge!(UPSTREAM_QUEUE_SIZE, "upstream" => upstream.to_owned()).set(config.queue as f64);
        let limit = config.max_requests.initial();
        let gradient = match config.max_requests {
            MaxRequests::Auto(bounds) => Some(Gradient::new(bounds, fastrand::u64(..), Duration::ZERO)),
            MaxRequests::Fixed(_) => None,
        };
        let admission = Admission {
            owed: AtomicUsize::new(0),
            queue: AtomicUsize::new(config.queue),
            learned: Learned::new(gradient.is_some()),
            state: Mutex::new(State { config, limit, gradient, codel: Codel::default() }),
            upstream: upstream.to_owned(),
            slots: Arc::new(Semaphore::new(limit)),
            waiting: AtomicUsize::new(0),
            typical_us: AtomicU64::new(0),
            depth: gauge!(UPSTREAM_QUEUE_DEPTH, "upstream" => upstream.to_owned()),
            wait: histogram!(UPSTREAM_QUEUE_WAIT, "upstream" => upstream.to_owned()),
        };
        admission.publish(&admission.state.lock().expect("admission lock"));
        admission
    }

    /// Applies a reload's settings to the slots and queue in use. A
    /// learned limit stays learned while the upstream stays `"auto"`
    /// (within the new bounds) and `same_target` (its requests go where they
    /// went); else it is learned again.
    pub fn reconfigure(&self, new: AdmissionConfig, same_target: bool) {
        let mut state = self.state.lock().expect("admission lock");
        state.config = new;
        self.queue.store(new.queue, Relaxed);
        gauge!(UPSTREAM_QUEUE_SIZE, "upstream" => self.upstream.clone()).set(new.queue as f64);
        let limit = match (new.max_requests, &mut state.gradient) {
            (MaxRequests::Fixed(n), gradient) => {
                *gradient = None;
                n
            }
            (MaxRequests::Auto(bounds), Some(g)) if same_target => {
                g.set_bounds(bounds);
                g.limit()
            }
            (MaxRequests::Auto(bounds), gradient) => {
                self.learned.new_epoch();
                let now = self.learned.elapsed(Instant::now());
                gradient.insert(Gradient::new(bounds, fastrand::u64(..), now)).limit()
            }
        };
        self.learned.on.store(state.gradient.is_some(), Relaxed);
        if let Some(g) = &state.gradient {
            self.learned.set_window(g.cadence());
        }
        self.resize(&mut state, limit);
    }

    /// Sizes the slots to `new`. More slots are free at once; fewer are
    /// taken back at once from the free ones and then from requests in
    /// flight as they finish (ahead of the queue, whose requests keep their
    /// order).
    fn resize(&self, state: &mut State, new: usize) {
        let old = std::mem::replace(&mut state.limit, new);
        if new > old {
            // Slots still owed from a lower limit are forgiven first.
            let mut more = new - old;
            let _ = self.owed.fetch_update(Relaxed, Relaxed, |owed| {
                let forgiven = owed.min(more);
                more -= forgiven;
                Some(owed - forgiven)
            });
            self.slots.add_permits(more);
        } else if new < old {
            let fewer = old - new;
            let taken = self.slots.forget_permits(fewer);
            self.owed.fetch_add(fewer - taken, Relaxed);
        }
        self.publish(state);
    }

    /// The limit, and what a learned one was learned from, to the metrics.
    fn publish(&self, state: &State) {
        let up = || self.upstream.clone();
        gauge!(UPSTREAM_MAX_REQUESTS, "upstream" => up()).set(state.limit as f64);
        gauge!(UPSTREAM_CONCURRENCY_LIMIT, "upstream" => up()).set(state.limit as f64);
        if let Some(g) = &state.gradient {
            gauge!(UPSTREAM_MIN_RTT, "upstream" => up()).set(g.min_rtt().map_or(0.0, |d| d.as_secs_f64()));
            gauge!(UPSTREAM_MIN_RTT_MEASURING, "upstream" => up()).set(f64::from(u8::from(g.measuring())));
            gauge!(UPSTREAM_QUEUE_OVERLOADED, "upstream" => up()).set(f64::from(u8::from(state.codel.overloaded())));
        }
    }

    /// Requests waiting in the queue now, and the queue's size.
    pub fn queued(&self) -> (usize, usize) {
        (self.waiting.load(Relaxed), self.queue.load(Relaxed))
    }

    /// For the status endpoints: the limit now, and for a learned one the
    /// minimum latency (none yet while first measured), whether it is being
    /// measured, and whether the queue stands (overloaded).
    pub fn limit(&self) -> Limit {
        let state = self.state.lock().expect("admission lock");
        Limit {
            limit: state.limit,
            learned: state.gradient.as_ref().map(|g| LearnedStatus {
                min_rtt: g.min_rtt(),
                measuring: g.measuring(),
                overloaded: state.codel.overloaded(),
            }),
        }
    }

    /// Records how long the upstream took to a response head, for the
    /// moving average (weight 1/8) that admission after a wait uses, and as
    /// a sample for a learned limit (`ticket`: how the request was admitted).
    fn observed(&self, took: Duration, ticket: Option<Ticket>, now: Instant) {
        let sample = took.as_micros() as u64;
        let old = self.typical_us.load(Relaxed);
        let new = if old == 0 { sample } else { old - old / 8 + sample / 8 };
        self.typical_us.store(new, Relaxed);
        if let Some(window) = ticket.and_then(|t| self.learned.sample(took, t, now)) {
            let mut state = self.state.lock().expect("admission lock");
            let Some(g) = &mut state.gradient else { return };
            let was_measuring = g.measuring();
            let limit = g.window(window, self.learned.elapsed(now));
            if g.measuring() && !was_measuring {
                self.learned.new_epoch();
            }
            self.learned.set_window(g.cadence());
            self.resize(&mut state, limit);
        }
    }

    fn slot(self: &Arc<Self>, permit: OwnedSemaphorePermit) -> Slot {
        let ticket = self.learned.on.load(Relaxed).then(|| self.learned.admitted());
        Slot { permit: Some(permit), admission: self.clone(), ticket }
    }

    /// A slot, at once or after waiting in the queue. `deadline` is the
    /// route's: past it the request gets 504 as any route timeout. A
    /// request that waited and has less time left than the upstream
    /// typically takes is not sent: it would time out anyway, after taking
    /// a slot and a worker of the upstream for nothing (see
    /// benches/README.md, Decisions). It gets 503 with Retry-After instead;
    /// so does one, with a learned limit, that waited past CoDel's target
    /// while the queue stands (see `Codel`).
    pub async fn admit(self: &Arc<Self>, deadline: Instant, route_timeout: Duration) -> Result<Slot, GatewayError> {
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            self.wait.record(0.0);
            if self.learned.on.load(Relaxed) && !self.learned.at_once.load(Relaxed) {
                self.learned.at_once.store(true, Relaxed);
            }
            return Ok(self.slot(permit));
        }
        // Claim a place in the queue, or be turned away at once.
        let queue = self.queue.load(Relaxed);
        if self.waiting.fetch_add(1, Relaxed) >= queue {
            // The last to leave, if the waiter it counted with left meanwhile.
            if self.waiting.fetch_sub(1, Relaxed) == 1 {
                self.emptied();
            }
            return Err(GatewayError::QueueFull { upstream: self.upstream.clone(), queue });
        }
        let _place = Place::new(self);
        let started = Instant::now();
        let (queue_timeout, codel) = self.wait_allowed();
        let queue_deadline = started + queue_timeout;
        let acquire = self.slots.clone().acquire_owned();
        let timed_out = || GatewayError::QueueTimeout { upstream: self.upstream.clone(), after: started.elapsed() };
        match tokio::time::timeout_at(queue_deadline.min(deadline), acquire).await {
            // A slot that frees just as the route's time runs out is no use:
            // the request waited out its time in the queue.
            Ok(_) if Instant::now() >= deadline => {
                Err(GatewayError::QueuedPastRouteTimeout { upstream: self.upstream.clone(), after: route_timeout })
            }
            Ok(_)
                if deadline.saturating_duration_since(Instant::now()).as_micros()
                    < u128::from(self.typical_us.load(Relaxed)) =>
            {
                Err(timed_out())
            }
            Ok(_) if codel && self.sloughed(started) => Err(timed_out()),
            Ok(permit) => {
                self.wait.record(started.elapsed().as_secs_f64());
                Ok(self.slot(permit.expect("the semaphore is never closed")))
            }
            // The route's timeout came first: 504 as any route timeout, but
            // counted as a queue wait, not as the upstream's failure (it
            // never saw the request).
            Err(_) if deadline <= queue_deadline => {
                Err(GatewayError::QueuedPastRouteTimeout { upstream: self.upstream.clone(), after: route_timeout })
            }
            Err(_) => Err(GatewayError::QueueTimeout { upstream: self.upstream.clone(), after: queue_timeout }),
        }
    }

    /// How long a request that has to wait may, and whether CoDel judges it
    /// when its turn comes (with a learned limit). While the queue stands,
    /// the wait is cut to what CoDel would still serve, so that a request
    /// turned away is told soon even when no slot frees.
    fn wait_allowed(&self) -> (Duration, bool) {
        let state = self.state.lock().expect("admission lock");
        let queue_timeout = state.config.queue_timeout;
        if state.gradient.is_none() {
            return (queue_timeout, false);
        }
        if !state.codel.overloaded() {
            return (queue_timeout, true);
        }
        let target = target(self.typical(), state.limit);
        (queue_timeout.min(INTERVAL.max(target * 4)), true)
    }

    /// A request's turn came after waiting since `started`: whether CoDel
    /// turns it away (its slot goes to the next in the queue).
    fn sloughed(&self, started: Instant) -> bool {
        let now = Instant::now();
        let mut state = self.state.lock().expect("admission lock");
        let target = target(self.typical(), state.limit);
        let at = self.learned.elapsed(now);
        let was = state.codel.overloaded();
        // Requests let in at once since the last turn: a wait of nothing.
        if self.learned.at_once.swap(false, Relaxed) {
            state.codel.dequeued(Duration::ZERO, at, target);
        }
        let away = state.codel.dequeued(now - started, at, target);
        if state.codel.overloaded() != was {
            self.publish(&state);
        }
        if away {
            counter!(UPSTREAM_QUEUE_SLOUGHED, "upstream" => self.upstream.clone()).increment(1);
        }
        away
    }

    /// The last waiter left the queue: a learned limit's queue stands no
    /// more (see [`Codel::emptied`]).
    fn emptied(&self) {
        let mut state = self.state.lock().expect("admission lock");
        if state.gradient.is_some() && state.codel.overloaded() {
            state.codel.emptied();
            self.publish(&state);
        }
    }

    fn typical(&self) -> Duration {
        Duration::from_micros(self.typical_us.load(Relaxed))
    }
}

/// The limit as the status endpoints show it.
pub struct Limit {
    pub limit: usize,
    /// For `max_requests = "auto"`.
    pub learned: Option<LearnedStatus>,
}

/// What a learned limit was learned from.
pub struct LearnedStatus {
    /// The latency measured with the upstream all but idle; none before
    /// the first measurement ends.
    pub min_rtt: Option<Duration>,
    /// The limit is held at `auto_min` while it is measured.
    pub measuring: bool,
    /// The queue has stood for a whole interval (CoDel).
    pub overloaded: bool,
}

/// A place in the queue, given back on drop (admitted, timed out, or the
/// client gone).
struct Place<'a>(&'a Admission);

impl<'a> Place<'a> {
    fn new(admission: &'a Admission) -> Self {
        admission.depth.increment(1.0);
        Place(admission)
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if self.0.waiting.fetch_sub(1, Relaxed) == 1 {
            self.0.emptied();
        }
        self.0.depth.decrement(1.0);
    }
}
