#!/usr/bin/env python3
"""Soak the gateway with mixed load and misbehaving upstreams, then check that
it gives back what it took.

What it runs, all on 127.0.0.1 and bounded in time:

* the built-in upstream (`gateway upstream --delay 50ms`);
* misbehaving upstreams written here, each on its own port: one that accepts
  and never answers (-> 504 at the route's 300ms timeout), a closed port
  (-> 502), one that sends a head with `Content-Length: 100000`, a few bytes,
  then closes or resets (-> the client's response is cut short), one that
  answers bytes that are not HTTP (-> 502), one that closes idle keep-alive
  connections at random times (-> GETs still get 200 through the gateway's
  stale-connection retry), and a well-behaved sink for big POST bodies;
* the gateway, with a generated config that has a route per peer;
* `--concurrency` clients speaking HTTP/1.1 keep-alive over raw asyncio
  streams, with slowloris clients (half a request head, trickled), clients
  that disconnect mid-request, big POST bodies (fixed length and chunked),
  idle clients (connect and send nothing, half the HTTP/2 preface, or one
  request and then nothing: closed by the header-read or idle timeout) and
  clients that stop reading a big response (closed by the send timeout).

After a warm-up at full load and a settle period (longer than the pools' idle
timeout and the header read timeout) it records a baseline: resident memory,
open fds, live tasks and connection slots in use from `/metrics`,
cross-checked with `/proc/PID`. It
then drives the load for `--duration` seconds, printing progress every 10 s,
settles again, measures again and prints a before/after table.

Exit status: 0 when open fds, live tasks and connection slots are back
within FD_MARGIN / TASK_MARGIN / CONN_MARGIN of the baseline, resident memory grew less than RSS_FACTOR plus
RSS_SLACK, and the gateway stayed up and exited 0 on SIGTERM; 1 otherwise;
2 when the soak could not start. Stdlib only:

    cargo build --release
    python3 scripts/soak.py [--duration 180] [--concurrency 200] [--gateway target/release/gateway]

Also --warmup, --settle, --seed, and --keep-logs (the generated config and the
gateway's log stay in a temporary folder, as they do when the soak fails).
`cargo test --test soak -- --ignored` runs it for 60 s against the debug build.
"""

import argparse
import asyncio
import collections
import ctypes
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024

# Pass/fail margins: the figures after the load, compared with the baseline.
FD_MARGIN = 10
TASK_MARGIN = 10
CONN_MARGIN = 2
RSS_FACTOR = 1.5
RSS_SLACK = 20 * MIB

# Gateway settings the load relies on (written into the generated config).
HUNG_ROUTE_TIMEOUT = "300ms"
HEADER_READ_TIMEOUT_S = 2
IDLE_TIMEOUT_S = 2
SEND_TIMEOUT_S = 2
POOL_IDLE_TIMEOUT_S = 2
BIG_FILE_BYTES = 32 * MIB
SHUTDOWN_TIMEOUT_S = 5

# Bounds on the client side: one exchange longer than this is a failure of
# the gateway to answer ("client_timeout"); a slowloris client gives up here.
EXCHANGE_TIMEOUT_S = 10.0
SLOWLORIS_GIVE_UP_S = HEADER_READ_TIMEOUT_S * 3 + 1
IDLE_GIVE_UP_S = max(HEADER_READ_TIMEOUT_S, IDLE_TIMEOUT_S) * 3 + 1
NOREAD_WAIT_S = SEND_TIMEOUT_S * 2 + 1
PROGRESS_EVERY_S = 10

