//! Prometheus metrics: the recorder, the metric names, and per-route and
//! per-upstream handle caches.
//!
//! Handles are looked up once per (route, method, status) and reused, so the
//! per-request cost is a read-locked map lookup and atomic increments rather
//! than building and hashing a label set on every request. Label values come
//! from configured route and upstream names and a bounded set of methods
//! (anything non-standard is `other`), never from raw request data.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use http::Method;
use metrics::{Counter, Gauge, Histogram, counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

mod describe;
pub mod histogram;

/// Histogram buckets (seconds) for every `*_duration_seconds` metric: 1 ms to 10 s.
pub const BUCKETS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0];

pub const REQUESTS_TOTAL: &str = "http_server_requests_total";
pub const REQUEST_DURATION: &str = "http_server_request_duration_seconds";
pub const ACTIVE_REQUESTS: &str = "http_server_active_requests";
pub const UPSTREAM_DURATION: &str = "gateway_upstream_request_duration_seconds";
pub const UPSTREAM_ERRORS: &str = "gateway_upstream_errors_total";
/// Written by `upstream::series` (as the `ENDPOINT_*` ones), not the recorder.
pub const UPSTREAM_CONNECTIONS_OPENED: &str = "gateway_upstream_connections_opened_total";
pub const ROUTE_TIMEOUT: &str = "gateway_route_timeout_seconds";
pub const UPSTREAM_RETRIES: &str = "gateway_upstream_retries_total";
pub const REJECTED: &str = "gateway_rejected_total";
pub const RUNTIME_ALIVE_TASKS: &str = "gateway_runtime_alive_tasks";
pub const CONNECTIONS_ACTIVE: &str = "gateway_connections_active";
pub const CONNECTIONS_PARKED: &str = "gateway_connections_parked";
pub const CONNECTIONS_TOTAL: &str = "gateway_connections_total";
pub const UPSTREAM_IN_FLIGHT: &str = "gateway_upstream_requests_in_flight";
pub const UPSTREAM_QUEUE_DEPTH: &str = "gateway_upstream_queue_depth";
pub const UPSTREAM_QUEUE_WAIT: &str = "gateway_upstream_queue_wait_seconds";
pub const ENDPOINT_HEALTHY: &str = "gateway_upstream_endpoint_healthy";
pub const ENDPOINT_EJECTIONS: &str = "gateway_upstream_ejections_total";
pub const UPSTREAM_RETRIES_SKIPPED: &str = "gateway_upstream_retries_skipped_total";
pub const PANICS: &str = "gateway_panics_total";
pub const FILE_COMPRESSIONS: &str = "gateway_file_compressions_total";
pub const TRACE_EXPORT_FAILURES: &str = "gateway_trace_export_failures_total";
pub const TRACE_SPANS_DROPPED: &str = "gateway_trace_spans_dropped_total";
pub const ENDPOINT_EJECTED: &str = "gateway_upstream_endpoint_ejected";
pub const UPSTREAM_MAX_REQUESTS: &str = "gateway_upstream_max_requests";
pub const UPSTREAM_QUEUE_SIZE: &str = "gateway_upstream_queue_size";
pub const UPSTREAM_CONCURRENCY_LIMIT: &str = "gateway_upstream_concurrency_limit";
pub const UPSTREAM_MIN_RTT: &str = "gateway_upstream_min_rtt_seconds";
pub const UPSTREAM_MIN_RTT_MEASURING: &str = "gateway_upstream_min_rtt_measuring";
pub const UPSTREAM_QUEUE_OVERLOADED: &str = "gateway_upstream_queue_overloaded";
pub const UPSTREAM_QUEUE_SLOUGHED: &str = "gateway_upstream_queue_sloughed_total";
pub const UPGRADED_ACTIVE: &str = "gateway_upgraded_connections_active";
pub const CACHE_REQUESTS: &str = "gateway_cache_requests_total";
pub const CACHE_BYTES: &str = "gateway_cache_bytes";
pub const CACHE_ENTRIES: &str = "gateway_cache_entries";
pub const CACHE_EVICTIONS: &str = "gateway_cache_evictions_total";
pub const AUTH_TOTAL: &str = "gateway_auth_total";
pub const MIRROR_TOTAL: &str = "gateway_mirror_total";
pub const SPLIT_TOTAL: &str = "gateway_split_requests_total";
pub const AUTH_FORWARD_DURATION: &str = "gateway_auth_forward_duration_seconds";
pub const AUTH_JWKS_REFRESH: &str = "gateway_auth_jwks_refresh_total";
pub const CONFIG_RELOADS: &str = "gateway_config_reloads_total";
pub const CONFIG_LAST_RELOAD: &str = "gateway_config_last_reload_success_timestamp_seconds";
pub const RATE_LIMITED: &str = "gateway_rate_limited_total";
pub const RATE_LIMIT_DECISIONS: &str = "gateway_rate_limit_decisions_total";
pub const RATE_LIMIT_STORE_ERRORS: &str = "gateway_rate_limit_store_errors_total";
pub const RATE_LIMIT_STORE_DURATION: &str = "gateway_rate_limit_store_duration_seconds";
pub const RATE_LIMIT_KEYS: &str = "gateway_rate_limit_keys";
pub const RATE_LIMIT_KEYS_DROPPED: &str = "gateway_rate_limit_keys_dropped_total";
pub const RATE_LIMIT_KEYS_EVICTED: &str = "gateway_rate_limit_keys_evicted_total";
pub const UPSTREAM_ENDPOINTS: &str = "gateway_upstream_endpoints";
pub const DISCOVERY_RESOLUTIONS: &str = "gateway_discovery_resolutions_total";
pub const DISCOVERY_LAST_SUCCESS: &str = "gateway_discovery_last_success_timestamp_seconds";
pub const DISCOVERY_SKIPPED: &str = "gateway_discovery_skipped_total";

