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
//! A reload keeps an upstream's admission ([`Admission::reconfigure`]): the
//! requests in flight keep their slots and the queued ones their places, in
//! order, so a reload can never let more than `max_requests` through.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use metrics::{Gauge, Histogram, gauge, histogram};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::config::Admission as AdmissionConfig;
use crate::error::GatewayError;
use crate::metrics::{UPSTREAM_MAX_REQUESTS, UPSTREAM_QUEUE_DEPTH, UPSTREAM_QUEUE_SIZE, UPSTREAM_QUEUE_WAIT};

/// A request's `max_requests` slot, given back when dropped, unless a lower
/// `max_requests` still has slots to take back (see
/// [`Admission::reconfigure`]).
pub struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    admission: Arc<Admission>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let owed = &self.admission.owed;
        if owed.load(Relaxed) > 0
            && owed.fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1)).is_ok()
            && let Some(permit) = self.permit.take()
        {
            permit.forget();
        }
    }
}

/// An upstream's slots and queue.
pub struct Admission {
    /// Slots a lower `max_requests` still has to take back from requests in
    /// flight, as they finish.
    owed: AtomicUsize,
    /// As configured now (a reload may change it).
    config: Mutex<AdmissionConfig>,
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
}

impl Admission {
    pub fn new(config: AdmissionConfig, upstream: &str) -> Self {
        gauge!(UPSTREAM_MAX_REQUESTS, "upstream" => upstream.to_owned()).set(config.max_requests as f64);
        gauge!(UPSTREAM_QUEUE_SIZE, "upstream" => upstream.to_owned()).set(config.queue as f64);
        Admission {
            owed: AtomicUsize::new(0),
            queue: AtomicUsize::new(config.queue),
            config: Mutex::new(config),
            upstream: upstream.to_owned(),
            slots: Arc::new(Semaphore::new(config.max_requests)),
            waiting: AtomicUsize::new(0),
            typical_us: AtomicU64::new(0),
            depth: gauge!(UPSTREAM_QUEUE_DEPTH, "upstream" => upstream.to_owned()),
            wait: histogram!(UPSTREAM_QUEUE_WAIT, "upstream" => upstream.to_owned()),
        }
    }

    /// Applies a reload's settings to the slots and queue in use. More slots
    /// are free at once; fewer are taken back at once from the free ones and
    /// then from requests in flight as they finish (ahead of the queue, whose
    /// requests keep their order).
    pub fn reconfigure(&self, new: AdmissionConfig) {
        let mut config = self.config.lock().expect("admission lock");
        let old = std::mem::replace(&mut *config, new);
        self.queue.store(new.queue, Relaxed);
        gauge!(UPSTREAM_MAX_REQUESTS, "upstream" => self.upstream.clone()).set(new.max_requests as f64);
        gauge!(UPSTREAM_QUEUE_SIZE, "upstream" => self.upstream.clone()).set(new.queue as f64);
        if new.max_requests > old.max_requests {
            // Slots still owed from a lower limit are forgiven first.
            let mut more = new.max_requests - old.max_requests;
            let _ = self.owed.fetch_update(Relaxed, Relaxed, |owed| {
                let forgiven = owed.min(more);
                more -= forgiven;
                Some(owed - forgiven)
            });
            self.slots.add_permits(more);
        } else if new.max_requests < old.max_requests {
            let fewer = old.max_requests - new.max_requests;
            let taken = self.slots.forget_permits(fewer);
            self.owed.fetch_add(fewer - taken, Relaxed);
        }
    }

    /// Requests waiting in the queue now, and the queue's size.
    pub fn queued(&self) -> (usize, usize) {
        (self.waiting.load(Relaxed), self.queue.load(Relaxed))
    }

    /// Records how long the upstream took to a response head, for the
    /// moving average (weight 1/8) that admission after a wait uses.
    pub fn observed(&self, took: std::time::Duration) {
        let sample = took.as_micros() as u64;
        let old = self.typical_us.load(Relaxed);
        let new = if old == 0 { sample } else { old - old / 8 + sample / 8 };
        self.typical_us.store(new, Relaxed);
    }

    /// A slot, at once or after waiting in the queue. `deadline` is the
    /// route's: past it the request gets 504 as any route timeout. A
    /// request that waited and has less time left than the upstream
    /// typically takes is not sent: it would time out anyway, after taking
    /// a slot and a worker of the upstream for nothing (see
    /// benches/README.md, Decisions). It gets 503 with Retry-After instead.
    pub async fn admit(
        self: &Arc<Self>,
        deadline: Instant,
        route_timeout: std::time::Duration,
    ) -> Result<Slot, GatewayError> {
        let slot = |permit| Slot { permit: Some(permit), admission: self.clone() };
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            self.wait.record(0.0);
            return Ok(slot(permit));
        }
        // Claim a place in the queue, or be turned away at once.
        let queue = self.queue.load(Relaxed);
        if self.waiting.fetch_add(1, Relaxed) >= queue {
            self.waiting.fetch_sub(1, Relaxed);
            return Err(GatewayError::QueueFull { upstream: self.upstream.clone(), queue });
        }
        let _place = Place::new(self);
        let started = Instant::now();
        let queue_timeout = self.config.lock().expect("admission lock").queue_timeout;
        let queue_deadline = started + queue_timeout;
        let acquire = self.slots.clone().acquire_owned();
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
                Err(GatewayError::QueueTimeout { upstream: self.upstream.clone(), after: started.elapsed() })
            }
            Ok(permit) => {
                self.wait.record(started.elapsed().as_secs_f64());
                Ok(slot(permit.expect("the semaphore is never closed")))
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
        self.0.waiting.fetch_sub(1, Relaxed);
        self.0.depth.decrement(1.0);
    }
}
