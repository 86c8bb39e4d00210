#!/usr/bin/env bash
# Installs what building and testing tollgate needs on a fresh Debian machine with Rust:
# cmake (pingora's zlib-ng build), curl (the HTTP/2 tests call it), valgrind (the performance
# guard counts instructions under callgrind), and a Python venv with the
# official `openai` and `anthropic` clients for the client tests. Safe to run again; it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
command -v valgrind >/dev/null 2>&1 || need_apt+=(valgrind)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3 python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv for the client tests"
  python3 -m venv .venv
fi
if ! .venv/bin/python -c "import openai, anthropic, pytest, h2" >/dev/null 2>&1; then
  # h2: the clients' HTTP/2 (tests/python/test_http2_clients.py)
  .venv/bin/pip install -q --disable-pip-version-check "openai>=1.40" "anthropic>=0.40" "pytest>=8" "h2>=4"
fi
