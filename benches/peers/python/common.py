"""Settings and upstream clients shared by the Python peers of benches/compare.

Every peer reads its settings from BENCH_* environment variables so that
multi-worker servers (uvicorn, Sanic) see the same values in every worker.

The four per-request fetchers are the handlers of seed 000, kept with the
libraries' defaults: that is what the article measured. The shared clients
are the fix its readers would try: one pooled client per worker process,
with the pool raised to BENCH_POOL (aiohttp and httpx both cap at 100 by
default, which alone caps a 1000-connection run at 100 requests per second).
"""

import os

import aiohttp
import httpx
import requests

UPSTREAM_URL = os.environ.get("BENCH_UPSTREAM_URL", "http://127.0.0.1:8000/a")
HOST = "127.0.0.1"
PORT = int(os.environ.get("BENCH_PORT", "8001"))
BACKLOG = int(os.environ.get("BENCH_BACKLOG", "4096"))
POOL = int(os.environ.get("BENCH_POOL", "2048"))
WORKERS = int(os.environ.get("BENCH_WORKERS", "1"))
FILE = os.environ.get("BENCH_FILE", "demo.txt")
# The article's client timeout, and the load tool's.
TIMEOUT_S = 2.0
HELLO = "Hello, world"


def fetch_requests():
    resp = requests.get(UPSTREAM_URL, timeout=TIMEOUT_S)
    resp.raise_for_status()
    return resp.text


def fetch_httpx_sync():
    with httpx.Client() as client:
        resp = client.get(UPSTREAM_URL, timeout=TIMEOUT_S)
        resp.raise_for_status()
        return resp.text


async def fetch_httpx_async():
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        resp = await client.get(UPSTREAM_URL)
        resp.raise_for_status()
        return resp.text


async def fetch_aiohttp():
    async with aiohttp.ClientSession() as session:
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
        async with session.get(UPSTREAM_URL, timeout=timeout) as resp:
            resp.raise_for_status()
            return await resp.text()


class SharedClients:
    """One aiohttp session and one httpx AsyncClient per worker, opened at start-up."""

    def __init__(self):
        self.aiohttp = None
        self.httpx = None

    async def open(self):
        connector = aiohttp.TCPConnector(limit=POOL, limit_per_host=POOL)
        self.aiohttp = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=TIMEOUT_S))
        limits = httpx.Limits(max_connections=POOL, max_keepalive_connections=POOL)
        self.httpx = httpx.AsyncClient(timeout=TIMEOUT_S, limits=limits)

    async def close(self):
        await self.aiohttp.close()
        await self.httpx.aclose()

    async def fetch_aiohttp(self):
        async with self.aiohttp.get(UPSTREAM_URL) as resp:
            resp.raise_for_status()
            return await resp.text()

    async def fetch_httpx(self):
        resp = await self.httpx.get(UPSTREAM_URL)
        resp.raise_for_status()
        return resp.text


SHARED = SharedClients()

# Path -> fetcher. Sync fetchers run in sync handlers, as in the article
# (FastAPI and Flask run those in threads; Sanic runs them on its event loop).
SYNC_ROUTES = {"/requests": fetch_requests, "/httpx-sync": fetch_httpx_sync}
ARTICLE_ASYNC_ROUTES = {"/httpx-async": fetch_httpx_async, "/aiohttp": fetch_aiohttp}
SHARED_ROUTES = {"/aiohttp-shared": SHARED.fetch_aiohttp, "/httpx-shared": SHARED.fetch_httpx}
ASYNC_ROUTES = {**ARTICLE_ASYNC_ROUTES, **SHARED_ROUTES}

# A failed upstream call answers 502, so that the load tool counts it as non-2xx
# (the article's handlers answered 200 or 500 depending on the framework).
FAILED = (502, "upstream request failed")


def call_sync(fetch):
    """Runs a sync fetcher; returns (status, body)."""
    try:
        return 200, fetch()
    except Exception:  # noqa: BLE001 - any failure is the upstream's, answered 502
        return FAILED


async def call_async(fetch):
    """Runs an async fetcher; returns (status, body)."""
    try:
        return 200, await fetch()
    except Exception:  # noqa: BLE001 - any failure is the upstream's, answered 502
        return FAILED