# Request mix: (action, weight). Routes are named after what they exercise.
MIX = [
    ("slow", 30),  # built-in upstream /a, 50 ms
    ("fast", 12),  # built-in upstream /hello
    ("file", 10),
    ("hello", 5),  # fixed response
    ("flaky", 15),  # upstream closing idle keep-alive connections at random
    ("hung", 3),
    ("refused", 3),
    ("reset", 3),
    ("garbage", 3),
    ("upload", 4),  # big POST body to the sink
    ("slowloris", 1),
    ("abort", 3),  # client disconnects mid-request
    ("idle", 2),  # connects and sends nothing (or one request), then waits
    ("noread", 1),  # asks for a big file and never reads it
]
# What each action should end in; anything else is listed as unexpected.
EXPECTED = {
    "slow": {"200"},
    "fast": {"200"},
    "file": {"200"},
    "hello": {"200"},
    "flaky": {"200"},
    "hung": {"504"},
    "refused": {"502"},
    "reset": {"cut"},
    "garbage": {"502"},
    "upload": {"200"},
    "slowloris": {"closed"},
    "abort": {"aborted"},
    "idle": {"closed"},
    "noread": {"closed"},
}
UPLOAD_SIZES = [64 * 1024, 256 * 1024, 1024 * 1024]
UPLOAD_DATA = b"u" * max(UPLOAD_SIZES)


def log(msg=""):
    print(msg, flush=True)


# ---------------------------------------------------------------- HTTP bits


class Incomplete(Exception):
    """The peer closed the connection before a whole head arrived."""

    def __init__(self, message, partial=0):
        super().__init__(message)
        self.partial = partial  # head bytes received before the close


