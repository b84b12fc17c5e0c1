//! The rate limits' metric handles; the names and their descriptions are
//! with every other metric's in [`crate::metrics`].

use std::time::Duration;

use ::metrics::{Counter, Gauge, counter, gauge, histogram};

use crate::metrics::{
    RATE_LIMIT_DECISIONS, RATE_LIMIT_KEYS, RATE_LIMIT_KEYS_DROPPED, RATE_LIMIT_OVERFLOW, RATE_LIMIT_STORE_DURATION,
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
    overflow: Counter,
}

impl LimiterMetrics {
    pub fn new(route: &str) -> Self {
        let decision = |store: &'static str, result: &'static str| counter!(RATE_LIMIT_DECISIONS, "route" => route.to_owned(), "store" => store, "result" => result);
        let pair = |store| (store, [decision(store, "refused"), decision(store, "allowed")]);
        LimiterMetrics {
            decisions: [pair("local"), pair("redis"), pair("on_error")],
            keys: gauge!(RATE_LIMIT_KEYS, "route" => route.to_owned()),
            dropped: counter!(RATE_LIMIT_KEYS_DROPPED, "route" => route.to_owned()),
            overflow: counter!(RATE_LIMIT_OVERFLOW, "route" => route.to_owned()),
        }
    }

    /// Counts a decision by `store` (`local`, `redis` or `on_error`).
    pub fn decided(&self, store: &str, allowed: bool) {
        if let Some((_, counters)) = self.decisions.iter().find(|(s, _)| *s == store) {
            counters[usize::from(allowed)].increment(1);
        }
    }

    /// A request went to the overflow bucket.
    pub fn overflowed(&self) {
        self.overflow.increment(1);
    }

    /// A sweep dropped `dropped` keys and left `left`.
    pub fn swept(&self, dropped: usize, left: usize) {
        self.dropped.increment(dropped as u64);
        self.keys.set(left as f64);
    }
}
