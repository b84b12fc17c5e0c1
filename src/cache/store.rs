//! One route's store: moka's cache of the answers for each key (one per
//! `Vary` variant), weighed in bytes (head + body), with its gauges and
//! eviction counter; and the fills under way, which concurrent misses of a
//! key wait on (coalescing) and which keep a background refresh to one per
//! key. A reload hands the store to the route's successor when its cache
//! settings did not change.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use metrics::{Counter, Gauge};
use moka::notification::RemovalCause;
use tokio::sync::watch;

use super::rules;
use super::status::Stamps;
use crate::config::CacheConfig;
use crate::headers::{Nominated, not_as_sent};
use crate::metrics::CacheStoreMetrics;

/// What a stored field costs besides its name's and value's bytes.
const FIELD_COST: usize = 224;
/// What an entry costs besides its fields, body and key.
const ENTRY_COST: usize = 768;

/// How long the misses of a key whose last answer could not be stored go
/// upstream each at once rather than wait on one another's fill (Varnish's
/// hit-for-miss): for a key that is never stored, waiting only doubled
/// each waiter's time. A stored answer ends it at once.
const PASS_FOR: Duration = Duration::from_secs(120);
/// The bytes of such keys a route remembers (the least used go first).
const PASS_KEYS: u64 = 1 << 20;

/// A `Vary` answer's selecting fields, as the request that brought it
/// sent them (`None`: it had none).
pub type VaryValues = Vec<(http::HeaderName, Option<String>)>;

/// Variants kept per key: each `Vary` value set an answer was stored for.
const MAX_VARIANTS: usize = 8;

/// The least time a stale entry with a validator is kept for revalidation.
const KEEP_TO_REVALIDATE: Duration = Duration::from_secs(60);

/// One stored answer.
pub struct Entry {
    /// When its age was zero: the crate's age grows with the clock from the
    /// moment it is judged, so it is read once, not on every hit. The
    /// crate's policy itself is not kept: it holds a copy of both heads and
    /// a parsed map of each one's directives, which the store could not
    /// weigh (one unknown directive, a few bytes on the wire, is a map
    /// entry and an allocation there).
    pub born: SystemTime,
    pub status: StatusCode,
    /// The head as the client gets it, less `Age` and `Cache-Status`.
    pub headers: HeaderMap,
    pub body: Bytes,
    /// Freshness lifetime (see [`rules::lifetime`]).
    pub lifetime: Duration,
    /// How long past it the entry may be served while refreshed, and when
    /// the upstream fails.
    pub while_revalidate: Duration,
    pub if_error: Duration,
    /// The request headers its `Vary` names, as [`rules::vary_value`] has them.
    pub vary: VaryValues,
    /// The targeted field (RFC 9213) whose directives it was judged by, in
    /// place of `Cache-Control` (shared with the route's configuration).
    pub targeted: Option<http::HeaderName>,
    /// Its latest answer's `Age` and `Cache-Status`.
    pub stamps: Stamps,
}

/// Whether a request with `headers` is one an answer with selecting
/// fields `vary` answers (RFC 9111 §4.1).
fn selects(vary: &VaryValues, headers: &HeaderMap) -> bool {
    if vary.is_empty() {
        return true;
    }
    let nominated = Nominated::of(headers);
    vary.iter().all(|(name, value)| rules::vary_value(headers, name) == *value && !not_as_sent(name, &nominated))
}

impl Entry {
    /// When an answer with head `response`, received `now`, had age zero
    /// (see [`rules::age_of`]).
    pub fn born(response: &HeaderMap, now: SystemTime) -> SystemTime {
        now.checked_sub(rules::age_of(response)).unwrap_or(SystemTime::UNIX_EPOCH)
    }

    /// Its age now (the upstream's `Age` counts).
    pub fn age(&self, now: SystemTime) -> Duration {
        now.duration_since(self.born).unwrap_or_default()
    }

    /// Seconds of freshness left; `None` once stale.
    pub fn ttl(&self, now: SystemTime) -> Option<Duration> {
        self.ttl_at(self.age(now))
    }

    /// Freshness left at age `age`; `None` once stale.
    pub fn ttl_at(&self, age: Duration) -> Option<Duration> {
        self.lifetime.checked_sub(age).filter(|d| !d.is_zero())
    }

