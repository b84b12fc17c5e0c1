#!/usr/bin/env python3
"""Metric names used by the alert rules and the Grafana dashboard.

Keeps deploy/ from drifting away from what the gateway exports:

    metric_names.py list  FILE...               one used metric name a line
    metric_names.py exprs FILE...               every PromQL expression, one JSON string a line
    metric_names.py check --metrics SCRAPE FILE...
                                                exit 1 unless SCRAPE (a /metrics body)
                                                exports every used metric

FILE is a Prometheus rules file (.yml/.yaml) or a Grafana dashboard (.json).
Standard library only, so it runs before any venv exists. PromQL is not parsed
in full: strings, label matchers, ranges and `by (...)`-style label lists are
cut out, then every identifier that is not a function call, keyword or number
is a metric name. Histogram series (`_bucket`, `_count`, `_sum`) map to the
histogram's base name.
"""

import argparse
import json
import re
import sys

# Series Prometheus makes itself; a gateway never exports them.
SYNTHETIC = {"up", "ALERTS", "ALERTS_FOR_STATE", "scrape_duration_seconds", "scrape_samples_scraped"}

# Metrics the gateway registers only when the event first happens, so a
# healthy run of ops-checks may not see them. Each needs its reason.
OPTIONAL = {
    "gateway_rejected_total": "created on the first rejected request; absent while nothing is shed",
}

KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
    "and", "or", "unless", "atan2", "inf", "nan", "start", "end",
}

HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")

# Grafana variables: $__rate_interval, $route, ${route}, ${route:regex}, [[route]].
GRAFANA_INTERVAL = re.compile(r"\$__(rate_interval|interval|range)\b")
GRAFANA_VAR = re.compile(r"\$\{[^}]*\}|\$\w+|\[\[\w+\]\]")


def rule_expressions(text):
    """`expr:` values of a rules file: plain, quoted, or `|`/`>` block scalars."""
    exprs = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)(?:-\s+)?expr:\s*(.*?)\s*$", lines[i])
        i += 1
        if not m:
            continue
        indent, value = len(m.group(1)), m.group(2)
        if value[:1] in ("|", ">"):
            block = []
            while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
                block.append(lines[i].strip())
                i += 1
            exprs.append(" ".join(block).strip())
        elif value[:1] in ("'", '"'):
            exprs.append(value[1:-1].replace("''", "'") if value[0] == "'" else json.loads(value))
        else:
            exprs.append(value)
    return exprs


def dashboard_expressions(doc):
    """Panel target `expr`s and template variable queries of a dashboard."""
    exprs = []

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                exprs.append(node["expr"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc.get("panels", []))
    for var in doc.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = var.get("query")
        query = query.get("query", "") if isinstance(query, dict) else query or ""
        # label_values(SELECTOR, label) / query_result(EXPR): keep the PromQL part.
        m = re.match(r"^\s*(?:label_values|query_result)\((.*)\)\s*$", query, re.S)
        if m:
            inner = m.group(1)
            if query.lstrip().startswith("label_values"):
                inner = inner.rsplit(",", 1)[0] if "," in inner else ""
            query = inner
        if query.strip():
            exprs.append(query)
    return exprs


def expressions(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith(".json"):
        return dashboard_expressions(json.loads(text))
    return rule_expressions(text)


def for_prometheus(expr):
    """The expression with Grafana variables replaced, ready for /api/v1/query."""
    expr = GRAFANA_INTERVAL.sub("1m", expr)
    return GRAFANA_VAR.sub(".*", expr)


def metric_names(expr):
    """Metric names in one PromQL expression, histogram series as the base name.

    >>> sorted(metric_names('sum by (route, le) (rate(a_seconds_bucket{route=~"x|y", le!="1"}[5m] offset 1h)) / on (route) group_left (kind) b_total * 1e3'))
    ['a_seconds', 'b_total']
    >>> sorted(metric_names('histogram_quantile(0.99, sum without (instance) (rate(c_count[$__rate_interval]))) > bool 0.5 and d:rate5m unless up'))
    ['c', 'd:rate5m', 'up']
    >>> sorted(metric_names('time() - min(process_start_time_seconds{job="gateway", instance=~"$instance"})'))
    ['process_start_time_seconds']
    """
    expr = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`', '""', expr)
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\boffset\s+-?[\w.]+", " ", expr)
    expr = GRAFANA_VAR.sub(" ", GRAFANA_INTERVAL.sub(" ", expr))
    names = set()
    for m in re.finditer(r"(?P<num>\d[\w.]*)|(?P<id>[A-Za-z_:][\w:]*)", expr):
        name = m.group("id")
        if not name or name.lower() in KEYWORDS:
            continue
        if re.match(r"\s*\(", expr[m.end():]):
            continue  # a function or aggregation: rate(, sum(, histogram_quantile(
        names.add(base_name(name))
    return names


def base_name(name):
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def used_metrics(paths):
    used = {}
    for path in paths:
        for expr in expressions(path):
            for name in metric_names(expr):
                used.setdefault(name, set()).add(path)
    return used


def exported_metrics(scrape):
    """Names in a Prometheus text exposition: TYPE lines and sample names."""
    exported = set()
    for line in scrape.splitlines():
        m = re.match(r"^#\s*TYPE\s+(\S+)", line)
        if m:
            exported.add(m.group(1))
        elif line and not line.startswith("#"):
            m = re.match(r"^([A-Za-z_:][\w:]*)", line)
            if m:
                exported.add(m.group(1))
    return exported | {base_name(n) for n in exported}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list").add_argument("files", nargs="+")
    sub.add_parser("exprs").add_argument("files", nargs="+")
    check = sub.add_parser("check")
    check.add_argument("--metrics", required=True, help="file holding a /metrics scrape")
    check.add_argument("files", nargs="+")
    args = parser.parse_args()

    if args.command == "exprs":
        for path in args.files:
            for expr in expressions(path):
                print(json.dumps(for_prometheus(expr)))
        return 0

    used = used_metrics(args.files)
    if args.command == "list":
        for name in sorted(used):
            print(name)
        return 0

    with open(args.metrics, encoding="utf-8") as f:
        exported = exported_metrics(f.read())
    missing = []
    for name in sorted(used):
        if name in SYNTHETIC:
            continue
        found = name in exported or base_name(name) in exported
        if found:
            print(f"ok       {name}")
        elif name in OPTIONAL:
            print(f"optional {name} (absent: {OPTIONAL[name]})")
        else:
            print(f"MISSING  {name} (used in {', '.join(sorted(used[name]))})")
            missing.append(name)
    if missing:
        print(f"{len(missing)} metric(s) used by rules or dashboard are not exported by the gateway", file=sys.stderr)
        return 1
    print(f"all {len(used)} metric names used by rules and dashboard are exported (or listed as synthetic/optional)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
