"""``celery leader schedule list|pause|resume|run``: real beats, a real worker, real Redis.

For each scheduler LeaderScheduler wraps (PersistentScheduler, RedBeat,
django-celery-beat): a pause stops the sends within a tick of the command
returning and holds across a SIGKILL of the sending beat; run-now sends once
within 2 s, also while paused, as a manual occurrence; resume sends from the
next due slot, with no burst of the slots missed while paused.
"""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import time
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from harness.cluster import ROOT, Cluster
from tests.integration.test_beat import wait_sending
from tests.integration.test_django_beat import setup_db

DJANGO_APP = "tests.integration.djangobeat.app"
TASKS_APP = "tests.integration.leaderapp"


def _schedulers() -> list[str]:
    return ["persistent", "redbeat", "django"]


@pytest.fixture(params=_schedulers())
def steered(cluster_for, tmp_path, request) -> tuple[Cluster, str]:  # type: ignore[no-untyped-def]
    """A worker recording beat's sends and two beats of a 1 s entry "tick", one scheduler each."""
    cluster = cluster_for("redis")
    app = TASKS_APP
    if request.param == "django":
        app = DJANGO_APP
        cluster.env.update(
            {"LEADER_DJANGO_DB": str(tmp_path / "beat.sqlite3"), "LEADER_DJANGO_EVERY": "1"}
        )
        setup_db(cluster)
    else:
        cluster.env["LEADER_BEAT_EVERY"] = "1"
        if request.param == "redbeat":
            cluster.env["LEADER_BEAT_WRAPPED"] = "redbeat.RedBeatScheduler"
            cluster.env["LEADER_BEAT_REDIS"] = f"redis://127.0.0.1:{cluster.data.port}/3"
    cluster.start(1)
    for _ in range(2):
        cluster.start_beat(app=app)
    return cluster, app


def schedule(cluster: Cluster, app: str, *args: str) -> subprocess.CompletedProcess[str]:
    return cluster.celery("leader", "schedule", *args, app=app)


