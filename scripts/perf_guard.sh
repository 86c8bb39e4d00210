#!/usr/bin/env bash
# The performance guard, part of the test command: the CPU instructions the full default
# chain (conf/tollgate.yaml's plugins on the embedded stores, a priced model, a funded
# workspace) spends per non-streamed request and per 64-token stream on its request thread,
# counted under callgrind by scripts/profile.sh, against the committed baseline in
# benches/instructions.txt. Counts do not move with the machine's load as timings do; a rise
# above the tolerance fails.
#
#   scripts/perf_guard.sh [--update] [--bin-dir DIR]
#
#   --update    write the measured counts as the new baseline (after a change that is meant
#               to cost more or less; commit the file with the change)
#   --bin-dir   binaries to measure (default: target/dist, built here with `--profile dist`)
#   PERF_GUARD_TOLERANCE=3   percent a count may rise before the guard fails
set -euo pipefail
cd "$(dirname "$0")/.."
BASELINE=benches/instructions.txt
TOLERANCE=${PERF_GUARD_TOLERANCE:-3}
UPDATE=0 BIN_DIR=""
while [[ $# -gt 0 ]]; do
    case $1 in
    --update) UPDATE=1; shift ;;
    --bin-dir) BIN_DIR=$2; shift 2 ;;
    *) echo "usage: scripts/perf_guard.sh [--update] [--bin-dir DIR]" >&2; exit 2 ;;
    esac
done
command -v valgrind >/dev/null || { echo "perf_guard: valgrind is missing (scripts/setup.sh installs it)" >&2; exit 1; }
if [[ -z $BIN_DIR ]]; then
    cargo build --profile dist --bins -q
    BIN_DIR=${CARGO_TARGET_DIR:-target}/dist
fi

# Each thread counted apart: the request thread's count is the same run after run (the
# plugins, the proxy, Pingora), while the ledger writer's depends on how the timing batched
# its commits (2-3% between runs), and so does the process total. The guard holds the
# request thread to the baseline and prints the other threads beside it. The request thread
# is found in each run by what it ran (the proxy's request_filter), not by its number:
# callgrind numbers threads in the order they started, which differs from run to run, and
# subtracting another thread's base count reads ~11% high.
N=1000 M=100
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-perf-guard.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
summary() { awk '/^summary:/{print $2}' "$1"; }
# request_thread PREFIX: the file of the busiest thread that ran the proxy's request_filter.
request_thread() {
    local f n most=-1 file=""
    for f in "$1"-*; do
        grep -q 'ProxyHttp.*request_filter' "$f" || continue
        n=$(summary "$f")
        if [[ $n -gt $most ]]; then most=$n file=$f; fi
    done
    echo "$file"
}
# measure CASE: prints the request thread's instructions per request of one profiled run.
measure() {
    local case=$1 dir="$WORK/$1.$RANDOM" at_n at_m most base_worker all_n=0 all_m=0 f count others
    PROFILE_CALLGRIND_ARGS="--separate-threads=yes" scripts/profile.sh --bin "$BIN_DIR/tollgate" \
        --chain full --case "$case" --requests "$N" --base "$M" --keep "$dir" >"$dir.log" 2>&1 ||
        { cat "$dir.log" >&2; return 1; }
    at_n=$(request_thread "$dir/callgrind.$case.$N")
    at_m=$(request_thread "$dir/callgrind.$case.$M")
    [[ -n $at_n && -n $at_m ]] || { echo "perf_guard: no request thread in the counts ($case)" >&2; cat "$dir.log" >&2; return 1; }
    for f in "$dir"/callgrind."$case".$N-*; do all_n=$((all_n + $(summary "$f"))); done
    for f in "$dir"/callgrind."$case".$M-*; do all_m=$((all_m + $(summary "$f"))); done
    most=$(summary "$at_n")
    base_worker=$(summary "$at_m")
    count=$(awk -v b="$most" -v a="$base_worker" -v n=$N -v m=$M 'BEGIN { printf "%.0f", (b - a) / (n - m) }')
    others=$(awk -v b="$((all_n - most))" -v a="$((all_m - base_worker))" -v n=$N -v m=$M 'BEGIN { printf "%.0f", (b - a) / (n - m) }')
    echo "perf_guard: $case: request thread $count instructions/request; other threads $others (not held: timing batches them)" >&2
    echo "$count"
}
# A check measures again only when the first run is over the tolerance and keeps the lower
# count (a busy machine can move a little work between threads); an update always takes the
# lower of two.
over() { awk -v n="$1" -v b="$2" -v t="$TOLERANCE" 'BEGIN { exit !(100 * (n - b) / b > t) }'; }
measured=()
for case in json sse; do
    count=$(measure "$case") || exit 1
    base=$(awk -v c="$case" '$1 == c { print $2 }' "$BASELINE" 2>/dev/null || true)
    if [[ $UPDATE == 1 ]] || { [[ -n $base ]] && over "$count" "$base"; }; then
        again=$(measure "$case") || exit 1
        if [[ $again -lt $count ]]; then count=$again; fi
    fi
    measured+=("$case $count")
done

if [[ $UPDATE == 1 ]]; then
    {
        echo "# Instructions per request on the request thread, full default chain (scripts/perf_guard.sh --update)."
        printf '%s\n' "${measured[@]}"
    } >"$BASELINE"
    echo "perf_guard: baseline written to $BASELINE"; cat "$BASELINE"
    exit 0
fi
[[ -f $BASELINE ]] || { echo "perf_guard: no $BASELINE (run with --update)" >&2; exit 1; }
failed=0
for m in "${measured[@]}"; do
    read -r case count <<<"$m"
    base=$(awk -v c="$case" '$1 == c { print $2 }' "$BASELINE")
    [[ -n $base ]] || { echo "perf_guard: $case has no baseline in $BASELINE" >&2; exit 1; }
    verdict=$(awk -v n="$count" -v b="$base" -v t="$TOLERANCE" \
        'BEGIN { d = 100 * (n - b) / b; printf "%+.2f%% %s", d, (d > t ? "FAIL" : "ok") }')
    echo "perf_guard: $case $count instructions/request on the request thread, baseline $base: $verdict (tolerance +$TOLERANCE%)"
    [[ $verdict == *FAIL ]] && failed=1
done
exit $failed
