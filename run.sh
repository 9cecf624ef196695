#!/usr/bin/env bash
# The project's two entry points, for a fresh Debian-like machine:
#   ./run.sh demo [--quick]   the demo: needs nothing but Python (SQLite lease store)
#   ./run.sh test [pytest args]   installs what the tests need, lints, type-checks, runs pytest
#   ./run.sh bench            every benchmark; writes docs/benchmarks.md and docs/failover.png
#   ./run.sh simulate [--seeds N] [--seed S]   deterministic simulation of the lease protocol;
#                             ends with "N seeds, V violations", exit 0 only when V is 0
set -euo pipefail
cd "$(dirname "$0")"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

apt_install() {
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

venv() {
  if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then apt_install python3-venv; fi
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".${1:+[$1]}"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

test_services() {
  # Tests start their own redis-server processes on free ports; they need the binary.
  command -v redis-server >/dev/null || apt_install redis-server
  # Azurite (the Azure Storage emulator, pinned in package.json) for the Azure Blob store tests.
  if [ ! -x node_modules/.bin/azurite-blob ]; then
    command -v npm >/dev/null || apt_install nodejs npm
    npm ci --no-audit --no-fund --loglevel=error
  fi
  # The chaos suite starts (and restarts) RabbitMQ nodes of its own: it needs the server.
  [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || apt_install rabbitmq-server
  # The other RabbitMQ broker tests use the machine's RabbitMQ on 127.0.0.1:5672 (guest/guest).
  if ! port_open 5672; then
    as_root rabbitmq-server -detached >/dev/null 2>&1 || true
    for _ in $(seq 1 120); do port_open 5672 && break; sleep 1; done
    port_open 5672 || { echo "RabbitMQ did not start on 127.0.0.1:5672" >&2; exit 1; }
  fi
}

cmd="${1:-}"; shift || true
case "$cmd" in
  demo)
    venv ""
    exec .venv/bin/celery-leader demo "$@"
    ;;
  test)
    test_services
    venv dev
    .venv/bin/ruff check .
    .venv/bin/ruff format --check .
    .venv/bin/mypy
    exec .venv/bin/python -m pytest "$@"
    ;;
  bench)
    test_services
    venv "dev,bench"
    exec .venv/bin/python -m benchmarks.report "$@"
    ;;
  simulate)
    venv ""
    exec .venv/bin/python -m celery_leader.simulation "$@"
    ;;
  *)
    echo "usage: ./run.sh demo|test|bench|simulate [args]" >&2
    exit 2
    ;;
esac