def wait_view(cluster: Cluster, app: str, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        proc = schedule(cluster, app, "list", "--json")
        if proc.returncode == 0:
            view = json.loads(proc.stdout)
            if any(row["name"] == "tick" and row["last_sent"] for row in view["entries"]):
                return view
        assert time.monotonic() < deadline, proc.stdout + proc.stderr
        time.sleep(0.3)


def ticks_after(cluster: Cluster, since: float) -> list[dict]:
    return [s for s in cluster.beat_sends() if s["at"] > since]


def slot(row: dict) -> float | None:
    """The slot a scheduled send stood for (unix time); None for a run-now send."""
    occurrence = row.get("occurrence") or ""
    _, _, when = occurrence.rpartition("@")
    if not when or when.startswith("manual:"):
        return None
    return datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp()


def scheduled_after(cluster: Cluster, wall: float) -> list[dict]:
    """Scheduled sends (not run-now) for slots after *wall*: judged by the slot, not by when
    the worker ran them (a loaded worker runs a send from before a pause seconds later)."""
    return [r for r in cluster.beat_sends() if (when := slot(r)) is not None and when > wall]


def manual_sends(cluster: Cluster) -> list[dict]:
    return [r for r in cluster.beat_sends() if "@manual:" in (r.get("occurrence") or "")]


def wait_rows(find, timeout: float = 15) -> list[dict]:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not (rows := find()):
        assert time.monotonic() < deadline, "nothing recorded in time"
        time.sleep(0.1)
    return rows


@pytest.mark.slow
def test_pause_holds_across_failover_run_now_sends_once_resume_has_no_burst(steered) -> None:
    cluster, app = steered
    old = wait_sending(cluster, cluster.beats, timeout=30)
    view = wait_view(cluster, app)
    row = next(r for r in view["entries"] if r["name"] == "tick")
    assert row["paused"] is False and row["paused_until"] is None
    assert row["task"].endswith("beat_tick") and row["next_due"] is not None
    assert view["leader"] == view["published_by"]

    proc = schedule(cluster, app, "pause", "tick")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tick paused" in proc.stdout and "confirmed" in proc.stdout, proc.stdout
    paused_at = time.time() + 0.6  # within one beat tick of the command returning
    listed = json.loads(schedule(cluster, app, "list", "--json").stdout)
    assert next(r for r in listed["entries"] if r["name"] == "tick")["paused"] is True
    time.sleep(3)
    assert not scheduled_after(cluster, paused_at), "a paused entry was sent"

    # Run now, while paused: one send, as a manual occurrence.
    proc = schedule(cluster, app, "run", "tick")
    asked = time.time()  # the command's answer: starting the CLI takes seconds under load
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tick sent as tick@manual:" in proc.stdout, proc.stdout
    (manual,) = wait_rows(lambda: manual_sends(cluster))
    assert manual["wall"] - asked < 10
    time.sleep(1.5)
    assert len(manual_sends(cluster)) == 1, "run-now sent once"

    # The sending beat dies: the other takes over and still sends nothing scheduled.
    old.signal(signal.SIGKILL)
    deadline = time.monotonic() + 20
    while not any(b is not old and b.sends_now() for b in cluster.beats):
        assert time.monotonic() < deadline, "the other beat did not take over"
        time.sleep(0.2)
    time.sleep(3)
    assert not scheduled_after(cluster, paused_at), "a paused entry was sent after the failover"
    assert len(manual_sends(cluster)) == 1, "the new beat leader did not send run-now again"

    proc = schedule(cluster, app, "resume", "tick")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    resumed = time.time()
    wait_rows(lambda: scheduled_after(cluster, paused_at))
    time.sleep(3.5)
    after = scheduled_after(cluster, paused_at)
    # No burst: no slot from while it was paused is sent, only the next due ones.
    assert all(slot(r) >= resumed - 1.0 for r in after), after
    assert 2 <= len(after) <= 6, after
    slots = sorted(slot(r) for r in after)
    assert all(b - a > 0.5 for a, b in itertools.pairwise(slots)), slots


def test_unknown_entry_no_view_and_store_errors(cluster_for) -> None:  # type: ignore[no-untyped-def]
    """Exit 1 with no view published or no such entry; exit 2, masked, when the store fails."""
    cluster = cluster_for("redis")
    cluster.env["LEADER_BEAT_EVERY"] = "1"
    proc = cluster.celery("leader", "schedule", "list")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "no beat has published a schedule view" in proc.stdout
    proc = cluster.celery("leader", "schedule", "pause", "tick")
    assert proc.returncode == 1 and "no beat has published" in proc.stdout

    cluster.start(1)
    beat = cluster.start_beat()
    wait_sending(cluster, cluster.beats, timeout=30)
    wait_view(cluster, TASKS_APP)
    status = json.loads(cluster.celery("leader", "status", "--beat", "--json").stdout)
    assert status["leader"]["pid"] == beat.proc.pid, "leader.pid is the beat process's"
    for command in ("pause", "resume", "run"):
        proc = cluster.celery("leader", "schedule", command, "nope")
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "no entry 'nope'" in proc.stdout and "tick" in proc.stdout.split("entries:")[1]
        assert "Traceback" not in proc.stderr

    broken = {**cluster.env, "LEADER_STORE": "redis://:s3cret-pw@127.0.0.1:1/0"}
    proc = subprocess.run(
        [sys.executable, "-m", "celery", "-A", TASKS_APP, "leader", "schedule", "list"],
        cwd=ROOT,
        env=broken,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "s3cret-pw" not in proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.slow
def test_pause_for_ends_by_itself_and_run_needs_a_beat_leader(cluster_for) -> None:  # type: ignore[no-untyped-def]
    cluster = cluster_for("redis")
    cluster.env["LEADER_BEAT_EVERY"] = "1"
    cluster.start(1)
    beat = cluster.start_beat()
    wait_sending(cluster, cluster.beats, timeout=30)
    wait_view(cluster, TASKS_APP)
    proc = cluster.celery("leader", "schedule", "pause", "tick", "--for", "8")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    quiet_from = time.time() + 0.6  # within one beat tick of the command returning
    listed = json.loads(cluster.celery("leader", "schedule", "list", "--json").stdout)
    row = next(r for r in listed["entries"] if r["name"] == "tick")
    until = row["paused_until"]
    assert row["paused"] is True and until > time.time()
    # Judged up to the pause's end (a loaded machine may take seconds to get here).
    time.sleep(max(0.0, until - time.time()))
    sent_while_paused = [r for r in scheduled_after(cluster, quiet_from) if slot(r) < until - 1.0]
    assert not sent_while_paused, "a paused entry was sent"
    wait_rows(lambda: scheduled_after(cluster, until), timeout=10)  # the pause ended

    beat.stop()
    deadline = time.monotonic() + 10
    while cluster.celery("leader", "status", "--beat").returncode == 0:
        assert time.monotonic() < deadline
        time.sleep(0.3)
    proc = cluster.celery("leader", "schedule", "run", "tick")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "no beat leader holds election" in proc.stdout


@pytest.mark.slow
def test_django_entries_not_loaded_yet_are_listed_and_run(cluster_for, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """django-celery-beat loads a crontab only hours before it is due: list and run see it."""
    cluster = cluster_for("redis")
    cluster.env.update(
        {
            "LEADER_DJANGO_DB": str(tmp_path / "beat.sqlite3"),
            "LEADER_DJANGO_EVERY": "1",
            "LEADER_DJANGO_FAR_CRONTAB": "1",
        }
    )
    setup_db(cluster)
    cluster.start(1)
    cluster.start_beat(app=DJANGO_APP)
    wait_sending(cluster, cluster.beats, timeout=30)
    view = wait_view(cluster, DJANGO_APP)
    far = next((r for r in view["entries"] if r["name"] == "far"), None)
    assert far is not None, view
    assert far["next_due"] - time.time() > 4 * 3600, far
    asked = time.monotonic()
    proc = schedule(cluster, DJANGO_APP, "run", "far")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    deadline = time.monotonic() + 10
    while not [s for s in ticks_after(cluster, asked) if s["entry"] == "far"]:
        assert time.monotonic() < deadline, "the far entry was not sent"
        time.sleep(0.1)


@pytest.mark.slow
def test_django_list_is_one_row_per_entry_and_next_due_follows_last_sent(
    cluster_for, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """django-celery-beat: a crontab's schedule on one line, one row per entry, and the next
    due time counted from the last send (the table's last_run_at is saved only minutes later)."""
    cluster = cluster_for("redis")
    cluster.env.update(
        {
            "LEADER_DJANGO_DB": str(tmp_path / "beat.sqlite3"),
            "LEADER_DJANGO_EVERY": "1",
            "LEADER_DJANGO_CRONTAB": "*/5",
        }
    )
    setup_db(cluster)
    cluster.start(1)
    cluster.start_beat(app=DJANGO_APP)
    wait_sending(cluster, cluster.beats, timeout=30)
    wait_view(cluster, DJANGO_APP)
    time.sleep(4)  # "tick" is sent a few times more: its row's last_run_at is now stale
    view = wait_view(cluster, DJANGO_APP)
    rows = {row["name"]: row for row in view["entries"]}
    assert {"tick", "minutes"} <= set(rows), view
    tick = rows["tick"]
    assert tick["last_sent"] > view["published_at"] - 3, tick
    # The next slot of a 1 s interval follows its last send (sent when due, so it is at
    # most a second on); before the fix it was counted from the run the table last saved.
    assert tick["last_sent"] - 0.5 <= tick["next_due"] <= tick["last_sent"] + 2.5, tick
    minutes = rows["minutes"]
    assert minutes["schedule"] == "crontab(*/5 * * * *, Europe/Paris)", minutes
    due = datetime.fromtimestamp(minutes["next_due"], tz=ZoneInfo("Europe/Paris"))
    assert due.minute % 5 == 0 and due.second == 0, due
    assert 0 < minutes["next_due"] - view["published_at"] <= 300, minutes

    table = schedule(cluster, DJANGO_APP, "list")
    assert table.returncode == 0, table.stdout + table.stderr
    lines = table.stdout.splitlines()
    # The title, the column headings, then exactly one line per entry, in name order.
    assert len(lines) == 2 + len(rows), table.stdout
    assert lines[1].split()[:3] == ["ENTRY", "TASK", "SCHEDULE"], lines[1]
    assert [line.split()[0] for line in lines[2:]] == sorted(rows), table.stdout
    row = next(line for line in lines[2:] if line.startswith("minutes "))
    assert "crontab(*/5 * * * *, Europe/Paris)" in row, row
