"""What is measured: the variants (a server under test, its kind and the
path loaded) and the scenarios that group them, with their connection
counts, durations, service A and --quick subsets. The closed-loop scenarios
come first; overload and failover, loaded at a fixed arrival rate (see
openloop), are RateScenarios. Nothing here starts anything: the servers
module builds each variant's command."""

from __future__ import annotations

from .common import KIND_ARTICLE, KIND_CEILING, KIND_DEFAULT, KIND_FLOOR, KIND_GATEWAY, KIND_TUNED, POOL
from .model import RateScenario, Scenario, Variant
from .servers import (
    Ctx,
    Proc,
    caddy,
    gateway,
    gateway_lean,
    gateway_server,
    go_peer,
    gateway_rate_limited,
    gateway_with,
    haproxy,
    hyper_floor,
    nginx,
    nginx_cache,
    nginx_limit_req,
    node_hello,
    pingora,
    protect_gateway,
    protect_nginx,
    python_peer,
    traefik,
    uvicorn_peer,
    varnish,
)


# What the HAProxy rows need beyond every run's packages: {program: Debian package}.
HAPROXY_PROGRAMS = {"haproxy": "haproxy"}

PY_SERVICE_B = {
    "fastapi": ("FastAPI, uvicorn 4 workers", uvicorn_peer("service_b_fastapi", 4)),
    "flask": ("Flask built-in server, threaded", python_peer("service_b_flask.py")),
    "sanic": ("Sanic 4 workers", python_peer("service_b_sanic.py", 4)),
}
PY_ARTICLE_CLIENTS = {
    "requests": "requests in a sync handler",
    "httpx-sync": "httpx.Client per request, sync handler",
    "httpx-async": "httpx.AsyncClient per request",
    "aiohttp": "aiohttp.ClientSession per request",
}
PY_SHARED_CLIENTS = {
    "aiohttp-shared": f"one aiohttp session per worker, pool {POOL}",
    "httpx-shared": f"one httpx.AsyncClient per worker, pool {POOL}",
}


def python_service_b_variants():
    variants = []
    for framework, (about, build) in PY_SERVICE_B.items():
        clients = [(PY_ARTICLE_CLIENTS, KIND_ARTICLE)]
        if framework != "flask":
            clients.append((PY_SHARED_CLIENTS, KIND_TUNED))
        for table, kind in clients:
            for client, client_about in table.items():
                variants.append(Variant(f"{framework}-{client}", kind, f"{about}; {client_about}", f"/{client}", build))
    return variants


# Issue 39's shadow traffic: route b copies a tenth of its requests to
# service A itself (rewritten like the requests, so a copy is as slow as
# the request), its answers dropped; the client's latency should not move.
GATEWAY_MIRROR = 'mirror = { upstream = "a", percent = 10 }'

# Issue 40's run under no overload: service A takes every request at once,
# so a learned limit must let all of them through, at no cost.
GATEWAY_AUTO = 'max_requests = "auto"'


# Issue 38's client-facing HTTP/1.1 connection of the gateway's own (the
# default), named, and hyper's, which `server.http1 = "hyper"` chooses.
GATEWAY_OWN_H1 = 'http1 = "gateway"'
gateway_own = gateway_server("own", GATEWAY_OWN_H1)
GATEWAY_HYPER_H1 = 'http1 = "hyper"'
gateway_hyper = gateway_server("hyper", GATEWAY_HYPER_H1)


