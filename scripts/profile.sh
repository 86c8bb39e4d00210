#!/usr/bin/env bash
# Count the gateway's CPU cost per request on the plain proxy path, deterministically.
#
# Usage: scripts/profile.sh [--bin PATH] [--mock PATH] [--case json|sse|msgs] [--tool callgrind|strace]
#                           [--requests N] [--base M] [--keep DIR] [--floor PATH]
#
#   --bin       gateway binary (default target/dist/tollgate under $CARGO_TARGET_DIR or ./target)
#   --mock      mock replica binary (default: tollgate-mock-replica next to --bin)
#   --case      json: non-streamed, 16 tokens (default); sse: `"stream": true`, 64 tokens;
#               whole: the sse request answered in one write with a Content-Length
#               (`x-mock-sse-whole`, the bench's sse64-whole);
#               msgs: a messages-dialect stream of 64 tokens (`/v1/messages`, plugins
#               `dialects` + `chat_completions`)
#   --tool      callgrind (default): instructions per request; strace: syscalls per request
#   --requests  requests in the measured run (default 2000)
#   --base      requests in the baseline run subtracted from it (default 200): startup,
#               shutdown and first-request warm-up cancel out, so the figure is
#               (cost(N) - cost(M)) / (N - M)
#   --keep      keep the callgrind/strace outputs in DIR (default: a temp dir, removed)
#   --chain     chat (default): only the plugins above; full: conf/tollgate.yaml's whole chain
#               (connection_gate auth dialects idempotency chat_completions limits billing) on
#               the embedded stores (SQLite identity and ledger, in-process limiter), with a
#               funded workspace and its key, limits that refuse nothing: what users run
#   --floor     profile the bare Pingora floor instead (`tollgate-bench-floor --mode pass` at
#               PATH, the bench's "pingora" row) with the same client and requests, so the
#               gateway's own share is the difference of the two figures
#   --idem MODE off (default); chain: the `idempotency` plugin joins the chain, requests carry
#               no key; key: the plugin, and each request a fresh `Idempotency-Key` (the
#               in-process record store): the difference is what a key costs
#   PROFILE_CALLGRIND_ARGS  extra callgrind options (scripts/perf_guard.sh: --separate-threads=yes)
#   PROFILE_GLIBC_TUNABLES  glibc tunables for the profiled process (default: no `rep movsb` or
#               `rep stosb` in memcpy and memset). Valgrind counts every byte a `rep movsb`
#               moves as an instruction, and glibc's size from which it copies that way
#               depends on the CPU's vendor and model: on an Intel Xeon with FSRM the
#               non-streamed request counted 11% more than on an AMD EPYC with the same
#               binary. With the vector loops on every CPU the counts compare across machines.
#
# The gateway runs with the config scripts/bench.py writes (one model pool on a mock
# replica, only the `chat_completions` plugin, no identity, threads: 1) under valgrind
# (callgrind) or strace -f -c. One client connection with keep-alive sends the same request
# (bench.py's bodies and headers) N times, one after another; the gateway is then stopped
# with SIGTERM (grace period 1 s; the floor with SIGINT, Pingora's fast shutdown) so callgrind
# writes its counts.
#
# Prints e.g. `json callgrind: 2000 vs 200 requests: 412345.6 instructions/request` and, with
# --keep, leaves callgrind.CASE.N / callgrind.CASE.M for `callgrind_annotate --inclusive=yes`.
set -euo pipefail

BIN="" MOCK="" CASE=json TOOL=callgrind N=2000 M=200 KEEP="" IDEM=off CHAIN=chat FLOOR=""
while [[ $# -gt 0 ]]; do
    case $1 in
    --bin) BIN=$2; shift 2 ;;
    --mock) MOCK=$2; shift 2 ;;
    --case) CASE=$2; shift 2 ;;
    --tool) TOOL=$2; shift 2 ;;
    --requests) N=$2; shift 2 ;;
    --base) M=$2; shift 2 ;;
    --keep) KEEP=$2; shift 2 ;;
    --idem) IDEM=$2; shift 2 ;;
    --chain) CHAIN=$2; shift 2 ;;
    --floor) FLOOR=$2; shift 2 ;;
    -h | --help) sed -n '2,44p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
