#!/usr/bin/env bash
# Run every fuzz target for a while, each from a copy of its seeds:
#   tests/fuzz/run.sh [seconds per target, default 60]
#   FUZZ_TARGETS="request_heads" FUZZ_DEV=1 tests/fuzz/run.sh 30   (what scripts/test.sh runs:
#   one target, built without optimisation so a fresh clone builds it in minutes)
# Needs cargo-fuzz (`cargo install cargo-fuzz`); the one stable toolchain is enough with
# RUSTC_BOOTSTRAP=1 and no sanitizer. A crash leaves its input in tests/fuzz/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-60}
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
export RUSTC_BOOTSTRAP=1
failed=0
profile=(-O)
[[ ${FUZZ_DEV:-0} == 1 ]] && profile=(--dev)
for t in ${FUZZ_TARGETS:-sse_framer chat_request messages_request responses_request dialect_streams request_heads}; do
    mkdir -p "corpus/$t"
    cp -n seeds/"$t"/* "corpus/$t/" 2>/dev/null || true
    if (cd ../.. && cargo fuzz run --fuzz-dir tests/fuzz -s none "${profile[@]}" "$t" "tests/fuzz/corpus/$t" \
        -- -max_total_time="$secs" -max_len=8192) >"$t.log" 2>&1; then
        echo "$t: $(grep -E '^Done' "$t.log" | tail -1)"
    else
        echo "$t: FAILED (see tests/fuzz/$t.log and tests/fuzz/artifacts/$t/)"; grep -m3 -E 'panicked|SUMMARY' "$t.log" || true
        failed=1
    fi
done
exit $failed
