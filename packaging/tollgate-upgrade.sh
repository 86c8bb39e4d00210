#!/usr/bin/env bash
# Zero-downtime binary upgrade of a running tollgate (docs/operations.md, "Zero-downtime
# upgrade"). Install the new binary first; the running process keeps the file it started from:
#   install -m 0755 tollgate /usr/local/bin/tollgate.new && mv -f /usr/local/bin/tollgate.new /usr/local/bin/tollgate
#
# What it does:
#   1. checks the configuration with the new binary (on failure nothing has changed);
#   2. starts `tollgate serve --config F --upgrade`: it loads the config, opens the stores,
#      then waits (about 5 s) on $TMPDIR/tollgate-<port>.sock for the listening sockets;
#   3. sends SIGQUIT to the running process: it hands its listening sockets over, accepts
#      for 5 more seconds, then stops accepting and finishes its requests;
#   4. checks that the new process holds the public port, then waits until the old process
#      has exited (once no request runs, for a quiet second; at most its
#      shutdown.grace_period_seconds, ~13 min at 800: decision 166).
# <port> is the port of `listen` in the config. Both processes must use the same TMPDIR, and
# `listen` and `admin_listen` must not change across the upgrade.
#
# Without systemd: run it as the user tollgate runs as, with the same environment (secrets,
# DATABASE_URL, REDIS_URL...) and the same TMPDIR as the running process. The new process's
# stderr goes to --log.
#   TMPDIR=/run/tollgate packaging/tollgate-upgrade.sh --config /etc/tollgate/tollgate.yaml --log /var/log/tollgate/tollgate.log
#
# Under systemd (packaging/tollgate.service): run it as root with --systemd. A Type=simple
# service ends when its main process (the old one) exits, so the new process is started as
# a transient unit, tollgate-<UTC time>.service, with the service's user, environment file
# and sandbox (PROPS below: keep them in step with tollgate.service).
#   packaging/tollgate-upgrade.sh --systemd
set -euo pipefail

CONFIG=/etc/tollgate/tollgate.yaml
BINARY=/usr/local/bin/tollgate
RUN_DIR=""
STATE_DIR=/var/lib/tollgate
OLD_PID=""
SYSTEMD=0
ENV_FILE=/etc/tollgate/tollgate.env
SERVICE_USER=tollgate
LOG=""
WAIT_OLD=1
START_TIMEOUT=120

usage() {
  cat <<'EOT'
usage: tollgate-upgrade.sh [options]
  --config F          tollgate.yaml of the running process (/etc/tollgate/tollgate.yaml)
  --binary B          the new binary (/usr/local/bin/tollgate)
  --run-dir D         TMPDIR of the running process (--systemd: /run/tollgate; else $TMPDIR or /tmp)
  --pid N             pid of the running process (default: from D/tollgate-<port>.pid, else
                      the process listening on the public port, found with `ss`)
  --log F             without --systemd: where the new process's stderr goes (D/tollgate-<port>.log)
  --start-timeout S   seconds the new process may take to load its config and open its stores (120)
  --no-wait           return once the new process serves; do not wait for the old one to exit
  --systemd           start the new process as a transient systemd unit (run as root)
  --user U            --systemd: the service user (tollgate)
  --env-file F        --systemd: the service's environment file (/etc/tollgate/tollgate.env)
  --state-dir D       --systemd: the writable state directory (/var/lib/tollgate)
EOT
}

say() { printf 'tollgate-upgrade: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }
value() { [ $# -ge 2 ] || die "$1 needs a value"; printf '%s' "$2"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --config) CONFIG=$(value "$@"); shift 2 ;;
    --binary) BINARY=$(value "$@"); shift 2 ;;
    --run-dir) RUN_DIR=$(value "$@"); shift 2 ;;
    --pid) OLD_PID=$(value "$@"); shift 2 ;;
    --log) LOG=$(value "$@"); shift 2 ;;
    --start-timeout) START_TIMEOUT=$(value "$@"); shift 2 ;;
    --no-wait) WAIT_OLD=0; shift ;;
    --systemd) SYSTEMD=1; shift ;;
    --user) SERVICE_USER=$(value "$@"); shift 2 ;;
    --env-file) ENV_FILE=$(value "$@"); shift 2 ;;
    --state-dir) STATE_DIR=$(value "$@"); shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done

[ -r "$CONFIG" ] || die "cannot read $CONFIG"
[ -x "$BINARY" ] || die "$BINARY is not an executable"
if [ -z "$RUN_DIR" ]; then
  if [ "$SYSTEMD" = 1 ]; then RUN_DIR=/run/tollgate; else RUN_DIR=${TMPDIR:-/tmp}; fi
