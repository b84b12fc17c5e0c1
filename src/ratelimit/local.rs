//! A route's buckets in this gateway's memory: GCRA (the Redis store's
//! steps, on this process's monotonic clock), with each key's state in
//! [`Segments`] of at most `max_keys` keys: a flood of one-off keys
//! (distinct addresses or header values) displaces other one-off keys
//! rather than the clients being counted, and a new key still gets a bucket
//! of its own. A key left idle until its bucket is full again is dropped,
//! since its state is then that of a fresh bucket.
//!
//! Hand-written rather than governor's limiter: governor keeps a bucket's
//! state private, so the time until a bucket is full (`RateLimit`'s `t`)
//! could only be guessed, and the two stores would answer differently.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use moka::notification::RemovalCause;

use super::Decision;
use super::segments::Segments;
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

/// A bucket: its theoretical arrival time (GCRA's TAT), in nanoseconds
/// since the buckets' origin; 0 in a fresh one.
type Tat = AtomicU64;

/// GCRA, the same steps as the Redis store's script, in nanoseconds: `t`
/// the interval, `limit` the interval times the burst.
#[derive(Debug, Clone, Copy)]
struct Gcra {
    t: u64,
    limit: u64,
}

impl Gcra {
    fn new(interval: Duration, burst: u32) -> Gcra {
        let t = u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX).max(1);
        // Validation bounds `limit` far below u64's range; saturating all the same.
        Gcra { t, limit: t.saturating_mul(u64::from(burst.max(1))) }
    }

    /// One request at `now` on the bucket `tat`: the state it leaves is
    /// read where it is written, so `reset` is exact (the bucket is full
    /// again at its TAT), not a whole number of intervals.
    fn decide(&self, tat: &Tat, now: u64) -> Decision {
        let nanos = Duration::from_nanos;
        let mut current = tat.load(Ordering::Acquire);
        loop {
            let from = current.max(now);
            let next = from.saturating_add(self.t);
            let ahead = next - now;
            if ahead > self.limit {
                let retry_after = nanos(ahead - self.limit);
                return Decision { allowed: false, remaining: 0, retry_after, reset: nanos(from - now) };
            }
            match tat.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    let remaining = u32::try_from((self.limit - ahead) / self.t).unwrap_or(u32::MAX);
                    return Decision { allowed: true, remaining, retry_after: Duration::ZERO, reset: nanos(ahead) };
                }
                Err(actual) => current = actual,
            }
        }
    }
}

/// A route's buckets in memory.
pub struct Local {
    gcra: Gcra,
    states: Segments<Tat>,
    /// [`Key::Shared`]'s bucket, outside the segments: one key asked for by
    /// many must never be evicted (it would come back full).
    shared: Tat,
    /// What the buckets' times count from.
    origin: Instant,
}

impl Local {
    /// The buckets of `config`; `removed` hears why each key was dropped:
    /// [`RemovalCause::Expired`] when its bucket was full again,
    /// [`RemovalCause::Size`] when evicted at `max_keys`,
    /// [`RemovalCause::Explicit`] when it moved between the segments.
    pub fn new(config: &RateLimitConfig, removed: impl Fn(RemovalCause) + Send + Sync + 'static) -> Local {
        let gcra = Gcra::new(config.rate.interval(), config.burst);
        let full_again = Duration::from_nanos(gcra.limit).min(MAX_IDLE);
        let states = Segments::new(config.max_keys, full_again, removed);
        Local { gcra, states, shared: Tat::new(0), origin: Instant::now() }
    }

    /// Takes one request's allowance from `key`'s bucket.
    pub fn decide(&self, key: &Key) -> Decision {
        let now = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
        match key {
            Key::Shared => self.gcra.decide(&self.shared, now),
            // A key evicted while a request holds its state leaves that
            // request deciding on it; the next one starts a fresh bucket.
            key => self.gcra.decide(&self.states.get(key), now),
        }
    }

    /// Drops the keys whose bucket is full again and applies moka's
    /// pending evictions; returns the keys held.
    pub fn count(&self) -> u64 {
        self.states.count()
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
    fn gcra_figures_are_exact() {
        let s = |secs: u64| secs * 1_000_000_000;
        // 10/m: one allowance every 6 s, burst 10.
        let gcra = Gcra::new(Duration::from_secs(6), 10);
        let tat = Tat::new(0);
        let at = |now| {
            let d = gcra.decide(&tat, now);
            (d.allowed, d.remaining, d.reset.as_millis(), d.retry_after.as_millis())
        };
        assert_eq!(at(s(100)), (true, 9, 6_000, 0));
        assert_eq!(at(s(103)), (true, 8, 9_000, 0), "full again 9 s later, not 12");
        assert_eq!(at(s(200)), (true, 9, 6_000, 0), "full again: a fresh bucket");
        // Burst 2 at 1/10s: the third at once waits 10 s; full 20 s later.
        let gcra = Gcra::new(Duration::from_secs(10), 2);
        let tat = Tat::new(0);
        let d: Vec<Decision> = (0..3).map(|_| gcra.decide(&tat, s(5))).collect();
        assert_eq!(d.iter().map(|d| (d.allowed, d.remaining)).collect::<Vec<_>>(), [(true, 1), (true, 0), (false, 0)]);
        assert_eq!((d[2].retry_after, d[2].reset), (Duration::from_secs(10), Duration::from_secs(20)));
        assert!(gcra.decide(&tat, s(15)).allowed, "allowed once the wait is over");
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
        // A first crowd of keys, asked for once each.
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
