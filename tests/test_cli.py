"""``celery -A app leader status|step-down`` as real subprocesses against a real Redis."""

from __future__ import annotations

import importlib.metadata
import json
import os
import pty
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import celery_leader
from celery_leader import cli
from celery_leader.cli.schedule import SCHEDULE_SHORT_HELP
from celery_leader.stores import open_store
from celery_leader.stores.base import Holder
from harness.servers import RedisServer, free_port

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "s3cretpw"
#: How the worker reports a bad setting at start (click's ``Error: `` and the package's
#: name), and so how the leader commands report every error.
ERROR_PREFIX = "Error: celery-leader: "

APP_MODULE = """\
import os

from celery import Celery

import celery_leader

app = Celery("cliapp", broker=os.environ["CLIAPP_BROKER"])
app.conf.leader_backend_url = os.environ["CLIAPP_STORE"]
if os.environ.get("CLIAPP_TTL"):
    app.conf.leader_lease_ttl = float(os.environ["CLIAPP_TTL"])
app.steps["worker"].add(celery_leader.LeaderElection)
if os.environ.get("CLIAPP_PRELOAD_LOG"):
    # A preload option, as apps add them: Celery hands its value to every top-level
    # command, `leader` included, and to the user_preload_options signal.
    import click
    from celery import signals

    app.user_options["preload"].add(click.Option(["--flavour"], default="plain"))

    @signals.user_preload_options.connect
    def _record_preload(app, options, **kwargs):
        with open(os.environ["CLIAPP_PRELOAD_LOG"], "a") as log:
            log.write(options["flavour"] + "\\n")
"""

Run = Callable[..., subprocess.CompletedProcess[str]]


def cli_env(app_dir: Path, store: str, broker: str) -> dict[str, str]:
    """The environment ``celery -A cliapp`` runs in: *app_dir* importable, help 80 wide."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLIAPP_")}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(app_dir), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    env["CLIAPP_BROKER"] = broker
    env["CLIAPP_STORE"] = store
    env["COLUMNS"] = "80"  # click wraps --help to the terminal: the same width everywhere
    env.pop("NO_COLOR", None)  # Celery reads it as -C; the colour test wants both cases
    return env


def celery_runner(
    app_dir: Path, default_store: str, broker: str, *, command: str = "leader"
) -> Run:
    """Run ``celery -A cliapp <command> ...`` (the app written into *app_dir*)."""
    (app_dir / "cliapp.py").write_text(APP_MODULE)

    def run(
        *args: str,
        store: str | None = None,
        ttl: str | None = None,
        env_extra: dict[str, str] | None = None,
        celery_args: tuple[str, ...] = (),
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        env = cli_env(app_dir, store or default_store, broker)
        if ttl is not None:
            env["CLIAPP_TTL"] = ttl
        env.update(env_extra or {})
        return subprocess.run(
            [sys.executable, "-m", "celery", "-A", "cliapp", *celery_args, command, *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    return run


@pytest.fixture
def leader_cli(tmp_path: Path, redis_server: RedisServer) -> Run:
    """Run ``celery -A cliapp leader ...``; the store defaults to the test's server."""
    return celery_runner(tmp_path, redis_server.url, redis_server.url)


def hold(url: str, name: str, holder: Holder, ttl: float = 30.0) -> int:
    """Take the lease *name* for *holder* (after one earlier term, so no hold-off); its token."""
    store = open_store(url, timeout=1)
    try:
        warm = store.acquire(name, Holder("id0", "w0@h", "h", 7), ttl=ttl)
        assert warm.acquired
        assert store.release(name, "id0")
        result = store.acquire(name, holder, ttl=ttl)
        assert result.acquired and result.token is not None
        assert result.hold_off == 0
        return result.token
    finally:
        store.close()


def one_json_object(stdout: str) -> dict:
    lines = stdout.strip().splitlines()
    assert len(lines) == 1, stdout
    payload = json.loads(lines[0])
    assert isinstance(payload, dict)
    return payload