fi
[ -d "$RUN_DIR" ] || die "$RUN_DIR does not exist (the running process's TMPDIR)"

# ---- read the config -------------------------------------------------------------------
# Only what this script needs, from the file's text (comment lines skipped).
listen=$(awk '/^[[:space:]]*#/ { next }
  /^listen:/ { sub(/^listen:[[:space:]]*/, ""); sub(/[[:space:]#].*/, ""); gsub(/["\047]/, ""); print; exit }' "$CONFIG")
listen=${listen:-0.0.0.0:8080}
PORT=${listen##*:}
[[ $PORT =~ ^[0-9]+$ ]] || die "cannot tell the port of listen: $listen"
setting() { # setting NAME DEFAULT: a numeric setting anywhere in the file (block or flow style)
  local v
  v=$(awk -v k="$1" '/^[[:space:]]*#/ { next }
    match($0, "(^|[[:space:]{,])" k ":[[:space:]]*[0-9]+") {
      s = substr($0, RSTART, RLENGTH); sub(/.*:[[:space:]]*/, "", s); print s; exit }' "$CONFIG")
  printf '%s' "${v:-$2}"
}
GRACE=$(setting grace_period_seconds 800)
FINAL=$(setting graceful_shutdown_timeout_seconds 5)
PID_FILE="$RUN_DIR/tollgate-$PORT.pid"
SOCK="$RUN_DIR/tollgate-$PORT.sock"

# ---- processes -------------------------------------------------------------------------
start_time() { awk '{print $22}' "/proc/$1/stat" 2>/dev/null || true; }
running() { # running PID [START]: alive, not a zombie, and (with START) the same process
  local st
  [ -n "$1" ] && [ -r "/proc/$1/stat" ] || return 1
  st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [ "$st" != Z ] || return 1
  [ -z "${2:-}" ] || [ "$(start_time "$1")" = "$2" ]
}
is_tollgate() { case "$(cat "/proc/$1/comm" 2>/dev/null)" in tollgate*) return 0 ;; *) return 1 ;; esac; }
listening_pids() { # pids holding a listening TCP socket on the public port
  command -v ss >/dev/null || return 0
  { ss -ltnp "sport = :$PORT" 2>/dev/null || true; } | { grep -o 'pid=[0-9]*' || true; } | cut -d= -f2 | sort -u
}

if [ -z "$OLD_PID" ] && [ -s "$PID_FILE" ]; then
  OLD_PID=$(tr -dc '0-9' <"$PID_FILE")
  running "$OLD_PID" || OLD_PID=""
fi
if [ -z "$OLD_PID" ]; then
  command -v ss >/dev/null || die "no live pid in $PID_FILE and no \`ss\` to find the process on :$PORT; pass --pid"
  pids=$(listening_pids)
  [ -n "$pids" ] || die "nothing listens on :$PORT (as far as this user can see); is tollgate running? pass --pid"
  [ "$(printf '%s\n' "$pids" | wc -l)" = 1 ] || die "several processes listen on :$PORT ($(echo $pids)); pass --pid"
  OLD_PID=$pids
fi
running "$OLD_PID" || die "process $OLD_PID is not running"
is_tollgate "$OLD_PID" || die "process $OLD_PID is $(cat "/proc/$OLD_PID/comm" 2>/dev/null), not tollgate"
OLD_START=$(start_time "$OLD_PID")
OLD_UNIT=""
if [ "$SYSTEMD" = 1 ]; then
  command -v systemd-run >/dev/null || die "--systemd needs systemd-run"
  [ "$(id -u)" = 0 ] || die "--systemd must run as root"
  OLD_UNIT=$(ps -o unit= -p "$OLD_PID" 2>/dev/null | tr -d ' ' || true)
fi
say "running: pid $OLD_PID${OLD_UNIT:+ ($OLD_UNIT)}, public port $PORT, TMPDIR $RUN_DIR"

# Keep in step with packaging/tollgate.service (the transient unit cannot read that file).
PROPS=(
  --uid="$SERVICE_USER" --gid="$SERVICE_USER"
  -p "EnvironmentFile=-$ENV_FILE"
  --setenv="TMPDIR=$RUN_DIR"
  -p LimitNOFILE=65536
  -p NoNewPrivileges=yes -p ProtectSystem=strict -p ProtectHome=yes -p PrivateTmp=yes
  -p PrivateDevices=yes -p ProtectKernelTunables=yes -p ProtectKernelModules=yes
  -p ProtectControlGroups=yes -p RestrictSUIDSGID=yes -p LockPersonality=yes
  -p "ReadWritePaths=-$RUN_DIR -$STATE_DIR"
)

# ---- 1. check the configuration with the new binary ------------------------------------
say "checking $CONFIG with $BINARY"
if [ "$SYSTEMD" = 1 ]; then
  systemd-run --quiet --wait --pipe --collect "${PROPS[@]}" "$BINARY" check-config --config "$CONFIG" \
    || die "the configuration does not pass check-config with the new binary; nothing was changed"
else
  TMPDIR="$RUN_DIR" "$BINARY" check-config --config "$CONFIG" \
    || die "the configuration does not pass check-config with the new binary; nothing was changed"
fi

# ---- 2. start the new process ----------------------------------------------------------
# A socket file left by an earlier upgrade would look like a ready new process.
rm -f "$SOCK"
NEW_UNIT=""
if [ "$SYSTEMD" = 1 ]; then
  NEW_UNIT="tollgate-$(date -u +%Y%m%d%H%M%S).service"
  # Restart=no: started again, `--upgrade` would wait for sockets nobody sends.
  systemd-run --quiet --collect --unit="$NEW_UNIT" --description="tollgate LLM inference gateway (upgraded)" \
    -p Restart=no -p KillSignal=SIGTERM -p "TimeoutStopSec=$((GRACE + FINAL + 95))" "${PROPS[@]}" \
    "$BINARY" serve --config "$CONFIG" --upgrade
  NEW_PID=$(systemctl show -p MainPID --value "$NEW_UNIT")
  [ "${NEW_PID:-0}" != 0 ] || die "$NEW_UNIT did not start: journalctl -u $NEW_UNIT"
  where="journalctl -u $NEW_UNIT"
  stop_new() { systemctl kill -s KILL "$NEW_UNIT" 2>/dev/null || true; }
else
  LOG=${LOG:-$RUN_DIR/tollgate-$PORT.log}
  TMPDIR="$RUN_DIR" setsid "$BINARY" serve --config "$CONFIG" --upgrade >>"$LOG" 2>&1 </dev/null &
  NEW_PID=$!
  where="$LOG"
  stop_new() { kill -KILL "$NEW_PID" 2>/dev/null || true; }
fi
NEW_START=$(start_time "$NEW_PID")
say "started: pid $NEW_PID${NEW_UNIT:+ ($NEW_UNIT)}; its log: $where"

deadline=$((SECONDS + START_TIMEOUT))
until [ -S "$SOCK" ]; do
  running "$NEW_PID" "$NEW_START" || die "the new process exited before it was ready (see $where); the old one serves on"
  if [ "$SECONDS" -ge "$deadline" ]; then
    stop_new
    die "the new process was not ready within ${START_TIMEOUT}s (see $where); stopped it, the old one serves on"
  fi
  sleep 0.2
done

# ---- 3. hand the sockets over ----------------------------------------------------------
say "new process ready; SIGQUIT to $OLD_PID"
kill -QUIT "$OLD_PID"

# ---- 4. check the handover, then wait for the old process ------------------------------
served=0
for i in $(seq 1 75); do # 15 s
  running "$NEW_PID" "$NEW_START" || break
  if command -v ss >/dev/null; then
    now=$(listening_pids)
    if grep -qx "$NEW_PID" <<<"$now"; then served=1; break; fi
  elif [ "$i" -ge 40 ]; then
    served=1 # no `ss`: alive 8 s after the handover (the new process gives up after about 6 s)
    break
  fi
  sleep 0.2
done
if [ "$served" != 1 ]; then
  say "the new process did not take the listening sockets (see $where)."
  say "The old process $OLD_PID stops accepting about 5 s after SIGQUIT, then finishes its requests."
  if [ "$SYSTEMD" = 1 ]; then
    say "Start the service again once it has exited: systemctl start tollgate.service"
  fi
  exit 1
fi
say "pid $NEW_PID${NEW_UNIT:+ ($NEW_UNIT)} now serves :$PORT"
if [ "$SYSTEMD" = 1 ]; then
  say "  reload:  systemctl kill -s HUP $NEW_UNIT  (or: tollgate admin reload)"
  say "  stop:    systemctl stop $NEW_UNIT"
  say "  logs:    journalctl -u $NEW_UNIT"
  say "  ${OLD_UNIT:-the old unit} shows inactive once the old process has exited; at boot tollgate.service starts as usual."
fi

[ "$WAIT_OLD" = 1 ] || { say "not waiting for $OLD_PID (--no-wait)"; exit 0; }
limit=$((GRACE + FINAL + 5 + 60))
say "waiting for $OLD_PID to finish its requests and exit (up to ${limit}s)"
deadline=$((SECONDS + limit))
while running "$OLD_PID" "$OLD_START"; do
  [ "$SECONDS" -lt "$deadline" ] || die "$OLD_PID still runs after ${limit}s; SIGINT ends it at once (requests still running are cut)"
  sleep 5
done
say "done: the old process has exited"
