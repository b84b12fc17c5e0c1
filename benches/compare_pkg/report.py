"""What a run leaves: a Markdown table per scenario on stdout, and
benches/results/<scenario>.json (the settings, the machine and every row)
beside the chart that the svg module draws."""

from __future__ import annotations

import json
import sys

from .common import BACKLOG, POOL, RESULTS, fmt_ms, fmt_number, fmt_rate, fmt_share
from .scenarios import GOODPUT_TARGET, OVERLOAD_QUEUE_TIMEOUT_S, OVERLOAD_SERVICE_MS, REJECTION_TARGET_MS
from .svg import svg_chart, svg_failover, svg_overload


RATIO_KEYS = {"vs direct": "ratio_to_direct", "vs limit": "ratio_to_limit"}


def markdown_table(scenario, rows):
    ratios = [name for name, key in RATIO_KEYS.items() if any(key in r for r in rows)]
    # slow-upstream-cached: the requests that reached service A.
    upstream = ["upstream req/s"] if any("upstream_rps" in r for r in rows) else []
    head = [
        "variant",
        "kind",
        "c",
        "req/s (2xx)",
        *ratios,
        "p50",
        "p99",
        *upstream,
        "timeouts",
        "socket errors",
        "non-2xx",
        "CPU-ms / 1k req",
        "peak RSS MiB",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r["status"] != "ok":
            cells = [r["variant"], r["kind"], r["connections"], f"failed: {r['error']}"] + [""] * (len(head) - 4)
        else:
            cells = [
                r["variant"],
                r["kind"],
                r["connections"],
                fmt_rate(r["rps"]),
                *(fmt_ratio(r.get(RATIO_KEYS[name])) for name in ratios),
                fmt_ms(r["p50_ms"]),
                fmt_ms(r["p99_ms"]),
                *([fmt_rate(r.get("upstream_rps"))] if upstream else []),
                r["timeouts"],
                r["socket_errors"],
                r["non_2xx"],
                fmt_number(r["cpu_ms_per_1k"]),
                fmt_number(r["peak_rss_mib"]),
            ]
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)


def fmt_ratio(value):
    return "-" if value is None else f"{value:.3f}"


def fmt_yes(value):
    return "-" if value is None else "yes" if value else "**no**"


def rate_table(scenario, rows):
    if scenario.kill_at is not None:
        head = [
            "variant", "run", "2xx/s", "errors", "error share", "first / last error after kill",
            "outcomes", "served p50", "served p99", "slowest answer", "gateway counters",
        ]
    else:
        head = [
            "variant", "run", "offered/s", "goodput 2xx/s", "vs capacity", "served p50", "served p99",
            "served max", "rejected", "slowest rejection", "slowest answer", "outcomes",
            *scenario_targets_short(),
        ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r["status"] != "ok":
            cells = [r["variant"], r["run"], f"failed: {r['error']}"] + [""] * (len(head) - 3)
        elif scenario.kill_at is not None:
            counters = r.get("gateway_counters") or {}
            cells = [
                r["variant"],
                r["run"],
                fmt_rate(r["goodput_rps"]),
                r["errors"],
                fmt_share(r["error_share"]),
                f"{fmt_ms(r['first_error_ms'])} / {fmt_ms(r['last_error_ms'])}" if r["errors"] else "-",
                fmt_outcomes(r["outcomes"]),
                fmt_ms(r["served_p50_ms"]),
                fmt_ms(r["served_p99_ms"]),
                fmt_ms(r["max_ms"]),
                ", ".join(f"{short_counter(k)} {v:g}" for k, v in counters.items()) or "-",
            ]
        else:
            cells = [
                r["variant"],
                r["run"],
                fmt_rate(r["offered_rps"]),
                fmt_rate(r["goodput_rps"]),
                f"{r['goodput_vs_capacity']:.3f}",
                fmt_ms(r["served_p50_ms"]),
                fmt_ms(r["served_p99_ms"]),
                fmt_ms(r["served_max_ms"]),
                fmt_share(r["rejected_share"]),
                fmt_ms(r["rejected_max_ms"]),
                fmt_ms(r["max_ms"]),
                fmt_outcomes(r["outcomes"]),
                *(fmt_yes(ok) for ok in r["targets"].values()),
            ]
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)


