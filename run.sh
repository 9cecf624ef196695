#!/usr/bin/env bash
# The project's two entry points, for a fresh Debian-like machine:
#   ./run.sh demo [--quick]   the demo: needs nothing but Python (SQLite lease store)
#   ./run.sh test [pytest args]   installs what the tests need, lints, type-checks, builds the
#                             docs, runs pytest
#   ./run.sh docs             the documentation site (Sphinx), warnings as errors, into docs/_build/html
#   ./run.sh bench            every benchmark; writes docs/benchmarks.md and docs/failover.png
#   ./run.sh compat [--all]    the compat subset (pytest -m compat) on the oldest allowed
#                             Celery/kombu/redis-py and on every supported Python
#   ./run.sh simulate [--seeds N] [--seed S] [--elections K] [--store S] [--lifelines]   deterministic simulation of the lease protocol;
#                             ends with "N seeds, V violations", exit 0 only when V is 0;
#                             --failover [N]: failover times after a leader's death, with and without lifelines
#   ./run.sh partition [--store S] [--broker B] [--fault F] [--repeat N]   every network
#                             partition scenario on every store and broker (root); a table
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

# The demo's .venv: created, or brought up to date, only when it is missing or pyproject.toml
# changed since the last install (the package is installed editable, so code changes need no
# reinstall). pip's output goes to a log shown only when the install fails.
demo_venv() {
  local stamp log
  stamp="$(sha1sum < pyproject.toml)"
  if [ -x .venv/bin/celery-leader ] && [ "$(cat .venv/.demo-inputs 2>/dev/null)" = "$stamp" ]; then
    return 0
  fi
  if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then apt_install python3-venv; fi
  log="$(mktemp "${TMPDIR:-/tmp}/celery-leader-install.XXXXXX")"
  echo "installing celery-leader into .venv (first run, or pyproject.toml changed)" >&2
  # Each step chained with && (not set -e, which a function in an if-condition ignores).
  if { [ -x .venv/bin/python ] || python3 -m venv .venv; } >"$log" 2>&1 \
      && .venv/bin/python -m pip install --disable-pip-version-check --upgrade pip >>"$log" 2>&1 \
      && .venv/bin/python -m pip install --disable-pip-version-check -e . >>"$log" 2>&1; then
    echo "$stamp" > .venv/.demo-inputs
    rm -f "$log"
  else
    cat "$log" >&2
    echo "installing celery-leader into .venv failed; pip's output is above and in $log" >&2
    return 1
  fi
}

