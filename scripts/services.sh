#!/usr/bin/env bash
# Makes the local PostgreSQL and Redis the tests use reachable: installs them from Debian's
# packages when missing, starts them when stopped, and prints the URLs to export.
#   eval "$(scripts/services.sh)"   # sets DATABASE_URL and REDIS_URL
# An explicit DATABASE_URL / REDIS_URL in the environment is used as it is.
set -euo pipefail
log() { echo "services: $*" >&2; }
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
apt_install() {
  log "installing $*"
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >&2
}

# PostgreSQL --------------------------------------------------------------------------
DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
pg_up() { pg_isready -q -h 127.0.0.1 -p 5432 >/dev/null 2>&1; }
if [[ "$DATABASE_URL" == *"@127.0.0.1:5432/"* || "$DATABASE_URL" == *"@localhost:5432/"* ]]; then
  if ! command -v pg_ctlcluster >/dev/null 2>&1; then
    apt_install postgresql postgresql-client
  fi
  if ! pg_up; then
    log "starting PostgreSQL"
    for v in $(ls /etc/postgresql 2>/dev/null); do
      $SUDO pg_ctlcluster --skip-systemctl-redirect "$v" main start >&2 || true
    done
    for _ in $(seq 1 50); do pg_up && break; sleep 0.2; done
  fi
  pg_up || { log "PostgreSQL did not come up on 127.0.0.1:5432"; exit 1; }
  if ! psql "$DATABASE_URL" -qtAc 'select 1' >/dev/null 2>&1; then
    # A fresh Debian install asks for a password on TCP: give the postgres role one.
    log "setting a password for the postgres role (fresh install)"
    $SUDO -u postgres psql -qc "ALTER USER postgres PASSWORD 'postgres'" >&2 2>/dev/null \
      || su postgres -c "psql -qc \"ALTER USER postgres PASSWORD 'postgres'\"" >&2
    DATABASE_URL="postgres://postgres:postgres@127.0.0.1:5432/postgres"
    psql "$DATABASE_URL" -qtAc 'select 1' >/dev/null || { log "cannot log in to PostgreSQL"; exit 1; }
  fi
fi

# Redis -------------------------------------------------------------------------------
REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379}"
if [[ "$REDIS_URL" == "redis://127.0.0.1:6379"* ]]; then
  command -v redis-server >/dev/null 2>&1 || apt_install redis-server
  if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    log "starting Redis"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no >&2
    for _ in $(seq 1 50); do redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 && break; sleep 0.1; done
  fi
  redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null || { log "Redis did not come up"; exit 1; }
fi

echo "export DATABASE_URL='$DATABASE_URL'"
echo "export REDIS_URL='$REDIS_URL'"
