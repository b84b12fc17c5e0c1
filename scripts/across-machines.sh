#!/usr/bin/env bash
# Across machines: three gateway replicas in front of three app instances,
# each in a network namespace of its own on one bridge, as an edge tier in
# front of a Kubernetes headless Service would be. The gateways find the apps
# by a DNS name (`discover = { dns = "app.test:8000" }`) that a real DNS
# server answers (scripts/zone_dns.py, which reads its zone file again on
# every query, so the script changes the answer as pods would come and go).
#
#   bash scripts/across-machines.sh [GATEWAY_BIN]     (default: target/debug/gateway)
#
# It shows, exiting 1 on any failure:
#   1. every replica spreads requests over all three apps (each app's own
#      GET /-/count, before and after a round through that replica alone);
#   2. an app taken out of the DNS answer gets no new requests from any
#      replica once they have asked again, and no client request fails
#      meanwhile; back in the answer, every replica sends it requests again;
#   3. a config change reaches one replica through a ConfigMap-style `..data`
#      symlink swap and `--watch`: a new route answers, same process, no
#      request failed meanwhile;
#   4. an app killed while still in DNS: every replica marks it unhealthy
#      (/-/upstreams), /readyz stays 200 while the others are healthy, no
#      request fails (retries on connect and reset, counted); all apps
#      killed: /readyz is 503 on every replica.
# Needs root (network namespaces), iproute2, curl and python3-venv (dnslib
# from PyPI goes into target/across-venv). Under CI=true it installs missing
# Debian packages; otherwise it prints the command and exits 2, as when not
# root. All traffic stays inside the namespaces it makes (10.77.0.0/24 exists
# only there), all of which it removes on exit, failed or not, with every
# process; a watchdog stops a run after TIME_LIMIT seconds.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

GATEWAY_BIN=${1:-target/debug/gateway}
VENV=target/across-venv
PY_REQUIREMENTS="dnslib==0.9.26"
TIME_LIMIT=100
NET=10.77.0
DNS_IP=$NET.1
GW_IPS=("$NET.11" "$NET.12" "$NET.13")
APP_IPS=("$NET.21" "$NET.22" "$NET.23")
# Namespace names carry this run's PID, so that a later run can tell the
# leftovers of a run that was killed outright (no trap) from a live run's.
RUN=acm$$
HUB=$RUN-hub
START=$SECONDS

log() { printf '\n==> [%3ds] %s\n' "$((SECONDS - START))" "$*"; }
die() { printf 'across-machines: FAILED: %s\n' "$*" >&2; exit 1; }
# Exit 2: this machine cannot run the check (not a failure of the gateway).
cannot_run() { CANNOT_RUN=1; printf 'across-machines: cannot run here: %s\n' "$*" >&2; exit 2; }

# --- tools --------------------------------------------------------------------