async def read_head(reader):
    """Reads one message head; returns (start line, lower-cased headers)."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        raise Incomplete(f"closed after {len(e.partial)} head bytes", len(e.partial)) from None
    except asyncio.LimitOverrunError:
        raise Incomplete("head too long") from None
    lines = raw[:-4].decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return lines[0], headers


async def read_body(reader, headers):
    """Reads a body framed by Content-Length, chunked coding or EOF.

    Returns (body, complete); complete is False when the connection ended
    before the framing said the body was over.
    """
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = bytearray()
        try:
            while True:
                line = await reader.readuntil(b"\r\n")
                size = int(line.split(b";")[0].strip(), 16)
                if size == 0:
                    while await reader.readuntil(b"\r\n") != b"\r\n":
                        pass
                    return bytes(body), True
                body += await reader.readexactly(size)
                await reader.readexactly(2)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            return bytes(body), False
    if "content-length" in headers:
        length = int(headers["content-length"])
        try:
            return await reader.readexactly(length), True
        except asyncio.IncompleteReadError as e:
            return e.partial, False
        except ConnectionError:
            return b"", False
    try:
        return await reader.read(), True
    except ConnectionError:
        return b"", False


def reset_and_close(writer):
    """Closes with an RST instead of a FIN (SO_LINGER 0)."""
    sock = writer.get_extra_info("socket")
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    writer.transport.abort()


# ------------------------------------------------------- misbehaving peers


class Peers:
    """The misbehaving upstreams, served from this process."""

    def __init__(self, rng):
        self.rng = rng
        self.servers = []
        self.ports = {}
        self.open = collections.Counter()  # peer -> connections open now

    async def start(self):
        handlers = {
            "hung": self.hung,
            "reset": self.reset,
            "garbage": self.garbage,
            "flaky": self.flaky,
            "sink": self.sink,
        }
        for name, handler in handlers.items():
            server = await asyncio.start_server(
                self._guard(name, handler), "127.0.0.1", 0, backlog=1024
            )
            self.servers.append(server)
            self.ports[name] = server.sockets[0].getsockname()[1]
        self.ports["refused"] = free_port()  # bound then closed: nothing listens

    def close(self):
        for server in self.servers:
            server.close()

    def _guard(self, name, handler):
        async def serve(reader, writer):
            self.open[name] += 1
            try:
                await handler(reader, writer)
            except (ConnectionError, Incomplete, asyncio.IncompleteReadError, ValueError):
                pass
            finally:
                self.open[name] -= 1
                writer.close()

        return serve

    async def hung(self, reader, writer):
        """Accepts, reads, never answers; returns once the gateway hangs up."""
        while await reader.read(65536):
            pass

    async def reset(self, reader, writer):
        """Promises 100000 bytes, sends 1000, then closes or resets."""
        await read_head(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
            b"Content-Length: 100000\r\n\r\n" + b"r" * 1000
        )
        await writer.drain()
        await asyncio.sleep(0.01)  # let the bytes leave before an RST drops them
        if self.rng.random() < 0.5:
            reset_and_close(writer)

    async def garbage(self, reader, writer):
        """Answers bytes that are not HTTP, then closes."""
        await read_head(reader)
        writer.write(
            self.rng.choice(
                [
                    b"SSH-2.0-OpenSSH_9.2p1 Debian\r\n",
                    b"HTTP/1.1 two hundred OK\r\n\r\n",
                    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(64),
                    b"hello, this is not http at all\r\n\r\n",
                    os.urandom(200),
                ]
            )
        )
        await writer.drain()

    async def flaky(self, reader, writer):
        """Keep-alive server that closes idle connections at random times,
        and sometimes right after answering, without `Connection: close`.

        A new connection waits for its first request without a deadline: the
        gateway retries a GET that met a stale pooled connection on a fresh
        one, and closing that too would be this peer's doing, not a gateway
        fault."""
        idle_limit = None
        while True:
            try:
                _, headers = await asyncio.wait_for(read_head(reader), idle_limit)
            except asyncio.TimeoutError:
                return
            await read_body_if_any(reader, headers)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"
            )
            await writer.drain()
            if self.rng.random() < 0.1:
                return
            idle_limit = self.rng.uniform(0.05, 1.5)

    async def sink(self, reader, writer):
        """Keep-alive server that reads the whole body and answers its size."""
        while True:
            try:
                _, headers = await read_head(reader)
            except Incomplete:
                return
            body, complete = await read_body_if_any(reader, headers)
            if not complete:
                return
            answer = b"got %d" % len(body)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(answer), answer)
            )
            await writer.drain()


async def read_body_if_any(reader, headers):
    """A request has a body only if it says so (RFC 9112 §6.3)."""
    if "content-length" in headers or "transfer-encoding" in headers:
        return await read_body(reader, headers)
    return b"", True


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- clients


class Stats:
    def __init__(self):
        self.outcomes = collections.Counter()  # (action, outcome) -> count
        self.reconnects = 0  # keep-alive connections the gateway had closed

    def total(self):
        return sum(self.outcomes.values())

    def by_outcome(self):
        c = collections.Counter()
        for (_, outcome), n in self.outcomes.items():
            c[outcome] += n
        return c


class Client:
    """One keep-alive connection to the gateway, reopened when it closes."""

    def __init__(self, port, stats):
        self.port = port
        self.stats = stats
        self.reader = self.writer = None

    def close(self):
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def request(self, method, path, body=b"", chunked=False):
        """Returns (status, body, complete); raises Incomplete or
        ConnectionError when no response head arrived."""
        head = f"{method} {path} HTTP/1.1\r\nHost: soak.test\r\nUser-Agent: soak\r\n"
        if chunked:
            head += "Transfer-Encoding: chunked\r\n"
        elif body or method == "POST":
            head += f"Content-Length: {len(body)}\r\n"
        head = (head + "\r\n").encode()
        for attempt in range(2):
            reused = self.writer is not None
            if not reused:
                self.reader, self.writer = await asyncio.open_connection(
                    "127.0.0.1", self.port, limit=256 * 1024
                )
            try:
                self.writer.write(head)
                await self._send_body(body, chunked)
                status_line, headers = await read_head(self.reader)
                break
            except (Incomplete, ConnectionError) as e:
                self.close()
                # A reused connection the gateway closed while it sat idle:
                # what any client does is open a new one and send again.
                if reused and attempt == 0 and getattr(e, "partial", 0) == 0:
                    self.stats.reconnects += 1
                    continue
                raise
        status = int(status_line.split(" ", 2)[1])
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            data, complete = b"", True
        else:
            data, complete = await read_body(self.reader, headers)
        if not complete or "close" in headers.get("connection", "").lower():
            self.close()
        return status, data, complete

    async def _send_body(self, body, chunked):
        step = 64 * 1024
        for i in range(0, len(body), step):
            part = body[i : i + step]
            if chunked:
                self.writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            else:
                self.writer.write(part)
            await self.writer.drain()
        if chunked:
            self.writer.write(b"0\r\n\r\n")
        await self.writer.drain()


async def do_get(client, path):
    status, _, complete = await client.request("GET", path)
    return str(status) if complete else "cut"


async def do_upload(client, rng):
    size = rng.choice(UPLOAD_SIZES)
    status, data, complete = await client.request(
        "POST", "/upload", UPLOAD_DATA[:size], chunked=rng.random() < 0.5
    )
    if not complete:
        return "cut"
    if status == 200 and data != b"got %d" % size:
        return "bad_body"
    return str(status)


async def do_slowloris(port, rng):
    """Half a request head, then a byte every half second, until the gateway
    hangs up ("closed") or we give up ("held")."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /slow HTTP/1.1\r\nHost: soak.test\r\nX-Trickle: ")
        deadline = time.monotonic() + SLOWLORIS_GIVE_UP_S
        while time.monotonic() < deadline:
            try:
                if await asyncio.wait_for(reader.read(4096), 0.5) == b"":
                    return "closed"
            except asyncio.TimeoutError:
                writer.write(b"a")
            except ConnectionError:
                return "closed"
        return "held"
    finally:
        writer.close()


