#!/usr/bin/env bash
# Saturation harness: the gateway's CPU per request at a fixed connection count, for
# comparing builds or chains side by side. Narrower than scripts/bench.py (no nginx, no
# ladder of targets, one case at a time) and quicker, so builds can be alternated many times in a noisy
# machine's quiet stretch. Not a headline figure: scripts/bench.py is.
#
#   scripts/saturate.sh BIN_DIR [BIN_DIR...]
#
# Each BIN_DIR holds tollgate and tollgate-mock-replica (copy them out of target/dist).
# Rounds alternate the directories: A B A B ... Every run starts a fresh gateway on a fresh
# store (a new SQLite file, or a new PostgreSQL database) with one funded workspace.
#
# Environment (all optional):
#   SAT_SECONDS=8        measured seconds per run (after a 2 s warm-up)
#   SAT_CONNECTIONS=32   wrk connections
#   SAT_ROUNDS=2         how many times each directory runs
#   SAT_STORE=sqlite     sqlite or pg (identity and ledger; pg uses DATABASE_URL's server)
#   SAT_LIMITER=         in_process or redis (default: in_process on sqlite, redis on pg)
#   SAT_PLUGINS=         space-separated plugin chain (default: conf/tollgate.yaml's chain)
#   SAT_PERF=            a directory: each run's `perf record -g` of the gateway is kept there
#   SAT_PERF_POSTGRES=1  record every postgres process instead of the gateway
#   SAT_SYSCALLS=1       also count the gateway's system calls per request (perf stat)
#   SAT_STREAM=1         streamed requests (the mock's 64-token SSE answer, usage included)
#   SAT_CLIENT=wrk       or probe: tollgate-bench-probe from BIN_DIR (one thread per connection,
#                        each latency exact; wrk's own tail shows at one connection)
#   BENCH_DELAY_MS=      each connection waits this long before every request (wrk_post.lua):
#                        with SAT_CONNECTIONS=5 and 5, about 1,000 requests/s, the bench's paced case
#   TMPDIR=/tmp          where the run's files go, the SQLite store included (/dev/shm: in memory)
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres   REDIS_URL=redis://127.0.0.1:6379
#
# Output, one line per run: requests/s, the gateway's CPU per request (us, every thread,
# from schedstat), its context switches per request (every thread) and, on pg, PostgreSQL's
# CPU per request (every postgres process), and wrk's p50, p99 and p99.9 latency (at
# saturation mostly queueing; with SAT_CONNECTIONS=1 the latency of one request at a time).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench/config_yaml.sh
. scripts/lib/stack.sh