ROOT=$(cd "$(dirname "$0")/.." && pwd)
NO_REP_STRINGS=glibc.cpu.x86_rep_movsb_threshold=4294967295:glibc.cpu.x86_rep_stosb_threshold=4294967295
TUNABLES=${PROFILE_GLIBC_TUNABLES-$NO_REP_STRINGS}
BIN=${BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/dist/tollgate}
MOCK=${MOCK:-$(dirname "$BIN")/tollgate-mock-replica}
[[ -x $BIN ]] || { echo "no gateway binary at $BIN" >&2; exit 1; }
[[ -x $MOCK ]] || { echo "no mock replica at $MOCK" >&2; exit 1; }
case $CASE in json | sse | whole | msgs) ;; *) echo "--case json|sse|whole|msgs" >&2; exit 2 ;; esac
case $TOOL in callgrind | strace) ;; *) echo "--tool callgrind|strace" >&2; exit 2 ;; esac
case $IDEM in off | chain | key) ;; *) echo "--idem off|chain|key" >&2; exit 2 ;; esac
case $CHAIN in chat | full) ;; *) echo "--chain chat|full" >&2; exit 2 ;; esac
[[ -z $FLOOR || -x $FLOOR ]] || { echo "no floor binary at $FLOOR" >&2; exit 1; }
if [[ -n $FLOOR && ( $CHAIN == full || $CASE == msgs || $IDEM != off ) ]]; then
    echo "--floor profiles the plain proxy hop: the json, sse and whole cases, no chain options" >&2
    exit 2
fi
if [[ $CHAIN == full && ( $CASE == msgs || $IDEM != off ) ]]; then
    echo "--chain full runs the json, sse and whole cases, with the chain's own idempotency plugin" >&2
    exit 2
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-profile.XXXXXX")
OUTDIR=${KEEP:-$WORK}
mkdir -p "$OUTDIR"
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
    local port=$1 pid=$2
    for _ in $(seq 600); do
        kill -0 "$pid" 2>/dev/null || { echo "process $pid died" >&2; return 1; }
        python3 -c "import socket,sys; s=socket.socket(); sys.exit(s.connect_ex(('127.0.0.1',$port)))" && return 0
        sleep 0.1
    done
    echo "port $port not listening" >&2
    return 1
}

MOCK_PORT=$(free_port)
"$MOCK" --listen "127.0.0.1:$MOCK_PORT" --threads 1 >"$WORK/mock.log" 2>&1 &
PIDS+=($!)
wait_port "$MOCK_PORT" "${PIDS[0]}"

mkdir -p "$WORK/gw"
# shellcheck source=bench/config_yaml.sh
source "$ROOT/scripts/bench/config_yaml.sh"
bench_models_yaml "chat_completions, messages" >"$WORK/gw/models.yaml"
bench_upstreams_yaml "$MOCK_PORT" 4096 >"$WORK/gw/upstreams.yaml"

MESSAGES='[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Write one short sentence about gateways."}]'
if [[ $CASE == json ]]; then
    printf '{"model":"llama-3.1-8b-instruct","messages":%s,"max_tokens":512}' "$MESSAGES" >"$WORK/body.json"
    TOKENS=16
elif [[ $CASE == sse || $CASE == whole ]]; then
    printf '{"model":"llama-3.1-8b-instruct","messages":%s,"max_tokens":512,"stream":true,"stream_options":{"include_usage":true}}' \
        "$MESSAGES" >"$WORK/body.json"
    TOKENS=64
else
    printf '{"model":"llama-3.1-8b-instruct","system":"You are a helpful assistant.","messages":[{"role":"user","content":"Write one short sentence about gateways."}],"max_tokens":512,"stream":true}' \
        >"$WORK/body.json"
    TOKENS=64
fi
REQUEST_PATH=/v1/chat/completions
PLUGINS="  - name: chat_completions"
if [[ $CASE == msgs ]]; then
    REQUEST_PATH=/v1/messages
    PLUGINS=$'  - name: dialects\n  - name: chat_completions'