def scenario_targets_short():
    bound = OVERLOAD_QUEUE_TIMEOUT_S + OVERLOAD_SERVICE_MS / 1000
    return [f">= {GOODPUT_TARGET} x cap", f"served <= {bound:g} s", f"rejections < {REJECTION_TARGET_MS} ms"]


def fmt_outcomes(outcomes):
    return ", ".join(f"{label}: {n}" for label, n in outcomes.items())


def short_counter(line):
    """gateway_upstream_retries_total{upstream="a"} -> retries."""
    name, _, labels = line.partition("{")
    name = name.removeprefix("gateway_upstream_").removeprefix("gateway_").removesuffix("_total")
    extra = [part.split("=", 1)[1].strip('"}') for part in labels.split(",") if part.startswith(("reason", "kind"))]
    return name + (f" ({', '.join(extra)})" if extra else "")


def write_results(scenario, rows, settings, started):
    duration = settings.duration_for(scenario)
    connections = ",".join(map(str, settings.connections_for(scenario)))
    upstream = f"; service A: {settings.service_a}, delay {scenario.a_delay}" if scenario.a_delay else ""
    if scenario.a_cache_control:
        upstream += f", Cache-Control: {scenario.a_cache_control}"
    if scenario.keys:
        upstream += f"; {scenario.keys} URLs"
    quick = " (--quick)" if settings.quick else ""
    subtitles = [
        (
            f"{settings.tool.name}, c={connections}, {duration:g} s per run{quick}, best of {settings.repeat}{upstream}; "
            "bars: 2xx req/s"
        ),
        f"{settings.pinning.describe()}; {started}",
    ]
    report = {
        **report_head(scenario, settings, started),
        "tool": settings.tool.name,
        "duration_s": duration,
        "repeat": settings.repeat,
        "warmup_s": settings.warmup_s,
        "warmup_connections": settings.warmup_connections,
        "pinning": vars(settings.pinning),
        "backlog": BACKLOG,
        "pool": max(POOL, *settings.connections_for(scenario)),
        "service_a": settings.service_a if scenario.a_delay is not None else None,
        "upstream_delay": scenario.a_delay,
        "upstream_cache_control": scenario.a_cache_control,
        "keys": scenario.keys,
        "machine": settings.machine,
        "rows": rows,
    }
    save(scenario, report, svg_chart(scenario, rows, subtitles))


def write_rate_results(scenario, rows, settings, started):
    duration = settings.duration_for(scenario)
    quick = " (--quick)" if settings.quick else ""
    what = (
        f"SIGKILL to service-a1 after {scenario.kill_at * duration:g} s"
        if scenario.kill_at is not None
        else f"figures over the requests due after {scenario.settle_s:g} s"
    )
    subtitles = [
        f"{scenario.describe()}; {duration:g} s per run{quick}, {settings.repeat} run(s) each; {what}",
        f"{settings.pinning.describe()}; {started}",
    ]
    report = {
        **report_head(scenario, settings, started),
        "tool": "benchpeers load (open loop, fixed arrival rate)",
        "duration_s": duration,
        "warmup_s": settings.warmup_s,
        "repeat": settings.repeat,
        "rate": scenario.rate,
        "service_a": {
            "processes": scenario.endpoints,
            "workers": scenario.workers,
            "service_ms": scenario.service_ms,
            "capacity_rps_each": scenario.capacity,
        },
        "settle_s": scenario.settle_s,
        "kill_at_s": scenario.kill_at * duration if scenario.kill_at is not None else None,
        "client_timeout_s": scenario.client_timeout_s,
        "pinning": vars(settings.pinning),
        "backlog": BACKLOG,
        "pool": POOL,
        "machine": settings.machine,
        "rows": rows,
    }
    draw = svg_failover if scenario.kill_at is not None else svg_overload
    save(scenario, report, draw(scenario, rows, subtitles))


def report_head(scenario, settings, started):
    """The first keys of every scenario's JSON."""
    return {
        "scenario": scenario.name,
        "title": scenario.title,
        "date": started,
        "command": " ".join(sys.argv),
        "quick": settings.quick,
    }


def save(scenario, report, svg):
    """Writes benches/results/<scenario>.json and .svg."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{scenario.name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (RESULTS / f"{scenario.name}.svg").write_text(svg)
