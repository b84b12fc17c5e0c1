#!/usr/bin/env bash
# Runs the public HTTP cache test suite (http-tests/cache-tests, the one
# cache-tests.fyi publishes) against a route with `cache = {}` in front of
# the suite's own origin server, and prints what passed beside the peers'
# published results in the suite's results/ folder. CI does not run it
# (it needs the suite's checkout and takes minutes); docs/operations.md,
# "The public HTTP cache test suite", says how to read it.
#
#   scripts/cache-tests.sh SUITE_DIR [GATEWAY_BINARY] [TEST_ID]
#
# SUITE_DIR: a checkout of the suite (git clone of http-tests/cache-tests);
# only Node.js (>= 14.8) is needed, no `npm i`: the origin and the client
# use Node's own modules. GATEWAY_BINARY: default target/release/gateway,
# else target/debug/gateway. TEST_ID: run that one test and print what the
# client and the origin saw (the suite's --id). The results JSON is left in
# $OUT (default /tmp/cache-tests-gateway.json). Ports: ORIGIN_PORT (18000)
# and GATEWAY_PORT (18080).
set -euo pipefail

suite=$(cd "${1:?usage: scripts/cache-tests.sh SUITE_DIR [GATEWAY_BINARY] [TEST_ID]}" && pwd)
here=$(cd "$(dirname "$0")/.." && pwd)
gateway=${2:-}
if [ -z "$gateway" ]; then
    gateway=$here/target/release/gateway
    [ -x "$gateway" ] || gateway=$here/target/debug/gateway
fi
test_id=${3:-}
origin_port=${ORIGIN_PORT:-18000}
gateway_port=${GATEWAY_PORT:-18080}
out=${OUT:-/tmp/cache-tests-gateway.json}
work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

cat >"$work/gateway.toml" <<TOML
[server]
listen = "127.0.0.1:$gateway_port"

[upstreams.origin]
url = "http://127.0.0.1:$origin_port"

[[routes]]
name = "suite"
prefix = "/"
upstream = "origin"
host = "preserve"
cache = {}
TOML

npm_config_protocol=http npm_config_port=$origin_port npm_config_pidfile=$work/origin.pid \
    node "$suite/test-engine/server/server.mjs" >"$work/origin.log" 2>&1 &
pids+=($!)
"$gateway" --config "$work/gateway.toml" >"$work/gateway.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
    if curl -fso /dev/null "http://127.0.0.1:$gateway_port/test-engine/lib/defines.mjs"; then break; fi
    sleep 0.1
done

cd "$suite"
if [ -n "$test_id" ]; then
    npm_config_base=http://127.0.0.1:$gateway_port npm_config_id=$test_id node --no-warnings test-engine/cli.mjs || true
    echo "==== The gateway's log"
    cat "$work/gateway.log"
    exit
fi
npm_config_base=http://127.0.0.1:$gateway_port npm_config_id= npm_package_config_id= node --no-warnings test-engine/cli.mjs >"$out"
node "$here/scripts/cache-tests-summary.mjs" "$suite" "$out" "$suite"/results/*.json