def test_status_without_holder_exits_1(leader_cli: Run, redis_server: RedisServer) -> None:
    """status with nobody holding the lease exits 1 and says so, naming election and store."""
    proc = leader_cli("status")
    assert proc.returncode == 1, proc.stderr
    assert "cliapp" in proc.stdout
    assert redis_server.url in proc.stdout
    assert "leader:     none" in proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("flag", ["--json", "-j"])
def test_status_json_without_holder(leader_cli: Run, redis_server: RedisServer, flag: str) -> None:
    """status --json (or -j, as celery inspect) with no holder: one object, leader null; exit 1."""
    proc = leader_cli("status", flag)
    assert proc.returncode == 1, proc.stderr
    payload = one_json_object(proc.stdout)
    assert {"name", "store", "leader"} <= set(payload)
    assert payload["name"] == "cliapp"
    assert payload["store"] == redis_server.url
    assert payload["leader"] is None


def test_step_down_without_holder_exits_1(leader_cli: Run) -> None:
    """step-down with nobody holding the lease exits 1 and says no leader holds it."""
    proc = leader_cli("step-down")
    assert proc.returncode == 1, proc.stderr
    assert "no leader holds election 'cliapp'" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_status_json_describes_the_holder(leader_cli: Run, redis_server: RedisServer) -> None:
    """status --json with a holder exits 0 with its nodename, host, pid, token, times."""
    before = time.time()
    token = hold(redis_server.url, "cliapp", Holder("id1", "w1@h", "h", 42))
    proc = leader_cli("status", "--json")
    assert proc.returncode == 0, proc.stderr
    payload = one_json_object(proc.stdout)
    assert payload["name"] == "cliapp"
    assert payload["store"] == redis_server.url
    leader = payload["leader"]
    assert leader["nodename"] == "w1@h"
    assert leader["hostname"] == "h"
    assert leader["pid"] == 42
    assert type(leader["token"]) is int
    assert leader["token"] == token
    assert isinstance(leader["acquired_at"], float)
    assert before - 5 <= leader["acquired_at"] <= time.time() + 5
    assert isinstance(leader["expires_in"], float)
    assert 0 < leader["expires_in"] <= 30


def test_status_human_names_holder_and_token(leader_cli: Run, redis_server: RedisServer) -> None:
    """Plain status with a holder exits 0 and names the holder's nodename, pid and token."""
    token = hold(redis_server.url, "cliapp", Holder("id1", "w1@h", "h", 42))
    proc = leader_cli("status")
    assert proc.returncode == 0, proc.stderr
    assert "w1@h" in proc.stdout
    assert "pid 42" in proc.stdout
    assert str(token) in proc.stdout
    assert "holding off" not in proc.stdout


def test_status_beat_reads_the_beat_election(leader_cli: Run, redis_server: RedisServer) -> None:
    """--beat reads election "cliapp.beat", separate from the workers' "cliapp"."""
    token = hold(redis_server.url, "cliapp.beat", Holder("b1", "beat1@h", "h", 43))
    beat = leader_cli("status", "--beat", "--json")
    assert beat.returncode == 0, beat.stderr
    payload = one_json_object(beat.stdout)
    assert payload["name"] == "cliapp.beat"
    assert payload["leader"]["nodename"] == "beat1@h"
    assert payload["leader"]["pid"] == 43
    assert payload["leader"]["token"] == token
    workers = leader_cli("status", "--json")
    assert workers.returncode == 1, workers.stderr
    assert one_json_object(workers.stdout)["leader"] is None


def test_status_masks_the_store_password(leader_cli: Run, tmp_path: Path) -> None:
    """A store URL with a password is shown as :***@ in both outputs; the password never."""
    server = RedisServer(tmp_path, extra=["--requirepass", PASSWORD]).start()
    try:
        url = f"redis://:{PASSWORD}@127.0.0.1:{server.port}/0"
        token = hold(url, "cliapp", Holder("id1", "w1@h", "h", 42))
        masked = f"redis://:***@127.0.0.1:{server.port}/0"
        human = leader_cli("status", store=url)
        as_json = leader_cli("status", "--json", store=url)
    finally:
        server.stop()
    assert human.returncode == 0, human.stderr
    assert masked in human.stdout
    assert str(token) in human.stdout
    assert as_json.returncode == 0, as_json.stderr
    payload = one_json_object(as_json.stdout)
    assert payload["store"] == masked
    assert payload["leader"]["token"] == token
    for proc in (human, as_json):
        assert PASSWORD not in proc.stdout + proc.stderr