def service_b_variants(a_path):
    return [
        Variant("direct", KIND_CEILING, "load straight to service A", a_path, None),
        Variant("gateway", KIND_GATEWAY, "target/release/gateway, worker_threads = 1", "/b", gateway),
        Variant(
            "gateway-lean",
            KIND_GATEWAY,
            "the same with request_id = false, trace_context = false",
            "/b",
            gateway_lean,
        ),
        Variant(
            "gateway-own",
            KIND_GATEWAY,
            f"the same with {GATEWAY_OWN_H1}: the own HTTP/1.1 connection for clients, not hyper's",
            "/b",
            gateway_own,
        ),
        Variant(
            "gateway-hyper",
            KIND_GATEWAY,
            f"the same with {GATEWAY_HYPER_H1}: hyper's HTTP/1.1 connection for clients",
            "/b",
            gateway_hyper,
        ),
        Variant(
            "gateway-mirror",
            KIND_GATEWAY,
            f"the same as gateway with route b's {GATEWAY_MIRROR}",
            "/b",
            gateway_with("mirror", route=GATEWAY_MIRROR),
        ),
        Variant(
            "gateway-auto",
            KIND_GATEWAY,
            f"the same as gateway with upstream a's {GATEWAY_AUTO}, nothing else set",
            "/b",
            gateway_with("auto", upstream=GATEWAY_AUTO),
        ),
        Variant("nginx", KIND_TUNED, f"nginx, 1 worker, upstream keepalive {POOL}", "/b", nginx),
        Variant(
            "haproxy",
            KIND_TUNED,
            f"HAProxy, nbthread 1, http-reuse always, server maxconn and pool-max-conn {POOL}",
            "/b",
            haproxy,
            programs=HAPROXY_PROGRAMS,
        ),
        Variant(
            "caddy",
            KIND_TUNED,
            f"Caddy, GOMAXPROCS=1, reverse_proxy keepalive_idle_conns_per_host {POOL}",
            "/b",
            caddy,
        ),
        Variant(
            "traefik",
            KIND_TUNED,
            f"Traefik, GOMAXPROCS=1, serversTransport maxIdleConnsPerHost {POOL}",
            "/b",
            traefik,
        ),
        Variant(
            "pingora",
            KIND_TUNED,
            f"Pingora (benches/peers/pingora), threads: 1, upstream_keepalive_pool_size {POOL}",
            "/b",
            pingora,
        ),
        Variant(
            "hyper-floor",
            KIND_FLOOR,
            "benches/floor: hyper's server and client alone, none of the gateway's work",
            "/b",
            hyper_floor,
        ),
        Variant(
            "go-reverseproxy",
            KIND_TUNED,
            f"httputil.ReverseProxy, MaxIdleConnsPerHost {POOL}",
            "/b",
            go_peer("reverse-proxy"),
        ),
        Variant(
            "go-default-client", KIND_ARTICLE, "net/http, http.Get with the default client", "/b", go_peer("client")
        ),
        *python_service_b_variants(),
    ]


FILE_VARIANTS = [
    Variant("gateway", KIND_GATEWAY, "gateway `file` route, worker_threads = 1", "/file", gateway),
    Variant("gateway-own", KIND_GATEWAY, f"the same with {GATEWAY_OWN_H1}", "/file", gateway_own),
    Variant("gateway-hyper", KIND_GATEWAY, f"the same with {GATEWAY_HYPER_H1}", "/file", gateway_hyper),
    Variant("nginx", KIND_TUNED, "nginx, 1 worker, sendfile + open_file_cache", "/file", nginx),
    Variant(
        "haproxy",
        KIND_TUNED,
        "HAProxy, nbthread 1, http-request return ... file: the file served from memory, read at start",
        "/file",
        haproxy,
        programs=HAPROXY_PROGRAMS,
    ),
    Variant("caddy", KIND_TUNED, "Caddy, GOMAXPROCS=1, file_server (from disk, each request)", "/file", caddy),
    Variant("go-servefile", KIND_DEFAULT, "Go http.ServeFile", "/file", go_peer("file")),
    Variant("aiohttp-aiofiles", KIND_ARTICLE, "aiohttp.web + aiofiles", "/file", python_peer("files_aiohttp.py")),
    Variant(
        "starlette-anyio",
        KIND_ARTICLE,
        "Starlette + anyio.Path, uvicorn 1 worker",
        "/file",
        uvicorn_peer("files_starlette", 1),
    ),
    Variant(
        "flask-open-read", KIND_ARTICLE, "Flask built-in server, open().read()", "/file", python_peer("files_flask.py")
    ),
]


HELLO_VARIANTS = [
    Variant("gateway", KIND_GATEWAY, "gateway `respond` route, worker_threads = 1", "/hello", gateway),
    Variant("gateway-own", KIND_GATEWAY, f"the same with {GATEWAY_OWN_H1}", "/hello", gateway_own),
    Variant("gateway-hyper", KIND_GATEWAY, f"the same with {GATEWAY_HYPER_H1}", "/hello", gateway_hyper),
    Variant("nginx", KIND_TUNED, "nginx, 1 worker, return 200", "/hello", nginx),
    Variant(
        "haproxy",
        KIND_TUNED,
        "HAProxy, nbthread 1, http-request return ... string: served from memory",
        "/hello",
        haproxy,
        programs=HAPROXY_PROGRAMS,
    ),
    Variant("caddy", KIND_TUNED, 'Caddy, GOMAXPROCS=1, respond "Hello, world" 200', "/hello", caddy),
    Variant(
        "go-gomaxprocs1", KIND_ARTICLE, "Go net/http, GOMAXPROCS=1", "/hello", go_peer("hello", env={"GOMAXPROCS": "1"})
    ),
    Variant("node-http", KIND_ARTICLE, "Node.js http", "/hello", node_hello),
    Variant("sanic-1-worker", KIND_ARTICLE, "Sanic, 1 worker", "/hello", python_peer("hello_sanic.py")),
]


