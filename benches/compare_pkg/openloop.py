"""The overload and failover runs. They ask what a proxy does for a slow
service with a fixed number of workers, rather than how fast it is: service A
serves `workers` requests at once, `service_ms` each, and keeps every other
request waiting inside it (a gunicorn app's shape); the load arrives at a
fixed rate whatever the answers take (`benchpeers load`, open loop: wrk and
oha only send on a connection once its previous request is answered, so a
server that slows down is offered less). Every request gets one line in a
log, from which the figures below are computed: per status, so that the
latency of the requests that were served is not mixed with that of the
ones turned away."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass

from .common import (
    GO_BIN,
    KIND_GATEWAY,
    ROOT,
    RUN_DIR,
    fmt_duration,
    fmt_ms,
    fmt_rate,
    fmt_share,
    free_port,
    log,
)
from .procfs import PeakRss, cpu_seconds
from .runner import new_row
from .scenarios import GOODPUT_TARGET, OVERLOAD_QUEUE_TIMEOUT_S, REJECTION_TARGET_MS
from .servers import NO_PROXY, Ctx, probe, start_all, stop_all, workers_service_a


@dataclass
class Outcome:
    """One request of `benchpeers load`: when it was due (s from the start),
    how long its answer took (ms), its status (0: no full answer) and error,
    and how late the generator handed it to its HTTP client (ms)."""

    sent_s: float
    latency_ms: float
    status: int
    error: str
    lag_ms: float

    @property
    def ok(self):
        return 200 <= self.status < 300

    @property
    def answered_s(self):
        return self.sent_s + self.latency_ms / 1000

    @property
    def label(self):
        return str(self.status) if self.status else self.error


def read_load_log(path):
    """(start in Unix ns, [Outcome]) from a `benchpeers load` log."""
    head, *lines = path.read_text().splitlines()
    header = dict(item.split("=", 1) for item in head.lstrip("# ").split())
    outcomes = []
    for line in lines:
        sent_us, latency_us, status, error, lag_us = line.split("\t")
        outcomes.append(Outcome(int(sent_us) / 1e6, int(latency_us) / 1000, int(status), error, int(lag_us) / 1000))
    return int(header["start_unix_ns"]), outcomes


def run_open_loop(scenario, url, rate, duration_s, cpu, log_path, kill=None):
    """Runs `benchpeers load`; with kill = (seconds, Running), SIGKILLs that
    server's process group that long after the start. Returns (start Unix ns,
    outcomes, kill Unix ns or None)."""
    argv = [GO_BIN, "load", "-url", url, "-rate", f"{rate:g}", "-duration", f"{duration_s:g}s"]
    argv += ["-timeout", f"{scenario.client_timeout_s:g}s", "-out", log_path]
    log_path.unlink(missing_ok=True)
    killed_ns = None
    with subprocess.Popen(
        ["taskset", "-c", str(cpu), *map(str, argv)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    ) as popen:
        try:
            if kill:
                after_s, victim = kill
                time.sleep(after_s)
                killed_ns = time.time_ns()
                victim.signal_group(signal.SIGKILL)
            output, _ = popen.communicate(timeout=duration_s + scenario.client_timeout_s + 30)
        except subprocess.TimeoutExpired:
            os.killpg(popen.pid, signal.SIGKILL)
            raise RuntimeError("benchpeers load did not finish") from None
    if popen.returncode != 0 or not log_path.exists():
        raise RuntimeError(f"benchpeers load failed ({popen.returncode}): {output[-500:]}")
    start_ns, outcomes = read_load_log(log_path)
    return start_ns, outcomes, killed_ns


def nearest_rank(sorted_values, percent):
    if not sorted_values:
        return None
    return sorted_values[max(0, math.ceil(len(sorted_values) * percent / 100) - 1)]


def latency_summary(outcomes, prefix):
    values = sorted(o.latency_ms for o in outcomes)
    return {
        f"{prefix}_p50_ms": nearest_rank(values, 50),
        f"{prefix}_p99_ms": nearest_rank(values, 99),
        f"{prefix}_max_ms": values[-1] if values else None,
    }


def generator_lag(outcomes):
    """How late the load generator itself was: part of every latency above."""
    lags = sorted(o.lag_ms for o in outcomes)
    return {"generator_lag_p99_ms": nearest_rank(lags, 99), "generator_lag_max_ms": lags[-1] if lags else None}


def outcome_counts(outcomes):
    counts = {}
    for o in outcomes:
        counts[o.label] = counts.get(o.label, 0) + 1
    return dict(sorted(counts.items()))


def overload_fields(scenario, outcomes, duration_s):
    """Goodput, served and rejected latency, over the requests due after the
    settling time."""
    settle_s = min(scenario.settle_s, duration_s / 4)
    window_s = duration_s - settle_s
    counted = [o for o in outcomes if o.sent_s >= settle_s]
    served = [o for o in counted if o.ok]
    rejected = [o for o in counted if not o.ok]
    goodput = len(served) / window_s
    fields = {
        "settle_s": settle_s,
        "window_s": window_s,
        "sent": len(counted),
        "offered_rps": len(counted) / window_s,
        "goodput_rps": goodput,
        "capacity_rps": scenario.capacity,
        "goodput_vs_capacity": goodput / scenario.capacity,
        **latency_summary(served, "served"),
        "rejected": len(rejected),
        "rejected_share": len(rejected) / len(counted) if counted else None,
        **latency_summary(rejected, "rejected"),
        # The slowest rejection less the generator's own lag in sending it.
        "rejected_max_less_lag_ms": max((o.latency_ms - o.lag_ms for o in rejected), default=None),
        "max_ms": max((o.latency_ms for o in counted), default=None),
        **generator_lag(counted),
        "outcomes": outcome_counts(counted),
        "outcomes_whole_run": outcome_counts(outcomes),
    }
    bound_ms = OVERLOAD_QUEUE_TIMEOUT_S * 1000 + scenario.service_ms
    # None: nothing to check (no request served, or none rejected).
    fields["targets"] = {
        f"goodput >= {GOODPUT_TARGET} x capacity": fields["goodput_vs_capacity"] >= GOODPUT_TARGET,
        f"served <= queue_timeout + service time ({bound_ms:g} ms)": (
            None if not served else fields["served_max_ms"] <= bound_ms
        ),
        f"every rejection < {REJECTION_TARGET_MS} ms": (
            None if not rejected else fields["rejected_max_ms"] < REJECTION_TARGET_MS
        ),
    }
    return fields


def failover_fields(outcomes, duration_s, start_ns, killed_ns):
    """Errors the clients saw, and when, relative to the kill."""
    kill_s = (killed_ns - start_ns) / 1e9
    served = [o for o in outcomes if o.ok]
    failed = [o for o in outcomes if not o.ok]
    after_kill = [o for o in served if o.answered_s >= kill_s]
    since_kill_ms = [(o.answered_s - kill_s) * 1000 for o in failed]
    return {
        "sent": len(outcomes),
        "offered_rps": len(outcomes) / duration_s,
        "goodput_rps": len(served) / duration_s,
        "kill_at_s": kill_s,
        "errors": len(failed),
        "error_share": len(failed) / len(outcomes) if outcomes else None,
        "errors_before_kill": sum(1 for ms in since_kill_ms if ms < 0),
        # When the failed answers came, from the kill.
        "first_error_ms": min(since_kill_ms, default=None),
        "last_error_ms": max(since_kill_ms, default=None),
        "error_times_ms": [round(ms, 1) for ms in sorted(since_kill_ms)],
        **latency_summary(served, "served"),
        **latency_summary(after_kill, "served_after_kill"),
        "max_ms": max((o.latency_ms for o in outcomes), default=None),
        **generator_lag(outcomes),
        "outcomes": outcome_counts(outcomes),
    }


GATEWAY_COUNTERS = (
    "gateway_upstream_retries_total",
    "gateway_upstream_retries_skipped_total",
    "gateway_upstream_ejections_total",
    "gateway_rejected_total",
    "gateway_upstream_errors_total",
)


def gateway_metrics(port):
    """The gateway's own account of the run, from /metrics: its counters of
    what it did, and per status the histogram bucket that holds all its
    answers (time from the request's arrival to the response head, as the
    gateway measured it): (counters, {status: [count, all within s]})."""
    try:
        with NO_PROXY.open(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except Exception as err:  # noqa: BLE001 - reported in the row
        return {"error": str(err)}, {}
    counters, buckets = {}, {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if line.startswith(GATEWAY_COUNTERS) and float(value):
            counters[name] = float(value)
        elif line.startswith('http_server_request_duration_seconds_bucket{route="b"'):
            status = re.search(r'status="(\w+)"', name).group(1)
            le = re.search(r'le="([^"]+)"', name).group(1)
            buckets.setdefault(status, []).append((float(le), float(value)))
    within = {}
    for status, points in buckets.items():
        total = max(count for _, count in points)
        within[status] = [total, min(le for le, count in points if count == total)]
    return dict(sorted(counters.items())), dict(sorted(within.items()))


def run_rate_variant(scenario, variant, settings, run):
    """Starts service A and the variant, warms up below capacity, runs the
    open-loop load (killing service A's first process mid-run in failover),
    and returns the row."""
    row = {**new_row(variant, None), "run": run}
    if settings.gateway_error and variant.kind == KIND_GATEWAY:
        return {**row, "status": "failed", "error": settings.gateway_error}
    a_ports = [free_port() for _ in range(scenario.endpoints)]
    ctx = Ctx(scenario, free_port(), a_ports[0], settings.pinning, "go", a_ports=a_ports)
    procs = [workers_service_a(scenario, settings.pinning, i, port) for i, port in enumerate(a_ports)]
    procs.append(variant.server(ctx))
    running, error = start_all(procs, RUN_DIR / "logs" / f"{scenario.name}-{variant.name}")
    if error:
        return {**row, "status": "failed", "error": error}
    under_test, server = running[-1], procs[-1]
    row["server_command"] = server.command_line()
    if server.config:
        row["server_config"] = server.config.read_text()
    url = f"http://127.0.0.1:{server.port}{variant.path}"
    duration_s, cpu = settings.duration_for(scenario), settings.pinning.load
    log_path = RUN_DIR / f"load-{scenario.name}-{variant.name}-{run}.tsv"
    try:
        error = probe(url)
        if error:
            log(f"    failed: {error}")
            return {**row, "status": "failed", "error": error}
        # Below capacity, so that nothing is queued when the run starts.
        warm_rate = min(scenario.rate, scenario.capacity * scenario.endpoints / 2)
        run_open_loop(scenario, url, warm_rate, settings.warmup_s, cpu, log_path)
        time.sleep(3 * scenario.service_ms / 1000 + 0.3)
        kill = (scenario.kill_at * duration_s, running[0]) if scenario.kill_at is not None else None
        cpu_before = cpu_seconds(under_test.pid)
        sampler = PeakRss(under_test.pid)
        sampler.start()
        try:
            start_ns, outcomes, killed_ns = run_open_loop(scenario, url, scenario.rate, duration_s, cpu, log_path, kill)
        finally:
            peak_rss = sampler.stop()
        cpu_s = cpu_seconds(under_test.pid) - cpu_before
        if variant.kind == KIND_GATEWAY:
            row["gateway_counters"], row["gateway_durations"] = gateway_metrics(server.port)
    except RuntimeError as err:
        log(f"    load failed: {err}")
        return {**row, "status": "failed", "error": str(err)}
    finally:
        stop_all(running)
    if killed_ns is not None:
        row.update(failover_fields(outcomes, duration_s, start_ns, killed_ns))
    else:
        row.update(overload_fields(scenario, outcomes, duration_s))
    row["load_log"] = str(log_path.relative_to(ROOT))
    row["cpu_ms_per_1k"] = cpu_s * 1e6 / len(outcomes) if outcomes else None
    row["peak_rss_mib"] = peak_rss / 2**20
    log("    " + rate_row_summary(row))
    return row


def rate_row_summary(row):
    if "errors" in row:
        return (
            f"{fmt_rate(row['goodput_rps'])} 2xx/s, {row['errors']} errors ({fmt_share(row['error_share'])}), "
            f"last {fmt_ms(row['last_error_ms'])} after the kill; {row['outcomes']}; "
            f"served p99 {fmt_ms(row['served_p99_ms'])}, max {fmt_ms(row['max_ms'])}; "
            f"generator lag max {fmt_ms(row['generator_lag_max_ms'])}"
        )
    return (
        f"offered {fmt_rate(row['offered_rps'])}/s, goodput {fmt_rate(row['goodput_rps'])} 2xx/s "
        f"({row['goodput_vs_capacity']:.3f} x capacity), served p50 {fmt_ms(row['served_p50_ms'])} "
        f"p99 {fmt_ms(row['served_p99_ms'])} max {fmt_ms(row['served_max_ms'])}, rejected "
        f"{fmt_share(row['rejected_share'])} (p99 {fmt_ms(row['rejected_p99_ms'])}, slowest "
        f"{fmt_ms(row['rejected_max_ms'])}); {row['outcomes']}; generator lag max {fmt_ms(row['generator_lag_max_ms'])}"
    )


def run_rate_scenario(scenario, variants, settings, left):
    """Every variant once, then all of them again (--repeat): each run is a
    row, so the spread shows. Returns (rows, seconds left)."""
    log(
        f"\n{scenario.name}: {scenario.describe()}; load: benchpeers load on CPU {settings.pinning.load}, "
        f"service A: benchpeers service-a on CPU {settings.pinning.upstream} (--tool, --connections and "
        "--service-a do not apply here)"
    )
    rows = []
    for run in range(1, settings.repeat + 1):
        for i, variant in enumerate(variants, 1):
            log(
                f"\n[{scenario.name} {i}/{len(variants)}, run {run}/{settings.repeat}] {variant.name} ({variant.kind}): "
                f"{variant.about}; {scenario.rate:g} req/s for {settings.duration_for(scenario):g}s; "
                f"about {fmt_duration(left)} left"
            )
            rows.append(run_rate_variant(scenario, variant, settings, run))
            left -= settings.estimate_s(scenario) / settings.repeat
    return rows, left