async def do_idle(port, rng):
    """Connects and then sends nothing, half the HTTP/2 preface, or one whole
    request; then waits for the gateway to hang up ("closed") or gives up
    ("held")."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        kind = rng.randrange(3)
        if kind == 1:
            writer.write(b"PRI * HTTP/2.0\r\n")
        elif kind == 2:
            writer.write(b"GET /hello HTTP/1.1\r\nHost: soak.test\r\n\r\n")
        await writer.drain()
        deadline = time.monotonic() + IDLE_GIVE_UP_S
        while time.monotonic() < deadline:
            try:
                if await asyncio.wait_for(reader.read(65536), 0.5) == b"":
                    return "closed"
            except asyncio.TimeoutError:
                pass
            except ConnectionError:
                return "closed"
        return "held"
    finally:
        writer.close()


async def do_noread(port, rng):
    """Asks for a file far larger than the socket buffers and reads none of
    it for a while: the gateway must close the connection ("closed") rather
    than hold it ("held")."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1024 * 1024)
    try:
        writer.write(b"GET /big HTTP/1.1\r\nHost: soak.test\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(NOREAD_WAIT_S)
        got = 0
        while True:
            try:
                chunk = await asyncio.wait_for(reader.read(1024 * 1024), 1.0)
            except asyncio.TimeoutError:
                return "held"
            except ConnectionError:
                return "closed"
            if chunk == b"":
                return "closed" if got < BIG_FILE_BYTES else "held"
            got += len(chunk)
    finally:
        reset_and_close(writer)


async def do_abort(port, rng):
    """Opens a connection, starts a request, disconnects before the end."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        kind = rng.randrange(5)
        if kind == 0:  # whole request, gone before the (50 ms) answer
            writer.write(b"GET /slow HTTP/1.1\r\nHost: soak.test\r\n\r\n")
            await asyncio.sleep(rng.uniform(0, 0.03))
        elif kind == 1:  # gone while the upstream hangs
            writer.write(b"GET /hung HTTP/1.1\r\nHost: soak.test\r\n\r\n")
            await asyncio.sleep(rng.uniform(0.05, 0.25))
        elif kind == 2:  # gone in the middle of a request body
            writer.write(
                b"POST /upload HTTP/1.1\r\nHost: soak.test\r\nContent-Length: 1000000\r\n\r\n"
                + UPLOAD_DATA[: 64 * 1024]
            )
            await asyncio.sleep(rng.uniform(0, 0.05))
        elif kind == 3:  # gone in the middle of the head
            writer.write(b"GET /fast HTTP/1.1\r\nHost: soa")
            await asyncio.sleep(rng.uniform(0, 0.05))
        else:  # gone in the middle of a response body
            writer.write(b"GET /reset HTTP/1.1\r\nHost: soak.test\r\n\r\n")
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError):
        pass
    finally:
        if rng.random() < 0.5:
            reset_and_close(writer)
        else:
            writer.close()
    return "aborted"


async def one_action(action, client, port, rng):
    if action == "upload":
        return await do_upload(client, rng)
    if action == "slowloris":
        return await do_slowloris(port, rng)
    if action == "abort":
        return await do_abort(port, rng)
    if action == "idle":
        return await do_idle(port, rng)
    if action == "noread":
        return await do_noread(port, rng)
    return await do_get(client, "/" + action)


async def client_loop(port, stats, rng, stop_at):
    actions = [a for a, _ in MIX]
    weights = [w for _, w in MIX]
    client = Client(port, stats)
    try:
        while time.monotonic() < stop_at:
            action = rng.choices(actions, weights)[0]
            limit = {
                "slowloris": SLOWLORIS_GIVE_UP_S + 2,
                "idle": IDLE_GIVE_UP_S + 2,
                "noread": NOREAD_WAIT_S + EXCHANGE_TIMEOUT_S,
            }.get(action, EXCHANGE_TIMEOUT_S)
            try:
                outcome = await asyncio.wait_for(one_action(action, client, port, rng), limit)
            except asyncio.TimeoutError:
                outcome = "client_timeout"
                client.close()
            except (Incomplete, ConnectionError, OSError):
                outcome = "conn_error"
                client.close()
            stats.outcomes[(action, outcome)] += 1
    finally:
        client.close()


async def drive(port, concurrency, seconds, seed, on_tick=None):
    """Runs the load for `seconds`; calls on_tick(stats, elapsed) every
    PROGRESS_EVERY_S. Clients finish their current exchange for at most 2 s
    past the end, then are cancelled."""
    stats = Stats()
    start = time.monotonic()
    stop_at = start + seconds
    tasks = [
        asyncio.create_task(client_loop(port, stats, random.Random(seed * 100003 + i), stop_at))
        for i in range(concurrency)
    ]
    try:
        next_tick = start + PROGRESS_EVERY_S
        while time.monotonic() < stop_at:
            await asyncio.sleep(max(0, min(next_tick, stop_at) - time.monotonic()))
            if on_tick and time.monotonic() >= next_tick:
                await on_tick(stats, time.monotonic() - start)
                next_tick += PROGRESS_EVERY_S
        _, pending = await asyncio.wait(tasks, timeout=2)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if pending:
        stats.outcomes[("(any)", "cancelled_at_end")] += len(pending)
    return stats


# --------------------------------------------------------------- measuring


async def http_get(port, path, timeout=5.0):
    """One GET on a fresh connection: (status, body)."""

    async def go():
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1024 * 1024)
        try:
            writer.write(
                f"GET {path} HTTP/1.1\r\nHost: soak.test\r\nConnection: close\r\n\r\n".encode()
            )
            await writer.drain()
            status_line, headers = await read_head(reader)
            body, _ = await read_body(reader, headers)
            return int(status_line.split(" ", 2)[1]), body
        finally:
            writer.close()

    return await asyncio.wait_for(go(), timeout)


async def scrape(port):
    """The /metrics text, or '' when it cannot be had."""
    try:
        status, body = await http_get(port, "/metrics")
        return body.decode() if status == 200 else ""
    except (OSError, Incomplete, asyncio.TimeoutError):
        return ""


def metric(text, name):
    """The value of an unlabelled series, or None."""
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            try:
                return float(line.rsplit(" ", 1)[1])
            except ValueError:
                return None
    return None


def proc_figures(pid):
    """(VmRSS bytes, open fds) from /proc, or (None, None) once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))
        return rss, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration):
        return None, None