SLOW_UPSTREAM = Scenario(
    name="slow-upstream",
    title="Service B in front of a 1 s upstream (seed 000)",
    connections=[1000],
    duration_s=30,
    quick_duration_s=5,
    variants=service_b_variants("/a"),
    quick_variants={
        "direct",
        "gateway",
        "gateway-auto",
        "nginx",
        "haproxy",
        "caddy",
        "traefik",
        "pingora",
        "go-reverseproxy",
        "go-default-client",
        "fastapi-httpx-async",
        "sanic-aiohttp",
        "sanic-aiohttp-shared",
    },
    a_delay="1s",
    a_path="/a",
    # A few: a full-size warm-up would leave the slow variants a queue of work.
    warmup_connections=10,
)
PROXY_OVERHEAD = Scenario(
    name="proxy-overhead",
    title="Proxy overhead: service A answers at once",
    connections=[100],
    duration_s=15,
    quick_duration_s=3,
    variants=service_b_variants("/hello"),
    quick_variants={
        "direct",
        "gateway",
        "nginx",
        "haproxy",
        "caddy",
        "traefik",
        "pingora",
        "go-reverseproxy",
        "sanic-aiohttp-shared",
    },
    a_delay="0s",
    a_path="/hello",
)
FILE = Scenario(
    name="file",
    title="GET a 1 KiB file (seed 001)",
    connections=[10, 100],
    duration_s=15,
    quick_duration_s=3,
    variants=FILE_VARIANTS,
)
HELLO = Scenario(
    name="hello",
    title="Hello world on one core (seed 002)",
    connections=[200],
    duration_s=15,
    quick_duration_s=3,
    variants=HELLO_VARIANTS,
)


# ---------------------------------------------------------------- slow-upstream-cached
#
# Issue 23's benchmark: service A as in slow-upstream (1 s), its answers
# fresh for a second, 100 distinct URLs; what a cache in front takes off it.

# The gateway's route cache, in issue 23's syntax (one place, to adjust when
# the cache lands): its size is also nginx's max_size and Varnish's malloc.
CACHE_SIZE_MIB = 64
GATEWAY_CACHE = (
    f'cache = {{ max_size = "{CACHE_SIZE_MIB}MiB", max_entry = "1MiB", default_ttl = "0s", '
    'coalesce = true, stale_while_revalidate = "10s" }'
)
CACHED_KEYS = 100
CACHED_MAX_AGE = "max-age=1"
VARNISH_GRACE_S = 10

SLOW_UPSTREAM_CACHED_VARIANTS = [
    Variant(
        "gateway-cache",
        KIND_GATEWAY,
        f"route b with {GATEWAY_CACHE}",
        "/b",
        gateway_with("cache", route=GATEWAY_CACHE),
        requires="needs the route cache of issue 23 (a gateway without it refuses the `cache` key)",
    ),
    Variant(
        "nginx-cache",
        KIND_TUNED,
        f"nginx, 1 worker, keepalive {POOL}; proxy_cache ({CACHE_SIZE_MIB} MiB) + proxy_cache_lock + "
        "proxy_cache_use_stale updating error timeout + proxy_cache_background_update",
        "/b",
        nginx_cache(CACHE_SIZE_MIB),
    ),
    Variant(
        "varnish",
        KIND_TUNED,
        f"varnishd, 1 thread pool, -s malloc,{CACHE_SIZE_MIB}m, default coalescing, "
        f"beresp.grace = {VARNISH_GRACE_S}s",
        "/b",
        varnish(CACHE_SIZE_MIB, VARNISH_GRACE_S),
        programs={"varnishd": "varnish"},
    ),
    Variant("gateway", KIND_GATEWAY, "target/release/gateway, worker_threads = 1, no cache", "/b", gateway),
]

