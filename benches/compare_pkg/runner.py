"""One run of a closed-loop scenario (slow-upstream, proxy-overhead, file,
hello): start a variant's servers, probe, warm up, load it at each
connection count with wrk, oha or h2load while /proc is sampled, and stop
everything; with --repeat the run with the most 2xx responses per second is
kept. Also the row every report is made of, and the Settings of a run."""

from __future__ import annotations

import time
from dataclasses import dataclass

from .common import (
    KIND_CEILING,
    KIND_GATEWAY,
    OVERHEAD_S,
    POOL,
    RUN_DIR,
    fmt_duration,
    fmt_ms,
    fmt_number,
    fmt_rate,
    free_port,
    log,
)
from .loadtools import LoadTool
from .machine import Pinning
from .procfs import PeakRss, cpu_times
from .model import RateScenario
from .servers import Ctx, hyper_floor, probe, read_count, service_a, start_all, stop_all


@dataclass
class Settings:
    tool: LoadTool
    pinning: Pinning
    service_a: str
    duration_s: float | None
    connections: list | None
    warmup_s: float
    # --warmup-connections: overrides the scenario's (and the run's) count.
    warmup_connections: int | None
    repeat: int
    quick: bool
    gateway_error: str | None
    machine: dict

    def duration_for(self, scenario):
        if self.duration_s:
            return self.duration_s
        return scenario.quick_duration_s if self.quick else scenario.duration_s

    def connections_for(self, scenario):
        return self.connections or scenario.connections

    def estimate_s(self, scenario):
        if isinstance(scenario, RateScenario):
            # Warm-up, the run, and the answers still due after it (at most 2 s).
            return self.repeat * (OVERHEAD_S + self.warmup_s + self.duration_for(scenario) + 2)
        per_load = self.warmup_s + (scenario.delay_s or 0) + self.duration_for(scenario)
        return self.repeat * (OVERHEAD_S + per_load * len(self.connections_for(scenario)))


def failed_rows(scenario, variant, settings, error):
    if variant.requires:
        error = f"{error}; {variant.requires}"
    return [new_row(variant, c, error=error) for c in settings.connections_for(scenario)]


def new_row(variant, connections, error=None, server_command=None):
    return {
        "variant": variant.name,
        "kind": variant.kind,
        "about": variant.about,
        "connections": connections,
        "status": "failed" if error else "ok",
        "error": error,
        "server_command": server_command,
    }


def needs_gateway(scenario, variant, settings):
    uses_gateway = variant.kind == KIND_GATEWAY or variant.server is hyper_floor
    return uses_gateway or (scenario.a_delay is not None and settings.service_a == "gateway")


def run_variant(scenario, variant, settings):
    """Starts the variant's servers once and loads it at each connection count."""
    if settings.gateway_error and needs_gateway(scenario, variant, settings):
        return failed_rows(scenario, variant, settings, settings.gateway_error)
    if scenario.keys and not settings.tool.cycles_urls:
        error = f"{scenario.name} cycles through {scenario.keys} URLs, which only wrk does here (--tool wrk)"
        log(f"    failed: {error}")
        return failed_rows(scenario, variant, settings, error)
    pool = max(POOL, *settings.connections_for(scenario))
    ctx = Ctx(scenario, free_port(), free_port(), settings.pinning, settings.service_a, pool=pool)
    try:
        procs = [service_a(ctx)] if scenario.a_delay is not None else []
        if variant.server:
            built = variant.server(ctx)
            procs += built if isinstance(built, list) else [built]
    except RuntimeError as err:
        log(f"    failed: {err}")
        return failed_rows(scenario, variant, settings, str(err))
    running, error = start_all(procs, RUN_DIR / "logs" / f"{scenario.name}-{variant.name}")
    if error:
        return failed_rows(scenario, variant, settings, error)
    try:
        under_test, port = running[-1], procs[-1].port
        url = f"http://127.0.0.1:{port}{variant.path}"
        error = probe(url)
        if error:
            log(f"    failed: {error}")
            return failed_rows(scenario, variant, settings, error)
        command = procs[-1].command_line()
        count_url = ctx.count_url if scenario.keys else None
        return [
            measure(scenario, variant, settings, url, c, under_test, command, count_url)
            for c in settings.connections_for(scenario)
        ]
    finally:
        stop_all(running)


