"""The machine under the benchmark: how the load tool, service A and the
server under test are pinned to CPUs, and the facts (CPU, memory, kernel,
load average, versions, commit) recorded in every JSON, so that a figure
can be read against the machine and the code that produced it."""

from __future__ import annotations

import os
import platform
import re
import resource
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .common import (
    CADDY_BIN,
    GATEWAY_BIN,
    PINGORA_BIN,
    PINGORA_MANIFEST,
    ROOT,
    TRAEFIK_BIN,
    VENV_PYTHON,
    find_program,
    log,
    somaxconn,
)


@dataclass
class Pinning:
    load: int
    server: int
    upstream: int

    def describe(self):
        return (
            f"load tool and this script on CPU {self.load}, service A on CPU {self.upstream}, "
            f"server under test on CPU {self.server} (taskset)"
        )


def choose_pinning():
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        log(f"warning: only CPU {cpus[0]} available; everything shares it")
        return Pinning(cpus[0], cpus[0], cpus[0])
    return Pinning(load=cpus[0], server=cpus[1], upstream=cpus[0])


def raise_fd_limit():
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def load_average():
    return float(Path("/proc/loadavg").read_text().split()[0])


def warn_if_busy(machine):
    """Other work on the machine skews every figure; say so."""
    load = machine["load_average_at_start"]
    if load > 0.5:
        log(f"warning: load average {load:.2f} before the run: other processes compete for the CPUs")


VERSION_COMMANDS = {
    "gateway": [GATEWAY_BIN, "--version"],
    "nginx": ["nginx", "-v"],
    "go": ["go", "version"],
    "node": ["node", "--version"],
    "python": [VENV_PYTHON, "--version"],
    "wrk": ["wrk", "-v"],
    "varnish": ["varnishd", "-V"],
    "haproxy": ["haproxy", "-v"],
    "caddy": [CADDY_BIN, "version"],
    "traefik": [TRAEFIK_BIN, "version"],
}


def versions():
    """First line each program prints about its version."""
    found = {}
    for name, (program, *args) in VERSION_COMMANDS.items():
        path = find_program(str(program))
        if path:
            done = subprocess.run([path, *args], capture_output=True, text=True, timeout=10, check=False)
            # Traefik's first line is "Version:      3.7.15": spaces collapsed.
            found[name] = " ".join((done.stdout + done.stderr).strip().split("\n")[0].split())
    # The Pingora peer prints no version: the pingora crate it was built with.
    pingora = locked_version(PINGORA_MANIFEST.with_name("Cargo.lock"), "pingora")
    if pingora and PINGORA_BIN.exists():
        found["pingora"] = f"pingora {pingora}"
    return found


def locked_version(lock, package):
    """The version of a package in a Cargo.lock, or None."""
    try:
        text = lock.read_text()
    except OSError:
        return None
    match = re.search(rf'\nname = "{re.escape(package)}"\nversion = "([^"]+)"', text)
    return match.group(1) if match else None


def machine_info():
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.machine(),
    )
    mem_kib = int(Path("/proc/meminfo").read_text().split()[1])
    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "memory_gib": round(mem_kib / 2**20, 1),
        "kernel": platform.release(),
        "somaxconn": somaxconn(),
        # Anything above ~0.1 means other processes compete with the benchmark.
        "load_average_at_start": load_average(),
        "ulimit_nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[1],
        "versions": versions(),
        # Which code the gateway and the floor were built from.
        "commit": git_describe(),
    }


def git_describe():
    done = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or None