    /// How long it has been stale (zero while fresh).
    pub fn staleness(&self, now: SystemTime) -> Duration {
        self.age(now).saturating_sub(self.lifetime)
    }

    /// Whether it answers a request with `headers` (its `Vary` matches).
    pub fn matches(&self, headers: &HeaderMap) -> bool {
        selects(&self.vary, headers)
    }

    /// Bytes it holds, as the store weighs it: its head, the request
    /// fields its `Vary` keeps, and its body; nothing else of the request
    /// that filled it is kept. A field and an entry cost what the process's
    /// memory grew by for them (the map's room and links, the allocations,
    /// the store's own bookkeeping), not only their bytes: weighed by
    /// their bytes alone, a store took 2.7 times its `max_size` (see
    /// benches/README.md, Decisions).
    pub(super) fn weight(&self) -> u64 {
        let head: usize = self.headers.iter().map(|(n, v)| n.as_str().len() + v.len() + FIELD_COST).sum();
        let vary: usize =
            self.vary.iter().map(|(n, v)| n.as_str().len() + v.as_ref().map_or(0, String::len) + FIELD_COST).sum();
        (head + vary + self.body.len() + ENTRY_COST) as u64
    }

    /// How long the store keeps it: fresh, then the longer stale window;
    /// one with a validator at least as long again (at least a minute), to
    /// be revalidated rather than fetched whole.
    fn keep(&self) -> Duration {
        let fresh = self.lifetime.saturating_sub(self.age(SystemTime::now()));
        let revalidate =
            if rules::has_validator(&self.headers) { self.lifetime.max(KEEP_TO_REVALIDATE) } else { Duration::ZERO };
        fresh.saturating_add(self.while_revalidate.max(self.if_error).max(revalidate))
    }
}

/// Every variant stored for one key, newest first.
#[derive(Clone, Default)]
pub struct Variants(pub Arc<[Arc<Entry>]>);

impl Variants {
    /// The variants' weights, with the key's bytes held once by the store.
    fn weight(&self, key: &str) -> u32 {
        let each = self.0.iter().map(|e| e.weight()).sum::<u64>();
        u32::try_from(each + key.len() as u64).unwrap_or(u32::MAX)
    }
}

/// What the fill of a key came to, for those waiting on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filled {
    Pending,
    /// A storable head arrived; its body is on its way. Waiters are past
    /// the route timeout's reach (it bounds the wait for a head).
    Streaming,
    /// Stored: look it up again.
    Stored,
    /// Not stored (uncacheable, too large, failed): go upstream yourself.
    NotShared,
    /// The upstream failed (with this status, if it answered) and the
    /// fill's client was served the stale entry (stale-if-error): serve it
    /// too, rather than each waiter asking a failing upstream again.
    Failed(Option<u16>),
}

/// A fill's place in the map; dropped, it tells the waiters and frees the key.
pub struct FillGuard {
    store: Arc<Store>,
    key: Arc<str>,
    tx: Arc<watch::Sender<Filled>>,
}

impl FillGuard {
    pub fn publish(&self, outcome: Filled) {
        self.tx.send_replace(outcome);
    }

    /// The answer cannot be stored (not storable, or too large): the
    /// waiters go upstream themselves, and with its selecting fields
    /// (`remember`) the key's next misses that it would select go at once
    /// for a while (see [`PASS_FOR`]).
    pub fn not_storable(&self, remember: Option<VaryValues>) {
        if let Some(vary) = remember {
            self.store.mark_pass(&self.key, vary);
        }
        self.publish(Filled::NotShared);
    }
}

impl Drop for FillGuard {
    fn drop(&mut self) {
        if *self.tx.borrow() == Filled::Pending {
            self.tx.send_replace(Filled::NotShared);
        }
        let mut fills = self.store.fills.lock().unwrap_or_else(|e| e.into_inner());
        if fills.get(&self.key).is_some_and(|tx| Arc::ptr_eq(tx, &self.tx)) {
            fills.remove(&self.key);
        }
    }
}

