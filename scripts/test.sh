#!/usr/bin/env bash
# The test command (README, CI): formatting, lints with warnings denied, every Rust test
# (unit, integration against the real binaries and the mock replica, store suites against
# SQLite and the real PostgreSQL), the config check of conf/, the official `openai`
# Python client against a running gateway, the Debian package, the request-head fuzz target,
# and the performance guard (instructions per request of the full chain, `dist` build).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# PostgreSQL and Redis: installed and started when missing (tests never skip them).
eval "$(scripts/services.sh)"
# Each PostgreSQL test makes its own database; drop those of earlier runs.
for db in $(psql "$DATABASE_URL" -qtAc "select datname from pg_database where datname like 'tollgate_t_%'"); do
  psql "$DATABASE_URL" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
done

echo "== vendor/pingora-core is the published crate plus vendor/patches"
scripts/vendor_pingora.sh --check
echo "== cargo fmt --check"
cargo fmt --check
echo "== cargo clippy (warnings denied)"
cargo clippy --all-targets -- -D warnings
echo "== tollgate check-config conf/tollgate.yaml"
cargo build --bins
./target/debug/tollgate init-secrets --dir data/secrets >/dev/null
./target/debug/tollgate check-config --config conf/tollgate.yaml
echo "== cargo test"
cargo test
echo "== official client tests (pytest)"
TOLLGATE_BIN=target/debug/tollgate MOCK_BIN=target/debug/tollgate-mock-replica \
  .venv/bin/python -m pytest -q tests/python
echo "== the Debian package: built, installed with dpkg -i, started, answering, purged"
scripts/deb_check.sh --bin target/debug/tollgate
echo "== fuzz: the request-head target for 30 s (tests/fuzz, libFuzzer; issue 49)"
FUZZ_TARGETS=request_heads FUZZ_DEV=1 tests/fuzz/run.sh 30
echo "== performance guard: instructions per request of the full chain against benches/instructions.txt"
scripts/perf_guard.sh
