//! The `# HELP` line of every metric the gateway exports, grouped by what
//! they watch.

use metrics::{describe_counter, describe_gauge, describe_histogram};

use super::*;

pub(super) fn describe() {
    describe_requests();
    describe_upstreams();
    describe_route_features();
    describe_operations();
}

/// Requests, connections and the gateway's own refusals.
fn describe_requests() {
    describe_counter!(REQUESTS_TOTAL, "Requests answered, by route, method and status.");
    describe_gauge!(ACTIVE_REQUESTS, "Requests being handled (until the response head).");
    describe_counter!(
        UPSTREAM_ERRORS,
        "Upstream failures by kind: connect, tls, timeout, reset, protocol, body, body_timeout, unavailable (no endpoint may take traffic)."
    );
    describe_gauge!(ROUTE_TIMEOUT, metrics::Unit::Seconds, "The configured timeout of each proxy route.");
    describe_gauge!(CONNECTIONS_ACTIVE, "Client connections open now.");
    describe_gauge!(
        CONNECTIONS_PARKED,
        "Idle client connections open now without a task of their own (parked until their next request)."
    );
    describe_counter!(CONNECTIONS_TOTAL, "Client connections accepted.");
    describe_counter!(
        REJECTED,
        "Requests and connections refused by a limit or as malformed, by route (empty for connection-level) and reason."
    );
    describe_gauge!(RUNTIME_ALIVE_TASKS, "Tasks alive in the async runtime (connections, requests, pools).");
    describe_counter!(
        UPSTREAM_RETRIES,
        "Requests sent again: after the upstream closed a pooled connection under them, or by a route's retries."
    );
    describe_counter!(UPSTREAM_RETRIES_SKIPPED, "Retries a route asked for that the upstream's retry budget refused.");
}

/// The upstreams' admission, queue and endpoints' state.
fn describe_upstreams() {
    describe_gauge!(UPSTREAM_IN_FLIGHT, "Requests admitted to the upstream and not finished (all endpoints).");
    describe_gauge!(UPSTREAM_QUEUE_DEPTH, "Requests waiting for one of the upstream's max_requests slots.");
    describe_histogram!(
        UPSTREAM_QUEUE_WAIT,
        metrics::Unit::Seconds,
        "Time requests waited for a max_requests slot (0 when admitted at once)."
    );
    describe_gauge!(UPSTREAM_MAX_REQUESTS, "The upstream's max_requests: as configured, or as learned for \"auto\".");
    describe_gauge!(
        UPSTREAM_CONCURRENCY_LIMIT,
        "The limit on requests in flight to the upstream now: max_requests, or the one learned for \"auto\"."
    );
    describe_gauge!(
        UPSTREAM_MIN_RTT,
        metrics::Unit::Seconds,
        "max_requests = \"auto\": the upstream's latency measured with it all but idle, which the limit follows."
    );
    describe_gauge!(
        UPSTREAM_MIN_RTT_MEASURING,
        "1 while that minimum is measured (the limit held at auto_min), else 0."
    );
    describe_gauge!(
        UPSTREAM_QUEUE_OVERLOADED,
        "max_requests = \"auto\": 1 while the queue has stood for a whole interval (CoDel), else 0."
    );
    describe_counter!(
        UPSTREAM_QUEUE_SLOUGHED,
        "Requests turned away with 503 when their turn came, having waited past the target while the queue stood."
    );
    describe_gauge!(UPSTREAM_QUEUE_SIZE, "The upstream's configured queue places.");
    describe_gauge!(
        UPSTREAM_ENDPOINTS,
        "Endpoints of the upstream by state: healthy (may take traffic), unhealthy (failing checks), ejected."
    );
}

