"""The command line of benches/compare: which scenarios and variants to run
(--list prints them), setting the machine and the tools up (see prereqs),
running every variant and printing the tables at the end."""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import os
import sys

from .common import BACKLOG, POOL, RESULTS, ROOT, RUN_DIR, TIMEOUT_S, log, parse_seconds, somaxconn
from .loadtools import TOOLS
from .machine import choose_pinning, machine_info, raise_fd_limit, warn_if_busy
from .openloop import run_rate_scenario
from .prereqs import CARGO_PEERS, gateway_has_upstream, install_or_report, set_up
from .report import markdown_table, rate_table, write_rate_results, write_results
from .runner import Settings, run_scenario
from .model import RateScenario
from .scenarios import SCENARIOS

# The first line of benches/compare's docstring, as --help prints it.
DESCRIPTION = (
    "Load benchmark of the gateway against the Python, Go, Node.js, nginx, HAProxy, Caddy, Traefik and Pingora peers."
)


def selected(names, available, what):
    unknown = [n for n in names if not any(fnmatch.fnmatch(a, n) for a in available)]
    if unknown:
        sys.exit(f"unknown {what}: {', '.join(unknown)} (known: {', '.join(available)})")
    return [a for a in available if any(fnmatch.fnmatch(a, n) for n in names)]


def plan(args):
    """[(scenario, [variants])] for the chosen scenarios and variant filter."""
    names = args.scenarios.split(",") if args.scenarios else [n for n, s in SCENARIOS.items() if s.in_default]
    work = []
    for name in selected(names, list(SCENARIOS), "scenario"):
        scenario = SCENARIOS[name]
        quick = scenario.quick_variants if args.quick else None
        variants = [v for v in scenario.variants if quick is None or v.name in quick]
        if args.variants:
            patterns = args.variants.split(",")
            variants = [v for v in variants if any(fnmatch.fnmatch(v.name, p) for p in patterns)]
        if variants:
            work.append((scenario, variants))
    if not work:
        sys.exit("no variant matches")
    return work


def choose_service_a(requested, gateway_error):
    if requested != "auto":
        return requested
    if gateway_error is None and gateway_has_upstream():
        return "gateway"
    log("service A: the gateway's `upstream` is not available, using the Go service A")
    return "go"


def parse_args():
    parser = argparse.ArgumentParser(
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--scenarios",
        help=f"comma-separated, of: {', '.join(SCENARIOS)} "
        f"(default: all but {', '.join(n for n, s in SCENARIOS.items() if not s.in_default)})",
    )
    parser.add_argument("--variants", help="comma-separated variant names or globs, e.g. gateway,nginx,sanic-*")
    parser.add_argument("--duration", type=parse_seconds, help="seconds per run (default: 30 slow-upstream, 15 others)")
    parser.add_argument("--connections", help="comma-separated connection counts (default: per scenario)")
    parser.add_argument("--quick", action="store_true", help="short runs of a reduced variant set (< 5 min)")
    parser.add_argument("--tool", choices=list(TOOLS), default="wrk", help="load tool (default: wrk)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per variant, the better one is kept")
    parser.add_argument("--warmup", type=parse_seconds, help="warm-up seconds (default: 2, 1 with --quick)")
    parser.add_argument(
        "--warmup-connections",
        type=int,
        help="warm-up connections (default: the run's, or the scenario's few: 10 in slow-upstream)",
    )
    parser.add_argument(
        "--service-a",
        choices=["auto", "gateway", "go"],
        default="auto",
        help="the upstream: `gateway upstream` or the Go one (default: gateway if built)",
    )
    parser.add_argument("--no-build", action="store_true", help="use target/release/gateway as it is")
    parser.add_argument(
        "--install",
        action="store_true",
        help="install what is missing (apt-get, the Python peers' and Caddy/Traefik's venvs, cargo install oha); "
        "without it, the run stops and prints the commands",
    )
    parser.add_argument("--list", action="store_true", help="list the scenarios and variants, then exit")
    return parser.parse_args()


