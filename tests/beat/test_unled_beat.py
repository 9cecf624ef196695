"""A beat with celery-leader's settings that runs another scheduler directly is refused at start.

Real ``celery beat`` processes of a real Django project with
django-celery-beat (tests/beat/djangoproj), its entries in SQLite, the broker
and the lease store in a real redis-server. ``celery beat -S django`` names
django-celery-beat's scheduler directly: such a beat sends whether or not it
holds beat's lease, beside the beat that does.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest

from harness.cluster import ROOT
from tests.beat.processes import Processes, base_env, error_line, sent, wait_sent

DJANGO_APP = "tests.beat.djangoproj.app"
PLAIN_APP = "tests.integration.leaderapp"
DATABASE_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
#: What the beat logs when it runs unled on purpose.
UNLED_ON_PURPOSE = "runs unled on purpose"


@pytest.fixture
def project(redis_server, tmp_path):
    """A Django project using celery-leader, its database with an entry due every second."""
    name = f"u{uuid.uuid4().hex[:8]}"
    env = {
        **base_env(name),
        "DJANGO_SETTINGS_MODULE": "tests.beat.djangoproj.settings",
        "LEADER_DJANGO_DB": str(tmp_path / "beat.sqlite3"),
        "LEADER_DJANGO_EVERY": "1",
        "LEADER_BROKER": f"redis://127.0.0.1:{redis_server.port}/0",
        "LEADER_STORE": f"redis://127.0.0.1:{redis_server.port}/1",
        # The plain app's own settings (the test without Django).
        "LEADER_HISTORY": f"redis://127.0.0.1:{redis_server.port}/2",
        "LEADER_TTL": "2",
    }
    subprocess.run(
        [sys.executable, "-m", "tests.integration.djangobeat.setup_db"],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=60,
    )
    processes = Processes(tmp_path, env)
    yield processes
    processes.stop_all()


def queue(processes: Processes) -> tuple[str, str]:
    """The broker URL and the queue the entry is sent to."""
    return processes.env["LEADER_BROKER"], f"{processes.env['LEADER_NAME']}.default"


def beat(processes: Processes, name: str, *extra: str, app: str = DJANGO_APP, **env: str):
    return processes.start(
        name,
        "-A",
        app,
        "beat",
        "-l",
        "info",
        "-s",
        str(processes.cwd / f"{name}-schedule"),
        *extra,
        env=env,
    )


@pytest.mark.parametrize(
    ("extra", "env"),
    [
        (["-S", "django"], {}),
        ([], {"LEADER_DJANGO_BEAT_SCHEDULER": DATABASE_SCHEDULER}),
    ],
    ids=["dash-S-django", "CELERY_BEAT_SCHEDULER"],
)
def test_a_beat_running_django_celery_beat_directly_is_refused(project, extra, env):
    """Beside a led beat, ``-S django`` (or CELERY_BEAT_SCHEDULER naming it) stops at start.

    One line, naming the settings as the Django project writes them and the
    fix; nothing is sent but the led beat's sends, each with beat's token.
    """
    broker, name = queue(project)
    led = beat(project, "led")
    led.wait_for("this beat sends now", timeout=60)
    unled = beat(project, "unled", *extra, **env)
    assert unled.exit_code(timeout=60) != 0
    line = error_line(unled)
    assert f"runs {DATABASE_SCHEDULER} directly" in line, line
    assert "-S leader" in line, line
    assert "CELERY_BEAT_SCHEDULER = 'celery_leader.beat:LeaderScheduler'" in line, line
    assert f"CELERY_LEADER_BEAT_SCHEDULER = '{DATABASE_SCHEDULER}'" in line, line
    assert "CELERY_LEADER_BEAT_UNLED = True" in line, line
    assert "leader_beat" not in line, "named as the project writes it"
    wait_sent(broker, name, 2, timeout=30)
    assert led.proc.poll() is None, led.text()[-3000:]
    tokens = [headers.get("leader_beat_token") for headers in sent(broker, name)]
    assert None not in tokens, f"a send without beat's token: {tokens}"


def test_a_plain_app_is_told_the_lower_case_names(project):
    """Without a namespace the line names the keys as a plain Celery app writes them."""
    unled = beat(
        project,
        "plain",
        "-S",
        "celery.beat:PersistentScheduler",
        app=PLAIN_APP,
        LEADER_BEAT_EVERY="1",
    )
    assert unled.exit_code(timeout=60) != 0
    line = error_line(unled)
    assert "runs celery.beat:PersistentScheduler directly" in line, line
    assert "beat_scheduler = 'celery_leader.beat:LeaderScheduler'" in line, line
    assert "leader_beat_scheduler = 'celery.beat:PersistentScheduler'" in line, line
    assert "leader_beat_unled = True" in line, line
    assert "CELERY_" not in line, line


def test_a_beat_meant_to_run_unled_says_so_once_and_sends(project):
    """CELERY_LEADER_BEAT_UNLED = True: ``-S django`` runs as without celery-leader.

    One info line says it runs unled on purpose; no warning, no refusal.
    """
    broker, name = queue(project)
    unled = beat(project, "unled", "-S", "django", LEADER_BEAT_UNLED="True")
    messages = wait_sent(broker, name, 2, timeout=60)
    assert unled.proc.poll() is None, unled.text()[-3000:]
    assert [headers.get("leader_beat_token") for headers in messages[:2]] == [None, None]
    lines = [line for line in unled.text().splitlines() if "celery-leader" in line]
    assert len(lines) == 1, lines
    assert UNLED_ON_PURPOSE in lines[0] and "CELERY_LEADER_BEAT_UNLED" in lines[0], lines[0]
    assert "WARNING" not in lines[0] and "ERROR" not in lines[0], lines[0]


def test_a_bad_leader_beat_unled_is_refused_with_one_line(project):
    """Only True or False: "yes" from an environment variable would be a guess."""
    unled = beat(project, "unled", "-S", "django", LEADER_BEAT_UNLED="yes")
    assert unled.exit_code(timeout=60) != 0
    line = error_line(unled)
    assert line == (
        "Error: celery-leader: CELERY_LEADER_BEAT_UNLED='yes' is not allowed: it must be "
        "True or False"
    )


def test_a_project_without_leader_settings_runs_django_celery_beat_as_before(project):
    """No CELERY_LEADER_* key: ``-S django`` is none of celery-leader's business.

    The project's own TEAM_LEADER_EMAIL is not a celery-leader setting.
    """
    broker, name = queue(project)
    unled = beat(project, "plain", "-S", "django", LEADER_STORE="")
    wait_sent(broker, name, 2, timeout=60)
    time.sleep(1)
    assert unled.proc.poll() is None, unled.text()[-3000:]
    assert "celery-leader" not in unled.text(), unled.text()[-3000:]


def test_the_beat_of_worker_b_under_another_scheduler_stops_and_the_worker_runs_on(project):
    """``worker -B --scheduler django``: one error line in the worker's log, no sends."""
    broker, name = queue(project)
    worker = project.start(
        "worker",
        "-A",
        DJANGO_APP,
        "worker",
        "-B",
        "--scheduler",
        "django",
        "-P",
        "solo",
        "-l",
        "info",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    )
    worker.wait_for(f"runs {DATABASE_SCHEDULER} directly", timeout=60)
    time.sleep(3)
    assert worker.proc.poll() is None, worker.text()[-3000:]
    text = worker.text()
    assert "Traceback" not in text, text[-3000:]
    (line,) = [line for line in text.splitlines() if "celery-leader: this beat" in line]
    assert "ERROR/Beat]" in line, line
    assert "--scheduler leader" in line and "CELERY_LEADER_BEAT_UNLED = True" in line, line
    assert sent(broker, name) == []


def test_a_plain_beat_beside_workers_settings_only_runs_with_one_warning(project, tmp_path):
    """Only the workers' settings (no leader_beat_*, no LeaderScheduler): one plain beat may be
    the project's choice; it starts, with one warning that it is not led."""
    plain = beat(
        project,
        "workers-only",
        "-S",
        "celery.beat:PersistentScheduler",
        "-s",
        str(tmp_path / "plain-schedule"),
        app=PLAIN_APP,
    )
    plain.wait_for("beat: Starting...", timeout=60)
    time.sleep(3)
    assert plain.proc.poll() is None, plain.text()[-3000:]
    text = plain.text()
    assert text.count("not under LeaderScheduler: it is not led") == 1, text[-3000:]
    assert "Error: celery-leader" not in text, text[-3000:]