async def measure(port, pid):
    text = await scrape(port)
    await asyncio.sleep(0.2)  # let the gateway close the scrape connection
    vmrss, proc_fds = proc_figures(pid)
    return {
        "rss": metric(text, "process_resident_memory_bytes"),
        "vmrss": vmrss,
        "fds": metric(text, "process_open_fds"),
        "proc_fds": proc_fds,
        "tasks": metric(text, "gateway_runtime_alive_tasks"),
        # The scrape's own connection is one of them.
        "conns": metric(text, "gateway_connections_active"),
    }


def fmt_mib(v):
    return "n/a" if v is None else f"{v / MIB:.1f}"


def fmt_int(v):
    return "n/a" if v is None else f"{int(v)}"


def rss_limit(before):
    return before * RSS_FACTOR + RSS_SLACK


# The figures compared: label, key in measure()'s dict, formatter, limit.
FIGURES = [
    ("RSS MiB (/metrics)", "rss", fmt_mib, rss_limit),
    ("RSS MiB (/proc VmRSS)", "vmrss", fmt_mib, rss_limit),
    ("open fds (/metrics)", "fds", fmt_int, lambda b: b + FD_MARGIN),
    ("open fds (/proc)", "proc_fds", fmt_int, lambda b: b + FD_MARGIN),
    ("alive tasks (/metrics)", "tasks", fmt_int, lambda b: b + TASK_MARGIN),
    ("connection slots", "conns", fmt_int, lambda b: b + CONN_MARGIN),
]