/// Upstream error kinds, the `kind` label values.
pub const UPSTREAM_ERROR_KINDS: &[&str] =
    &["connect", "tls", "timeout", "reset", "protocol", "body", "body_timeout", "unavailable"];

/// The process-wide exporter: the recorder's handle and the process collector.
pub struct Exporter {
    handle: PrometheusHandle,
    process: metrics_process::Collector,
}

static EXPORTER: OnceLock<Exporter> = OnceLock::new();

/// The connection count and gauge, looked up once the recorder is in:
/// every accepted connection touches both, and a lookup by name hashes
/// and compares the key and allocates (see benches/README.md, "A new
/// connection's cost").
struct ConnectionHandles {
    total: Counter,
    active: Gauge,
}

static CONNECTIONS: OnceLock<ConnectionHandles> = OnceLock::new();

/// Installs the global recorder once (later calls return the same exporter)
/// and describes every metric.
pub fn install() -> &'static Exporter {
    EXPORTER.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_duration_seconds".into()), BUCKETS)
            .expect("non-empty buckets")
            .set_buckets_for_metric(Matcher::Full(UPSTREAM_QUEUE_WAIT.into()), BUCKETS)
            .expect("non-empty buckets")
            .build_recorder();
        let handle = recorder.handle();
        metrics::set_global_recorder(recorder).expect("no other metrics recorder is installed");
        describe::describe();
        let _ = CONNECTIONS
            .set(ConnectionHandles { total: counter!(CONNECTIONS_TOTAL), active: gauge!(CONNECTIONS_ACTIVE) });
        let process = metrics_process::Collector::default();
        process.describe();
        Exporter { handle, process }
    })
}

impl Exporter {
    /// The Prometheus text exposition, with fresh process metrics.
    pub fn render(&self) -> String {
        self.process.collect();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            gauge!(RUNTIME_ALIVE_TASKS).set(rt.metrics().num_alive_tasks() as f64);
        }
        let mut text = self.handle.render();
        histogram::REQUESTS.render(&mut text);
        histogram::UPSTREAMS.render(&mut text);
        text
    }

    /// Drains histogram buffers; run periodically or histograms grow unbounded.
    pub fn run_upkeep(&self) {
        self.handle.run_upkeep();
    }

    /// Spawns the periodic upkeep task on the current runtime.
    pub fn spawn_upkeep(&'static self) {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            loop {
                tick.tick().await;
                self.run_upkeep();
            }
        });
    }
}

/// The bounded `method` label value.
pub fn method_label(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::OPTIONS => "OPTIONS",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "other",
    }
}

/// The `status` label's key: a registered status code (one with a
/// canonical reason phrase) is itself; any other code in 100-599 is its
/// class, 1 to 5, labelled `1xx` to `5xx`. An upstream can therefore mint at
/// most the ~60 registered codes and 5 classes per route and method.
fn status_key(status: u16) -> u16 {
    match http::StatusCode::from_u16(status) {
        // 499: a client that left before its answer (never sent; logged).
        Ok(s) if s.canonical_reason().is_some() || status == 499 => status,
        _ => (status / 100).clamp(1, 5),
    }
}

/// The `status` label for a [`status_key`].
fn status_label(key: u16) -> String {
    if key < 10 { format!("{key}xx") } else { key.to_string() }
}