fi
if [[ $IDEM != off ]]; then PLUGINS+=$'\n  - name: idempotency'; fi
# The full chain: stores, secrets and limits, written after the plugins list.
STORES=""
API_KEY=""
if [[ $CHAIN == full ]]; then
    PLUGINS=$(full_chain_plugins_yaml | tail -n +2)
    "$BIN" init-secrets --dir "$WORK/secrets" >/dev/null
    STORES="$(identity_yaml "{ backend: sqlite, path: $WORK/tollgate.db }" "$WORK/secrets")
billing:
  topup_url: https://billing.example.com/top-up
$(open_limits_yaml "{ backend: in_process }")"
fi

# client PORT COUNT: COUNT identical POSTs on one keep-alive connection; fails on any non-200.
client() {
    python3 - "$1" "$2" "$WORK/body.json" "$TOKENS" "$CASE" "$REQUEST_PATH" "$IDEM" "$API_KEY" "${FLOOR:+floor}" <<'PY'
import http.client, sys
port, count, body_file, tokens, case, path, idem, key, floor = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6], sys.argv[7], sys.argv[8], sys.argv[9] == "floor"
body = open(body_file, "rb").read()
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
for i in range(count):
    conn.putrequest("POST", path, skip_accept_encoding=True)
    conn.putheader("Content-Type", "application/json")
    conn.putheader("x-mock-tokens", tokens)
    if case == "whole":
        conn.putheader("x-mock-sse-whole", "1")
    if key:
        conn.putheader("Authorization", f"Bearer {key}")
    if idem == "key":
        conn.putheader("Idempotency-Key", f"profile-{port}-{i}")
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body)
    r = conn.getresponse()
    data = r.read()
    # The floor passes the replica's answer on unpriced: no `cost` in its usage.
    done = {"json": b'"usage"' if floor else b'"cost"', "sse": b"data: [DONE]", "whole": b"data: [DONE]", "msgs": b"event: message_stop"}[case]
    if r.status != 200 or done not in data or (case != "msgs" and not floor and b'"cost"' not in data):
        sys.exit(f"request {i}: HTTP {r.status}: {data[:300]!r}")
conn.close()
PY
}

# write_config PORT ADMIN_PORT: the gateway's tollgate.yaml.
write_config() {
    local port=$1 admin=$2
    cat >"$WORK/gw/tollgate.yaml" <<EOF
listen: 127.0.0.1:$port
admin_listen: 127.0.0.1:$admin
threads: 1
models_file: models.yaml
upstreams_file: upstreams.yaml
shutdown:
  grace_period_seconds: 1
  graceful_shutdown_timeout_seconds: 1
plugins:
$(printf '%b' "$PLUGINS")
$STORES
EOF
}

# The full chain's workspace, funded, and its key: made once through the admin API of a
# gateway run outside the tool, so both measured runs use the same store.
if [[ $CHAIN == full ]]; then
    port=$(free_port)
    admin_port=$(free_port)
    write_config "$port" "$admin_port"
    env RUST_LOG=warn TMPDIR="$WORK/gw" "$BIN" serve --config "$WORK/gw/tollgate.yaml" >"$WORK/gw.setup.log" 2>&1 &
    setup_pid=$!
    PIDS+=("$setup_pid")
    wait_port "$admin_port" "$setup_pid" || { tail -20 "$WORK/gw.setup.log" >&2; exit 1; }
    admin() {
        python3 - "$admin_port" "$WORK/secrets/admin_token" "$1" "$2" "$3" <<'PY'
import http.client, json, sys
port, token_file, path, body, field = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
conn.request("POST", path, body, {"Authorization": "Bearer " + open(token_file).read().strip(), "Content-Type": "application/json"})
r = conn.getresponse()
data = r.read()
if r.status >= 300:
    sys.exit(f"admin {path}: HTTP {r.status}: {data[:300]!r}")
print(json.loads(data).get(field, "") if field else "")
PY
    }
    WS=$(admin /admin/v1/workspaces '{"name":"profile"}' id) || exit 1
    API_KEY=$(admin "/admin/v1/workspaces/$WS/keys" '{"name":"profile"}' key) || exit 1
    admin "/admin/v1/workspaces/$WS/credits" '{"amount_cents":100000000,"source":"purchase"}' "" >/dev/null || exit 1
    kill -TERM "$setup_pid"
    wait "$setup_pid" || true