def test_status_wrong_password_exits_2_masked(leader_cli: Run, tmp_path: Path) -> None:
    """A store refusing the password: exit 2, one stderr line, the given password masked."""
    server = RedisServer(tmp_path, extra=["--requirepass", PASSWORD]).start()
    try:
        proc = leader_cli("status", store=f"redis://:wrong-{PASSWORD}@127.0.0.1:{server.port}/0")
    finally:
        server.stop()
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert PASSWORD not in proc.stdout + proc.stderr
    assert f"redis://:***@127.0.0.1:{server.port}/0" in lines[0]
    assert lines[0].startswith(ERROR_PREFIX), "the form the worker prints for the same error"
    assert lines[0].endswith(
        "read failed: the server refused the password in leader_backend_url (check the "
        "credentials: a wrong password, or an ACL user that does not exist or is disabled)"
    ), lines[0]


def test_status_without_a_password_says_the_store_needs_one(
    leader_cli: Run, tmp_path: Path
) -> None:
    """A store that wants a password and got none: exit 2, one line that says so and names
    leader_backend_url, not redis-py's words about HELLO."""
    server = RedisServer(tmp_path, extra=["--requirepass", PASSWORD]).start()
    try:
        proc = leader_cli("status", store=f"redis://127.0.0.1:{server.port}/0")
    finally:
        server.stop()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"{ERROR_PREFIX}lease store redis://127.0.0.1:{server.port}/0: read failed: the server "
        "needs a password and leader_backend_url gives none (write it before the host: "
        ":PASSWORD@, or USER:PASSWORD@ for an ACL user)"
    ], proc.stderr


@pytest.mark.parametrize(
    "args",
    [("status",), ("status", "--json"), ("step-down",), ("step-down", "--beat")],
    ids=" ".join,
)
def test_unreachable_store_exits_2_with_one_line(leader_cli: Run, args: tuple[str, ...]) -> None:
    """Nothing listening at the store: exit 2, exactly one stderr line, no traceback, masked."""
    port = free_port()
    proc = leader_cli(*args, store=f"redis://:{PASSWORD}@127.0.0.1:{port}/0")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith(f"{ERROR_PREFIX}lease store redis://:***@"), lines[0]
    assert f"127.0.0.1:{port}" in lines[0]
    assert PASSWORD not in proc.stdout + proc.stderr
    assert proc.stdout == ""


