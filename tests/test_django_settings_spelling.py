"""Leader settings a Django project writes without Celery's namespace are warned of at start.

A real Django settings module, read by Celery as Django projects do
(``config_from_object("django.conf:settings", namespace="CELERY")``), a real
worker and a real beat on a real redis-server. ``LEADER_LEASE_TTL = 3``
there is never read (Celery reads ``CELERY_LEADER_LEASE_TTL``): the worker
and beat each say so once at start, naming the spelling to use, and keep
the default ttl. The project's own settings that merely contain LEADER are
left alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SETTINGS = """\
SECRET_KEY = "celery-leader-tests-only"
INSTALLED_APPS = []
USE_TZ = True
CELERY_BROKER_URL = {broker!r}
CELERY_BEAT_SCHEDULER = "celery_leader.beat:LeaderScheduler"
CELERY_LEADER_NAME = "proj"
# Written without the namespace: Celery never reads it.
LEADER_LEASE_TTL = 3
# The project's own settings, whose names merely contain LEADER.
TEAM_LEADER_EMAIL = "lead@example.com"
LEADER_BOARD_PAGE_SIZE = 20
"""

CELERY_MODULE = """\
import os

from celery import Celery

from celery_leader import LeaderElection

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")

app = Celery("proj")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.steps["worker"].add(LeaderElection)
"""

WARNING = (
    "celery-leader: LEADER_LEASE_TTL is ignored: Celery reads this app's settings under the "
    "namespace 'CELERY'; write it as CELERY_LEADER_LEASE_TTL"
)


@pytest.fixture
def project(redis_server, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A Django project (``proj``) in *tmp_path*, and the environment its processes run in."""
    package = tmp_path / "proj"
    package.mkdir()
    (package / "__init__.py").write_text("")
    broker = f"redis://127.0.0.1:{redis_server.port}/0"
    (package / "settings.py").write_text(SETTINGS.format(broker=broker))
    (package / "celery.py").write_text(CELERY_MODULE)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "DJANGO_SETTINGS_MODULE": "proj.settings"}
    return tmp_path, env


def run_until(cwd: Path, env: dict[str, str], args: list[str], line: str) -> str:
    """Start ``celery -A proj ARGS``, wait for *line* in its log, stop it; the whole log."""
    log = cwd / f"{args[0]}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "proj", *args, "-l", "info"],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 90
        while line not in log.read_text(errors="replace"):
            assert process.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    return log.read_text(errors="replace")


def test_a_worker_warns_once_of_a_leader_setting_without_the_namespace(project):
    """The worker names LEADER_LEASE_TTL and CELERY_LEADER_LEASE_TTL once, and keeps ttl 5."""
    cwd, env = project
    log = run_until(cwd, env, ["worker", "-c", "1", "-n", "w1@%h"], " ready.")
    assert log.count(WARNING) == 1, log[-3000:]
    assert "celery-leader: election 'proj' on " in log and "ttl 5 s" in log, "the default ttl"
    assert "TEAM_LEADER_EMAIL" not in log and "LEADER_BOARD_PAGE_SIZE" not in log


def test_a_beat_warns_once_of_a_leader_setting_without_the_namespace(project):
    """Beat, which reads its settings more than once at start, says it once too."""
    cwd, env = project
    log = run_until(
        cwd, env, ["beat", "-s", str(cwd / "beat-schedule")], "celery-leader beat: election"
    )
    assert log.count(WARNING) == 1, log[-3000:]
    assert "TEAM_LEADER_EMAIL" not in log and "LEADER_BOARD_PAGE_SIZE" not in log