def print_settings(settings, fd_limit):
    log(f"pinning: {settings.pinning.describe()}")
    log(
        f"listen backlog {BACKLOG} for every peer (uvicorn/Sanic/aiohttp/werkzeug/Node/nginx set explicitly; "
        f"Go listens with net.core.somaxconn = {somaxconn()}; the gateway binds with 4096 itself)"
    )
    log(
        f"pools: {POOL} connections (or the run's largest connection count, if larger) where a variant pools "
        f"(nginx keepalive, HAProxy server maxconn, Caddy keepalive_idle_conns_per_host, Traefik and Go MaxIdleConnsPerHost, Pingora upstream_keepalive_pool_size, aiohttp/httpx shared clients, gateway pool_max_idle_per_host); "
        f"article variants keep library defaults"
    )
    log(f"load tool: {settings.tool.name}, one thread, request timeout {TIMEOUT_S}s; open files limit {fd_limit}")
    log(f"service A: {settings.service_a}")


def list_variants(work):
    for scenario, variants in work:
        if isinstance(scenario, RateScenario):
            log(f"{scenario.name}: {scenario.title}; {scenario.describe()}")
        else:
            log(f"{scenario.name}: {scenario.title}; c={','.join(map(str, scenario.connections))}")
        for v in variants:
            quick = "quick" if scenario.quick_variants is None or v.name in scenario.quick_variants else ""
            log(f"  {v.name:<22} {v.kind:<16} {quick:<6} {v.about}")


def main():
    args = parse_args()
    work = plan(args)
    if args.list:
        list_variants(work)
        return 0
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    planned = [v for _, variants in work for v in variants]
    programs = {program: package for v in planned for program, package in v.programs.items()}
    venvs = {v.server.venv for v in planned if getattr(v.server, "venv", None)}
    cargo_peers = {v.server.cargo for v in planned if getattr(v.server, "cargo", None)}
    if not args.no_build:
        programs.update(p for name in cargo_peers for p in CARGO_PEERS[name].programs.items())
    install_or_report(args.tool, args.install, programs, venvs)
    RUN_DIR.joinpath("logs").mkdir(parents=True, exist_ok=True)
    gateway_error = set_up(args, cargo_peers)
    if gateway_error:
        log(f"gateway unavailable: {gateway_error}; its variants will be reported as failed")
    fd_limit = raise_fd_limit()
    settings = make_settings(args, gateway_error)
    os.sched_setaffinity(0, {settings.pinning.load})
    print_settings(settings, fd_limit)
    warn_if_busy(settings.machine)
    failures = run_all(work, settings, started)
    if failures:
        log(f"\n{failures} variant(s) failed: see the tables above")
    return 1 if failures else 0


def make_settings(args, gateway_error):
    return Settings(
        tool=TOOLS[args.tool],
        pinning=choose_pinning(),
        service_a=choose_service_a(args.service_a, gateway_error),
        duration_s=args.duration,
        connections=[int(c) for c in args.connections.split(",")] if args.connections else None,
        warmup_s=args.warmup if args.warmup is not None else (1 if args.quick else 2),
        warmup_connections=args.warmup_connections,
        repeat=max(1, args.repeat),
        quick=args.quick,
        gateway_error=gateway_error,
        machine=machine_info(),
    )


def run_all(work, settings, started):
    """Runs every planned variant, prints and writes each scenario's report."""
    left = sum(settings.estimate_s(s) * len(vs) for s, vs in work)
    failures, reports = 0, []
    for scenario, variants in work:
        if isinstance(scenario, RateScenario):
            rows, left = run_rate_scenario(scenario, variants, settings, left)
            failures += sum(r["status"] != "ok" for r in rows)
            write_rate_results(scenario, rows, settings, started)
        else:
            rows, left, failed = run_scenario(scenario, variants, settings, left)
            failures += failed
            write_results(scenario, rows, settings, started)
        reports.append((scenario, rows))
    for scenario, rows in reports:
        log(f"\n### {scenario.name}: {scenario.title}\n")
        log(rate_table(scenario, rows) if isinstance(scenario, RateScenario) else markdown_table(scenario, rows))
    log(f"\npinning: {settings.pinning.describe()}; results in {RESULTS.relative_to(ROOT)}/")
    return failures
