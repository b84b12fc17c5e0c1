//! Where the local buckets keep each key's state: two moka caches, each
//! evicting its least recently asked key (a segmented LRU). A new key lands
//! in the young segment; a key that asks again while still there moves to
//! the kept one. A flood of one-off keys (distinct addresses or header
//! values) so churns only the young segment, and a key that keeps asking
//! stays at any fill level: no count of how often keys ask has to warm up
//! first (moka's TinyLFU counts nothing until its cache has been half
//! full). Each segment holds half of `max_keys`, the young one the odd key.
//! A key that keeps asking costs what it did in one cache (benches/README.md,
//! "Decisions").

use std::sync::Arc;
use std::time::Duration;

use moka::notification::RemovalCause;
use moka::policy::EvictionPolicy;
use moka::sync::Cache;

use super::local::Key;

/// One segment: a key and its bucket's state.
type Segment<S> = Cache<Key, Arc<S>>;

/// The two segments of a route's local keys.
pub struct Segments<S> {
    /// Keys asked for once since they came (or came back).
    young: Segment<S>,
    /// Keys that asked again; `None` when `max_keys` is 1 (one young key).
    kept: Option<Segment<S>>,
}

impl<S: Default + Send + Sync + 'static> Segments<S> {
    /// At most `max_keys` keys, each dropped once idle for `idle`;
    /// `removed` hears why a key left a segment ([`RemovalCause::Explicit`]
    /// when it moved from the young segment to the kept one).
    pub fn new(max_keys: usize, idle: Duration, removed: impl Fn(RemovalCause) + Send + Sync + 'static) -> Self {
        let removed = Arc::new(removed);
        let segment = |capacity: usize| {
            let removed = removed.clone();
            Cache::builder()
                .max_capacity(u64::try_from(capacity).unwrap_or(u64::MAX))
                .eviction_policy(EvictionPolicy::lru())
                .time_to_idle(idle)
                .eviction_listener(move |_key, _state, cause| removed(cause))
                .build()
        };
        let kept = max_keys / 2;
        Segments { young: segment(max_keys - kept), kept: (kept > 0).then(|| segment(kept)) }
    }

    /// `key`'s state: a fresh one for a key not held.
    pub fn get(&self, key: &Key) -> Arc<S> {
        let Some(kept) = &self.kept else { return self.young.get_with_by_ref(key, Default::default) };
        if let Some(state) = kept.get(key) {
            return state;
        }
        // A request that missed the kept segment just before another moved
        // the key there finds it while inserting, so both share one state.
        let entry = self.young.entry_by_ref(key).or_insert_with(|| kept.get(key).unwrap_or_default());
        if entry.is_fresh() {
            return entry.into_value();
        }
        let state = entry.into_value();
        // Into the kept segment before out of the young one: a concurrent
        // request finds the key in one or the other.
        kept.insert(key.clone(), state.clone());
        self.young.invalidate(key);
        state
    }

    /// Drops the idle keys and applies moka's pending evictions; returns
    /// the keys held.
    pub fn count(&self) -> u64 {
        self.young.run_pending_tasks();
        let kept = self.kept.as_ref().map_or(0, |kept| {
            kept.run_pending_tasks();
            kept.entry_count()
        });
        self.young.entry_count() + kept
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    const LONG: Duration = Duration::from_secs(3600);

    fn key(i: u32) -> Key {
        Key::Client(std::net::Ipv4Addr::from(0x0a00_0000 + i).into())
    }

    /// Segments of counters whose removals are recorded.
    fn recorded(max_keys: usize, idle: Duration) -> (Segments<AtomicU32>, Arc<Mutex<Vec<RemovalCause>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        (Segments::new(max_keys, idle, move |cause| s.lock().unwrap().push(cause)), seen)
    }

    /// Asks for `key` and counts one request on its state; returns the
    /// requests its state has counted.
    fn ask(segments: &Segments<AtomicU32>, key: &Key) -> u32 {
        segments.get(key).fetch_add(1, Ordering::Relaxed) + 1
    }

    #[test]
    fn how_max_keys_is_split() {
        for (max_keys, young, kept) in [(1, 1, None), (2, 1, Some(1)), (3, 2, Some(1)), (200, 100, Some(100))] {
            let segments = Segments::<AtomicU32>::new(max_keys, LONG, |_| {});
            let capacity = |c: &Segment<AtomicU32>| c.policy().max_capacity();
            assert_eq!(capacity(&segments.young), Some(young), "max_keys {max_keys}");
            assert_eq!(segments.kept.as_ref().and_then(capacity), kept, "max_keys {max_keys}");
        }
    }

    #[test]
    fn a_key_keeps_its_state_as_it_moves_to_the_kept_segment() {
        let (segments, removed) = recorded(10, LONG);
        let a = key(1);
        let asked: Vec<u32> = (0..4).map(|_| ask(&segments, &a)).collect();
        assert_eq!(asked, [1, 2, 3, 4], "one state throughout");
        assert!(segments.young.get(&a).is_none() && segments.kept.as_ref().unwrap().get(&a).is_some());
        assert_eq!(segments.count(), 1);
        assert_eq!(*removed.lock().unwrap(), [RemovalCause::Explicit], "the move out of the young segment");
    }

    /// Keys asked for before the flood, each with how many times.
    type Asked<'a> = &'a [(u32, u32)];

    /// (keys asked for before the flood) → whether each still has its
    /// state after a flood of one-off keys, at any fill level before it.
    #[test]
    fn one_off_keys_push_out_only_one_off_keys() {
        let cases: [(Asked, &[bool]); 4] = [
            (&[(1, 15)], &[true]),
            (&[(1, 2), (2, 1)], &[true, false]),
            (&[(1, 1)], &[false]),
            (&[(1, 15), (2, 3), (3, 1), (4, 2)], &[true, true, false, true]),
        ];
        for (before, kept) in cases {
            for filled in [0, 30, 90, 200] {
                let (segments, _) = recorded(200, LONG);
                for i in 0..filled {
                    ask(&segments, &key(10_000 + i));
                }
                for &(k, times) in before {
                    for _ in 0..times {
                        ask(&segments, &key(k));
                    }
                }
                segments.count();
                for i in 0..300 {
                    assert_eq!(ask(&segments, &key(20_000 + i)), 1, "a one-off key has a fresh state");
                }
                assert!(segments.count() <= 200, "held within max_keys");
                let still: Vec<bool> = before.iter().map(|&(k, times)| ask(&segments, &key(k)) == times + 1).collect();
                assert_eq!(still, kept, "{before:?} after {filled} keys");
            }
        }
    }

    #[test]
    fn the_kept_segment_drops_its_least_recently_asked_key() {
        let (segments, removed) = recorded(4, LONG);
        for k in [1, 2, 3] {
            ask(&segments, &key(k));
            ask(&segments, &key(k));
        }
        segments.count();
        assert_eq!(segments.count(), 2, "two kept (key 1 pushed out), none young");
        assert_eq!(ask(&segments, &key(1)), 1, "key 1 came back to a fresh state");
        assert_eq!(ask(&segments, &key(3)), 3, "key 3 kept its own");
        assert!(removed.lock().unwrap().contains(&RemovalCause::Size));
    }

    #[test]
    fn one_key_at_max_keys_1() {
        let (segments, _) = recorded(1, LONG);
        assert_eq!((ask(&segments, &key(1)), ask(&segments, &key(1))), (1, 2));
        assert_eq!(ask(&segments, &key(2)), 1);
        assert_eq!(segments.count(), 1);
    }

    #[test]
    fn idle_keys_are_dropped_from_both_segments() {
        let (segments, removed) = recorded(10, Duration::from_millis(5));
        ask(&segments, &key(1));
        ask(&segments, &key(2));
        ask(&segments, &key(2));
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(segments.count(), 0);
        let expired = removed.lock().unwrap().iter().filter(|c| **c == RemovalCause::Expired).count();
        assert_eq!(expired, 2);
    }
}
