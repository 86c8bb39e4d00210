#!/usr/bin/env python3
"""Load bench: what the gateway adds on top of a replica, next to nginx doing a plain proxy
hop in front of the same replica. Loopback only (127.0.0.1), bounded in time, and it stops
everything it started on exit.

  scripts/bench.py [--quick] [--no-build]

The ladder: the mock replica (`direct`), nginx, the bare Pingora floor (`pingora`,
`pingora-replay`), the gateway with chat_completions alone (`gateway`) and, with BENCH_FULL,
the full default chain on SQLite (`gw-full`) and on PostgreSQL + Redis (`gw-full-pg`); the
comparison sets BENCH_LIMITS and BENCH_BILLING add their own gateways. Each runs the cases
json16, sse64 (and json256, sse64-paced, sse64-whole; json16-h2, sse64-h2 with BENCH_H2), a
paced run and one connection; the report gives CPU per request of each proxy (utime+stime and
schedstat around each run) and its ratio to the nginx hop, with the issue's targets met or
NOT met. The table goes to stdout; everything raw to target/bench/load-<time>/. The method,
the options (BENCH_* environment variables, REDIS_URL, DATABASE_URL, NGINX_BIN) and what
each figure means: docs/benchmarks.md. Modules: scripts/bench/*.py (settings, stack, clients,
measure, ladder, report).
"""
import argparse
import os
import signal
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts", "bench"))
sys.dont_write_bytecode = True  # no __pycache__ beside the shell helpers

import ladder  # noqa: E402
import settings  # noqa: E402


def interrupted(signum, _frame):
    # Unwinds through the cleanup (stack.Stack.stop) like any error, with the shell's codes.
    raise SystemExit(128 + signum)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3-second runs (default: BENCH_SECONDS, else 10)")
    parser.add_argument("--no-build", action="store_true",
                        help="use the binaries already in target/dist (or BENCH_BIN_DIR)")
    args = parser.parse_args()
    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    try:
        s = settings.load(args.quick, not args.no_build, ROOT)
        settings.prepare_tools(s)
        ladder.main(s)
    except settings.BenchError as e:
        settings.log(f"ERROR: {e}")
        sys.exit(1)


if __name__ == "__main__":
    main()