/// The cache, access control and rate limits of routes that have them.
fn describe_route_features() {
    describe_counter!(
        CACHE_REQUESTS,
        "Requests on cache routes, by route and result (hit, miss, stale, revalidated, coalesced, bypass, uncacheable)."
    );
    describe_gauge!(CACHE_BYTES, metrics::Unit::Bytes, "Bytes (heads and bodies) a route's cache holds.");
    describe_gauge!(CACHE_ENTRIES, "Answers a route's cache holds (each Vary variant counts).");
    describe_counter!(CACHE_EVICTIONS, "Answers a route's cache dropped to stay within max_size.");
    describe_counter!(
        MIRROR_TOTAL,
        "Copies of requests for a route's mirror, by route, shadow upstream and result: sent, skipped_in_flight, skipped_body, answered, failed."
    );
    describe_counter!(
        SPLIT_TOTAL,
        "Requests a route's split sent to each of its upstreams (as chosen, before admission), by route and upstream."
    );
    describe_counter!(
        AUTH_TOTAL,
        "Access decisions, by route, kind (address, basic, jwt, forward) and result (allowed, denied, error)."
    );
    describe_counter!(AUTH_JWKS_REFRESH, "Fetches of JWT routes' jwks_url, by result (ok, error).");
    describe_histogram!(
        AUTH_FORWARD_DURATION,
        metrics::Unit::Seconds,
        "Time the forward auth service took to answer (or to fail), by route."
    );
    describe_counter!(RATE_LIMITED, "Requests refused with 429 by the route's rate limit.");
    describe_counter!(
        RATE_LIMIT_DECISIONS,
        "Rate limit decisions by route, store (local, redis, on_error: the store's on_error allow or deny) and result (allowed, refused)."
    );
    describe_counter!(
        RATE_LIMIT_STORE_ERRORS,
        "Rate limit decisions Redis did not give, by kind: timeout, connection, reply, down (not asked while it fails)."
    );
    describe_histogram!(
        RATE_LIMIT_STORE_DURATION,
        metrics::Unit::Seconds,
        "Time a shared rate limit decision took in Redis (up to the store's timeout)."
    );
    describe_gauge!(
        RATE_LIMIT_KEYS,
        "Keys (clients, header values) the route's local rate limiter holds, counted every 5 s."
    );
    describe_counter!(
        RATE_LIMIT_KEYS_DROPPED,
        "Keys the route's local rate limiter dropped because their bucket was full again."
    );
    describe_counter!(
        RATE_LIMIT_KEYS_EVICTED,
        "Keys the route's local rate limiter evicted, or did not let in, because it held max_keys keys."
    );
}

/// Reloads, discovery, tracing, compression and panics.
fn describe_operations() {
    describe_counter!(
        CONFIG_RELOADS,
        "Configuration reloads, by result (ok, error) and trigger (signal, admin, watch)."
    );
    describe_gauge!(
        CONFIG_LAST_RELOAD,
        "When the configuration was last loaded successfully (start or reload), Unix time."
    );
    describe_counter!(
        DISCOVERY_RESOLUTIONS,
        "Lookups of a discovered upstream's name, by result: ok, not_found (NXDOMAIN, no records), error (timeout, SERVFAIL)."
    );
    describe_gauge!(
        DISCOVERY_LAST_SUCCESS,
        "When a lookup of the discovered upstream's name last found addresses, Unix time."
    );
    describe_counter!(
        DISCOVERY_SKIPPED,
        "Records of a discovered name left out, by reason: port_zero and no_service (SRV), other_name, unspecified, multicast, broadcast, link_local; too_many: addresses beyond the 1024 an upstream holds."
    );
    describe_gauge!(UPGRADED_ACTIVE, "Upgraded connections (WebSocket tunnels) open now, per route.");
    describe_counter!(
        TRACE_EXPORT_FAILURES,
        "Span batches the OTLP collector did not take (unreachable, error, timeout)."
    );
    describe_counter!(TRACE_SPANS_DROPPED, "Spans dropped because the export queue was full.");
    describe_counter!(
        FILE_COMPRESSIONS,
        "Compressed forms of cached files made, by coding (once per file version and coding)."
    );
    describe_counter!(PANICS, "Requests whose handling panicked (answered 500; the process keeps serving).");
}
