"""``celery leader step-down --beat``: real ``celery beat`` processes, a real worker and Redis."""

from __future__ import annotations

import re
import time

import pytest

from celery_leader.stores import open_store
from harness.cluster import Cluster
from tests.integration.test_beat import gaps, wait_sending


@pytest.fixture
def two_beats(cluster_for) -> Cluster:  # type: ignore[no-untyped-def]
    """A worker and two beats (an entry every second); one of the beats sends."""
    cluster = cluster_for("redis")
    cluster.env["LEADER_BEAT_EVERY"] = "1"
    cluster.start(1)
    for _ in range(2):
        cluster.start_beat()
    return cluster


def beat_token(cluster: Cluster) -> int | None:
    store = open_store(cluster.store.url, timeout=2)
    try:
        record = store.read(f"{cluster.name}.beat")
    finally:
        store.close()
    return None if record is None else record.token


@pytest.mark.slow
def test_step_down_beat_hands_over_to_the_other_beat(two_beats: Cluster) -> None:
    """step-down --beat: exit 0, the sending beat releases, the other sends; no slot twice."""
    cluster = two_beats
    old = wait_sending(cluster, cluster.beats, timeout=20)
    time.sleep(2.5)
    token = beat_token(cluster)
    assert token is not None
    asked_at = time.monotonic()
    proc = cluster.celery("leader", "step-down", "--beat")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(rf"beat-\S+ stepped down \(token {token}\)", proc.stdout), proc.stdout
    assert "now leading:" in proc.stdout
    new = wait_sending(cluster, cluster.beats, timeout=20, exclude=old)  # generous: a loaded CI
    assert new is not old
    assert "asked to step down" in old.text(), "the old beat says why it released"
    time.sleep(3)
    sends = cluster.beat_sends()
    after = [s for s in sends if s["at"] > asked_at]
    assert after, "the other beat sends after the step-down"
    assert min(s["token"] for s in after[-2:]) > token, "the new beat sends under a newer term"
    assert min(gaps(sends)) > 0.5, "no slot sent twice across the handover"
    assert old.proc.poll() is None, "the old beat still runs, as a standby"


def test_step_down_beat_without_a_beat_exits_1(cluster_for) -> None:  # type: ignore[no-untyped-def]
    """step-down --beat with no beat holding beat's lease: exit 1, says so."""
    cluster = cluster_for("redis")
    proc = cluster.celery("leader", "step-down", "--beat")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"no beat leader holds election '{cluster.name}.beat'" in proc.stdout
    assert "Traceback" not in proc.stderr