install_tools() {
    [ "$(id -u)" -eq 0 ] || cannot_run "needs root for network namespaces (ip netns add); run as root"
    local missing=()
    command -v ip >/dev/null || missing+=(iproute2)
    command -v curl >/dev/null || missing+=(curl)
    command -v python3 >/dev/null || missing+=(python3)
    python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
    if [ ${#missing[@]} -gt 0 ]; then
        [ "${CI:-}" = true ] || cannot_run "missing ${missing[*]}: apt-get install -y ${missing[*]}"
        log "installing Debian packages: ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
    if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$VENV/requirements.txt" 2>/dev/null)" != "$PY_REQUIREMENTS" ]; then
        log "creating $VENV with $PY_REQUIREMENTS"
        python3 -m venv --clear "$VENV"
        # shellcheck disable=SC2086 # one argument per requirement
        "$VENV/bin/pip" install --quiet --disable-pip-version-check $PY_REQUIREMENTS
        echo "$PY_REQUIREMENTS" >"$VENV/requirements.txt"
    fi
    "$VENV/bin/python" -m doctest scripts/zone_dns.py || die "scripts/zone_dns.py doctests"
    [ -x "$GATEWAY_BIN" ] || die "gateway binary $GATEWAY_BIN not found: build it first (cargo build)"
    GATEWAY_BIN=$(realpath "$GATEWAY_BIN")
}

# --- namespaces and processes -------------------------------------------------

PIDS=()
NAMESPACES=()
APP_PID=()
GW_PID=()

stop_pid() {
    kill "$1" 2>/dev/null || return 0
    for _ in $(seq 1 30); do
        kill -0 "$1" 2>/dev/null || break
        sleep 0.1
    done
    kill -9 "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}

# crash PID...: SIGKILL, reaped quietly (bash would report each as Killed).
crash() {
    kill -9 "$@"
    local pid
    for pid; do wait "$pid" 2>/dev/null || true; done
}

# Ends every process inside namespace $1 (all started by this script or the
# run that made it) and deletes it, with the veths and the bridge in it.
remove_namespace() {
    local pid
    for pid in $(ip netns pids "$1" 2>/dev/null); do
        stop_pid "$pid"
    done
    ip netns del "$1" 2>/dev/null || true
}

# What runs that died without their trap (SIGKILL) left: namespaces, and
# the folders their names share.
remove_stale_runs() {
    local ns pid
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^acm[0-9]+-' || true); do
        pid=$(sed -E 's/^acm([0-9]+)-.*/\1/' <<<"$ns")
        kill -0 "$pid" 2>/dev/null && continue
        echo "removing namespace $ns, left by an earlier run (pid $pid) that ended without cleaning up"
        remove_namespace "$ns"
        rm -rf "${TMPDIR:-/tmp}/acm$pid".*
    done
}

cleanup() {
    local rc=$? pid ns f
    [ "$rc" -ne 2 ] || [ -n "${CANNOT_RUN:-}" ] || rc=1
    [ -z "${WATCHDOG:-}" ] || stop_pid "$WATCHDOG"
    [ -z "${WORK:-}" ] || touch "$WORK/stop"
    for pid in ${PIDS[@]+"${PIDS[@]}"}; do
        stop_pid "$pid"
    done
    for ns in ${NAMESPACES[@]+"${NAMESPACES[@]}"}; do
        remove_namespace "$ns"
    done
    if ip netns list 2>/dev/null | grep -q "^$RUN-"; then
        echo "across-machines: FAILED: namespaces left: $(ip netns list | grep "^$RUN-" | tr '\n' ' ')" >&2
        rc=1
    fi
    if [ "$rc" -ne 0 ] && [ -n "${WORK:-}" ]; then
        for f in "$WORK"/*.log; do
            [ -s "$f" ] && { echo "--- last lines of $(basename "$f")"; tail -n 15 "$f"; } >&2
        done
    fi
    [ -z "${WORK:-}" ] || rm -rf "$WORK"
    if [ "$rc" -eq 0 ]; then
        echo "across-machines: all passed in $((SECONDS - START))s; ${#NAMESPACES[@]} namespaces removed"
    fi
    exit "$rc"
}

# host NAME IP: a namespace NAME with eth0 at IP, its veth peer on the bridge.
# Both ends are made inside namespaces: the machine's own has nothing added.
add_host() {
    local ns=$RUN-$1
    ip netns add "$ns"
    NAMESPACES+=("$ns")
    ip -n "$HUB" link add "v-$1" type veth peer name eth0 netns "$ns"
    ip -n "$HUB" link set "v-$1" master br0 up
    ip -n "$ns" addr add "$2/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
}

setup_network() {
    if ! ip netns add "$HUB" 2>"$WORK/netns.err"; then
        [ "${CI:-}" = true ] && die "ip netns add failed: $(cat "$WORK/netns.err")"
        cannot_run "ip netns add failed: $(cat "$WORK/netns.err")"
    fi
    NAMESPACES+=("$HUB")
    ip -n "$HUB" link set lo up
    ip -n "$HUB" link add br0 type bridge
    ip -n "$HUB" addr add "$DNS_IP/24" dev br0
    ip -n "$HUB" link set br0 up
    local i
    for i in 1 2 3; do
        add_host "gw$i" "${GW_IPS[i - 1]}"
        add_host "app$i" "${APP_IPS[i - 1]}"
    done
    echo "bridge br0 at $DNS_IP in $HUB; gateways ${GW_IPS[*]}; apps ${APP_IPS[*]}"
}

# The client side (curl, the checks) runs on the bridge's own namespace.
hub() { ip netns exec "$HUB" "$@"; }

# --- DNS, apps, gateways ------------------------------------------------------

# zone IP...: the DNS answer for app.test from now on (TTL 1 s). Written to
# a new file and renamed, so the server never reads half a file.
zone() {
    local ips
    ips=$(printf '"%s",' "$@")
    printf '{"app.test": {"A": [%s], "ttl": 1}}\n' "${ips%,}" >"$WORK/zone.json.tmp"
    mv "$WORK/zone.json.tmp" "$WORK/zone.json"
}

# gateway_toml N [EXTRA]: replica N's configuration.
gateway_toml() {
    local ip=${GW_IPS[$1 - 1]}
    cat <<EOF
[server]
listen = "$ip:8080"
shutdown_timeout = "2s"
# The probes and the status endpoints, as a pod's admin port.
[metrics]
listen = "$ip:9090"
[resolver]
nameservers = ["$DNS_IP"]
timeout = "500ms"
attempts = 2
# The apps behind one name, as a headless Service's pods. Asked again at the
# records' TTL (1 s), so a change is seen within about a second.
[upstreams.app]
discover = { dns = "app.test:8000", interval = "1s", min_ttl = "200ms", max_ttl = "2s" }
balance = "round_robin"
connect_timeout = "500ms"
[upstreams.app.health]
path = "/hello"
interval = "250ms"
timeout = "200ms"
unhealthy_after = 2
healthy_after = 1
# A killed app refuses connections and resets those it had: both are safe
# to send again, to another app, for a GET.
[[routes]]
name = "app"
prefix = "/a"
upstream = "app"
timeout = "2s"
retries = 1
retry_on = ["connect", "reset"]
${2:-}
EOF
}

# configmap N VERSION [EXTRA]: replica N's config folder laid out as the
# kubelet lays out a ConfigMap volume (gateway.toml -> ..data/gateway.toml,
# ..data -> ..VERSION), the ..data link replaced in one rename on update.
configmap() {
    local dir=$WORK/gw$1-config old
    mkdir -p "$dir/..$2"
    gateway_toml "$1" "${3:-}" >"$dir/..$2/gateway.toml"
    old=$(readlink "$dir/..data" 2>/dev/null || true)
    ln -s "..$2" "$dir/..data_tmp"
    mv -T "$dir/..data_tmp" "$dir/..data"
    [ -L "$dir/gateway.toml" ] || ln -s ..data/gateway.toml "$dir/gateway.toml"
    [ -z "$old" ] || rm -rf "${dir:?}/$old"
}

start_processes() {
    local i
    zone "${APP_IPS[@]}"
    ip netns exec "$HUB" "$VENV/bin/python" scripts/zone_dns.py "$WORK/zone.json" "$DNS_IP" 53 >"$WORK/dns.log" 2>&1 &
    PIDS+=($!)
    for i in 1 2 3; do
        ip netns exec "$RUN-app$i" "$GATEWAY_BIN" upstream --listen "${APP_IPS[i - 1]}:8000" --delay 20ms \
            >"$WORK/app$i.log" 2>&1 &
        APP_PID[i]=$!
        PIDS+=($!)
    done
    for i in 1 2 3; do
        configmap "$i" v1
        ip netns exec "$RUN-gw$i" "$GATEWAY_BIN" check --config "$WORK/gw$i-config/gateway.toml" >"$WORK/check$i.txt"
        ip netns exec "$RUN-gw$i" "$GATEWAY_BIN" --watch --config "$WORK/gw$i-config/gateway.toml" \
            >"$WORK/gw$i.log" 2>&1 &
        GW_PID[i]=$!
        PIDS+=($!)
    done
}

# --- observations -------------------------------------------------------------

# app_counts: each app's count of GET /a so far, "-" for one that is down.
app_counts() {
    local ip n out=()
    for ip in "${APP_IPS[@]}"; do
        n=$(hub curl -fsS --max-time 2 "http://$ip:8000/-/count" 2>/dev/null) || n=-
        out+=("$n")
    done
    echo "${out[*]}"
}

# endpoints N: what replica N's upstream `app` has, e.g.
# "10.77.0.21:8000=healthy 10.77.0.22:8000=unhealthy".
endpoints() {
    hub curl -fsS --max-time 2 "http://${GW_IPS[$1 - 1]}:9090/-/upstreams" 2>/dev/null | python3 -c '
import json, sys
app = next(u for u in json.load(sys.stdin) if u["name"] == "app")
print(" ".join(sorted(e["address"] + ("=healthy" if e["healthy"] else "=unhealthy") for e in app["endpoints"])))' 2>/dev/null
}

# readyz N: replica N's /readyz, "BODY CODE".
readyz() {
    hub curl -s --max-time 2 -w ' %{http_code}' "http://${GW_IPS[$1 - 1]}:9090/readyz" | tr -d '\n'
}

# every_replica FUNCTION PATTERN: FUNCTION N matches the glob PATTERN for
# each replica N.
every_replica() {
    local i
    for i in 1 2 3; do
        # shellcheck disable=SC2053 # a glob on purpose
        [[ "$("$1" "$i")" == $2 ]] || return 1
    done
}

# wait_until SECONDS WHAT COMMAND...: until COMMAND succeeds; says how long.
wait_until() {
    local limit=$1 what=$2 t0
    shift 2
    t0=$(date +%s%N)
    until "$@"; do
        [ $(($(date +%s%N) - t0)) -lt $((limit * 1000000000)) ] || die "$what: not within ${limit}s"
        sleep 0.1
    done
    t0=$(( ($(date +%s%N) - t0) / 100000000 ))
    printf '%s: after %d.%ds\n' "$what" $((t0 / 10)) $((t0 % 10))
}

# healthy ADDRESS...: the endpoints string of those addresses, all healthy;
# an address ending in "!" unhealthy.
healthy() { printf '%s\n' "$@" | sed 's/!$/:8000=unhealthy/; /=/!s/$/:8000=healthy/' | sort | paste -sd' '; }

# spread N REQUESTS: REQUESTS through replica N alone; every app must get a
# share, and together all of them (each app's own count tells).
spread() {
    local before after codes i b a got=() sum=0
    read -ra before <<<"$(app_counts)"
    codes=$(hub curl -s -o /dev/null --max-time 5 -w '%{http_code}\n' "http://${GW_IPS[$1 - 1]}:8080/a?[1-$2]" | sort | uniq -c | xargs)
    [ "$codes" = "$2 200" ] || die "replica $1: $2 requests answered $codes"
    read -ra after <<<"$(app_counts)"
    for i in 0 1 2; do
        b=${before[i]} a=${after[i]}
        [ "$a" != - ] && [ "$b" != - ] || die "app $((i + 1)) is down"
        got+=($((a - b)))
        sum=$((sum + a - b))
        [ $((a - b)) -gt 0 ] || die "replica $1 sent app $((i + 1)) nothing (${got[*]})"
    done
    [ "$sum" -eq "$2" ] || die "replica $1: apps counted $sum requests, $2 sent"
    printf 'replica %d (%s): %d requests, all 200; app1 %d, app2 %d, app3 %d\n' "$1" "${GW_IPS[$1 - 1]}" "$2" "${got[@]}"
}

# load_start: each replica gets requests from a client loop of its own,
# five per curl, until load_stop (or 300 rounds, or 40 s); one status code a
# line in load-N.codes.
load_start() {
    local i
    rm -f "$WORK/stop" "$WORK"/load-*.codes
    LOAD_PIDS=()
    LOAD_T0=$(date +%s%N)
    for i in 1 2 3; do
        (
            deadline=$((SECONDS + 40))
            for _ in $(seq 1 300); do
                [ ! -e "$WORK/stop" ] && [ "$SECONDS" -lt "$deadline" ] || break
                hub curl -s -o /dev/null --max-time 3 -w '%{http_code}\n' "http://${GW_IPS[i - 1]}:8080/a?[1-5]" || true
            done >"$WORK/load-$i.codes"
        ) &
        LOAD_PIDS+=($!)
        PIDS+=($!)
    done
}

# load_stop WHAT: stops the load; fails if any request got other than 200.
load_stop() {
    touch "$WORK/stop"
    local pid i total=0 bad=0 per=() ms
    for pid in "${LOAD_PIDS[@]}"; do
        wait "$pid" || true
    done
    ms=$(( ($(date +%s%N) - LOAD_T0) / 1000000 ))
    for i in 1 2 3; do
        per+=("$(wc -l <"$WORK/load-$i.codes")")
        total=$((total + per[i - 1]))
        bad=$((bad + $(grep -vc '^200$' "$WORK/load-$i.codes" || true)))
    done
    [ "${per[0]}" -gt 0 ] && [ "${per[1]}" -gt 0 ] && [ "${per[2]}" -gt 0 ] || die "$1: a replica got no load (${per[*]})"
    if [ "$bad" -ne 0 ]; then
        cat "$WORK"/load-*.codes | grep -v '^200$' | sort | uniq -c >&2
        die "$1: $bad of $total requests failed"
    fi
    printf '%s: %d requests in %d.%ds (%s per replica), all 200\n' "$1" "$total" $((ms / 1000)) $((ms % 1000 / 100)) "$(IFS=/; echo "${per[*]}")"
}

metric() {
    hub curl -fsS --max-time 2 "http://${GW_IPS[$1 - 1]}:9090/metrics" | awk -v s="$2" '$1 == s { print $2 }'
}

# --- the checks ---------------------------------------------------------------

check_spread() {
    log "1. every replica spreads its requests over the three apps"
    wait_until 15 "every replica has the three apps from DNS, healthy" \
        every_replica endpoints "$(healthy "${APP_IPS[@]}")"
    local i
    for i in 1 2 3; do
        spread "$i" 30
    done
}

check_dns_removal() {
    log "2. app3 leaves the DNS answer under load, then comes back"
    local c1 c2 c3 d1 d2 d3 i
    load_start
    sleep 1
    zone "${APP_IPS[0]}" "${APP_IPS[1]}"
    wait_until 10 "every replica has dropped app3" every_replica endpoints "$(healthy "${APP_IPS[0]}" "${APP_IPS[1]}")"
    # A request that picked app3 just before the change has arrived by now.
    sleep 0.5
    read -r c1 c2 c3 <<<"$(app_counts)"
    sleep 2
    read -r d1 d2 d3 <<<"$(app_counts)"
    load_stop "while app3 left the answer"
    [ "$d3" = "$c3" ] || die "app3 got $((d3 - c3)) requests after every replica had dropped it"
    [ $((d1 - c1)) -gt 0 ] && [ $((d2 - c2)) -gt 0 ] || die "app1 and app2 got nothing meanwhile"
    echo "in the 2 s after: app3 got 0 new requests (count stayed $c3), app1 $((d1 - c1)), app2 $((d2 - c2))"
    zone "${APP_IPS[@]}"
    wait_until 10 "app3 back in the answer: every replica has it again" \
        every_replica endpoints "$(healthy "${APP_IPS[@]}")"
    for i in 1 2 3; do
        spread "$i" 30
    done
}

# version_is BODY: replica 1's /version answers BODY.
version_is() { [ "$(hub curl -s --max-time 2 "http://${GW_IPS[0]}:8080/version")" = "$1" ]; }

check_config_swap() {
    log "3. a ConfigMap-style ..data swap reaches replica 1 through --watch"
    local before after
    before=$(hub curl -s -o /dev/null --max-time 2 -w '%{http_code}' "http://${GW_IPS[0]}:8080/version")
    [ "$before" = 404 ] || die "replica 1: /version answered $before before the change"
    load_start
    sleep 0.5
    configmap 1 v2 $'[[routes]]\nname = "version"\nprefix = "/version"\nrespond = { status = 200, body = "v2" }'
    wait_until 5 "replica 1 answers the new route /version" version_is v2
    sleep 0.5
    load_stop "during the reload"
    [ "$(ip netns pids "$RUN-gw1")" = "${GW_PID[1]}" ] || die "replica 1 is not the process it was (pid ${GW_PID[1]})"
    local series='gateway_config_reloads_total{result="ok",trigger="watch"}'
    after=$(metric 1 "$series")
    [ "$after" = 1 ] || die "replica 1: $series is '$after', not 1"
    echo "replica 1: same process (pid ${GW_PID[1]}), $series 1"
    after=$(hub curl -s -o /dev/null --max-time 2 -w '%{http_code}' "http://${GW_IPS[1]}:8080/version")
    [ "$after" = 404 ] || die "replica 2 answered /version with $after; its config did not change"
    echo "replica 2 (its own ConfigMap unchanged): /version still 404"
}

check_app_killed() {
    log "4. app2 killed while still in DNS: health checks take it out, /readyz stays 200"
    local i code
    load_start
    sleep 0.5
    # SIGKILL: a crash, with requests in flight on its connections.
    crash "${APP_PID[2]}"
    wait_until 10 "every replica marks app2 unhealthy" \
        every_replica endpoints "$(healthy "${APP_IPS[0]}" "${APP_IPS[1]}!" "${APP_IPS[2]}")"
    sleep 0.5
    load_stop "while app2 died"
    echo "requests sent again to another app (gateway_upstream_retries_total, three replicas): $(
        for i in 1 2 3; do metric "$i" 'gateway_upstream_retries_total{upstream="app"}'; done | awk '{ n += $1 } END { print n + 0 }')"
    every_replica readyz "ready 200" || die "/readyz: $(readyz 1), $(readyz 2), $(readyz 3) with app1 and app3 healthy"
    echo "/readyz on every replica: 200 (app1 and app3 healthy)"

    log "4b. every app killed: /readyz turns 503 on every replica"
    crash "${APP_PID[1]}" "${APP_PID[3]}"
    wait_until 10 "every replica answers /readyz with 503" every_replica readyz "* 503"
    for i in 1 2 3; do echo "replica $i: /readyz $(readyz "$i")"; done
    code=$(hub curl -s -o /dev/null --max-time 2 -w '%{http_code}' "http://${GW_IPS[0]}:8080/a")
    [ "$code" = 503 ] || die "with every app down, /a answered $code, not 503"
    echo "GET /a with every app down: 503"
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/$RUN.XXXXXX")
trap cleanup EXIT
trap 'exit 143' TERM INT
# One process, so cleanup can end it by its PID; it gives up when the script
# is gone (a SIGKILL skips the trap), never signalling a PID reused since.
python3 -c 'import os, signal, sys, time
script, limit = int(sys.argv[1]), int(sys.argv[2])
for _ in range(limit):
    time.sleep(1)
    if os.getppid() != script:
        sys.exit(0)
print(f"across-machines: FAILED: still running after {limit}s; stopping it", file=sys.stderr, flush=True)
os.kill(script, signal.SIGTERM)' $$ "$TIME_LIMIT" &
WATCHDOG=$!

log "tools"
install_tools
remove_stale_runs
log "network: a bridge and seven namespaces"
setup_network
log "starting the DNS server, three apps and three gateways (--watch)"
start_processes
check_spread
check_dns_removal
check_config_swap
check_app_killed
echo "DNS queries answered: $(grep -c ' A ' "$WORK/dns.log") A, $(grep -c ' AAAA ' "$WORK/dns.log") AAAA"
