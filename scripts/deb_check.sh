#!/usr/bin/env bash
# Build the Debian package, install it with dpkg -i, start tollgate as its systemd unit says
# (with systemctl when systemd runs this machine; else the unit's ExecStart as its User with
# its Environment and runtime directory), and check that it answers `GET /admin/v1/health`
# with the admin token the package made. Then the package is purged and what it left
# (the tollgate user, /var/lib/tollgate) removed, so the machine is as before.
#   scripts/deb_check.sh [--bin target/debug/tollgate]
# Needs root (sudo is used when not root). Part of scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=target/dist/tollgate
[ "${1:-}" = --bin ] && BIN=$2
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"

if dpkg -s tollgate >/dev/null 2>&1; then
    echo "deb_check: a tollgate package is installed already; not touching it" >&2; exit 1
fi
DEB=$(scripts/package_deb.sh --bin "$BIN" --out target/deb --compression gzip)
echo "deb_check: built $DEB ($(du -h "$DEB" | cut -f1))"
cleanup() {
    $SUDO pkill -KILL -u tollgate 2>/dev/null && sleep 0.5 || true
    $SUDO dpkg --purge tollgate >/dev/null 2>&1 || true
    $SUDO rm -rf /var/lib/tollgate /run/tollgate /etc/tollgate
    $SUDO userdel tollgate 2>/dev/null || true
    $SUDO groupdel tollgate 2>/dev/null || true
}
trap cleanup EXIT

$SUDO dpkg -i "$DEB" >/dev/null
echo "deb_check: installed; files:"
dpkg -L tollgate | grep -E '^/(usr/bin|lib/systemd|etc/tollgate)/' | sed 's/^/  /'
getent passwd tollgate >/dev/null || { echo "deb_check: no tollgate user" >&2; exit 1; }
for f in key_pepper key_encryption_key admin_token; do
    mode=$($SUDO stat -c '%U %a' "/var/lib/tollgate/secrets/$f")
    [ "$mode" = "tollgate 600" ] || { echo "deb_check: secrets/$f is $mode, not tollgate 600" >&2; exit 1; }
done
$SUDO runuser -u tollgate -- /usr/bin/tollgate check-config --config /etc/tollgate/tollgate.yaml >/dev/null

UNIT=/lib/systemd/system/tollgate.service
unit() { sed -n "s/^$1=//p" "$UNIT" | head -1; }
if [ -d /run/systemd/system ]; then
    $SUDO systemctl start tollgate.service
    STARTED=systemctl
else
    # No systemd here (a container): what the unit would run, as it would run it.
    USER_=$(unit User); EXEC=$(unit ExecStart); ENV_=$(unit Environment)
    $SUDO install -d -o "$USER_" -g "$(unit Group)" -m "$(unit RuntimeDirectoryMode)" "/run/$(unit RuntimeDirectory)"
    # shellcheck disable=SC2086
    $SUDO env $ENV_ runuser -u "$USER_" -- $EXEC > target/deb/serve.log 2>&1 &
    STARTED="the unit's ExecStart as $USER_"
fi
ADMIN=$(sed -n 's/^admin_listen: *\([^ ]*\).*/\1/p' /etc/tollgate/tollgate.yaml)
TOKEN=$($SUDO cat /var/lib/tollgate/secrets/admin_token)
for _ in $(seq 1 300); do
    if BODY=$(curl -fsS -m 2 -H "Authorization: Bearer $TOKEN" "http://$ADMIN/admin/v1/health" 2>/dev/null); then
        break
    fi
    BODY=""
    sleep 0.1
done
if [ -z "$BODY" ]; then
    echo "deb_check: no answer from http://$ADMIN/admin/v1/health" >&2
    cat target/deb/serve.log >&2 2>/dev/null || true
    exit 1
fi
echo "$BODY" | grep -q '"status":"ok"' || { echo "deb_check: health says $BODY" >&2; exit 1; }
echo "deb_check: started by $STARTED, /admin/v1/health: $(echo "$BODY" | cut -c1-120)"
# The public listener answers too, with the catalogued envelope for a missing key.
PUBLIC=$(sed -n 's/^listen: *\([^ ]*\).*/\1/p' /etc/tollgate/tollgate.yaml | sed 's/0\.0\.0\.0/127.0.0.1/')
CODE=$(curl -sS -m 5 -o /dev/null -w '%{http_code}' "http://$PUBLIC/v1/models")
[ "$CODE" = 401 ] || { echo "deb_check: GET /v1/models without a key answered $CODE" >&2; exit 1; }
# A graceful stop (the unit's KillSignal) of an idle gateway ends at once (decision 166).
$SUDO pkill "-$(unit KillSignal | sed 's/^SIG//')" -u tollgate -f "tollgate serve"
for _ in $(seq 1 150); do
    pgrep -u tollgate -f "tollgate serve" >/dev/null || break
    sleep 0.1
done
if pgrep -u tollgate -f "tollgate serve" >/dev/null; then
    echo "deb_check: still running 15 s after $(unit KillSignal)" >&2; exit 1
fi
echo "deb_check: ok (GET /v1/models without a key: 401; stopped by $(unit KillSignal))"
