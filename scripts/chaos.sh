#!/usr/bin/env bash
# The chaos suite (issue 48, tests/chaos.rs): two gateway instances on one PostgreSQL and a
# Redis of the suite's own, streaming clients, and per scenario one production failure (an
# instance SIGKILLed mid-stream, Redis restarted, PostgreSQL restarted, a replica killed and
# another frozen, clients leaving). Prints one line per scenario: requests, outcomes by status
# and code, hung requests, time to recover, the ledger audit and the limits check; fails if a
# request hung, the audit failed or a limit was exceeded.
#
#   scripts/chaos.sh          the short form (what the test command runs; a few minutes)
#   scripts/chaos.sh --long   48 clients, 10 s outages, a minute of load after each fault
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
    --long) export CHAOS_LONG=1 ;;
    "") ;;
    *) echo "usage: $0 [--long]" >&2; exit 2 ;;
esac
scripts/setup.sh
eval "$(scripts/services.sh)"
# The scenarios run one at a time (they share the two cores); each prints its line.
cargo test --test chaos -- --nocapture --test-threads 1 2>&1 | grep -E '^chaos: |^test |test result|panicked'
