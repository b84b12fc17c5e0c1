//! A route's buckets in this gateway's memory: governor's keyed GCRA
//! limiter, swept of keys whose bucket is full again, and capped at
//! `max_keys`, so that a flood of distinct clients cannot grow it without
//! bound: past the cap, requests share one overflow bucket until a sweep
//! makes room.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use governor::clock::{Clock, DefaultClock};
use governor::middleware::StateInformationMiddleware;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};

use super::Decision;
use crate::config::RateLimitConfig;

/// How often keys whose bucket is full again are dropped. A key is kept
/// only while its bucket is not full (at most `burst` intervals after its
/// last request) plus up to this long.
pub const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// How many decisions pass between two looks at the number of keys (a look
/// takes every shard's lock): the cap is overshot by at most this many.
const COUNT_EVERY: u32 = 64;

/// The least time between two sweeps made because the cap was reached.
const EARLY_SWEEP_GAP: Duration = Duration::from_secs(1);

/// What one bucket is kept for. Header values are kept as sent: they are
/// bounded by `server.max_header_size`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Key {
    Client(IpAddr),
    Value(Box<[u8]>),
    /// Requests without the key's header, when they share one bucket; and a
    /// `key = "route"` limit's one bucket.
    Shared,
    /// Every request while the buckets are at `max_keys`.
    Overflow,
}

type Keyed = RateLimiter<Key, DefaultKeyedStateStore<Key>, DefaultClock, StateInformationMiddleware>;

/// A route's buckets in memory.
pub struct Local {
    limiter: Keyed,
    interval: Duration,
    max_keys: usize,
    /// Decisions since the keys were last counted.
    since_count: AtomicU32,
    /// The keys were at `max_keys` when last counted.
    full: AtomicBool,
    /// When the cap last made a sweep.
    early_sweep: Mutex<Option<Instant>>,
}

impl Local {
    pub fn new(config: &RateLimitConfig) -> Local {
        let interval = config.rate.interval();
        let burst = NonZeroU32::new(config.burst).unwrap_or(NonZeroU32::MIN);
        let quota = Quota::with_period(interval).expect("validated: a non-zero interval").allow_burst(burst);
        Local {
            limiter: RateLimiter::keyed(quota).with_middleware::<StateInformationMiddleware>(),
            interval,
            max_keys: config.max_keys,
            since_count: AtomicU32::new(0),
            full: AtomicBool::new(false),
            early_sweep: Mutex::new(None),
        }
    }

    /// Takes one request's allowance from `key`'s bucket, if it has one;
    /// from the overflow bucket while the buckets are at `max_keys` (which
    /// cannot tell a known key from a new one without a lookup of its own).
    /// Returns whether it was the overflow bucket.
    pub fn decide(&self, key: &Key) -> (Decision, bool) {
        let overflow = self.at_cap();
        let key = if overflow { &Key::Overflow } else { key };
        (self.decide_in(key), overflow)
    }

    /// Whether the buckets are at `max_keys`; counts them every
    /// [`COUNT_EVERY`] decisions, and sweeps early (at most once per
    /// [`EARLY_SWEEP_GAP`]) when they are.
    fn at_cap(&self) -> bool {
        if !self.since_count.fetch_add(1, Ordering::Relaxed).is_multiple_of(COUNT_EVERY) {
            return self.full.load(Ordering::Relaxed);
        }
        let mut full = self.limiter.len() >= self.max_keys;
        if full
            && let Ok(mut last) = self.early_sweep.try_lock()
            && last.is_none_or(|at| at.elapsed() >= EARLY_SWEEP_GAP)
        {
            *last = Some(Instant::now());
            self.limiter.retain_recent();
            full = self.limiter.len() >= self.max_keys;
        }
        self.full.store(full, Ordering::Relaxed);
        full
    }

    fn decide_in(&self, key: &Key) -> Decision {
        match self.limiter.check_key(key) {
            Ok(snapshot) => {
                let remaining = snapshot.remaining_burst_capacity();
                let used = snapshot.quota().burst_size().get() - remaining;
                Decision { allowed: true, remaining, retry_after: Duration::ZERO, reset: self.interval * used }
            }
            Err(not_until) => {
                let wait = not_until.wait_time_from(self.limiter.clock().now());
                let full = not_until.quota().burst_size_replenished_in();
                Decision { allowed: false, remaining: 0, retry_after: wait, reset: full.max(wait) }
            }
        }
    }