# The documentation site: every warning (a broken link or cross-reference included) fails it.
build_docs() {
  .venv/bin/sphinx-build -W --keep-going -n -q -b html docs docs/_build/html
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
  # The PostgreSQL store tests initdb clusters of their own (as the postgres user when
  # root); redis-server also runs Sentinel, which needs nothing more.
  compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || apt_install postgresql
  # The etcd store tests start etcd members (one, or a cluster of three) of their own.
  { command -v etcd && command -v etcdctl; } >/dev/null || apt_install etcd-server etcd-client
  # The chaos suite starts (and restarts) RabbitMQ nodes of its own: it needs the server.
  [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || apt_install rabbitmq-server
  # The partition tests (harness/netbed.py) build network namespaces joined by veths and
  # cut them with nftables rules: iproute2 and nftables.
  command -v ip >/dev/null || apt_install iproute2
  command -v nft >/dev/null || apt_install nftables
  # The alert rules' and the dashboard's tests run promtool (check rules, test rules); the
  # live test (tests/integration/test_prometheus_live.py) runs a Prometheus server.
  { command -v prometheus && command -v promtool; } >/dev/null || apt_install prometheus
  # The lifeline tests behind a pooler (tests/stores/test_postgres_pooler.py) run PgBouncer.
  [ -x /usr/sbin/pgbouncer ] || apt_install pgbouncer
  # The other RabbitMQ broker tests use the machine's RabbitMQ on 127.0.0.1:5672 (guest/guest).
  if ! port_open 5672; then
    as_root rabbitmq-server -detached >/dev/null 2>&1 || true
    for _ in $(seq 1 120); do port_open 5672 && break; sleep 1; done
    port_open 5672 || { echo "RabbitMQ did not start on 127.0.0.1:5672" >&2; exit 1; }
  fi
}

# A Python interpreter of version $1 (e.g. 3.10): on PATH, under pyenv, or installed by pyenv.
python_for() {
  local root="${PYENV_ROOT:-$HOME/.pyenv}" candidate
  # A pyenv shim answers to python3.X even when that version is not selected: try each one.
  for candidate in "$(command -v "python$1" || true)" \
      $(ls -d "$root"/versions/"$1".*/bin/python 2>/dev/null | sort -rV); do
    if [ -n "$candidate" ] && "$candidate" -c 'import venv' 2>/dev/null; then
      echo "$candidate"; return 0
    fi
  done
  if command -v pyenv >/dev/null; then
    pyenv install -s "$(pyenv install --list | tr -d ' ' | grep -E "^$1\.[0-9]+$" | tail -1)" >&2
    candidate="$(ls -d "$(pyenv root)"/versions/"$1".*/bin/python 2>/dev/null | sort -rV | head -1)"
    [ -n "$candidate" ] && { echo "$candidate"; return 0; }
  fi
  echo "Python $1 is needed for the compat tests and was not found" >&2
  return 1
}

# compat_venv LABEL PYTHON [PIN...]: a venv .venv-compat/LABEL with the test extra (and the
# pins as constraints), kept while its inputs are unchanged.
compat_venv() {
  local label="$1" python="$2"; shift 2
  local dir=".venv-compat/$label" stamp
  stamp="$("$python" -V 2>&1) $* $(cat pyproject.toml | sha1sum)"
  if [ ! -x "$dir/bin/python" ] || [ "$(cat "$dir/.inputs" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$dir"
    "$python" -m venv "$dir" || return 1
    "$dir/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip || return 1
    printf '%s\n' "$@" > "$dir/constraints.txt"
    "$dir/bin/python" -m pip install -q --disable-pip-version-check \
      -c "$dir/constraints.txt" -e ".[test]" || return 1
    echo "$stamp" > "$dir/.inputs"
  fi
}

# compat_test LABEL MARKS: pytest -m MARKS in .venv-compat/LABEL (exit 5, no test
# selected, counts as passing: the serial part of the subset may be empty).
compat_test() {
  local dir=".venv-compat/$1" status=0
  echo "== compat $1 ($2): $("$dir/bin/python" -c 'import sys, celery, kombu, redis; print(f"Python {sys.version.split()[0]}, Celery {celery.__version__}, kombu {kombu.__version__}, redis-py {redis.__version__}")')"
  "$dir/bin/python" -m pytest -m "$2" -q -p no:cacheprovider || status=$?
  [ "$status" = 5 ] && status=0
  return "$status"
}

#: The oldest releases pyproject.toml allows; keep in step with its dependencies.
FLOOR_PINS=(celery==5.3.0 kombu==5.3.0 redis==5.0.0)

# The compat runs, one a line: LABEL PYTHON-VERSION [PIN...]. Python 3.10 runs with the
# floor releases (the main suite has the newest on 3.11); --all adds the newest on 3.10 and
# the Celery releases between the floor and the newest.
compat_matrix() {
  echo "floor-py3.10 3.10 ${FLOOR_PINS[*]}"
  for version in 3.12 3.13; do echo "py$version $version"; done
  if [ "${1:-}" = "--all" ]; then
    echo "py3.10 3.10"
    for celery in 5.4.0 5.5.3 5.6.3; do echo "celery$celery-py3.12 3.12 celery==$celery"; done
  fi
}

# Every compat venv, one after the other (they share pip's cache of wheels).
compat_prepare() {
  local status=0 line label version python runs
  mapfile -t runs < <(compat_matrix "$@")
  for line in "${runs[@]}"; do
    # shellcheck disable=SC2086 # LABEL VERSION PIN...: words
    set -- $line
    label="$1" version="$2"; shift 2
    python="$(python_for "$version")" && compat_venv "$label" "$python" "$@" || status=1
  done
  return "$status"
}

# The compat subset in every compat venv, all runs at once: each mostly waits on its
# workers. Each run takes its own share of the free ports (harness/servers.py), and the
# machine's RabbitMQ on a virtual host of its own; its output is shown whole, in order.
# The tests that bound a reaction time tightly (marker serial) then run one run at a
# time, as in the suite's serial pass: four runs side by side would slow them past it.
compat_tests() {
  local status=0 index label runs pids=() labels=()
  mapfile -t runs < <(compat_matrix "$@")
  mkdir -p .venv-compat
  for index in "${!runs[@]}"; do
    label="${runs[$index]%% *}"
    LEADER_TEST_PORT_SHARE="$index/${#runs[@]}" compat_test "$label" "compat and not serial" \
      >".venv-compat/$label.log" 2>&1 </dev/null &
    pids+=("$!"); labels+=("$label")
  done
  for index in "${!pids[@]}"; do
    wait "${pids[$index]}" || status=1
    cat ".venv-compat/${labels[$index]}.log"
  done
  for label in "${labels[@]}"; do
    compat_test "$label" "compat and serial" </dev/null || status=1
  done
  return "$status"
}

compat() {
  local status=0
  compat_prepare "$@" || status=1
  compat_tests "$@" || status=1
  return "$status"
}

cmd="${1:-}"; shift || true
case "$cmd" in
  demo)
    demo_venv
    exec .venv/bin/celery-leader demo "$@"
    ;;
  test)
    test_services
    venv dev
    .venv/bin/ruff check .
    .venv/bin/ruff format --check .
    .venv/bin/mypy
    build_docs
    status=0
    if [ "$#" != 0 ]; then  # a part of the suite, as pytest's arguments select it
      .venv/bin/python -m pytest "$@" || status=$?
      exit "$status"
    fi
    # The compat venvs are built while the suite runs (its tests mostly wait).
    mkdir -p .venv-compat
    compat_prepare >.venv-compat/prepare.log 2>&1 </dev/null &
    prepare=$!
    # The suite in parallel processes, more than the cores: most tests wait on real
    # workers, servers and beats. The tests marked serial bound a time tightly: they run
    # next, one at a time, with nothing else of the suite beside them. Those marked
    # matrix (partition scenarios of a minute each) are left to ./run.sh partition.
    .venv/bin/python -m pytest -n "${PYTEST_WORKERS:-5}" --dist loadgroup \
      --no-loadscope-reorder -m "not serial and not matrix" || status=$?
    .venv/bin/python -m pytest -m serial || status=$?
    # The compat subset on the oldest allowed releases and the other Pythons.
    wait "$prepare" || { cat .venv-compat/prepare.log; status=1; }
    compat_tests || status=1
    exit "$status"
    ;;
  compat)
    test_services
    compat "$@"
    ;;
  bench)
    test_services
    # benchmarks.instructions counts instructions with callgrind.
    command -v valgrind >/dev/null || apt_install valgrind
    venv "dev,bench"
    exec .venv/bin/python -m benchmarks.report "$@"
    ;;
  partition)
    test_services
    venv dev
    exec .venv/bin/python -m tests.partition "$@"
    ;;
  docs)
    venv docs
    build_docs
    echo "docs/_build/html/index.html"
    ;;
  simulate)
    venv ""
    exec .venv/bin/python -m celery_leader.simulation "$@"
    ;;
  *)
    echo "usage: ./run.sh demo|test|docs|compat|bench|simulate|partition [args]" >&2
    exit 2
    ;;
esac
