#!/usr/bin/env bash
# Ledger load test (issue 12): two gateway instances (the real `tollgate` binary, billing on)
# on ONE store, one funded workspace and one key, wrk against both for LOAD_SECONDS, then the
# ledger audit. Prints settled requests per second and whether the ledger is exact:
# balance == sum of entries less open holds (the admin API's check), one settlement entry per request served
# (2xx answers counted by wrk; requests wrk abandoned at the end may settle too), every hold
# row settled (with its settlement entry) or released, no open hold. Loopback only; stops what it started and drops its database on exit.
# During the run it reads GET /v1/credits through both instances every 5 s and prints the most
# each showed as held and how far apart their balances were (decision 190).
#
#   scripts/ledger_load.sh [--store pg|sqlite]
#
# Environment (all optional):
#   LOAD_SECONDS=60         length of the measured run
#   LOAD_CONNECTIONS=64     wrk connections per instance
#   LOAD_THREADS=1          gateway worker threads per instance
#   LOAD_BIN_DIR=           directory with tollgate and tollgate-mock-replica (default
#                           $CARGO_TARGET_DIR/dist, else target/dist; not built here)
#   LOAD_HONOR_RETRY_AFTER=1  a connection refused with 429/503 waits its Retry-After before
#                           sending again, as the official clients do (0: at once, as plain wrk)
#   LOAD_CHAIN=billing      billing: auth, chat_completions, billing; full: conf/tollgate.yaml's
#                           whole chain (limits set too high to refuse)
#   LOAD_LIMITER=in_process the full chain's limiter: in_process, or redis (REDIS_URL, default
#                           redis://127.0.0.1:6379, a fresh key prefix per run), the production
#                           setting, where both instances count on one Redis
#   LOAD_LEDGER_MAX_WAIT_MS=500  billing.ledger_max_wait_ms (decision 131)
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres   server for --store pg: a
#                           fresh database is created and dropped (LOAD_KEEP_DB=1 keeps it)
set -euo pipefail

