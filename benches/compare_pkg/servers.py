"""How each server is started: service A, the gateway, the floor, nginx,
HAProxy, Caddy, Traefik, Pingora and the Go, Node.js and Python peers, each
built as a Proc from a Ctx (ports, pinning, pool) and run pinned in its own
session, so that it can be waited for, probed and stopped by process group
with all its workers."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .common import (
    BACKLOG,
    CADDY_BIN,
    DEMO_FILE,
    FLOOR_BIN,
    GATEWAY_BIN,
    GO_BIN,
    PEERS,
    POOL,
    ROOT,
    RUN_DIR,
    START_TIMEOUT_S,
    STOP_GRACE_S,
    TIMEOUT_S,
    TRAEFIK_BIN,
    VENV_PYTHON,
    fill_template,
    find_program,
    free_port,
    log,
)
from .prereqs import CARGO_PEERS
from .procfs import process_tree, proc_stat

if TYPE_CHECKING:
    from .machine import Pinning
    from .model import Scenario


@dataclass
class Proc:
    """A server to start: what runs, on which port and CPU."""

    name: str
    argv: list
    port: int
    cpu: int
    env: dict = field(default_factory=dict)
    cwd: Path | None = None
    # The config file it runs with, recorded in the JSON (overload, failover).
    config: Path | None = None

    def command_line(self):
        env = " ".join(f"{k}={v}" for k, v in self.env.items() if not k.startswith("BENCH_"))
        argv = " ".join(str(a) for a in self.argv).replace(str(ROOT) + "/", "")
        return f"taskset -c {self.cpu} {env + ' ' if env else ''}{argv}"


@dataclass
class Ctx:
    """What a variant needs to build its server's command."""

    scenario: Scenario
    port: int
    a_port: int
    pinning: Pinning
    service_a: str
    # Every service A process (failover has two); a_port is the first.
    a_ports: list = field(default_factory=list)
    # The pool size for this run: POOL, or the run's largest connection count
    # if that is larger (slow-upstream at 4000), so no pool churns.
    pool: int = POOL

    @property
    def upstream_url(self):
        return f"http://127.0.0.1:{self.a_port}{self.scenario.a_path}"

    def proc(self, argv, **kwargs):
        return Proc("server", argv, self.port, self.pinning.server, **kwargs)

    def python_env(self, workers):
        return {
            "BENCH_PORT": str(self.port),
            "BENCH_UPSTREAM_URL": self.upstream_url,
            "BENCH_BACKLOG": str(BACKLOG),
            "BENCH_POOL": str(self.pool),
            "BENCH_WORKERS": str(workers),
            "BENCH_FILE": str(DEMO_FILE),
        }

    def template_values(self):
        return {
            "PORT": self.port,
            "A_PORT": self.a_port,
            "A_PATH": self.scenario.a_path,
            "POOL": self.pool,
            "BACKLOG": BACKLOG,
            "FILE": DEMO_FILE,
            "ROUTE_B": "",
            "UPSTREAM_A": "",
            "TOP": "",
        }

    @property
    def count_url(self):
        """Service A's count of the requests for its /a (`gateway upstream`)."""
        return f"http://127.0.0.1:{self.a_port}/-/count"


def service_a(ctx):
    addr = f"127.0.0.1:{ctx.a_port}"
    delay = ctx.scenario.a_delay or "1s"
    if ctx.service_a == "gateway":
        argv = [GATEWAY_BIN, "upstream", "--listen", addr, "--delay", delay]
        if ctx.scenario.a_cache_control:
            argv += ["--cache-control", ctx.scenario.a_cache_control]
    elif ctx.scenario.a_cache_control or ctx.scenario.keys:
        raise RuntimeError(
            f"{ctx.scenario.name} needs `gateway upstream` as service A (--cache-control, /-/count), "
            "not the Go one: run with --service-a gateway and a built gateway"
        )
    else:
        argv = [GO_BIN, "service-a", "-listen", addr, "-delay", delay]
    return Proc("service-a", argv, ctx.a_port, ctx.pinning.upstream)


