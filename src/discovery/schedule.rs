//! When a name is asked again, and what an answer does to the set of
//! addresses an upstream has: pure, so the rules are table-tested.
//!
//! - An answer with addresses replaces the set (but for the addresses it
//!   left out that `hold` keeps for their TTL); the name is asked again at
//!   the answer's TTL clamped to `min_ttl..max_ttl`, and within `interval`
//!   at the latest.
//! - A failed lookup (timeout, SERVFAIL, refused) keeps the set as it is:
//!   the DNS being down says nothing about the service. A lookup of which
//!   only a part failed (AAAA, one SRV target) replaces the set with what
//!   answered and that part's last good addresses, and is asked again
//!   after `min_ttl`.
//! - "No such name" or an answer without addresses keeps the set until
//!   `max_ttl` has passed since the last answer with addresses (no record
//!   of that answer may still be valid by then), then empties it.
//! - After a failure or a negative answer the name is asked again after
//!   `min_ttl`, so that a service that comes back is seen soon.

use std::time::Duration;

use tokio::time::Instant;

use crate::config::Discover;

/// What one lookup found, as far as the schedule cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Looked {
    /// Addresses, valid for `ttl` (the smallest of the records').
    Found { ttl: Duration },
    /// Addresses, but some part of the lookup failed (it stands in with
    /// its last good addresses).
    Partial { ttl: Duration },
    /// NXDOMAIN, or no A/AAAA (or SRV) records.
    NotFound,
    /// Timeout, SERVFAIL, refused: nothing learnt.
    Failed,
}

/// What to do with the set of addresses after a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetChange {
    /// Take the addresses of the answer.
    Replace,
    /// Keep the set as it is.
    Keep,
    /// Empty it: the name has been gone for `max_ttl`.
    Empty,
}

/// What to do with the set, and when to ask again. `last_found` is when
/// the name last had addresses (`None`: never, since the start).
pub fn decide(looked: Looked, last_found: Option<Instant>, now: Instant, d: &Discover) -> (SetChange, Duration) {
    match looked {
        Looked::Found { ttl } => (SetChange::Replace, ttl.clamp(d.min_ttl, d.max_ttl).min(d.interval)),
        // The parts that answered count at once; the failed one is asked
        // again soon, as a failed lookup is.
        Looked::Partial { .. } => (SetChange::Replace, d.min_ttl),
        Looked::Failed => (SetChange::Keep, d.min_ttl),
        Looked::NotFound => {
            let gone = last_found.is_none_or(|t| now.saturating_duration_since(t) >= d.max_ttl);
            (if gone { SetChange::Empty } else { SetChange::Keep }, d.min_ttl)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DiscoverName;

    fn discover(interval: u64, min: u64, max: u64) -> Discover {
        Discover {
            name: DiscoverName::Dns { host: "app".into(), port: 80 },
            scheme: http::uri::Scheme::HTTP,
            interval: Duration::from_secs(interval),
            min_ttl: Duration::from_secs(min),
            max_ttl: Duration::from_secs(max),
            tls_name: None,
        }
    }

    #[test]
    fn decide_table() {
        let s = Duration::from_secs;
        let now = Instant::now();
        let ago = |secs: u64| Some(now - s(secs));
        type Case = (Looked, Option<Instant>, Discover, SetChange, Duration);
        let cases: Vec<Case> = vec![
            // The TTL, when it lies within min_ttl..max_ttl and interval.
            (Looked::Found { ttl: s(3) }, None, discover(5, 1, 60), SetChange::Replace, s(3)),
            // A TTL of 0 does not make the gateway hammer the DNS.
            (Looked::Found { ttl: s(0) }, None, discover(5, 1, 60), SetChange::Replace, s(1)),
            // A long TTL is asked again within interval...
            (Looked::Found { ttl: s(300) }, None, discover(5, 1, 60), SetChange::Replace, s(5)),
            // ... and within max_ttl.
            (Looked::Found { ttl: s(300) }, None, discover(120, 1, 60), SetChange::Replace, s(60)),
            // A partial failure takes what answered, and asks again soon.
            (Looked::Partial { ttl: s(30) }, None, discover(5, 1, 60), SetChange::Replace, s(1)),
            // A failure keeps the set, however long ago the last answer.
            (Looked::Failed, ago(3600), discover(5, 1, 60), SetChange::Keep, s(1)),
            (Looked::Failed, None, discover(5, 2, 60), SetChange::Keep, s(2)),
            // Not found: kept until max_ttl has passed since the last answer.
            (Looked::NotFound, ago(10), discover(5, 1, 60), SetChange::Keep, s(1)),
            (Looked::NotFound, ago(60), discover(5, 1, 60), SetChange::Empty, s(1)),
            (Looked::NotFound, None, discover(5, 1, 60), SetChange::Empty, s(1)),
        ];
        for (looked, last, d, change, next) in cases {
            assert_eq!(decide(looked, last, now, &d), (change, next), "{looked:?} {last:?} {d:?}");
        }
    }
}