STORE=pg
while [[ $# -gt 0 ]]; do
    case $1 in
    --store) STORE=${2:?--store needs pg or sqlite}; shift 2 ;;
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
[[ $STORE == pg || $STORE == sqlite ]] || { echo "--store must be pg or sqlite" >&2; exit 2; }

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/config_yaml.sh
source "$ROOT/scripts/bench/config_yaml.sh"
# shellcheck source=lib/stack.sh
source "$ROOT/scripts/lib/stack.sh"
SECONDS_RUN=${LOAD_SECONDS:-60}
CONNS=${LOAD_CONNECTIONS:-64}
THREADS=${LOAD_THREADS:-1}
CHAIN=${LOAD_CHAIN:-billing}
[[ $CHAIN == billing || $CHAIN == full ]] || { echo "LOAD_CHAIN must be billing or full" >&2; exit 2; }
LIMITER=${LOAD_LIMITER:-in_process}
case $LIMITER in
in_process) LIMITER_YAML="{ backend: in_process }" ;;
redis) LIMITER_YAML="{ backend: redis, url_env: REDIS_URL, prefix: tgload-$$-$(date +%s) }" ;;
*) echo "LOAD_LIMITER must be in_process or redis" >&2; exit 2 ;;
esac
export REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379}
BIN_DIR=${LOAD_BIN_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/dist}
DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
GW=$BIN_DIR/tollgate
MOCK=$BIN_DIR/tollgate-mock-replica
log() { printf '[ledger-load] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[[ -x $GW && -x $MOCK ]] || die "no binaries in $BIN_DIR (cargo build --profile dist -p tollgate-app -p tollgate-mock-replica)"
for t in wrk curl jq; do command -v $t >/dev/null || die "$t is needed (apt-get install $t)"; done

WORK=$(mktemp -d /tmp/ledger-load.XXXXXX)
DB=""
stack_after_stop() {
    if [[ -n $DB && ${LOAD_KEEP_DB:-0} != 1 ]]; then psql "$DATABASE_URL" -qtAX -c "DROP DATABASE IF EXISTS $DB" >/dev/null 2>&1 || true; fi
    log "work files in $WORK"
}
stack_init "$WORK"
trap 'exit 130' INT

stack_mock mock "$MOCK" --listen 127.0.0.1:0 --threads 1
"$GW" init-secrets --dir "$WORK/secrets" >/dev/null
if [[ $STORE == pg ]]; then
    DB=tollgate_ledger_load_$$
    psql "$DATABASE_URL" -qtAX -c "CREATE DATABASE $DB" >/dev/null || die "cannot create database $DB"
    export LOAD_DB_URL="${DATABASE_URL%/*}/$DB"
    STORE_YAML="{ backend: postgres, url_env: LOAD_DB_URL }"
    sql() { psql "$LOAD_DB_URL" -qtAX -c "$1"; }
else
    STORE_YAML="{ backend: sqlite, path: $WORK/tollgate.db }"
    sql() { sqlite3 -cmd '.timeout 5000' "$WORK/tollgate.db" "$1"; }
fi
PORTS=() ADMIN_PORTS=()
bench_models_yaml >"$WORK/models.yaml"
bench_upstreams_yaml "$MOCK_PORT" 100000 >"$WORK/upstreams.yaml"
for i in 1 2; do
    cat >"$WORK/gw$i.yaml" <<EOF
listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
threads: $THREADS
models_file: models.yaml
upstreams_file: upstreams.yaml
shutdown: { grace_period_seconds: 1, graceful_shutdown_timeout_seconds: 1 }
$(identity_yaml "$STORE_YAML" "$WORK/secrets")
billing:
  topup_url: https://billing.example.com/top-up
  ledger_max_wait_ms: ${LOAD_LEDGER_MAX_WAIT_MS:-500}
EOF
    if [[ $CHAIN == full ]]; then
        # conf/tollgate.yaml's chain, with limits so high that they refuse nothing.
        { open_limits_yaml "$LIMITER_YAML"; full_chain_plugins_yaml; } >>"$WORK/gw$i.yaml"
    else
        printf 'plugins:\n  - name: auth\n  - name: chat_completions\n  - name: billing\n' >>"$WORK/gw$i.yaml"
    fi
    mkdir -p "$WORK/tmp$i"
    stack_gateway "gw$i" env RUST_LOG=warn TMPDIR="$WORK/tmp$i" "$GW" serve --config "$WORK/gw$i.yaml"
    PORTS[i]=$GW_PORT ADMIN_PORTS[i]=$ADMIN_PORT
done
admin() {
    local -a data=()
    if [[ $# -ge 2 ]]; then data=(-H 'content-type: application/json' --data-binary "$2"); fi
    curl -sS --max-time 30 -H "authorization: Bearer $(<"$WORK/secrets/admin_token")" "${data[@]}" "http://127.0.0.1:${ADMIN_PORTS[1]}$1"
}
WS=$(admin /admin/v1/workspaces '{"name":"load"}' | jq -r '.id // empty')
[[ -n $WS ]] || die "workspace not created"
KEY=$(admin "/admin/v1/workspaces/$WS/keys" '{"name":"load"}' | jq -r '.key // empty')
[[ -n $KEY ]] || die "key not created"
admin "/admin/v1/workspaces/$WS/credits" '{"amount_cents":100000000,"source":"purchase"}' >/dev/null
MESSAGES='[{"role":"user","content":"Write one short sentence about gateways."}]'
printf '{"model":"llama-3.1-8b-instruct","messages":%s,"max_tokens":512}' "$MESSAGES" >"$WORK/body.json"
# One request through each instance: priced, held and settled.
for i in 1 2; do
    code=$(curl -sS -o "$WORK/check$i.json" -w '%{http_code}' -H "authorization: Bearer $KEY" \
        -H 'content-type: application/json' --data-binary @"$WORK/body.json" "http://127.0.0.1:${PORTS[i]}/v1/chat/completions")
    [[ $code == 200 ]] || die "instance $i answered $code: $(cat "$WORK/check$i.json")"
done
settled0=$(sql "SELECT count(*) FROM ledger_entries WHERE workspace_id = '$WS' AND kind = 'settlement'")

log "store $STORE, chain $CHAIN, 2 instances (threads: $THREADS), $CONNS connections each, ${SECONDS_RUN}s"
for i in 1 2; do
    BENCH_BODY_FILE="$WORK/body.json" BENCH_API_KEY="$KEY" BENCH_TOKENS=16 BENCH_HONOR_RETRY_AFTER=${LOAD_HONOR_RETRY_AFTER:-1} \
        wrk -t1 "-c$CONNS" "-d${SECONDS_RUN}s" --timeout 10s -s "$ROOT/scripts/bench/wrk_post.lua" \
        "http://127.0.0.1:${PORTS[i]}/v1/chat/completions" >"$WORK/wrk$i.txt" 2>&1 &
    WRK[$i]=$!
done
# Every 5 s, GET /v1/credits through both instances at once: each shows every instance's
# unused lease as balance (decision 190), so the two agree up to the requests that start or end
# between the reads, and held_cents is what the running requests hold.
sample_credits() {
    local n=0 c1 c2
    while ((n < SECONDS_RUN / 5 - 1)); do
        sleep 5
        n=$((n + 1))
        curl -sS --max-time 5 -H "authorization: Bearer $KEY" "http://127.0.0.1:${PORTS[1]}/v1/credits" >"$WORK/credits1.$n.json" &
        c1=$!
        curl -sS --max-time 5 -H "authorization: Bearer $KEY" "http://127.0.0.1:${PORTS[2]}/v1/credits" >"$WORK/credits2.$n.json" &
        c2=$!
        wait "$c1" "$c2" || true
    done
}
sample_credits &
SAMPLER=$!
wait "${WRK[1]}" "${WRK[2]}"
wait "$SAMPLER" || true
sleep 3 # the last settlements of requests wrk stopped waiting for

field() { grep -o "$2=[0-9.]*" "$WORK/wrk$1.txt" | head -1 | cut -d= -f2; }
total=0; errors=0
for i in 1 2; do
    total=$((total + $(field $i requests)))
    errors=$((errors + $(field $i err_status)))
    log "instance $i: $(grep '^BENCH' "$WORK/wrk$i.txt" | tr ' ' '\n' | grep -E 'requests|p50|p99_|err_status|err_timeout|shed' | tr '\n' ' ')"
done
ok=$((total - errors))
settled=$(( $(sql "SELECT count(*) FROM ledger_entries WHERE workspace_id = '$WS' AND kind = 'settlement'") - settled0 ))
# Every hold row ends settled or released (decision 133: a hold is recorded by its row, not
# by ledger entries); a settled hold has its request's settlement entry.
holds=$(sql "SELECT count(*) FROM holds WHERE workspace_id = '$WS'")
closed=$(sql "SELECT count(*) FROM holds WHERE workspace_id = '$WS' AND state IN ('settled', 'released')")
open=$(sql "SELECT count(*) FROM holds WHERE workspace_id = '$WS' AND state = 'open'")
settled_unbooked=$(sql "SELECT count(*) FROM holds h WHERE h.workspace_id = '$WS' AND h.state = 'settled' \
    AND NOT EXISTS (SELECT 1 FROM ledger_entries s WHERE s.request_id = h.request_id AND s.kind = 'settlement')")
unmatched=$(sql "SELECT count(*) FROM ledger_entries s WHERE s.workspace_id = '$WS' AND s.kind = 'settlement' \
    AND NOT EXISTS (SELECT 1 FROM holds h WHERE h.request_id = s.request_id)")
# The mid-run credits reads: pairs, the most held through each instance, the largest
# difference between the two balances of a pair.
credits_line=$(for f in "$WORK"/credits1.*.json; do
    [[ -f $f && -f ${f/credits1/credits2} ]] || continue
    jq -s '[.[0].balance_cents, .[0].held_cents, .[1].balance_cents, .[1].held_cents]' "$f" "${f/credits1/credits2}" -c
done | jq -rs 'if length == 0 then "none" else
    "pairs=\(length) held_max_i1=\(map(.[1]) | max) held_max_i2=\(map(.[3]) | max) balance_diff_max=\(map(.[0] - .[2] | if . < 0 then -. else . end) | max)" end')
audit=$(admin "/admin/v1/workspaces/$WS/ledger")
consistent=$(jq -r '.check.consistent' <<<"$audit")
echo "store=$STORE chain=$CHAIN limiter=$([[ $CHAIN == full ]] && echo "$LIMITER" || echo none) instances=2 threads=$THREADS connections=$((2 * CONNS)) seconds=$SECONDS_RUN"
echo "requests=$total served_2xx=$ok non_2xx=$errors settled=$settled settled_per_s=$((settled / SECONDS_RUN))"
echo "credits read mid-run through both instances: $credits_line"
echo "audit: balance_equals_entries=$consistent balance=$(jq -r .balance_cents <<<"$audit") derived=$(jq -r .check.derived_balance_cents <<<"$audit") held=$(jq -r .held_cents <<<"$audit") open_holds=$open hold_rows=$holds closed_hold_rows=$closed settled_holds_without_entry=$settled_unbooked settlements_without_hold=$unmatched"
pass=1
[[ $consistent == true && $open == 0 && $holds == "$closed" && $unmatched == 0 && $settled_unbooked == 0 ]] || pass=0
# A request wrk gave up on at the end may still settle; never fewer settlements than 2xx.
[[ $settled -ge $ok ]] || pass=0
if [[ $pass == 1 ]]; then echo "audit: PASS"; else echo "audit: FAIL"; exit 1; fi
