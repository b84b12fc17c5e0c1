//! A route's buckets in this gateway's memory: governor's GCRA, with each
//! key's state in a moka cache of at most `max_keys` keys. At the bound
//! moka evicts, and its TinyLFU admission keeps the keys asked for often:
//! a flood of one-off keys (distinct addresses or header values) displaces
//! other one-off keys rather than the clients being counted, and a new key
//! still gets a bucket of its own. A key left idle until its bucket is full
//! again is dropped, since its state is then that of a fresh bucket.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::{Arc, Weak};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::middleware::{StateInformationMiddleware, StateSnapshot};
use governor::nanos::Nanos;
use governor::state::{InMemoryState, NotKeyed, StateStore};
use governor::{NotUntil, Quota, RateLimiter};
use moka::notification::RemovalCause;
use moka::policy::EvictionPolicy;
use moka::sync::Cache;

use super::Decision;
use crate::config::RateLimitConfig;

/// How often the keys are counted, expired ones dropped first, for
/// `gateway_rate_limit_keys`.
pub const COUNT_EVERY: Duration = Duration::from_secs(5);

/// The longest `time_to_idle` moka takes (it panics past it).
const MAX_IDLE: Duration = Duration::from_secs(1000 * 365 * 24 * 3600);

/// What one bucket is kept for. Its `Debug` never shows a header's value,
/// which may be a credential.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Key {
    Client(IpAddr),
    /// A header's value, as sent: a short one whose header does not name a
    /// secret.
    Value(Box<[u8]>),
    /// The SHA-256 of a header's value: a long one, or any value of a
    /// header that names a secret (`Authorization`, `Cookie`, `X-Api-Key`).
    Digest([u8; 32]),
    /// Requests without the key's header, when they share one bucket; and a
    /// `key = "route"` limit's one bucket.
    Shared,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Key::Client(ip) => write!(f, "Client({ip})"),
            Key::Value(v) => write!(f, "Value({} bytes)", v.len()),
            Key::Digest(_) => f.write_str("Digest"),
            Key::Shared => f.write_str("Shared"),
        }
    }
}

type States = Cache<Key, Arc<InMemoryState>>;

/// The keys' GCRA states as a governor state store, so that governor's
/// `RateLimiter` does the maths on states that moka keeps and evicts.
struct Buckets(States);

impl StateStore for Buckets {
    type Key = Key;

    fn measure_and_replace<T, F, E>(&self, key: &Key, f: F) -> Result<T, E>
    where
        F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
    {
        // A key evicted while a request holds its state leaves that request
        // deciding on it; the next one starts a fresh bucket.
        self.0.get_with_by_ref(key, Default::default).measure_and_replace(&NotKeyed::NonKey, f)
    }
}

type Keyed = RateLimiter<Key, Buckets, DefaultClock, StateInformationMiddleware>;
type Direct = RateLimiter<NotKeyed, InMemoryState, DefaultClock, StateInformationMiddleware>;

/// A route's buckets in memory.
pub struct Local {
    keyed: Keyed,
    /// The cache inside `keyed` (moka's handles share it), to count it.
    states: States,
    /// [`Key::Shared`]'s bucket, outside the cache: one key asked for by
    /// many must never be evicted (it would come back full).
    shared: Direct,
    interval: Duration,
}

impl Local {
    /// The buckets of `config`; `removed` hears why each key was dropped:
    /// [`RemovalCause::Expired`] when its bucket was full again,
    /// [`RemovalCause::Size`] when evicted (or not let in) at `max_keys`.
    pub fn new(config: &RateLimitConfig, removed: impl Fn(RemovalCause) + Send + Sync + 'static) -> Local {
        let interval = config.rate.interval();
        let burst = NonZeroU32::new(config.burst).unwrap_or(NonZeroU32::MIN);
        let quota = Quota::with_period(interval).expect("validated: a non-zero interval").allow_burst(burst);
        // Not governor's `burst_size_replenished_in`: it wraps past u64 nanoseconds.
        let full_again = interval.checked_mul(burst.get()).map_or(MAX_IDLE, |d| d.min(MAX_IDLE));
        let states: States = Cache::builder()
            .max_capacity(u64::try_from(config.max_keys).unwrap_or(u64::MAX))
            .eviction_policy(EvictionPolicy::tiny_lfu())
            .time_to_idle(full_again)
            .eviction_listener(move |_key, _state, cause| removed(cause))
            .build();
        Local {
            keyed: Keyed::new(quota, Buckets(states.clone()), DefaultClock::default()),
            states,
            shared: RateLimiter::direct(quota).with_middleware::<StateInformationMiddleware>(),
            interval,
        }
    }

    /// Takes one request's allowance from `key`'s bucket.
    pub fn decide(&self, key: &Key) -> Decision {
        let outcome = match key {
            Key::Shared => self.shared.check(),
            key => self.keyed.check_key(key),
        };
        self.decision(outcome)
    }

