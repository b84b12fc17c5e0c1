//! The rate limits' metric handles; the names and their descriptions are
//! with every other metric's in [`crate::metrics`].

use std::time::Duration;

use ::metrics::{Counter, Gauge, counter, gauge, histogram};
use moka::notification::RemovalCause;

use crate::metrics::{
    RATE_LIMIT_DECISIONS, RATE_LIMIT_KEYS, RATE_LIMIT_KEYS_DROPPED, RATE_LIMIT_KEYS_EVICTED, RATE_LIMIT_STORE_DURATION,
    RATE_LIMIT_STORE_ERRORS, RATE_LIMITED,
};

/// Counts a request refused by the route's rate limit.
pub fn rate_limited(route: &str) {
    counter!(RATE_LIMITED, "route" => route.to_owned()).increment(1);
}

/// Records how long a Redis rate limit decision took.
pub fn rate_limit_store_duration(elapsed: Duration) {
    histogram!(RATE_LIMIT_STORE_DURATION).record(elapsed.as_secs_f64());
}

/// Counts a rate limit decision Redis did not give.
pub fn rate_limit_store_error(kind: &'static str) {
    counter!(RATE_LIMIT_STORE_ERRORS, "kind" => kind).increment(1);
}

/// A rate-limited route's handles, registered once per route.
pub struct LimiterMetrics {
    /// `(store, allowed)` -> `gateway_rate_limit_decisions_total`.
    decisions: [(&'static str, [Counter; 2]); 3],
    keys: Gauge,
    dropped: Counter,
    evicted: Counter,
}

impl LimiterMetrics {
    pub fn new(route: &str) -> Self {
        let decision = |store: &'static str, result: &'static str| counter!(RATE_LIMIT_DECISIONS, "route" => route.to_owned(), "store" => store, "result" => result);
        let pair = |store| (store, [decision(store, "refused"), decision(store, "allowed")]);
        LimiterMetrics {
            decisions: [pair("local"), pair("redis"), pair("on_error")],
            keys: gauge!(RATE_LIMIT_KEYS, "route" => route.to_owned()),
            dropped: counter!(RATE_LIMIT_KEYS_DROPPED, "route" => route.to_owned()),
            evicted: counter!(RATE_LIMIT_KEYS_EVICTED, "route" => route.to_owned()),
        }
    }

    /// Counts a decision by `store` (`local`, `redis` or `on_error`).
    pub fn decided(&self, store: &str, allowed: bool) {
        if let Some((_, counters)) = self.decisions.iter().find(|(s, _)| *s == store) {
            counters[usize::from(allowed)].increment(1);
        }
    }

    /// Counts each key the local buckets let go: dropped when its bucket
    /// was full again, evicted at `max_keys`.
    pub fn removals(&self) -> impl Fn(RemovalCause) + Send + Sync + 'static {
        let (dropped, evicted) = (self.dropped.clone(), self.evicted.clone());
        move |cause| match cause {
            RemovalCause::Expired => dropped.increment(1),
            RemovalCause::Size => evicted.increment(1),
            // A key moved between the local buckets' two halves is still held.
            RemovalCause::Explicit | RemovalCause::Replaced => {}
        }
    }

    /// The local buckets hold `held` keys.
    pub fn counted(&self, held: u64) {
        self.keys.set(held as f64);
    }
}