    /// Drops the keys whose bucket is full again; returns how many.
    pub fn sweep(&self) -> usize {
        let before = self.limiter.len();
        self.limiter.retain_recent();
        self.limiter.shrink_to_fit();
        let left = self.limiter.len();
        self.full.store(left >= self.max_keys, Ordering::Relaxed);
        before.saturating_sub(left)
    }

    /// Keys held now.
    pub fn len(&self) -> usize {
        self.limiter.len()
    }

    pub fn is_empty(&self) -> bool {
        self.limiter.is_empty()
    }
}

/// Sweeps `owner`'s buckets every [`SWEEP_EVERY`] until it is dropped (a
/// reload that replaced its route), calling `swept` with the keys dropped
/// and the keys left.
pub fn spawn_sweeper<T: Send + Sync + 'static>(
    owner: &Arc<T>,
    local: impl Fn(&T) -> &Local + Send + 'static,
    swept: impl Fn(&T, usize, usize) + Send + 'static,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    let weak: Weak<T> = Arc::downgrade(owner);
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(SWEEP_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let Some(owner) = weak.upgrade() else { return };
            let l = local(&owner);
            let dropped = l.sweep();
            swept(&owner, dropped, l.len());
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Rate, RateLimitKey, StoreKind};

    fn config(count: u32, secs: u64, burst: u32) -> RateLimitConfig {
        RateLimitConfig {
            rate: Rate { count, period: Duration::from_secs(secs) },
            burst,
            key: RateLimitKey::Client,
            headers: false,
            store: StoreKind::Local,
            max_keys: 1000,
        }
    }

    #[test]
    fn past_max_keys_requests_share_the_overflow_bucket() {
        let local = Local::new(&RateLimitConfig { max_keys: 2, ..config(1, 60, 1) });
        let client = |i: u8| Key::Client([192, 0, 2, i].into());
        // Counted on the first decision and every COUNT_EVERY after it.
        let mut overflowed = Vec::new();
        for i in 0..=COUNT_EVERY as u8 {
            overflowed.push(local.decide(&client(i)).1);
        }
        assert!(!overflowed[..COUNT_EVERY as usize].iter().any(|o| *o), "under the cap when last counted");
        assert!(overflowed[COUNT_EVERY as usize], "at the cap: the overflow bucket");
        let (decision, overflow) = local.decide(&client(200));
        assert!(overflow && !decision.allowed, "the overflow bucket (burst 1) is taken already");
        assert!(local.len() <= 2 + COUNT_EVERY as usize + 1, "the cap is overshot by at most COUNT_EVERY");
    }

    #[test]
    fn a_burst_then_refusals_with_the_wait() {
        let local = Local::new(&config(1, 10, 3));
        let a = Key::Client([192, 0, 2, 1].into());
        let remaining: Vec<u32> =
            (0..3).map(|_| local.decide(&a).0).inspect(|d| assert!(d.allowed)).map(|d| d.remaining).collect();
        assert_eq!(remaining, [2, 1, 0]);
        let refused = local.decide(&a).0;
        assert!(!refused.allowed);
        assert!(refused.retry_after > Duration::from_secs(9) && refused.retry_after <= Duration::from_secs(10));
        // Another key has its own bucket.
        assert!(local.decide(&Key::Client([192, 0, 2, 2].into())).0.allowed);
        assert_eq!(local.len(), 2);
    }

    #[test]
    fn a_sweep_drops_only_full_buckets() {
        // 1000/s: one allowance comes back every millisecond.
        let local = Local::new(&config(1000, 1, 1));
        local.decide(&Key::Shared);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(local.sweep(), 1, "a bucket full again is dropped");
        assert!(local.is_empty());
        let slow = Local::new(&config(1, 60, 1));
        slow.decide(&Key::Shared);
        assert_eq!(slow.sweep(), 0, "a bucket still refilling stays");
        assert_eq!(slow.len(), 1);
    }
}