# The usage: this file's opening comment.
[[ $# -ge 1 ]] || { awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 2; }
SECS=${SAT_SECONDS:-8}
CONNS=${SAT_CONNECTIONS:-32}
ROUNDS=${SAT_ROUNDS:-2}
STORE=${SAT_STORE:-sqlite}
LIMITER=${SAT_LIMITER:-$([[ $STORE == pg ]] && echo redis || echo in_process)}
PLUGINS=${SAT_PLUGINS:-connection_gate auth dialects idempotency chat_completions limits billing}
DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379}
for d in "$@"; do [[ -x $d/tollgate && -x $d/tollgate-mock-replica ]] || { echo "no binaries in $d" >&2; exit 2; }; done
command -v wrk >/dev/null || { echo "wrk is needed (apt-get install wrk)" >&2; exit 2; }
if [[ ${SAT_CLIENT:-wrk} == probe ]]; then
    for d in "$@"; do
        [[ -x $d/tollgate-bench-probe ]] ||
            { echo "SAT_CLIENT=probe: no tollgate-bench-probe in $d (copy it from target/dist)" >&2; exit 2; }
    done
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-sat.XXXXXX")
stack_after_stop() { rm -rf "$WORK"; }
stack_init "$WORK"
# Every thread's CPU (ns) of the processes given.
cpu_ns() {
    local total=0 v t
    for p in "$@"; do
        for t in /proc/"$p"/task/*/schedstat; do read -r v _ <"$t" 2>/dev/null && total=$((total + v)); done
    done
    echo "$total"
}
# Every thread's context switches (voluntary and not) of the process given.
switches() { cat /proc/"$1"/task/*/status 2>/dev/null | awk '/ctxt_switches/ { n += $2 } END { print n + 0 }'; }
pg_ns() { if [[ $STORE == pg ]]; then cpu_ns $(pgrep -x postgres || pgrep postgres); else echo 0; fi; }

stack_mock mock taskset -c 0 "$1/tollgate-mock-replica" --listen 127.0.0.1:0 --threads 1
bench_models_yaml >"$WORK/models.yaml"
bench_upstreams_yaml $MOCK_PORT 4096 >"$WORK/upstreams.yaml"
STREAM=""
[[ ${SAT_STREAM:-0} == 1 ]] && STREAM=',"stream":true,"stream_options":{"include_usage":true}'
printf '{"model":"llama-3.1-8b-instruct","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Write one short sentence about gateways."}],"max_tokens":512%s}' "$STREAM" >"$WORK/body.json"

admin() {
    curl -sS --max-time 10 -H "authorization: Bearer $(<"$RUN/secrets/admin_token")" \
        -H 'content-type: application/json' --data-binary "$2" "http://127.0.0.1:$ADMIN_PORT$1"
}

# run_one BIN_DIR N: one fresh gateway, warm-up, measured run; prints the result line.
run_one() {
    local bin=$1 n=$2 store db="" gw
    RUN=$WORK/run$n
    mkdir -p "$RUN"
    cp "$WORK/models.yaml" "$WORK/upstreams.yaml" "$RUN/"
    "$bin/tollgate" init-secrets --dir "$RUN/secrets" >/dev/null
    if [[ $STORE == pg ]]; then
        db=tollgate_sat_$$_$n
        psql "$DATABASE_URL" -qtAX -c "CREATE DATABASE $db" >/dev/null
        store="{ backend: postgres, url_env: DATABASE_URL }"
    else
        store="{ backend: sqlite, path: $RUN/tollgate.db }"
    fi
    local lstore="{ backend: in_process }"
    [[ $LIMITER == redis ]] && lstore="{ backend: redis, url_env: REDIS_URL, prefix: tgsat-$$-$n }"
    {
        printf 'listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nthreads: 1\n'
        printf 'models_file: models.yaml\nupstreams_file: upstreams.yaml\n'
        printf 'shutdown: { grace_period_seconds: 1, graceful_shutdown_timeout_seconds: 1 }\n'
        identity_yaml "$store" "$RUN/secrets"
        open_limits_yaml "$lstore"
        printf 'billing:\n  topup_url: https://billing.example.com/top-up\nplugins:\n'
        for p in $PLUGINS; do printf '  - name: %s\n' "$p"; done
    } >"$RUN/tollgate.yaml"
    # A run stopped by an error leaves no gateway behind: the stack stops it at exit.
    stack_gateway "gw$n" env RUST_LOG=warn TMPDIR="$RUN" REDIS_URL="$REDIS_URL" \
        DATABASE_URL="${DATABASE_URL%/*}/${db:-unused}" taskset -c 1 "$bin/tollgate" serve --config "$RUN/tollgate.yaml"
    gw=$STACK_PID
    local ws key
    ws=$(admin /admin/v1/workspaces '{"name":"sat"}' | jq -r .id)
    key=$(admin "/admin/v1/workspaces/$ws/keys" '{"name":"sat"}' | jq -r .key)
    admin "/admin/v1/workspaces/$ws/credits" '{"amount_cents":100000000,"source":"purchase"}' >/dev/null
    local -a wrk=(taskset -c 0 wrk -t1 "-c$CONNS" --timeout 10s -s scripts/bench/wrk_post.lua
        "http://127.0.0.1:$GW_PORT/v1/chat/completions")
    if [[ ${SAT_CLIENT:-wrk} == probe ]]; then
        wrk=(taskset -c 0 "$bin/tollgate-bench-probe" "-c$CONNS" "http://127.0.0.1:$GW_PORT/v1/chat/completions")
    fi
    BENCH_BODY_FILE=$WORK/body.json BENCH_API_KEY=$key "${wrk[@]}" -d2s >/dev/null 2>&1
    local g0 p0 g1 p1 s0 s1 out req sc=0
    g0=$(cpu_ns "$gw") p0=$(pg_ns) s0=$(switches "$gw")
    local perf="" calls=""
    if [[ ${SAT_SYSCALLS:-0} == 1 ]]; then
        perf stat -x, -e raw_syscalls:sys_enter -p "$gw" -o "$RUN/syscalls.csv" -- sleep "$SECS" >/dev/null 2>&1 &
        calls=$!
    fi
    if [[ -n ${SAT_PERF:-} ]]; then
        mkdir -p "$SAT_PERF"
        local who=$gw
        [[ ${SAT_PERF_POSTGRES:-0} == 1 ]] && who=$(pgrep -d, -x postgres || pgrep -d, postgres)
        perf record -q -g -p "$who" -o "$SAT_PERF/run$n.data" -- sleep "$SECS" >/dev/null 2>&1 &
        perf=$!
    fi
    out=$(BENCH_BODY_FILE=$WORK/body.json BENCH_API_KEY=$key "${wrk[@]}" "-d${SECS}s" 2>&1)
    [[ -n $perf ]] && wait "$perf"
    [[ -n $calls ]] && wait "$calls"
    g1=$(cpu_ns "$gw") p1=$(pg_ns) s1=$(switches "$gw")
    # A number from wrk_post.lua's BENCH line.
    field() { sed -n "s/.* $1=\([0-9]*\).*/\1/p" <<<"$out" | head -1; }
    local p50 p99 p999
    req=$(field requests) p50=$(field p50_us) p99=$(field p99_us) p999=$(field p999_us)
    [[ -n $req && $req -gt 0 ]] || { echo "no requests counted: $out" >&2; exit 1; }
    # A run with refusals or errors measured something else (a refusal is cheap): stop.
    grep -q "err_connect=0 err_read=0 err_write=0 err_status=0 err_timeout=0" <<<"$out" ||
        { echo "errors or non-2xx answers, logs in $RUN: $(grep '^BENCH' <<<"$out")" >&2
          echo "the gateway's answers other than 2xx: $(curl -sS --max-time 10 -H "authorization: Bearer $(<"$RUN/secrets/admin_token")" \
              "http://127.0.0.1:$ADMIN_PORT/metrics" | awk -f scripts/bench/non_2xx.awk)" >&2
          exit 1; }
    stack_stop "gw$n"
    [[ -n $db ]] && psql "$DATABASE_URL" -qtAX -c "DROP DATABASE $db" >/dev/null
    [[ -n $calls ]] && sc=$(awk -F, '/sys_enter/ { print $1 }' "$RUN/syscalls.csv")
    awk -v b="$bin" -v r="$req" -v s="$SECS" -v g=$((g1 - g0)) -v p=$((p1 - p0)) -v w=$((s1 - s0)) -v sc="$sc" -v p50="$p50" -v p99="$p99" -v p999="$p999" 'BEGIN {
        printf "%-24s %7.0f req/s  gateway %6.1f us/req  %5.2f switches/req", b, r / s, g / r / 1000, w / r
        if (sc > 0) printf "  %5.2f syscalls/req", sc * s / r / s
        if (p > 0) printf "  postgres %6.1f us/req", p / r / 1000
        printf "  p50 %.3f  p99 %.3f  p99.9 %.3f ms", p50 / 1000, p99 / 1000, p999 / 1000
        printf "\n" }'
}

echo "store $STORE, limiter $LIMITER, c=$CONNS, ${SECS}s, stream ${SAT_STREAM:-0}, chain: $PLUGINS"
n=0
for _ in $(seq "$ROUNDS"); do
    for d in "$@"; do
        n=$((n + 1))
        run_one "$d" "$n"
    done
done
