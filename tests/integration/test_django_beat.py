"""django-celery-beat under LeaderScheduler: real Django, SQLite, beats, a worker and kills.

The schedule lives in a database that django-celery-beat writes only every
few minutes, so a new leader cannot trust it at takeover; these tests show it
counts from the previous leader's last send all the same.
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
import time

import pytest

from harness.cluster import ROOT
from tests.integration.test_beat import wait_sending

DJANGO_APP = "tests.integration.djangobeat.app"
#: The entry's period, seconds: long enough to kill a leader between two sends.
EVERY = 6
TTL = 2.0


#: When the one-off entry is due, seconds after the database is set up.
ONE_OFF_IN = 10


@pytest.fixture
def django_cluster(cluster_for, tmp_path, request):
    """A worker that records beat's sends, and a Django database with an interval entry.

    Tests marked ``one_off`` get a one-off entry due ``ONE_OFF_IN`` seconds later too.
    """
    cluster = cluster_for("redis")
    cluster.env.update(
        {
            "LEADER_DJANGO_DB": str(tmp_path / "beat.sqlite3"),
            "LEADER_DJANGO_EVERY": str(EVERY),
            "LEADER_TTL": str(TTL),
        }
    )
    if request.node.get_closest_marker("one_off"):
        cluster.env["LEADER_DJANGO_ONE_OFF_IN"] = str(ONE_OFF_IN)
    setup_db(cluster)
    cluster.start(1)
    return cluster


def setup_db(cluster) -> None:  # type: ignore[no-untyped-def]
    """Create the cluster's Django database with its entries (tests.integration.djangobeat)."""
    subprocess.run(
        [sys.executable, "-m", "tests.integration.djangobeat.setup_db"],
        cwd=ROOT,
        env=cluster.env,
        check=True,
        timeout=60,
    )


def sends_after(cluster, since: float) -> list[dict]:
    return [s for s in cluster.beat_sends() if s["at"] > since]


def wait_send_after(cluster, since: float, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        after = sends_after(cluster, since)
        if after:
            return after[0]
        time.sleep(0.05)
    raise AssertionError(f"no send within {timeout} s; sends: {cluster.beat_sends()}")


def sender(cluster, beats, token: int):  # type: ignore[no-untyped-def]
    """The beat whose log announces the term *token*."""
    for beat in beats:
        if f"this beat sends now (token {token})" in beat.text():
            return beat
    raise AssertionError(f"no beat announced token {token}")


@pytest.mark.slow
@pytest.mark.parametrize(("standby", "missed"), [("auto", "once"), ("idle", "skip")])
def test_django_celery_beat_fails_over_without_early_double_or_skipped_sends(
    django_cluster, standby, missed
):
    """SIGKILL after a send, SIGTERM after a send, SIGKILL just before a slot.

    Every gap between two sends is at least one period (no early send, none
    twice). Under "once" it is at most one period plus a takeover (no slot
    skipped; the slot missed while nobody led is sent once, at takeover);
    under "skip" that slot is skipped and the entry counts from the takeover.
    """
    cluster = django_cluster
    cluster.env["LEADER_BEAT_STANDBY"] = standby
    cluster.env["LEADER_BEAT_MISSED"] = missed
    beats = [cluster.start_beat(app=DJANGO_APP) for _ in range(4)]
    wait_sending(cluster, beats, timeout=30)
    first = wait_send_after(cluster, 0.0, timeout=EVERY + 10)
    faults = [(signal.SIGKILL, 1.0), (signal.SIGTERM, 1.0), (signal.SIGKILL, EVERY - 0.5)]
    last = first
    for signum, delay in faults:
        # Wait for the current leader's next send, then strike *delay* seconds after it.
        last = wait_send_after(cluster, last["at"], timeout=EVERY + TTL + 5)
        time.sleep(max(0.0, last["at"] + delay - time.monotonic()))
        sender(cluster, beats, last["token"]).signal(signum)
    # The last leader sends twice more: its first send, and one a period later.
    last = wait_send_after(cluster, last["at"], timeout=2 * EVERY + TTL + 5)
    wait_send_after(cluster, last["at"], timeout=EVERY + 5)
    sends = cluster.beat_sends()
    gaps = [round(b["at"] - a["at"], 2) for a, b in itertools.pairwise(sends)]
    tokens = [s["token"] for s in sends]
    assert tokens == sorted(tokens) and len(set(tokens)) == 4, tokens
    assert min(gaps) > EVERY - 0.5, f"a send came early or twice: gaps {gaps}"
    *before_last_fault, across_last_fault, _ = gaps
    assert max(before_last_fault) < EVERY + 0.5, f"a slot was late: gaps {gaps}"
    if missed == "once":
        # The slot that passed while nobody led went out once, at takeover.
        assert EVERY + 0.5 < across_last_fault < EVERY + TTL + 3, gaps
    else:
        # It was skipped: the next send is a period after the takeover.
        assert 2 * EVERY < across_last_fault < 2 * EVERY + TTL + 3, gaps


def test_reserve_mode_is_refused_with_one_line(django_cluster):
    """A standby that ticks would advance the shared database schedule without sending."""
    cluster = django_cluster
    cluster.env["LEADER_BEAT_STANDBY"] = "reserve"
    beat = cluster.start_beat(app=DJANGO_APP)
    assert beat.proc.wait(60) != 0
    text = beat.text()
    assert "Traceback" not in text, text[-3000:]
    errors = [line for line in text.splitlines() if "celery-leader:" in line]
    assert len(errors) == 1, text[-3000:]
    assert errors[0].startswith("Error: celery-leader: CELERY_LEADER_BEAT_STANDBY='reserve'")
    assert "auto" in errors[0] and "idle" in errors[0]


@pytest.mark.one_off
def test_one_off_entry_is_not_sent_again_after_a_failover(django_cluster):
    """A one-off (clocked) entry sent just before the leader's SIGKILL is not sent again.

    The table counts its run only at the next sync, minutes later, and a
    clocked schedule is due again whatever its last run.
    """
    cluster = django_cluster
    beats = [cluster.start_beat(app=DJANGO_APP) for _ in range(2)]
    deadline = time.monotonic() + ONE_OFF_IN + 20
    while time.monotonic() < deadline:
        once = [s for s in cluster.beat_sends() if s["entry"] == "once"]
        if once:
            break
        time.sleep(0.05)
    assert once, f"the one-off entry was sent: {cluster.beat_sends()}"
    time.sleep(max(0.0, once[0]["at"] + 1.0 - time.monotonic()))
    old = sender(cluster, beats, once[0]["token"])
    old.signal(signal.SIGKILL)
    wait_sending(cluster, beats, timeout=TTL + 10, exclude=old)
    # The new leader has ticked over its whole schedule, the one-off included.
    wait_send_after(cluster, time.monotonic(), timeout=EVERY + 5)
    once = [s for s in cluster.beat_sends() if s["entry"] == "once"]
    assert len(once) == 1, f"the one-off entry was sent {len(once)} times: {once}"
