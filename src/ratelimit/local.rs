//! A route's buckets in this gateway's memory: governor's keyed GCRA
//! limiter, swept of keys whose bucket is full again so that a flood of
//! distinct clients cannot grow it without bound.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::{Arc, Weak};
use std::time::Duration;

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

/// What one bucket is kept for. Header values are kept as sent: they are
/// bounded by `server.max_header_size`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Key {
    Client(IpAddr),
    Value(Box<[u8]>),
    /// Requests without the key's header, when they share one bucket; and a
    /// `key = "route"` limit's one bucket.
    Shared,
}

type Keyed = RateLimiter<Key, DefaultKeyedStateStore<Key>, DefaultClock, StateInformationMiddleware>;

/// A route's buckets in memory.
pub struct Local {
    limiter: Keyed,
    interval: Duration,
}

impl Local {
    pub fn new(config: &RateLimitConfig) -> Local {
        let interval = config.rate.interval();
        let burst = NonZeroU32::new(config.burst).unwrap_or(NonZeroU32::MIN);
        let quota = Quota::with_period(interval).expect("validated: a non-zero interval").allow_burst(burst);
        Local { limiter: RateLimiter::keyed(quota).with_middleware::<StateInformationMiddleware>(), interval }
    }

    /// Takes one request's allowance from `key`'s bucket, if it has one.
    pub fn decide(&self, key: &Key) -> Decision {
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
        before.saturating_sub(self.limiter.len())
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
        }
    }

    #[test]
    fn a_burst_then_refusals_with_the_wait() {
        let local = Local::new(&config(1, 10, 3));
        let a = Key::Client([192, 0, 2, 1].into());
        let remaining: Vec<u32> =
            (0..3).map(|_| local.decide(&a)).inspect(|d| assert!(d.allowed)).map(|d| d.remaining).collect();
        assert_eq!(remaining, [2, 1, 0]);
        let refused = local.decide(&a);
        assert!(!refused.allowed);
        assert!(refused.retry_after > Duration::from_secs(9) && refused.retry_after <= Duration::from_secs(10));
        // Another key has its own bucket.
        assert!(local.decide(&Key::Client([192, 0, 2, 2].into())).allowed);
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