SLOW_UPSTREAM_CACHED = Scenario(
    name="slow-upstream-cached",
    title=f"A cache in front of a 1 s upstream: {CACHED_MAX_AGE}, {CACHED_KEYS} URLs (issue 23)",
    connections=[1000],
    duration_s=30,
    quick_duration_s=5,
    variants=SLOW_UPSTREAM_CACHED_VARIANTS,
    a_delay="1s",
    a_path="/a",
    a_cache_control=CACHED_MAX_AGE,
    keys=CACHED_KEYS,
    # Only when named (--scenarios slow-upstream-cached) while main has no
    # route cache: its gateway-cache row would fail every full run, and
    # Varnish would be needed by all of them.
    in_default=False,
)


# ---------------------------------------------------------------- rate-limit
#
# Issue 25's benchmark: proxy-overhead's load through a route with a rate
# limit keyed by the client, at a rate no run reaches (every request is
# allowed), so what is measured is the cost of a decision: in the
# gateway's memory, in a Redis shared by every replica (one EVALSHA per
# request), and nginx's limit_req (its worker's memory only).
LIMIT_RATE = 10_000_000
LIMIT_BURST = 1_000_000
GATEWAY_LIMIT = f'rate = "{LIMIT_RATE}/s", burst = {LIMIT_BURST}, key = "client"'

RATE_LIMIT_VARIANTS = [
    Variant("gateway", KIND_GATEWAY, "target/release/gateway, worker_threads = 1, no limit", "/b", gateway),
    Variant(
        "gateway-limit-local",
        KIND_GATEWAY,
        f"route b with rate_limit = {{ {GATEWAY_LIMIT} }}",
        "/b",
        gateway_rate_limited(GATEWAY_LIMIT, shared=False),
    ),
    Variant(
        "gateway-limit-redis",
        KIND_GATEWAY,
        f'route b with rate_limit = {{ {GATEWAY_LIMIT}, shared = "redis" }}, a redis-server on the load CPU, '
        'timeout 50ms, on_error "deny"',
        "/b",
        gateway_rate_limited(GATEWAY_LIMIT, shared=True),
        programs={"redis-server": "redis-server"},
    ),
    Variant("nginx", KIND_TUNED, f"nginx, 1 worker, keepalive {POOL}, no limit", "/b", nginx),
    Variant(
        "nginx-limit-req",
        KIND_TUNED,
        f"nginx as above, limit_req_zone $binary_remote_addr rate={LIMIT_RATE}r/s, limit_req burst={LIMIT_BURST} "
        "nodelay",
        "/b",
        nginx_limit_req(LIMIT_RATE, LIMIT_BURST),
    ),
]

RATE_LIMIT = Scenario(
    name="rate-limit",
    title="Proxy overhead with a rate limit per client: local, in Redis, nginx limit_req (issue 25)",
    connections=[100],
    duration_s=15,
    quick_duration_s=3,
    variants=RATE_LIMIT_VARIANTS,
    a_delay="0s",
    a_path="/hello",
    in_default=False,
)


# ---------------------------------------------------------------- overload and failover
#
# Loaded at a fixed arrival rate by `benchpeers load` (see openloop): what a
# proxy does for a slow service with a fixed number of workers.


# The gateway's admission settings in `overload`: 8 requests in flight (A's
# workers) and a queue that A drains in 0.5 s, well inside queue_timeout, so
# that in a steady overload nobody waits out the timeout: the overflow is
# turned away at once when it arrives, and a request that is queued is served.
OVERLOAD_WORKERS = 8
OVERLOAD_SERVICE_MS = 100
OVERLOAD_QUEUE = 40
OVERLOAD_QUEUE_TIMEOUT_S = 1.0
# A queue sized past the route timeout (A drains it in 2.5 s, the route gives
# up after 2 s), to show what that costs.
OVERLOAD_LONG_QUEUE = 200
# Targets of issue 9, checked on every row of `overload`.
GOODPUT_TARGET = 0.98
REJECTION_TARGET_MS = 10


