"""The Quickstart, as the README and the Getting started page show it, run as written.

Its app is one file, docs/examples/quickstart/proj.py: the page includes it
and the README shows it word for word (checked here). The test writes it
into an empty directory with only the Redis address pointed at this test's
redis-server, starts workers with the README's command lines, sends the task
with the README's ``celery call`` line, and checks what the README says one
sees: one worker logs the task's line, ``leader status`` names that worker,
and no worker warns about the task's time limit.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
EXAMPLE = ROOT / "docs" / "examples" / "quickstart" / "proj.py"
PAGE = ROOT / "docs" / "getting-started.md"


def quickstart() -> str:
    text = README.read_text()
    return text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]


def code_blocks(section: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.DOTALL)


def command_lines(prefix: str) -> list[list[str]]:
    """The Quickstart's shell lines that start with *prefix*, split as a shell would."""
    return [
        shlex.split(line.split("  #", 1)[0])
        for block in code_blocks(quickstart(), "sh")
        for line in block.splitlines()
        if line.startswith(prefix)
    ]


def test_the_readme_shows_the_example_file_word_for_word():
    """The README's Quickstart code is the file the docs include and this test runs."""
    (source,) = code_blocks(quickstart(), "python")
    assert source == EXAMPLE.read_text()
    assert "examples/quickstart/proj.py" in PAGE.read_text()


def test_quickstart_app_sets_prefetch_and_the_visibility_timeout():
    """The Quickstart's app takes one message at a time, sets a visibility_timeout, and its
    leader task's time limit is below it (so the worker has nothing to warn about)."""
    namespace: dict[str, object] = {"__name__": "proj"}
    exec(compile(EXAMPLE.read_text(), str(EXAMPLE), "exec"), namespace)
    app = namespace["app"]
    assert app.conf.worker_prefetch_multiplier == 1
    timeout = app.conf.broker_transport_options["visibility_timeout"]
    assert isinstance(timeout, (int, float)) and timeout > 0
    assert 0 < namespace["aggregate"].time_limit < timeout


def test_quickstart_workers_on_one_host_each_have_their_own_name():
    """Several workers on one host: each command line gives its own `-n name@%h`."""
    commands = command_lines("celery -A proj worker")
    assert len(commands) >= 3, commands
    names = [command[command.index("-n") + 1] for command in commands]
    assert len(set(names)) == len(names)
    assert all(name.endswith("@%h") for name in names)


def _celery(command: list[str]) -> list[str]:
    assert command[0] == "celery", command
    return [sys.executable, "-m", "celery", *command[1:]]


@pytest.mark.slow
def test_quickstart_runs_as_written(redis_server, tmp_path):
    """Two workers as the README starts them; the task sent as it says runs on the one
    that ``leader status`` names, which logs the task's line."""
    base = f"redis://127.0.0.1:{redis_server.port}"
    source = EXAMPLE.read_text()
    assert source.count("redis://127.0.0.1:6379") == 2
    (tmp_path / "proj.py").write_text(source.replace("redis://127.0.0.1:6379", base))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    workers = command_lines("celery -A proj worker")[:2]
    (call,) = command_lines("celery -A proj call")
    (status,) = command_lines("celery -A proj leader status")
    logs = [tmp_path / f"worker{index}.log" for index in range(len(workers))]
    procs = []
    try:
        for command, log in zip(workers, logs, strict=True):
            with log.open("wb") as out:
                procs.append(
                    subprocess.Popen(
                        _celery(command),
                        cwd=tmp_path,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        subprocess.run(_celery(call), cwd=tmp_path, env=env, check=True, timeout=60)
        # The first leader of a new store holds off one ttl (10 s) before it leads.
        deadline = time.monotonic() + 90
        ran: list[str] = []
        while not ran:
            texts = [log.read_text(errors="replace") for log in logs]
            ran = [text for text in texts if "aggregated 2026-12-01 on " in text]
            assert time.monotonic() < deadline, "\n".join(text[-2000:] for text in texts)
            assert all(proc.poll() is None for proc in procs), texts
            time.sleep(0.2)
        (leader_log,) = ran
        nodename = re.search(r"aggregated 2026-12-01 on (\S+), token \d+", leader_log)
        assert nodename, leader_log[-2000:]
        shown = subprocess.run(
            _celery(status),
            check=False,
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert f"leader:     {nodename.group(1)} " in shown.stdout, shown.stdout
        for log in logs:
            assert "time_limit" not in log.read_text(errors="replace")
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
