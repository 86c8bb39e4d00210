# Sourced by the bash scripts that run the mock replica and gateways (demo.sh, ledger_load.sh,
# saturate.sh, profile.sh): one way to start them on ports they pick themselves, wait until
# they accept, and stop everything started here when the script exits.
#
# Each process listens on port 0 and announces its port on its first line of output: the mock
# `listening on ADDR`, `tollgate serve` `tollgate: listen ADDR admin_listen ADDR` (decision
# 222). So no script probes for free ports, and two scripts never meet on one.
#
#   stack_init DIR              output of every process goes to DIR/NAME.out and DIR/NAME.log;
#                               stops them all on EXIT, then calls `stack_after_stop` if the
#                               script defines it
#   stack_mock NAME CMD...      CMD runs the mock with `--listen 127.0.0.1:0`; sets MOCK_PORT
#   stack_gateway NAME CMD...   CMD runs `tollgate serve` on a config whose listeners are on
#                               port 0; sets GW_PORT and ADMIN_PORT
#   stack_stop NAME             stop one process and wait for it
# Each start sets STACK_PID. A process that exits or stays silent for 20 s ends the script
# with its log's tail.

declare -gA STACK_PIDS=()
STACK_DIR=""

stack_init() {
    STACK_DIR=$1
    mkdir -p "$STACK_DIR"
    trap stack_exit EXIT
}

stack_exit() {
    local pid
    for pid in "${STACK_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${STACK_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    STACK_PIDS=()
    if declare -F stack_after_stop >/dev/null; then stack_after_stop; fi
}

stack_fail() {
    printf '%s\n' "$1" >&2
    tail -n 20 "$STACK_DIR/$2.log" >&2 2>/dev/null || true
    exit 1
}

stack_start() {
    local name=$1
    shift
    "$@" >"$STACK_DIR/$name.out" 2>"$STACK_DIR/$name.log" &
    STACK_PID=$!
    STACK_PIDS[$name]=$STACK_PID
}

# stack_announced NAME PREFIX: wait for NAME's line starting with PREFIX; sets STACK_LINE.
stack_announced() {
    local name=$1 prefix=$2 _
    for _ in $(seq 200); do
        STACK_LINE=$(grep -m1 "^$prefix" "$STACK_DIR/$name.out" 2>/dev/null || true)
        [[ -n $STACK_LINE ]] && return 0
        kill -0 "${STACK_PIDS[$name]}" 2>/dev/null || stack_fail "$name exited before it listened" "$name"
        sleep 0.1
    done
    stack_fail "$name announced no port within 20 s" "$name"
}

# stack_wait_port NAME PORT: wait until 127.0.0.1:PORT accepts.
stack_wait_port() {
    local name=$1 port=$2 _
    for _ in $(seq 200); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
        kill -0 "${STACK_PIDS[$name]}" 2>/dev/null || stack_fail "$name exited before it accepted" "$name"
        sleep 0.1
    done
    stack_fail "$name does not accept on $port" "$name"
}

stack_mock() {
    local name=$1
    stack_start "$@"
    stack_announced "$name" "listening on "
    MOCK_PORT=${STACK_LINE##*:}
    stack_wait_port "$name" "$MOCK_PORT"
}

stack_gateway() {
    local name=$1 _ public admin
    stack_start "$@"
    stack_announced "$name" "tollgate: listen "
    read -r _ _ public _ admin <<<"$STACK_LINE"
    GW_PORT=${public##*:} ADMIN_PORT=${admin##*:}
    stack_wait_port "$name" "$GW_PORT"
    stack_wait_port "$name" "$ADMIN_PORT"
}

stack_stop() {
    local pid=${STACK_PIDS[$1]:-}
    [[ -n $pid ]] || return 0
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    unset "STACK_PIDS[$1]"
}