def gateway(ctx):
    config = RUN_DIR / f"gateway-{ctx.scenario.name}.toml"
    config.write_text(fill_template(PEERS / "gateway" / "gateway.toml.in", ctx.template_values()))
    return ctx.proc([GATEWAY_BIN, "--config", config])


def gateway_server(tag, lines):
    """The gateway on gateway.toml.in with these keys added to [server]."""

    def build(ctx):
        config = RUN_DIR / f"gateway-{tag}-{ctx.scenario.name}.toml"
        text = fill_template(PEERS / "gateway" / "gateway.toml.in", ctx.template_values())
        keyed = text.replace("[server]\n", f"[server]\n{lines}\n", 1)
        if keyed == text:
            raise RuntimeError(f"gateway.toml.in has no [server] line to add {lines!r} under")
        config.write_text(keyed)
        return ctx.proc([GATEWAY_BIN, "--config", config])

    return build


# The gateway with request IDs and trace context (on by default) off.
gateway_lean = gateway_server("lean", "request_id = false\ntrace_context = false")


def gateway_with(tag, route="", upstream=""):
    """The gateway on gateway.toml.in with these keys added to route b and
    to upstream a."""

    def build(ctx):
        config = RUN_DIR / f"gateway-{tag}-{ctx.scenario.name}.toml"
        values = {**ctx.template_values(), "ROUTE_B": route, "UPSTREAM_A": upstream}
        config.write_text(fill_template(PEERS / "gateway" / "gateway.toml.in", values))
        return ctx.proc([GATEWAY_BIN, "--config", config], config=config)

    return build