OVERLOAD_VARIANTS = [
    Variant(
        "gateway-queue",
        KIND_GATEWAY,
        f"max_requests = {OVERLOAD_WORKERS}, queue = {OVERLOAD_QUEUE}, queue_timeout = {OVERLOAD_QUEUE_TIMEOUT_S:g}s",
        "/b",
        protect_gateway(
            "queue",
            f'max_requests = {OVERLOAD_WORKERS}\nqueue = {OVERLOAD_QUEUE}\nqueue_timeout = "{OVERLOAD_QUEUE_TIMEOUT_S:g}s"',
        ),
    ),
    Variant(
        "gateway-auto",
        KIND_GATEWAY,
        'max_requests = "auto", nothing else set (queue 100, queue_timeout 5s: the defaults)',
        "/b",
        protect_gateway("auto", 'max_requests = "auto"'),
    ),
    Variant(
        "gateway-no-queue",
        KIND_GATEWAY,
        f"max_requests = {OVERLOAD_WORKERS}, queue = 0 (nginx max_conns' behaviour)",
        "/b",
        protect_gateway("no-queue", f"max_requests = {OVERLOAD_WORKERS}\nqueue = 0"),
    ),
    Variant(
        "gateway-long-queue",
        KIND_GATEWAY,
        f"max_requests = {OVERLOAD_WORKERS}, queue = {OVERLOAD_LONG_QUEUE}, queue_timeout = 5s (the default): "
        "A needs 2.5 s to drain that queue, more than the route's 2 s timeout",
        "/b",
        protect_gateway("long-queue", f"max_requests = {OVERLOAD_WORKERS}\nqueue = {OVERLOAD_LONG_QUEUE}"),
    ),
    Variant("gateway-plain", KIND_GATEWAY, "no max_requests", "/b", protect_gateway("plain")),
    Variant(
        "nginx-max-conns",
        KIND_TUNED,
        f"nginx, upstream server max_conns={OVERLOAD_WORKERS} (no queue: 502 past it), keepalive {POOL}",
        "/b",
        protect_nginx(f" max_conns={OVERLOAD_WORKERS}"),
    ),
    Variant(
        "go-reverseproxy",
        KIND_TUNED,
        f"httputil.ReverseProxy, no limit, MaxIdleConnsPerHost {POOL}",
        "/b",
        go_peer("reverse-proxy"),
    ),
]


FAILOVER_GATEWAY_UPSTREAM = """\
[upstreams.a.health]
path = "/hello"
interval = "1s"
timeout = "500ms"
unhealthy_after = 2
healthy_after = 2
[upstreams.a.outlier]
consecutive_failures = 5
ejection_time = "30s\""""


FAILOVER_VARIANTS = [
    Variant(
        "gateway",
        KIND_GATEWAY,
        'two endpoints, health checks, ejection; retries = 1, retry_on = ["connect", "reset"]',
        "/b",
        protect_gateway("retry", FAILOVER_GATEWAY_UPSTREAM, 'retries = 1\nretry_on = ["connect", "reset"]'),
    ),
    Variant(
        "gateway-retry-connect",
        KIND_GATEWAY,
        'the same with retry_on = ["connect"], the default',
        "/b",
        protect_gateway("retry-connect", FAILOVER_GATEWAY_UPSTREAM, 'retries = 1\nretry_on = ["connect"]'),
    ),
    Variant(
        "gateway-no-retry",
        KIND_GATEWAY,
        "the same, retries = 0: only health checks and ejection",
        "/b",
        protect_gateway("no-retry", FAILOVER_GATEWAY_UPSTREAM),
    ),
    Variant(
        "nginx",
        KIND_TUNED,
        f"nginx, two servers (max_fails=1 fail_timeout=10s, the defaults), proxy_next_upstream error timeout, "
        f"keepalive {POOL}",
        "/b",
        protect_nginx(),
    ),
]


OVERLOAD = RateScenario(
    name="overload",
    title="Overload: a service with 8 workers offered 3x what it can serve",
    connections=[],
    duration_s=12,
    quick_duration_s=6,
    variants=OVERLOAD_VARIANTS,
    quick_variants={"gateway-queue", "gateway-auto", "gateway-plain", "nginx-max-conns", "go-reverseproxy"},
    a_path="/a",
    rate=3 * OVERLOAD_WORKERS * 1000 / OVERLOAD_SERVICE_MS,
    workers=OVERLOAD_WORKERS,
    service_ms=OVERLOAD_SERVICE_MS,
    settle_s=1,
)
FAILOVER = RateScenario(
    name="failover",
    title="Failover: one of two service A processes killed mid-run",
    connections=[],
    duration_s=15,
    quick_duration_s=8,
    variants=FAILOVER_VARIANTS,
    quick_variants={"gateway", "gateway-no-retry", "nginx"},
    a_path="/a",
    rate=40,
    workers=OVERLOAD_WORKERS,
    service_ms=OVERLOAD_SERVICE_MS,
    endpoints=2,
    kill_at=1 / 3,
)


SCENARIOS = {
    s.name: s for s in (SLOW_UPSTREAM, PROXY_OVERHEAD, FILE, HELLO, SLOW_UPSTREAM_CACHED, RATE_LIMIT, OVERLOAD, FAILOVER)
}