fi

# run COUNT: one gateway under the tool, COUNT requests, stopped; prints the tool's output file.
run() {
    local count=$1 port admin out pid
    port=$(free_port)
    admin=$(free_port)
    write_config "$port" "$admin"
    local cmd=("$BIN" serve --config "$WORK/gw/tollgate.yaml") stop=TERM
    if [[ -n $FLOOR ]]; then
        # SIGINT: Pingora's fast shutdown (the floor has no short grace period configured).
        cmd=("$FLOOR" --listen "127.0.0.1:$port" --upstream "127.0.0.1:$MOCK_PORT" --mode pass)
        stop=INT
    fi
    if [[ $TOOL == callgrind ]]; then
        out=$OUTDIR/callgrind.$CASE.$count
        # shellcheck disable=SC2086 # PROFILE_CALLGRIND_ARGS: extra callgrind options, word-split
        env RUST_LOG=warn TMPDIR="$WORK/gw" GLIBC_TUNABLES="$TUNABLES" valgrind --tool=callgrind --callgrind-out-file="$out" \
            ${PROFILE_CALLGRIND_ARGS:-} "${cmd[@]}" >"$WORK/gw.$count.log" 2>&1 &
    else
        out=$OUTDIR/strace.$CASE.$count
        env RUST_LOG=warn TMPDIR="$WORK/gw" strace -f -c -o "$out" \
            "${cmd[@]}" >"$WORK/gw.$count.log" 2>&1 &
    fi
    pid=$!
    wait_port "$port" "$pid" || { tail -20 "$WORK/gw.$count.log" >&2; return 1; }
    # Signal the gateway itself (under strace, $! is strace, which would only detach).
    local gw=$pid
    if [[ $TOOL == strace ]]; then gw=$(pgrep -P "$pid" | head -n 1); fi
    if [[ $count -gt 0 ]] && ! client "$port" "$count" >&2; then
        kill -"$stop" "$gw"
        wait "$pid" || true
        return 1
    fi
    kill -"$stop" "$gw"
    wait "$pid" || true
    echo "$out"
}

total_ir() { awk '/^summary:/{print $2}' "$1"; }
total_calls() { awk '$NF=="total"{print $(NF-1)}' "$1"; }

A=$(run "$M") || exit 1
B=$(run "$N") || exit 1
if [[ $TOOL == callgrind ]]; then
    ia=$(total_ir "$A")
    ib=$(total_ir "$B")
    awk -v a="$ia" -v b="$ib" -v n="$N" -v m="$M" -v c="$CASE" \
        'BEGIN{printf "%s callgrind: %d vs %d requests: %.1f instructions/request (totals %d, %d)\n", c, n, m, (b-a)/(n-m), b, a}'
else
    # per syscall: (calls in N run - calls in M run) / (N - M)
    python3 - "$A" "$B" "$N" "$M" "$CASE" <<'PY'
import sys
def parse(path):
    calls = {}
    for line in open(path):
        f = line.split()
        if len(f) < 5 or not f[0][0].isdigit():
            continue
        name = f[-1]
        if name == "total":
            continue
        # columns: %time seconds usecs/call calls [errors] syscall
        calls[name] = int(f[3])
    return calls
a, b = parse(sys.argv[1]), parse(sys.argv[2])
n, m, case = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
rows = sorted(((b.get(k, 0) - a.get(k, 0)) / (n - m), k) for k in set(a) | set(b))
total = sum(r for r, _ in rows)
print(f"{case} strace: {n} vs {m} requests: {total:.2f} syscalls/request")
for r, k in reversed(rows):
    if abs(r) >= 0.005:
        print(f"  {k:<16} {r:6.2f}")
PY
fi
if [[ -n $KEEP ]]; then echo "outputs in $OUTDIR" >&2; fi