def over_limit(before, after):
    """The labels of the figures past their limit."""
    return [
        label
        for label, key, _, limit in FIGURES
        if before[key] is not None and after[key] is not None and after[key] > limit(before[key])
    ]


def print_table(before, after):
    log(f"{'figure':<24}{'before':>10}{'after':>10}{'delta':>10}{'limit':>10}  verdict")
    for label, key, fmt, limit in FIGURES:
        b, a = before[key], after[key]
        if b is None or a is None:
            log(f"{label:<24}{fmt(b):>10}{fmt(a):>10}{'n/a':>10}{'n/a':>10}  not measured")
            continue
        delta = ("+" if a >= b else "-") + fmt(abs(a - b))
        verdict = "ok" if a <= limit(b) else "FAIL"
        log(f"{label:<24}{fmt(b):>10}{fmt(a):>10}{delta:>10}{fmt(limit(b)):>10}  {verdict}")


# -------------------------------------------------------------- processes


LIBC = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1


def die_with_parent():
    """Runs in the child before exec: the kernel sends it SIGTERM if this
    script dies without cleaning up (SIGKILL, say)."""
    LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(argv, logfile):
    out = open(logfile, "wb")
    try:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )
    finally:
        out.close()


def stop(proc, grace=5.0):
    """SIGTERM, then SIGKILL past `grace`; returns the exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


async def wait_ready(port, proc, path, seconds=15.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            if path is None:
                _, w = await asyncio.open_connection("127.0.0.1", port)
                w.close()
                return True
            status, _ = await http_get(port, path, timeout=1)
            if status == 200:
                return True
        except (OSError, Incomplete, asyncio.TimeoutError):
            pass
        await asyncio.sleep(0.1)
    return False


def write_config(tmp, gw_port, up_port, peers):
    demo = tmp / "demo.txt"
    demo.write_bytes(b"soak file line\n" * 1000)
    big = tmp / "big.bin"
    with open(big, "wb") as f:
        f.truncate(BIG_FILE_BYTES)
    ups = {"builtin": up_port, **peers.ports}
    text = f"""# Generated by scripts/soak.py.
[server]
listen = "127.0.0.1:{gw_port}"
header_read_timeout = "{HEADER_READ_TIMEOUT_S}s"
idle_timeout = "{IDLE_TIMEOUT_S}s"
send_timeout = "{SEND_TIMEOUT_S}s"
shutdown_timeout = "{SHUTDOWN_TIMEOUT_S}s"
"""
    for name, port in ups.items():
        text += f"""