/// A route's store.
pub struct Store {
    /// The settings it was built with (a reload keeps it when they hold).
    pub config: CacheConfig,
    /// moka's sync cache, not its future one: a lookup is a plain call,
    /// so a hit is answered by a plain call too (see `RouteCache::lookup`);
    /// its inserts and housekeeping are short, and done only by a fill.
    cache: moka::sync::Cache<Arc<str>, Variants>,
    fills: Mutex<HashMap<Arc<str>, Arc<watch::Sender<Filled>>>>,
    /// Keys whose last answer could not be stored, with its selecting
    /// fields: per variant, as one variant's `private` answer says nothing
    /// of another's (see [`PASS_FOR`]).
    passes: moka::sync::Cache<Arc<str>, Arc<Vec<VaryValues>>>,
    /// Whether any key was ever marked: until then a miss and a store
    /// leave `passes` untouched (a lookup costs moka a read-log slot).
    marked: AtomicBool,
    counts: Arc<Counts>,
}

/// Bytes and entries held, kept by inserts and the eviction listener
/// (moka's own counts lag until its pending tasks run).
struct Counts {
    bytes: AtomicI64,
    entries: AtomicI64,
    bytes_gauge: Gauge,
    entries_gauge: Gauge,
    evictions: Counter,
}

impl Counts {
    fn add(&self, bytes: i64, entries: i64) {
        let b = self.bytes.fetch_add(bytes, Relaxed) + bytes;
        let e = self.entries.fetch_add(entries, Relaxed) + entries;
        self.bytes_gauge.set(b as f64);
        self.entries_gauge.set(e as f64);
    }
}

/// moka's per-entry expiry: each entry's own freshness and stale windows.
struct KeepFor;

impl moka::Expiry<Arc<str>, Variants> for KeepFor {
    fn expire_after_create(&self, _: &Arc<str>, v: &Variants, _: std::time::Instant) -> Option<Duration> {
        v.0.iter().map(|e| e.keep()).max()
    }

    fn expire_after_update(
        &self,
        _: &Arc<str>,
        v: &Variants,
        _: std::time::Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        v.0.iter().map(|e| e.keep()).max()
    }
}

impl Store {
    /// An empty store named `name` in its metrics (the route's name).
    pub fn new(config: CacheConfig, name: &str) -> Arc<Store> {
        let m = CacheStoreMetrics::new(name);
        let counts = Arc::new(Counts {
            bytes: AtomicI64::new(0),
            entries: AtomicI64::new(0),
            bytes_gauge: m.bytes,
            entries_gauge: m.entries,
            evictions: m.evictions,
        });
        counts.add(0, 0);
        let listener = counts.clone();
        let cache = moka::sync::Cache::builder()
            .max_capacity(config.max_size)
            .weigher(|k: &Arc<str>, v: &Variants| v.weight(k))
            .expire_after(KeepFor)
            .eviction_listener(move |k: Arc<Arc<str>>, v: Variants, cause| {
                if cause == RemovalCause::Size {
                    listener.evictions.increment(1);
                }
                listener.add(-i64::from(v.weight(&k)), -(v.0.len() as i64));
            })
            .build();
        let passes = moka::sync::Cache::builder()
            .max_capacity(PASS_KEYS)
            .weigher(|k: &Arc<str>, v: &Arc<Vec<VaryValues>>| {
                let fields = v.iter().flatten().map(|(n, v)| n.as_str().len() + v.as_ref().map_or(0, String::len) + 32);
                u32::try_from(k.len() + fields.sum::<usize>()).unwrap_or(u32::MAX).saturating_add(64)
            })
            .time_to_live(PASS_FOR)
            .build();
        Arc::new(Store { config, cache, fills: Mutex::default(), passes, marked: AtomicBool::new(false), counts })
    }

    /// The variant stored for `key` that answers a request with `headers`.
    pub fn get(&self, key: &str, headers: &HeaderMap) -> Option<Arc<Entry>> {
        let variants = self.cache.get(key)?;
        variants.0.iter().find(|e| e.matches(headers)).cloned()
    }

    /// Stores `entry` for `key`, replacing the variant with the same `Vary` values.
    pub fn put(&self, key: &Arc<str>, entry: Entry) {
        self.put_in_place_of(key, entry, None);
    }

    /// Stores `entry` for `key` in place of `old` (the variant it
    /// refreshes, whose `Vary` may have changed) and of the variant with
    /// the same `Vary` values.
    pub fn replace(&self, key: &Arc<str>, entry: Entry, old: &Arc<Entry>) {
        self.put_in_place_of(key, entry, Some(old));
    }