    fn decision(&self, outcome: Result<StateSnapshot, NotUntil<<DefaultClock as Clock>::Instant>>) -> Decision {
        match outcome {
            Ok(snapshot) => {
                let remaining = snapshot.remaining_burst_capacity();
                let used = snapshot.quota().burst_size().get() - remaining;
                Decision { allowed: true, remaining, retry_after: Duration::ZERO, reset: self.interval * used }
            }
            Err(not_until) => {
                let wait = not_until.wait_time_from(self.keyed.clock().now());
                let full = not_until.quota().burst_size_replenished_in();
                Decision { allowed: false, remaining: 0, retry_after: wait, reset: full.max(wait) }
            }
        }
    }

    /// Drops the keys whose bucket is full again and applies moka's
    /// pending evictions; returns the keys held.
    pub fn count(&self) -> u64 {
        self.states.run_pending_tasks();
        self.states.entry_count()
    }
}

/// Counts `owner`'s keys every [`COUNT_EVERY`] until it is dropped (a
/// reload that replaced its route), calling `counted` with the number.
pub fn spawn_counter<T: Send + Sync + 'static>(
    owner: &Arc<T>,
    local: impl Fn(&T) -> &Local + Send + 'static,
    counted: impl Fn(&T, u64) + Send + 'static,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    let weak: Weak<T> = Arc::downgrade(owner);
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(COUNT_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let Some(owner) = weak.upgrade() else { return };
            let held = local(&owner).count();
            counted(&owner, held);
        }
    });
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::config::{Rate, RateLimitKey, StoreKind};

    fn config(count: u32, secs: u64, burst: u32, max_keys: usize) -> RateLimitConfig {
        RateLimitConfig {
            rate: Rate { count, period: Duration::from_secs(secs) },
            burst,
            key: RateLimitKey::Client,
            headers: false,
            store: StoreKind::Local,
            max_keys,
        }
    }

    fn client(i: u32) -> Key {
        Key::Client(std::net::Ipv4Addr::from(0xc000_0000 + i).into())
    }

    /// Buckets whose removals are recorded.
    fn recorded(config: &RateLimitConfig) -> (Local, Arc<Mutex<Vec<RemovalCause>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        (Local::new(config, move |cause| s.lock().unwrap().push(cause)), seen)
    }

    #[test]
    fn a_burst_then_refusals_with_the_wait() {
        let local = Local::new(&config(1, 10, 3, 1000), |_| {});
        let a = client(1);
        let remaining: Vec<u32> =
            (0..3).map(|_| local.decide(&a)).inspect(|d| assert!(d.allowed)).map(|d| d.remaining).collect();
        assert_eq!(remaining, [2, 1, 0]);
        let refused = local.decide(&a);
        assert!(!refused.allowed);
        assert!(refused.retry_after > Duration::from_secs(9) && refused.retry_after <= Duration::from_secs(10));
        assert!(local.decide(&client(2)).allowed, "another key has its own bucket");
        assert!(local.decide(&Key::Shared).allowed, "and the shared one its own");
        assert_eq!(local.count(), 2, "the shared bucket is not one of the cache's keys");
    }

    #[test]
    fn at_max_keys_one_off_keys_neither_share_a_bucket_nor_push_out_a_busy_one() {
        let (local, removed) = recorded(&config(1, 60, 2, 100));
        let busy = client(0);
        // Past half of max_keys, moka starts counting how often keys are asked for.
        for i in 1..=60 {
            local.decide(&client(i));
        }
        local.count();
        let mut busy_allowed = 0;
        for i in 1000..6000 {
            assert!(local.decide(&client(i)).allowed, "a new key has a full bucket of its own");
            if i % 20 == 0 {
                busy_allowed += usize::from(local.decide(&busy).allowed);
            }
        }
        assert!(local.count() <= 100, "held within max_keys");
        assert_eq!(busy_allowed, 2, "the busy key kept its bucket (burst 2) through the flood");
        let evicted = removed.lock().unwrap().iter().filter(|c| **c == RemovalCause::Size).count();
        assert!(evicted >= 5000 - 100, "every key let go is counted: {evicted}");
    }

    #[test]
    fn a_key_is_dropped_once_its_bucket_is_full_again() {
        // 1000/s, burst 2: full again 2 ms after its last request.
        let (local, removed) = recorded(&config(1000, 1, 2, 1000));
        local.decide(&client(1));
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(local.count(), 0);
        assert_eq!(*removed.lock().unwrap(), [RemovalCause::Expired]);
        let slow = Local::new(&config(1, 60, 1, 1000), |_| {});
        slow.decide(&client(1));
        assert_eq!(slow.count(), 1, "a bucket still refilling stays");
    }
}