[upstreams.{name}]
url = "http://127.0.0.1:{port}"
connect_timeout = "1s"
pool_idle_timeout = "{POOL_IDLE_TIMEOUT_S}s"
"""
    routes = [
        ("slow", 'upstream = "builtin"\nrewrite = "/a"\ntimeout = "2s"'),
        ("fast", 'upstream = "builtin"\nrewrite = "/hello"\ntimeout = "2s"'),
        ("file", f'file = "{demo}"'),
        ("big", f'file = "{big}"'),
        ("hello", 'respond = { status = 200, body = "Hello, soak" }'),
        ("flaky", 'upstream = "flaky"\ntimeout = "2s"'),
        ("hung", f'upstream = "hung"\ntimeout = "{HUNG_ROUTE_TIMEOUT}"'),
        ("refused", 'upstream = "refused"\ntimeout = "2s"'),
        ("reset", 'upstream = "reset"\ntimeout = "2s"'),
        ("garbage", 'upstream = "garbage"\ntimeout = "2s"'),
        ("upload", 'upstream = "sink"\ntimeout = "5s"'),
    ]
    for name, target in routes:
        text += f'\n[[routes]]\nname = "{name}"\nprefix = "/{name}"\n{target}\n'
    path = tmp / "soak.toml"
    path.write_text(text)
    return path


# ------------------------------------------------------------------- main


async def soak(args, tmp, procs):
    rng = random.Random(args.seed)
    peers = Peers(rng)
    await peers.start()
    try:
        return await soak_with_peers(args, tmp, procs, peers)
    finally:
        peers.close()


async def soak_with_peers(args, tmp, procs, peers):
    up_port, gw_port = free_port(), free_port()
    upstream = spawn(
        [args.gateway, "upstream", "--listen", f"127.0.0.1:{up_port}", "--delay", "50ms"],
        tmp / "upstream.log",
    )
    procs.append(upstream)
    if not await wait_ready(up_port, upstream, None):
        log(f"soak: the built-in upstream did not start; see {tmp / 'upstream.log'}")
        return 2
    config = write_config(tmp, gw_port, up_port, peers)
    gateway = spawn([args.gateway, "--config", str(config)], tmp / "gateway.log")
    procs.append(gateway)
    if not await wait_ready(gw_port, gateway, "/healthz"):
        log(f"soak: the gateway did not start; see {tmp / 'gateway.log'}:")
        log((tmp / "gateway.log").read_text(errors="replace")[-2000:])
        return 2
    log(f"gateway pid {gateway.pid} on 127.0.0.1:{gw_port}; config {config}")
    log(f"upstreams: builtin:{up_port} " + " ".join(f"{k}:{v}" for k, v in peers.ports.items()))

    def gateway_alive():
        return gateway.poll() is None

    log(f"warm-up: {args.warmup}s at {args.concurrency} clients")
    warm = await drive(gw_port, args.concurrency, args.warmup, args.seed)
    log(f"warm-up done: {warm.total()} exchanges; settling {args.settle}s")
    await asyncio.sleep(args.settle)
    if not gateway_alive():
        log(f"soak: FAIL: the gateway exited ({gateway.returncode}) during the warm-up")
        return 1
    before = await measure(gw_port, gateway.pid)
    log(
        f"baseline: RSS {fmt_mib(before['rss'])} MiB (VmRSS {fmt_mib(before['vmrss'])}), "
        f"fds {fmt_int(before['fds'])} (/proc {fmt_int(before['proc_fds'])}), "
        f"tasks {fmt_int(before['tasks'])}"
    )

    last = {"t": 0.0, "n": 0}

    async def tick(stats, elapsed):
        n = stats.total()
        rate = (n - last["n"]) / max(elapsed - last["t"], 1e-9)
        last.update(t=elapsed, n=n)
        m = await measure(gw_port, gateway.pid)
        counts = " ".join(f"{k}:{v}" for k, v in sorted(stats.by_outcome().items()))
        log(
            f"[{elapsed:4.0f}s] {rate:7.0f} req/s | {counts} | RSS {fmt_mib(m['vmrss'])} MiB "
            f"fds {fmt_int(m['proc_fds'])} tasks {fmt_int(m['tasks'])} | "
            f"peer conns open {dict(+peers.open) or '{}'}"
        )
        if not gateway_alive():
            raise GatewayDied()

    log(f"load: {args.duration}s at {args.concurrency} clients")
    started = time.monotonic()
    try:
        stats = await drive(gw_port, args.concurrency, args.duration, args.seed + 1, tick)
    except GatewayDied:
        log(f"soak: FAIL: the gateway exited ({gateway.returncode}) under load")
        return 1
    elapsed = time.monotonic() - started
    log(
        f"load done: {stats.total()} exchanges in {elapsed:.0f}s "
        f"({stats.total() / elapsed:.0f}/s), {stats.reconnects} keep-alive reconnects"
    )
    report_outcomes(stats)

    failures = []
    if not gateway_alive():
        log(f"soak: FAIL: the gateway exited ({gateway.returncode}) under load")
        return 1
    # Healthy routes still answer after the storm.
    for path in ("/slow", "/fast", "/file", "/hello", "/flaky"):
        try:
            status, _ = await http_get(gw_port, path)
        except (OSError, Incomplete, asyncio.TimeoutError) as e:
            status = f"error {e!r}"
        if status != 200:
            failures.append(f"GET {path} after the load: {status}")

    log(f"settling {args.settle}s")
    await asyncio.sleep(args.settle)
    after = await measure(gw_port, gateway.pid)
    for _ in range(2):  # a slow close is not a leak; a leak stays
        if not over_limit(before, after):
            break
        log(f"not back yet; settling {args.settle}s more")
        await asyncio.sleep(args.settle)
        after = await measure(gw_port, gateway.pid)

    log("\nthe gateway's counters (non-zero), warm-up included:")
    text = await scrape(gw_port)
    counters = (
        "gateway_upstream_errors_total",
        "gateway_upstream_retries_total",
        "gateway_upstream_connections_opened_total",
        "gateway_rejected_total",
    )
    for line in sorted(text.splitlines()):
        if line.startswith(counters) and not line.endswith(" 0"):
            log("  " + line)

    log("\nbefore/after (quiet gateway, after the settle period):")
    print_table(before, after)
    failures += [f"{label} past its limit" for label in over_limit(before, after)]
    log(f"peer connections still open: {dict(+peers.open) or 'none'}")

    status = stop(gateway, SHUTDOWN_TIMEOUT_S + 5)
    log(f"gateway exit status on SIGTERM: {status}")
    if status != 0:
        failures.append(f"gateway exited {status} on SIGTERM")

    if failures:
        log("\nsoak: FAIL")
        for f in failures:
            log("  - " + f)
        log(f"logs: {tmp}")
        return 1
    log("\nsoak: ok")
    return 0


class GatewayDied(Exception):
    pass


def report_outcomes(stats):
    log(f"\n{'action':<11}{'count':>9}  outcomes")
    actions = sorted({a for a, _ in stats.outcomes})
    unexpected = []
    for action in actions:
        row = {o: n for (a, o), n in stats.outcomes.items() if a == action}
        text = " ".join(f"{o}:{n}" for o, n in sorted(row.items()))
        log(f"{action:<11}{sum(row.values()):>9}  {text}")
        want = EXPECTED.get(action, set())
        unexpected += [f"{action} {o}:{n}" for o, n in row.items() if o not in want]
    if unexpected:
        log("unexpected outcomes (reported, not judged): " + ", ".join(sorted(unexpected)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=180, help="seconds of load (180)")
    parser.add_argument("--concurrency", type=int, default=200, help="concurrent clients (200)")
    parser.add_argument(
        "--gateway",
        default=str(REPO / "target" / "release" / "gateway"),
        help="the gateway binary (target/release/gateway)",
    )
    parser.add_argument(
        "--warmup", type=float, default=10, help="seconds of load before the baseline (10)"
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=max(HEADER_READ_TIMEOUT_S, IDLE_TIMEOUT_S, SEND_TIMEOUT_S, POOL_IDLE_TIMEOUT_S) + 4,
        help="quiet seconds before each measurement (6)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep the config and logs even when it passes"
    )
    args = parser.parse_args()
    if sys.stdout is not None:
        sys.stdout.reconfigure(line_buffering=True)

    if not (os.path.isfile(args.gateway) and os.access(args.gateway, os.X_OK)):
        log(f"soak: no gateway binary at {args.gateway}")
        log(f"build it first:  (cd {REPO} && cargo build --release)")
        return 2

    tmp = Path(tempfile.mkdtemp(prefix="gateway-soak-"))
    procs = []
    status = 1

    async def run():
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, task.cancel)
        return await soak(args, tmp, procs)

    try:
        status = asyncio.run(run())
    except (asyncio.CancelledError, KeyboardInterrupt):
        log("\nsoak: interrupted")
        status = 130
    finally:
        for proc in reversed(procs):
            stop(proc)
        if status == 0 and not args.keep_logs:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            log(f"config and logs kept in {tmp}")
    return status


if __name__ == "__main__":
    sys.exit(main())