def measure(scenario, variant, settings, url, connections, under_test, command, count_url=None):
    """Warms up, then runs the load once; returns the row. With count_url
    (service A's /-/count), also the requests that reached service A
    during the run, per second."""
    tool, cpu, keys = settings.tool, settings.pinning.load, scenario.keys
    try:
        warm = settings.warmup_connections or min(connections, scenario.warmup_connections or connections)
        tool.run(url, warm, settings.warmup_s, cpu, keys)
        # Let requests still in flight from the warm-up finish.
        time.sleep(scenario.delay_s or 0.2)
        counted = upstream_counter(count_url)
        result, cpu, peak_rss = load_with_accounting(
            tool, url, connections, settings.duration_for(scenario), cpu, under_test.pid, keys
        )
        upstream = counted()
    except (RuntimeError, OSError, ValueError) as err:
        log(f"    load failed: {err}")
        return new_row(variant, connections, error=str(err), server_command=command)
    row = new_row(variant, connections, server_command=command)
    row.update(result_fields(result, cpu, peak_rss))
    if upstream:
        row["upstream_requests"], row["upstream_window_s"] = upstream
        row["upstream_rps"] = upstream[0] / upstream[1]
    log(
        f"    c={connections}: {fmt_rate(row['rps'])} req/s, p50 {fmt_ms(row['p50_ms'])}, "
        f"p99 {fmt_ms(row['p99_ms'])}, timeouts {row['timeouts']}, socket errors {row['socket_errors']}, "
        f"non-2xx {row['non_2xx']}, {fmt_number(row['cpu_ms_per_1k'])} CPU-ms/1k "
        f"(user {fmt_number(row['user_ms_per_1k'])}, system {fmt_number(row['sys_ms_per_1k'])}), "
        f"{fmt_number(row['peak_rss_mib'])} MiB"
        + (f", upstream {fmt_rate(row['upstream_rps'])} req/s" if upstream else "")
    )
    return row


def upstream_counter(count_url):
    """Reads service A's count now; returns a function that gives (requests
    since, seconds since), or None when there is nothing to count."""
    if not count_url:
        return lambda: None
    before, started = read_count(count_url), time.monotonic()

    def since():
        return read_count(count_url) - before, time.monotonic() - started

    return since


def load_with_accounting(tool, url, connections, duration_s, cpu, server_pid, keys=None):
    """Runs the load; returns (result, server (user, system) CPU seconds,
    server peak RSS bytes)."""
    cpu_before = cpu_times(server_pid)
    sampler = PeakRss(server_pid)
    sampler.start()
    try:
        result = tool.run(url, connections, duration_s, cpu, keys)
    finally:
        peak_rss = sampler.stop()
    cpu_after = cpu_times(server_pid)
    return result, (cpu_after[0] - cpu_before[0], cpu_after[1] - cpu_before[1]), peak_rss


def result_fields(result, cpu, peak_rss):
    answered = result.requests > 0
    per_1k = lambda s: s * 1000 / result.requests * 1000 if answered else None  # noqa: E731
    return {
        "requests": result.requests,
        "duration_s": round(result.duration_s, 3),
        "rps": (result.requests - result.non_2xx) / result.duration_s,
        "all_rps": result.requests / result.duration_s,
        "p50_ms": result.p50_ms if answered else None,
        "p99_ms": result.p99_ms if answered else None,
        "timeouts": result.timeouts,
        "socket_errors": result.socket_errors,
        "non_2xx": result.non_2xx,
        "cpu_ms_per_1k": per_1k(cpu[0] + cpu[1]),
        # Of it, the server's own code and the kernel's work for it.
        "user_ms_per_1k": per_1k(cpu[0]),
        "sys_ms_per_1k": per_1k(cpu[1]),
        "peak_rss_mib": peak_rss / 2**20,
    }


def best_rows(attempts):
    """Per connection count, the run with the most 2xx req/s."""
    best = {}
    for rows in attempts:
        for row in rows:
            key = row["connections"]
            if key not in best or (row.get("rps") or -1) > (best[key].get("rps") or -1):
                best[key] = row
    return list(best.values())


def add_ratios(scenario, rows):
    direct = {r["connections"]: r.get("rps") for r in rows if r["kind"] == KIND_CEILING}
    for row in rows:
        rps = row.get("rps")
        if rps is None:
            continue
        if direct.get(row["connections"]):
            row["ratio_to_direct"] = rps / direct[row["connections"]]
        # With a cache in front of A (keys), connections / delay bounds nothing.
        if scenario.delay_s and not scenario.keys:
            row["ratio_to_limit"] = rps / (row["connections"] / scenario.delay_s)


def run_scenario(scenario, variants, settings, left):
    """Every variant, each --repeat times with the best run kept. Returns
    (rows, seconds left, variants that failed)."""
    rows, failures = [], 0
    for i, variant in enumerate(variants, 1):
        log(
            f"\n[{scenario.name} {i}/{len(variants)}] {variant.name} ({variant.kind}): "
            f"c={','.join(map(str, settings.connections_for(scenario)))}, "
            f"{settings.duration_for(scenario):g}s x{settings.repeat}; about {fmt_duration(left)} left"
        )
        attempts = [run_variant(scenario, variant, settings) for _ in range(settings.repeat)]
        variant_rows = best_rows(attempts)
        failures += any(r["status"] != "ok" for r in variant_rows)
        rows.extend(variant_rows)
        left -= settings.estimate_s(scenario)
    add_ratios(scenario, rows)
    return rows, left, failures
