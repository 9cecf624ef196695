"""One schedule file, one beat: a second beat on the same host and file is refused at start.

Real ``celery beat`` and ``celery worker -B`` processes of the tests' app
under LeaderScheduler wrapping PersistentScheduler, started from one working
directory without ``--schedule``: each would use ``./celerybeat-schedule``.
Standbys tick and write that shelve file as the leader does, so two beats on
it would write one file at once.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
import redis

from tests.beat.processes import Processes, base_env, error_line, sent, wait_sent

APP = "tests.integration.leaderapp"


@pytest.fixture
def processes(redis_server, tmp_path):
    """The test app's processes, every one started in one working directory."""
    name = f"f{uuid.uuid4().hex[:8]}"
    env = {
        **base_env(name),
        "LEADER_BROKER": f"redis://127.0.0.1:{redis_server.port}/0",
        "LEADER_STORE": f"redis://127.0.0.1:{redis_server.port}/1",
        "LEADER_HISTORY": f"redis://127.0.0.1:{redis_server.port}/2",
        "LEADER_TTL": "2",
        "LEADER_BEAT_EVERY": "1",
    }
    started = Processes(tmp_path, env)
    yield started
    started.stop_all()


def beat(processes: Processes, name: str, *extra: str):
    return processes.start(name, "-A", APP, "beat", "-l", "info", *extra)


def worker_b(processes: Processes, name: str):
    return processes.start(
        name,
        "-A",
        APP,
        "worker",
        "-B",
        "-P",
        "solo",
        "-n",
        f"{name}@%h",
        "-l",
        "info",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    )


def queue(processes: Processes) -> tuple[str, str]:
    return processes.env["LEADER_BROKER"], f"{processes.env['LEADER_NAME']}.default"


@pytest.mark.parametrize("spelling", ["default", "absolute"])
def test_a_second_beat_on_the_same_schedule_file_is_refused(processes, spelling):
    """Same directory, no --schedule (or the same file by another name): one line, exit.

    The first beat runs on and keeps sending.
    """
    first = beat(processes, "first")
    first.wait_for("this beat sends now", timeout=60)
    extra = [] if spelling == "default" else ["-s", str(processes.cwd / "celerybeat-schedule")]
    second = beat(processes, "second", *extra)
    assert second.exit_code(timeout=60) != 0
    line = error_line(second)
    assert str(processes.cwd / "celerybeat-schedule") in line, line
    assert "--schedule" in line and "beat_schedule_filename" in line, line
    assert f"pid {first.proc.pid}" in line, line
    assert "this beat sends now" not in second.text()
    broker, name = queue(processes)
    before = len(sent(broker, name))
    wait_sent(broker, name, before + 2, timeout=30)
    assert first.proc.poll() is None, first.text()[-3000:]


def test_a_beat_restarted_after_a_crash_takes_the_file_again(processes):
    """SIGKILL leaves the lock file behind, but not the lock: the next beat starts on it."""
    first = beat(processes, "first")
    first.wait_for("this beat sends now", timeout=60)
    first.kill()
    second = beat(processes, "second")
    second.wait_for("this beat sends now", timeout=60)
    assert (processes.cwd / "celerybeat-schedule.lock").exists()


def beat_tokens(processes: Processes, count: int, timeout: float) -> set[int]:
    """Wait until runs of what beats sent carry *count* beat terms' tokens (a worker ran them)."""
    history = redis.Redis.from_url(processes.env["LEADER_HISTORY"])
    deadline = time.monotonic() + timeout
    try:
        while True:
            rows = [json.loads(row) for row in history.lrange("history", 0, -1)]
            tokens = {row["token"] for row in rows if row["kind"] == "beat"}
            if len(tokens) >= count or time.monotonic() > deadline:
                return tokens
            time.sleep(0.1)
    finally:
        history.close()


def test_worker_b_holds_the_file_for_its_beat_and_gives_it_up_when_it_stops(processes):
    """worker -B: its beat holds the file; stopped, it lets go.

    A beat beside it is refused; so is the beat of a second ``worker -B``,
    with one error line in that worker's log, and that worker runs on.
    """
    first = worker_b(processes, "w1")
    assert len(beat_tokens(processes, 1, timeout=60)) == 1, first.text()[-3000:]
    beside = beat(processes, "beside")
    assert beside.exit_code(timeout=60) != 0
    assert "--schedule" in error_line(beside)
    other = worker_b(processes, "w1b")
    other.wait_for("is in use by another beat", timeout=60)
    text = other.text()
    assert "Traceback" not in text, text[-3000:]
    (line,) = [line for line in text.splitlines() if "is in use by another beat" in line]
    assert "ERROR/Beat] celery-leader: the schedule file" in line, line
    other.stop()
    assert other.proc.returncode == 0, "the worker ran on without its beat"
    first.stop()
    assert first.proc.returncode is not None
    second = worker_b(processes, "w2")
    assert len(beat_tokens(processes, 2, timeout=60)) == 2, second.text()[-3000:]