def gateway_rate_limited(limit, shared):
    """The gateway with `rate_limit = limit` on route b; shared: its buckets
    in a redis-server of its own (no persistence), started first and pinned
    with the load tool and service A, so the Redis round trip is in every
    request's time but Redis's own CPU is not counted as the gateway's."""

    def build(ctx):
        store = ', shared = "redis"' if shared else ""
        route = f"rate_limit = {{ {limit}{store} }}"
        config = RUN_DIR / f"gateway-limit-{'redis' if shared else 'local'}-{ctx.scenario.name}.toml"
        values = {**ctx.template_values(), "ROUTE_B": route}
        procs = []
        if shared:
            program = find_program("redis-server")
            if not program:
                raise RuntimeError("redis-server not found (Debian package redis-server)")
            port = free_port()
            argv = [program, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
            procs.append(Proc("redis", argv, port, ctx.pinning.load))
            values["TOP"] = f'[rate_limit_store]\nurl = "redis://127.0.0.1:{port}"\ntimeout = "50ms"\non_error = "deny"\n'
        config.write_text(fill_template(PEERS / "gateway" / "gateway.toml.in", values))
        return procs + [ctx.proc([GATEWAY_BIN, "--config", config], config=config)]

    return build


def nginx_limit_req(rate, burst):
    """nginx on nginx/limit.conf.in: nginx.conf.in's /b with limit_req."""

    def build(ctx):
        prefix = RUN_DIR / "nginx"
        prefix.mkdir(parents=True, exist_ok=True)
        values = {**ctx.template_values(), "RUN_DIR": prefix, "RATE": rate, "BURST": burst}
        config = prefix / f"nginx-{ctx.scenario.name}.conf"
        config.write_text(fill_template(PEERS / "nginx" / "limit.conf.in", values))
        return ctx.proc([find_program("nginx"), "-p", prefix, "-e", "stderr", "-c", config], config=config)

    return build


def hyper_floor(ctx):
    """A proxy built like the gateway on hyper alone, on the gateway's config
    file: the floor under the gateway's costs (benches/floor)."""
    if not FLOOR_BIN.exists():
        raise RuntimeError(f"{FLOOR_BIN} not found (run without --no-build to build it)")
    config = RUN_DIR / f"floor-{ctx.scenario.name}.toml"
    config.write_text(fill_template(PEERS / "gateway" / "gateway.toml.in", ctx.template_values()))
    return ctx.proc([FLOOR_BIN, "--config", config])


def nginx(ctx):
    prefix = RUN_DIR / "nginx"
    prefix.mkdir(parents=True, exist_ok=True)
    config = prefix / "nginx.conf"
    config.write_text(fill_template(PEERS / "nginx" / "nginx.conf.in", {**ctx.template_values(), "RUN_DIR": prefix}))
    return ctx.proc([find_program("nginx"), "-p", prefix, "-e", "stderr", "-c", config])


def haproxy(ctx):
    """haproxy in the foreground (-db) on haproxy/haproxy.cfg.in: one thread,
    pinned to one CPU like every server under test, no logs."""
    program = find_program("haproxy")
    if not program:
        raise RuntimeError("haproxy not found (Debian package haproxy)")
    prefix = RUN_DIR / "haproxy"
    prefix.mkdir(parents=True, exist_ok=True)
    config = prefix / f"haproxy-{ctx.scenario.name}.cfg"
    config.write_text(fill_template(PEERS / "haproxy" / "haproxy.cfg.in", ctx.template_values()))
    return ctx.proc([program, "-db", "-f", config], config=config)


def caddy(ctx):
    """caddy run on caddy/Caddyfile.in, GOMAXPROCS=1 (it is pinned to one CPU
    like every server under test), its data and config folders in the run's
    own (admin is off, so it saves nothing there)."""
    prefix = RUN_DIR / "caddy"
    prefix.mkdir(parents=True, exist_ok=True)
    config = prefix / f"Caddyfile-{ctx.scenario.name}"
    values = {**ctx.template_values(), "PUBLIC_DIR": DEMO_FILE.parent, "FILE_NAME": DEMO_FILE.name}
    config.write_text(fill_template(PEERS / "caddy" / "Caddyfile.in", values))
    env = {"GOMAXPROCS": "1", "XDG_DATA_HOME": prefix / "data", "XDG_CONFIG_HOME": prefix / "config"}
    return ctx.proc([CADDY_BIN, "run", "--adapter", "caddyfile", "--config", config], env=env, config=config)


# It runs from the venv of Caddy's and Traefik's binaries (prereqs.VENVS).
caddy.venv = "proxies"


def traefik(ctx):
    """traefik on traefik/traefik.yml.in (static) and dynamic.yml.in (the
    file provider's), GOMAXPROCS=1, pinned like every server under test."""
    prefix = RUN_DIR / "traefik"
    prefix.mkdir(parents=True, exist_ok=True)
    dynamic = prefix / f"dynamic-{ctx.scenario.name}.yml"
    dynamic.write_text(fill_template(PEERS / "traefik" / "dynamic.yml.in", ctx.template_values()))
    config = prefix / f"traefik-{ctx.scenario.name}.yml"
    values = {**ctx.template_values(), "DYNAMIC": dynamic}
    config.write_text(fill_template(PEERS / "traefik" / "traefik.yml.in", values))
    return ctx.proc([TRAEFIK_BIN, f"--configFile={config}"], env={"GOMAXPROCS": "1"}, config=config)


traefik.venv = "proxies"


def pingora(ctx):
    """benches/peers/pingora: a reverse proxy on Pingora, `threads: 1`, an
    idle pool to service A of the run's size (upstream_keepalive_pool_size),
    pinned like every server under test; /b to A's path, as nginx's."""
    program = CARGO_PEERS[pingora.cargo].ready_binary()
    argv = [program, "--listen", f"127.0.0.1:{ctx.port}", "--upstream", ctx.upstream_url, "--pool", ctx.pool]
    return ctx.proc(argv)


# Built from its own Cargo package, only when a planned variant runs it (prereqs.CARGO_PEERS).
pingora.cargo = "pingora"


def nginx_cache(size_mib):
    """nginx on nginx/cache.conf.in: proxy_cache of size_mib, emptied first."""

    def build(ctx):
        prefix = RUN_DIR / "nginx"
        cache = prefix / f"cache-{ctx.scenario.name}"
        shutil.rmtree(cache, ignore_errors=True)
        prefix.mkdir(parents=True, exist_ok=True)
        values = {**ctx.template_values(), "RUN_DIR": prefix, "CACHE_DIR": cache, "CACHE_MIB": size_mib}
        config = prefix / f"nginx-{ctx.scenario.name}.conf"
        config.write_text(fill_template(PEERS / "nginx" / "cache.conf.in", values))
        return ctx.proc([find_program("nginx"), "-p", prefix, "-e", "stderr", "-c", config], config=config)

    return build


def varnish(size_mib, grace_s):
    """varnishd in the foreground on varnish/cache.vcl.in: malloc storage of
    size_mib, one thread pool (pinned to one CPU like every server under
    test), the listen backlog of the others, no management port, no
    privilege separation (it runs as whoever runs this, in its own work
    directory, made afresh every run)."""

    def build(ctx):
        program = find_program("varnishd")
        if not program:
            raise RuntimeError("varnishd not found (Debian package varnish)")
        work = RUN_DIR / "varnish"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        vcl = work / f"{ctx.scenario.name}.vcl"
        vcl.write_text(fill_template(PEERS / "varnish" / "cache.vcl.in", {**ctx.template_values(), "GRACE_S": grace_s}))
        argv = [program, "-F", "-j", "none", "-n", work / "state", "-T", "none"]
        argv += ["-a", f"127.0.0.1:{ctx.port}", "-f", vcl, "-s", f"malloc,{size_mib}m"]
        argv += ["-p", "thread_pools=1", "-p", f"listen_depth={BACKLOG}"]
        return ctx.proc(argv, config=vcl)

    return build


def go_peer(command, env=None):
    def build(ctx):
        flags = {
            "client": ["-upstream", ctx.upstream_url],
            "reverse-proxy": ["-upstream", ctx.upstream_url, "-pool", ctx.pool],
            "file": ["-file", DEMO_FILE],
        }.get(command, [])
        return ctx.proc([GO_BIN, command, "-listen", f"127.0.0.1:{ctx.port}", *flags], env=env or {})

    return build


def uvicorn_peer(module, workers):
    def build(ctx):
        flags = f"--host 127.0.0.1 --port {ctx.port} --workers {workers} --backlog {BACKLOG} --no-access-log"
        argv = [VENV_PYTHON, "-m", "uvicorn", f"{module}:app", *flags.split(), "--log-level", "warning"]
        return ctx.proc(argv, env=ctx.python_env(workers), cwd=PEERS / "python")

    build.venv = "python"
    return build


def python_peer(script, workers=1):
    def build(ctx):
        return ctx.proc([VENV_PYTHON, script], env=ctx.python_env(workers), cwd=PEERS / "python")

    # A Python peer: the run needs its venv (see prereqs.install_or_report).
    build.venv = "python"
    return build


def node_hello(ctx):
    return ctx.proc([find_program("node"), PEERS / "node" / "hello.js", ctx.port, BACKLOG])


def protect_gateway(tag, upstream="", route=""):
    """The gateway on gateway/protect.toml.in with these upstream and route keys."""

    def build(ctx):
        urls = [f"http://127.0.0.1:{port}" for port in ctx.a_ports]
        where = f'url = "{urls[0]}"' if len(urls) == 1 else "endpoints = [" + ", ".join(f'"{u}"' for u in urls) + "]"
        values = {**ctx.template_values(), "UPSTREAM": "\n".join(filter(None, [where, upstream])), "ROUTE": route}
        config = RUN_DIR / f"gateway-{ctx.scenario.name}-{tag}.toml"
        config.write_text(fill_template(PEERS / "gateway" / "protect.toml.in", values))
        return ctx.proc([GATEWAY_BIN, "--config", config], config=config)

    return build


def protect_nginx(server_options=""):
    """nginx on nginx/protect.conf.in, one `server` line per service A process."""

    def build(ctx):
        prefix = RUN_DIR / "nginx"
        prefix.mkdir(parents=True, exist_ok=True)
        servers = "\n".join(f"        server 127.0.0.1:{port}{server_options};" for port in ctx.a_ports)
        values = {**ctx.template_values(), "RUN_DIR": prefix, "SERVERS": servers}
        config = prefix / f"nginx-{ctx.scenario.name}.conf"
        config.write_text(fill_template(PEERS / "nginx" / "protect.conf.in", values))
        return ctx.proc([find_program("nginx"), "-p", prefix, "-e", "stderr", "-c", config], config=config)

    return build


def workers_service_a(scenario, pinning, index, port):
    name = f"service-a{index + 1}" if scenario.endpoints > 1 else "service-a"
    argv = [GO_BIN, "service-a", "-listen", f"127.0.0.1:{port}", "-delay", f"{scenario.service_ms}ms"]
    return Proc(name, [*argv, "-workers", scenario.workers], port, pinning.upstream)


class Running:
    """A started server: its own session, so its process group is its PID."""

    def __init__(self, proc, log_path):
        self.proc = proc
        self.log_path = log_path
        with open(log_path, "wb") as out:
            self.popen = subprocess.Popen(
                ["taskset", "-c", str(proc.cpu), *map(str, proc.argv)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=proc.cwd,
                env={**os.environ, **proc.env},
                start_new_session=True,
            )

    @property
    def pid(self):
        return self.popen.pid

    def wait_for_port(self):
        """None once the port accepts connections, else why it does not."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                return f"{self.proc.name} exited with status {self.popen.returncode}"
            try:
                socket.create_connection(("127.0.0.1", self.proc.port), timeout=0.5).close()
                return None
            except OSError:
                time.sleep(0.05)
        return f"{self.proc.name} did not open port {self.proc.port} in {START_TIMEOUT_S}s"

    def log_tail(self, lines=8):
        text = self.log_path.read_text(errors="replace").strip().splitlines()
        return "\n".join("    | " + line for line in text[-lines:])

    def stop(self):
        tree = process_tree(self.pid)
        self.signal_group(signal.SIGTERM)
        try:
            self.popen.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.signal_group(signal.SIGKILL)
            self.popen.wait()
        # Anything that left the group (none of our peers do) goes by PID.
        for pid in tree[1:]:
            if proc_stat(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def signal_group(self, sig):
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass


def start_all(procs, log_prefix):
    """Starts procs in order, each once the previous one listens.

    Returns (running, error); on error the ones started are already stopped."""
    running = []
    for proc in procs:
        log(f"    {proc.name:<10} {proc.command_line()}")
        server = Running(proc, Path(f"{log_prefix}-{proc.name}.log"))
        running.append(server)
        error = server.wait_for_port()
        if error:
            log(f"    failed: {error}, log {server.log_path}:\n{server.log_tail()}")
            stop_all(running)
            return [], error
    return running, None


def stop_all(running):
    for server in reversed(running):
        server.stop()


# Loopback only: never through an http_proxy from the environment.
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def probe(url):
    """None once a GET answers 2xx, else why not: a multi-worker server may
    open its port before its workers serve."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            with NO_PROXY.open(url, timeout=TIMEOUT_S + 3) as resp:
                resp.read()
                return None
        except Exception as err:  # noqa: BLE001 - any failure is reported as text
            if time.monotonic() > deadline:
                return f"probe GET {url}: {err}"
            time.sleep(0.2)


def read_count(url):
    """Service A's /-/count: the requests for /a it has received."""
    with NO_PROXY.open(url, timeout=TIMEOUT_S) as resp:
        return int(resp.read().decode().strip())