/// A (method label, status key) pair.
type MethodStatus = (&'static str, u16);

/// Per-route metric handles.
pub struct RouteMetrics {
    name: String,
    active: Gauge,
    by_method_status: HandleCache<MethodStatus, (Counter, Arc<histogram::Histogram>)>,
}

impl RouteMetrics {
    pub fn new(name: &str) -> Self {
        RouteMetrics {
            name: name.to_owned(),
            active: gauge!(ACTIVE_REQUESTS, "route" => name.to_owned()),
            by_method_status: HandleCache::default(),
        }
    }

    /// The route's name, as in the `route` label.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Marks a request active until the guard drops.
    pub fn start(&self) -> ActiveGuard<'_> {
        self.active.increment(1.0);
        ActiveGuard(&self.active)
    }

    /// Counts a finished request and records its duration.
    pub fn record(&self, method: &Method, status: u16, elapsed: Duration) {
        let key = (method_label(method), status_key(status));
        self.by_method_status.with(
            key,
            || {
                let (method, status) = (key.0.to_owned(), status_label(key.1));
                let duration = histogram::REQUESTS.series(vec![self.name.clone(), method.clone(), status.clone()]);
                let labels = [("route", self.name.clone()), ("method", method), ("status", status)];
                (counter!(REQUESTS_TOTAL, &labels), duration)
            },
            |(count, duration)| {
                count.increment(1);
                duration.record(elapsed);
            },
        );
    }
}

/// Metric handles keyed by a few label values, registered on first use.
/// A handful of entries per route, so a linear scan under a read lock beats
/// hashing.
struct HandleCache<K, V>(RwLock<Vec<(K, V)>>);

impl<K, V> Default for HandleCache<K, V> {
    fn default() -> Self {
        HandleCache(RwLock::new(Vec::new()))
    }
}

impl<K: PartialEq + Copy, V> HandleCache<K, V> {
    fn with(&self, key: K, make: impl FnOnce() -> V, apply: impl FnOnce(&V)) {
        if let Some((_, v)) = self.0.read().expect("metrics lock").iter().find(|(k, _)| *k == key) {
            return apply(v);
        }
        let mut entries = self.0.write().expect("metrics lock");
        if let Some((_, v)) = entries.iter().find(|(k, _)| *k == key) {
            return apply(v);
        }
        let v = make();
        apply(&v);
        entries.push((key, v));
    }
}

/// Decrements the active-requests gauge on drop.
pub struct ActiveGuard<'a>(&'a Gauge);

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// Per-upstream metric handles.
pub struct UpstreamMetrics {
    name: String,
    /// `gateway_upstream_errors_total{kind="body"}`, used on every response.
    pub body_failed: Counter,
    /// `gateway_upstream_errors_total{kind="body_timeout"}`, likewise.
    pub body_stalled: Counter,
    errors: HashMap<&'static str, Counter>,
    by_status: HandleCache<u16, Arc<histogram::Histogram>>,
}

impl UpstreamMetrics {
    pub fn new(name: &str) -> Self {
        let errors: HashMap<&'static str, Counter> = UPSTREAM_ERROR_KINDS
            .iter()
            .map(|kind| (*kind, counter!(UPSTREAM_ERRORS, "upstream" => name.to_owned(), "kind" => *kind)))
            .collect();
        UpstreamMetrics {
            name: name.to_owned(),
            body_failed: errors["body"].clone(),
            body_stalled: errors["body_timeout"].clone(),
            errors,
            by_status: HandleCache::default(),
        }
    }

    /// The error counter for `kind` (one of [`UPSTREAM_ERROR_KINDS`]).
    pub fn errors(&self, kind: &'static str) -> Counter {
        self.errors
            .get(kind)
            .cloned()
            .unwrap_or_else(|| counter!(UPSTREAM_ERRORS, "upstream" => self.name.clone(), "kind" => kind))
    }

    /// Records the time to an upstream response head with its status.
    pub fn record(&self, status: u16, elapsed: Duration) {
        let key = status_key(status);
        self.by_status.with(
            key,
            || histogram::UPSTREAMS.series(vec![self.name.clone(), status_label(key)]),
            |h| h.record(elapsed),
        );
    }
}

/// Publishes a proxy route's configured timeout.
pub fn set_route_timeout(route: &str, timeout: Duration) {
    gauge!(ROUTE_TIMEOUT, "route" => route.to_owned()).set(timeout.as_secs_f64());
}

/// Counts a rejection; `route` is empty for connection-level ones.
pub fn rejected(route: &str, reason: &'static str) {
    counter!(REJECTED, "route" => route.to_owned(), "reason" => reason).increment(1);
}

/// The `gateway_auth_total` counter of one route, kind and result.
pub fn auth(route: &str, kind: &'static str, result: &'static str) -> Counter {
    counter!(AUTH_TOTAL, "route" => route.to_owned(), "kind" => kind, "result" => result)
}