def test_bad_ttl_exits_2_naming_the_setting(leader_cli: Run) -> None:
    """leader_lease_ttl = 0: status exits 2 with one stderr line naming leader_lease_ttl."""
    proc = leader_cli("status", ttl="0")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"{ERROR_PREFIX}leader_lease_ttl=0 is not allowed"), lines[0]
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_bad_setting_reads_the_same_from_the_cli_and_the_worker(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """leader_lease_ttl = 0: `leader status` prints the very line `celery worker` stops with."""
    worker = celery_runner(tmp_path, redis_server.url, redis_server.url, command="worker")
    started = worker("-P", "solo", "--without-mingle", "--without-gossip", ttl="0", timeout=120)
    assert started.returncode != 0, started.stdout + started.stderr
    worker_errors = [line for line in started.stderr.splitlines() if line.startswith("Error")]
    assert len(worker_errors) == 1, started.stderr
    assert worker_errors[0].startswith(f"{ERROR_PREFIX}leader_lease_ttl=0 is not allowed")
    status = celery_runner(tmp_path, redis_server.url, redis_server.url)("status", ttl="0")
    assert status.returncode == 2
    assert status.stderr.strip().splitlines() == worker_errors


def test_step_down_unanswered_keeps_the_lease_and_exits_1(
    leader_cli: Run, redis_server: RedisServer
) -> None:
    """step-down to a holder with no live worker: exit 1 after --timeout, lease untouched."""
    token = hold(redis_server.url, "cliapp", Holder("id1", "w1@h", "h", 42))
    started = time.monotonic()
    proc = leader_cli("step-down", "--timeout", "0.5")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "w1@h did not release within 0.5 s" in proc.stdout
    assert time.monotonic() - started < 20
    store = open_store(redis_server.url, timeout=1)
    try:
        record = store.read("cliapp")
    finally:
        store.close()
    assert record is not None
    assert record.nodename == "w1@h"
    assert record.token == token


def test_step_down_beat_unanswered_keeps_the_lease_and_exits_1(
    leader_cli: Run, redis_server: RedisServer
) -> None:
    """step-down --beat to a beat lease no live beat holds: exit 1 after --timeout, kept."""
    token = hold(redis_server.url, "cliapp.beat", Holder("b1", "beat-1@h", "h", 43))
    proc = leader_cli("step-down", "--beat", "--timeout", "1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "beat-1@h did not release within 1 s" in proc.stdout
    store = open_store(redis_server.url, timeout=1)
    try:
        record = store.read("cliapp.beat")
        workers = store.read("cliapp")
    finally:
        store.close()
    assert record is not None and record.token == token, "nobody but the holder releases"
    assert workers is None, "the workers' election is not touched"


def exit_code_table(help_text: str) -> dict[int, str]:
    """The ``Exit codes:`` section of a command's --help: code -> its (unwrapped) meaning."""
    lines = help_text.split("Exit codes:\n", 1)[1].splitlines()
    table: dict[int, str] = {}
    code = -1
    for line in lines:
        head, _, rest = line.strip().partition("  ")
        if head.isdigit() and rest:
            code = int(head)
            table[code] = rest.strip()
        elif line.strip() and code >= 0:
            table[code] += " " + line.strip()
    return table


@pytest.mark.compat
def test_group_help_shows_each_command_whole(leader_cli: Run) -> None:
    """leader --help lists its commands with their whole short help, nothing cut off."""
    proc = leader_cli("--help")
    assert proc.returncode == 0, proc.stderr
    listed = {
        line.split()[0]: " ".join(line.split()[1:])
        for line in proc.stdout.split("Commands:\n", 1)[1].splitlines()
        if line.strip()
    }
    assert listed == {
        "schedule": SCHEDULE_SHORT_HELP,
        "status": cli.STATUS_SHORT_HELP,
        "step-down": cli.STEP_DOWN_SHORT_HELP,
    }
    assert "..." not in proc.stdout.split("Commands:\n", 1)[1]
    assert "exit codes" in proc.stdout


@pytest.mark.compat
def test_schedule_help_lists_its_commands_and_exit_codes(leader_cli: Run) -> None:
    """leader schedule --help lists list, pause, resume and run; each has its exit codes."""
    proc = leader_cli("schedule", "--help")
    assert proc.returncode == 0, proc.stderr
    commands = {
        line.split()[0]
        for line in proc.stdout.split("Commands:\n", 1)[1].splitlines()
        if line.strip()
    }
    assert commands == {"list", "pause", "resume", "run"}
    for command in commands:
        help_text = leader_cli("schedule", command, "--help").stdout
        assert set(exit_code_table(help_text)) == {0, 1, 2}, help_text


@pytest.mark.compat
@pytest.mark.parametrize(
    ("command", "codes", "group"),
    [("status", [0, 1, 2], "Status Options:"), ("step-down", [0, 1, 2, 3], "Step-down Options:")],
)
def test_command_help_lists_its_exit_codes(
    leader_cli: Run, command: str, codes: list[int], group: str
) -> None:
    """Each command's --help has an exit-code table (every code it uses) and grouped options."""
    proc = leader_cli(command, "--help")
    assert proc.returncode == 0, proc.stderr
    table = exit_code_table(proc.stdout)
    assert sorted(table) == codes, proc.stdout
    assert "store" in table[2]
    assert "command line" in table[2], "click's usage errors exit 2 too"
    assert group in proc.stdout, "options grouped as Celery's commands group them"
    if command == "step-down":
        assert "--timeout" in table[1]
        assert "pool cannot stop" in table[3]
        assert "--beat" in proc.stdout, "beat's leader can be stepped down too"
    else:
        assert "holding off" in table[0], "a holder in its hold-off holds but does not lead yet"


def test_usage_errors_exit_2_with_celerys_suggestions(leader_cli: Run) -> None:
    """A misspelled command suggests the right one (as `celery` does); a bad option exits 2."""
    typo = leader_cli("stauts")
    assert typo.returncode == 2
    assert "Did you mean" in typo.stderr
    assert "status" in typo.stderr
    bad = leader_cli("step-down", "--timeout", "0")
    assert bad.returncode == 2
    assert "--timeout" in bad.stderr
    for proc in (typo, bad):
        assert "Traceback" not in proc.stderr
        assert proc.stdout == ""


@pytest.mark.compat
def test_app_preload_options_reach_the_signal(leader_cli: Run, tmp_path: Path) -> None:
    """An app with a preload option: `leader --flavour x status` runs and the signal gets x."""
    log = tmp_path / "preload.log"
    env = {"CLIAPP_PRELOAD_LOG": str(log)}
    given = leader_cli("--flavour", "mint", "status", "--json", env_extra=env)
    default = leader_cli("step-down", env_extra=env)
    assert given.returncode == 1, given.stdout + given.stderr
    assert one_json_object(given.stdout)["leader"] is None
    assert default.returncode == 1, default.stdout + default.stderr
    assert "Traceback" not in given.stderr + default.stderr
    assert log.read_text().split() == ["mint", "plain"]


def run_on_a_terminal(args: list[str], env: dict[str, str]) -> tuple[int, bytes]:
    """Run *args* with stderr on a pseudo-terminal (stdout piped); exit code and stderr bytes."""
    main, child = pty.openpty()
    try:
        proc = subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=child, stdin=subprocess.DEVNULL
        )
        os.close(child)
        chunks = []
        while True:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # EIO: the child closed its end
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert proc.stdout is not None
        proc.stdout.read()
        return proc.wait(60), b"".join(chunks)
    finally:
        os.close(main)


def test_error_is_red_on_a_terminal_and_plain_with_no_color(tmp_path: Path) -> None:
    """On a terminal the error reads `Error: celery-leader: ...`, Error in red; -C: no colour."""
    (tmp_path / "cliapp.py").write_text(APP_MODULE)
    store = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"
    env = cli_env(tmp_path, store, store)
    base = [sys.executable, "-m", "celery", "-A", "cliapp"]
    code, coloured = run_on_a_terminal([*base, "leader", "status"], env)
    assert code == 2
    assert coloured.startswith(b"\x1b["), coloured
    assert b"\x1b[31m" in coloured.split(b"Error", 1)[0], "Error in red"
    code, plain = run_on_a_terminal([*base, "--no-color", "leader", "status"], env)
    assert code == 2
    assert plain.startswith(f"{ERROR_PREFIX}lease store redis://:***@".encode()), plain
    assert b"\x1b" not in plain
    for output in (coloured, plain):
        assert output.strip().count(b"\n") == 0, "one line"
        assert PASSWORD.encode() not in output


def test_version_has_one_source() -> None:
    """celery_leader.__version__ is the installed distribution's version; pyproject reads it."""
    assert celery_leader.__version__ == importlib.metadata.version("celery-leader")
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "celery_leader.__version__"
    }


def test_console_script_reports_the_version() -> None:
    """`celery-leader --version` prints celery_leader.__version__."""
    proc = subprocess.run(
        [sys.executable, "-m", "celery_leader", "--version"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-1] == celery_leader.__version__


def test_metadata_names_the_project_urls() -> None:
    """The installed metadata carries Homepage, Documentation, Changelog and Issues URLs."""
    urls = dict(
        entry.split(", ", 1)
        for entry in importlib.metadata.metadata("celery-leader").get_all("Project-URL") or []
    )
    home = "https://github.com/celery-leader/celery-leader"
    assert urls["Homepage"] == home
    assert urls["Documentation"] == "https://celery-leader.readthedocs.io/"
    assert urls["Changelog"] == f"{home}/blob/main/CHANGELOG.md"
    assert urls["Issues"] == f"{home}/issues"