    fn put_in_place_of(&self, key: &Arc<str>, entry: Entry, old: Option<&Arc<Entry>>) {
        let entry = Arc::new(entry);
        let stored = self.cache.get(&**key).unwrap_or_default();
        let kept: Vec<_> = stored
            .0
            .iter()
            .filter(|e| e.vary != entry.vary && !old.is_some_and(|o| Arc::ptr_eq(e, o)))
            .take(MAX_VARIANTS - 1)
            .cloned()
            .collect();
        let variants = Variants(std::iter::once(entry).chain(kept).collect());
        self.counts.add(i64::from(variants.weight(key)), variants.0.len() as i64);
        self.unmark_pass(key, &variants.0[0].vary);
        self.cache.insert(key.clone(), variants);
        // The size bound and the eviction counts applied now, not at moka's
        // next housekeeping: a miss (an upstream request) pays for it.
        self.cache.run_pending_tasks();
    }

    /// Drops every variant of `key` (RFC 9111 §4.4).
    pub fn invalidate(&self, key: &str) {
        self.cache.invalidate(key);
    }

    /// Whether the misses of `key` with `headers` go upstream each at once
    /// (see [`PASS_FOR`]).
    pub fn passes(&self, key: &str, headers: &HeaderMap) -> bool {
        self.marked.load(Relaxed)
            && self.passes.get(key).is_some_and(|marks| marks.iter().any(|vary| selects(vary, headers)))
    }

    /// Remembers that the variant `vary` of `key` could not be stored,
    /// beside the key's other such variants (as many as it stores).
    fn mark_pass(&self, key: &Arc<str>, vary: VaryValues) {
        self.marked.store(true, Relaxed);
        let marks = self.passes.get(&**key).unwrap_or_default();
        let others: Vec<VaryValues> = marks.iter().filter(|v| **v != vary).take(MAX_VARIANTS - 1).cloned().collect();
        self.passes.insert(key.clone(), Arc::new(std::iter::once(vary).chain(others).collect()));
    }

    /// An answer for the variant `vary` of `key` was stored: that variant
    /// is no longer one that could not be.
    fn unmark_pass(&self, key: &Arc<str>, vary: &VaryValues) {
        if !self.marked.load(Relaxed) {
            return;
        }
        let Some(marks) = self.passes.get(&**key) else { return };
        let kept: Vec<VaryValues> = marks.iter().filter(|v| *v != vary).cloned().collect();
        match kept.is_empty() {
            true => self.passes.invalidate(&**key),
            false => self.passes.insert(key.clone(), Arc::new(kept)),
        }
    }

    /// A fill of `key` that no one waits on (coalescing off, or a request
    /// that may not share another's answer).
    pub fn solo(self: &Arc<Self>, key: &Arc<str>) -> FillGuard {
        let tx = Arc::new(watch::Sender::new(Filled::Pending));
        FillGuard { store: self.clone(), key: key.clone(), tx }
    }

    /// Starts a fill of `key` unless one is under way (a background
    /// refresh: nothing waits on it here); the key as the map shares it.
    pub fn start(self: &Arc<Self>, key: &str) -> Option<(FillGuard, Arc<str>)> {
        let mut fills = self.fills.lock().unwrap_or_else(|e| e.into_inner());
        if fills.contains_key(key) {
            return None;
        }
        let key: Arc<str> = key.into();
        let tx = Arc::new(watch::Sender::new(Filled::Pending));
        fills.insert(key.clone(), tx.clone());
        Some((FillGuard { store: self.clone(), key: key.clone(), tx }, key))
    }

    /// Joins the fill of `key` under way, or starts one: `Err` holds the
    /// new fill's guard, `Ok` the one to wait on.
    pub fn join_or_start(self: &Arc<Self>, key: &Arc<str>) -> Result<watch::Receiver<Filled>, FillGuard> {
        let mut fills = self.fills.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = fills.get(key) {
            return Ok(tx.subscribe());
        }
        let tx = Arc::new(watch::Sender::new(Filled::Pending));
        fills.insert(key.clone(), tx.clone());
        Err(FillGuard { store: self.clone(), key: key.clone(), tx })
    }
}