/// The `gateway_mirror_total` counter of one route, shadow upstream and
/// result.
pub fn mirror(route: &str, upstream: &str, result: &'static str) -> Counter {
    counter!(MIRROR_TOTAL, "route" => route.to_owned(), "upstream" => upstream.to_owned(), "result" => result)
}

/// The `gateway_split_requests_total` counter of one route and upstream of
/// its split.
pub fn split(route: &str, upstream: &str) -> Counter {
    counter!(SPLIT_TOTAL, "route" => route.to_owned(), "upstream" => upstream.to_owned())
}

/// The forward auth service's answer times of one route.
pub fn auth_forward_duration(route: &str) -> Histogram {
    histogram!(AUTH_FORWARD_DURATION, "route" => route.to_owned())
}

/// Counts a request whose handling panicked.
pub fn panicked() {
    counter!(PANICS).increment(1);
}

/// Connection-level gauges and counters.
pub fn connection_opened() -> ConnectionGuard {
    match CONNECTIONS.get() {
        Some(c) => {
            c.total.increment(1);
            c.active.increment(1.0);
        }
        // No recorder of ours: whatever the global one is counts it.
        None => {
            counter!(CONNECTIONS_TOTAL).increment(1);
            gauge!(CONNECTIONS_ACTIVE).increment(1.0);
        }
    }
    ConnectionGuard
}

/// `gateway_connections_parked`, the handle kept by a listener: a park and
/// a wake do not look the series up again.
pub fn parked_connections() -> Gauge {
    gauge!(CONNECTIONS_PARKED)
}

/// Decrements `gateway_connections_active` on drop.
pub struct ConnectionGuard;

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        match CONNECTIONS.get() {
            Some(c) => c.active.decrement(1.0),
            None => gauge!(CONNECTIONS_ACTIVE).decrement(1.0),
        }
    }
}

/// The configuration was loaded at start: the time of the last good load,
/// and the reload counters at zero (so their rate is defined from the start).
pub fn config_loaded() {
    for result in ["ok", "error"] {
        for trigger in ["signal", "admin", "watch"] {
            counter!(CONFIG_RELOADS, "result" => result, "trigger" => trigger).increment(0);
        }
    }
    set_config_time();
}

/// A reload: `gateway_config_reloads_total{result,trigger}` (`trigger`:
/// `signal`, `admin` or `watch`), and the time of the last good load.
pub fn config_reloaded(ok: bool, trigger: &'static str) {
    counter!(CONFIG_RELOADS, "result" => if ok { "ok" } else { "error" }, "trigger" => trigger).increment(1);
    if ok {
        set_config_time();
    }
}

/// `gateway_upstream_endpoints{upstream,state}`.
pub fn endpoint_states(upstream: &str, healthy: usize, unhealthy: usize, ejected: usize) {
    for (state, n) in [("healthy", healthy), ("unhealthy", unhealthy), ("ejected", ejected)] {
        gauge!(UPSTREAM_ENDPOINTS, "upstream" => upstream.to_owned(), "state" => state).set(n as f64);
    }
}

fn set_config_time() {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    gauge!(CONFIG_LAST_RELOAD).set(now.as_secs_f64());
}

/// What a route's cache did with each request: `gateway_cache_requests_total`.
pub struct CacheMetrics {
    pub hit: Counter,
    pub miss: Counter,
    pub stale: Counter,
    pub revalidated: Counter,
    pub coalesced: Counter,
    pub bypass: Counter,
    pub uncacheable: Counter,
}

impl CacheMetrics {
    pub fn new(route: &str) -> Self {
        let c = |result: &'static str| counter!(CACHE_REQUESTS, "route" => route.to_owned(), "result" => result);
        CacheMetrics {
            hit: c("hit"),
            miss: c("miss"),
            stale: c("stale"),
            revalidated: c("revalidated"),
            coalesced: c("coalesced"),
            bypass: c("bypass"),
            uncacheable: c("uncacheable"),
        }
    }
}

/// A cache store's size and evictions, labelled `cache` (the route's name).
pub struct CacheStoreMetrics {
    pub bytes: Gauge,
    pub entries: Gauge,
    pub evictions: Counter,
}

impl CacheStoreMetrics {
    pub fn new(cache: &str) -> Self {
        CacheStoreMetrics {
            bytes: gauge!(CACHE_BYTES, "cache" => cache.to_owned()),
            entries: gauge!(CACHE_ENTRIES, "cache" => cache.to_owned()),
            evictions: counter!(CACHE_EVICTIONS, "cache" => cache.to_owned()),
        }
    }
}
