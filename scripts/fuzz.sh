#!/usr/bin/env bash
# Runs every `cargo fuzz` target in fuzz/ for a bounded time.
#
#   bash scripts/fuzz.sh [SECONDS_PER_TARGET]        (default: 60)
#
# 1. Installs cargo-fuzz from crates.io if it is missing.
# 2. Builds all targets once (ASan + coverage instrumentation). cargo fuzz
#    passes `-Zsanitizer=address`, a nightly flag; this machine has only the
#    stable toolchain, so RUSTC_BOOTSTRAP=1 lets stable rustc accept it.
# 3. Runs each target for SECONDS_PER_TARGET (libFuzzer's -max_total_time),
#    one after the other, starting from fuzz/corpus/<target> (grown by earlier
#    runs, not committed) plus the committed seeds in fuzz/seeds/<target>.
#    Each run is also capped by `timeout` in case libFuzzer itself hangs.
# 4. Prints one summary line per target and exits 1 if any target crashed,
#    panicked, hit an input slower than PER_INPUT_TIMEOUT or ran out of memory;
#    the failing input is in fuzz/artifacts/<target>/, the full output in
#    fuzz/target/fuzz-logs/<target>.log. To replay one by hand:
#    RUSTC_BOOTSTRAP=1 cargo fuzz run <target> fuzz/artifacts/<target>/<file>
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

SECONDS_PER_TARGET=${1:-60}
[[ $SECONDS_PER_TARGET =~ ^[1-9][0-9]*$ ]] || {
    echo "usage: $0 [SECONDS_PER_TARGET]" >&2
    exit 64
}
# FUZZ_TARGETS="a b" runs only those targets.
read -ra TARGETS <<<"${FUZZ_TARGETS:-config_load route_match path_sanitize path_normalize}"
# One input taking longer than this is a finding (a hang), not a slow run.
PER_INPUT_TIMEOUT=10
RSS_LIMIT_MB=2048
LOG_DIR=fuzz/target/fuzz-logs

export RUSTC_BOOTSTRAP=1
export PATH="$HOME/.cargo/bin:$PATH"
# config::load applies GATEWAY__* environment overrides; keep runs reproducible.
while read -r var; do unset "$var"; done < <(compgen -e | grep '^GATEWAY__' || true)

START=$SECONDS
log() { printf '==> [%3ds] %s\n' "$((SECONDS - START))" "$*"; }

if ! cargo fuzz --version >/dev/null 2>&1; then
    log "installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi
log "$(cargo fuzz --version); building ${TARGETS[*]}"
for target in "${TARGETS[@]}"; do
    cargo fuzz build "$target"
done

mkdir -p "$LOG_DIR"
summary=()
failed=0
for target in "${TARGETS[@]}"; do
    corpus=fuzz/corpus/$target
    artifacts=fuzz/artifacts/$target
    mkdir -p "$corpus" "$artifacts"
    dirs=("$corpus")
    [[ -d fuzz/seeds/$target ]] && dirs+=("fuzz/seeds/$target")
    flags=(
        "-max_total_time=$SECONDS_PER_TARGET"
        "-timeout=$PER_INPUT_TIMEOUT"
        "-rss_limit_mb=$RSS_LIMIT_MB"
        "-print_final_stats=1"
    )
    [[ -f fuzz/dicts/$target.dict ]] && flags+=("-dict=fuzz/dicts/$target.dict")
    logfile=$LOG_DIR/$target.log
    stamp=$(mktemp)

    log "fuzzing $target for ${SECONDS_PER_TARGET}s"
    rc=0
    timeout -k 10 "$((SECONDS_PER_TARGET + 120))" \
        cargo fuzz run "$target" "${dirs[@]}" -- "${flags[@]}" >"$logfile" 2>&1 || rc=$?

    runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$logfile" | tail -1 | grep -o '[0-9]*$' ||
        grep -o 'Done [0-9]* runs' "$logfile" | tail -1 | grep -o '[0-9][0-9]*' || echo '?')
    inputs=$(find "$corpus" -type f | wc -l)
    found=$(find "$artifacts" -type f -newer "$stamp" | sort)
    rm -f "$stamp"
    if [[ $rc -eq 0 && -z $found ]]; then
        summary+=("$(printf '%-14s ok     %10s runs  corpus %5d  nothing found' "$target" "$runs" "$inputs")")
    else
        failed=1
        note="exit $rc"
        [[ $rc -eq 124 || $rc -eq 137 ]] && note+=", killed by timeout"
        what=${found:-"no artifact ($note)"}
        summary+=("$(printf '%-14s FAILED %10s runs  corpus %5d  found: %s' "$target" "$runs" "$inputs" "${what//$'\n'/ }")")
        echo "---- $target: what it found (full output: $logfile) ----"
        grep -m1 -A5 -E 'panicked at|ERROR: (libFuzzer|AddressSanitizer|LeakSanitizer)' "$logfile" || tail -n 20 "$logfile"
        sed -n '/^Failing input:/,/^Minimize test case/p' "$logfile"
        echo "----"
    fi
done

log "done"
printf '%s\n' "${summary[@]}"
exit "$failed"
