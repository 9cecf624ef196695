"""``celery leader status`` beside real workers: a hold-off, and a leader killed with SIGKILL."""

from __future__ import annotations

import json
import re
import signal
import time

import pytest

from celery_leader.stores import open_store
from celery_leader.stores.base import Holder, LeaseRecord
from harness.cluster import Cluster


def read_record(cluster: Cluster) -> LeaseRecord | None:
    store = open_store(cluster.store.url, timeout=2)
    try:
        return store.read(cluster.name)
    finally:
        store.close()


def roles(cluster: Cluster) -> dict[str, str]:
    """Each worker's own view, from ``celery inspect leader``."""
    proc = cluster.celery("inspect", "leader", "--json", "--timeout", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {node: view["role"] for node, view in json.loads(proc.stdout).items()}


@pytest.mark.slow
def test_status_agrees_with_inspect_during_the_first_hold_off(cluster_for):  # type: ignore[no-untyped-def]
    """First worker on a new store: status and inspect both say it does not lead yet."""
    cluster = cluster_for("redis")
    # The hold-off on a new store is one ttl: long enough for three commands in it, each a
    # Python process of its own (three took over 10 s on a loaded machine).
    cluster.env["LEADER_TTL"] = "30"
    (worker,) = cluster.start(1)
    deadline = time.monotonic() + 10
    record = read_record(cluster)
    while (record is None or record.hold_off <= 0) and time.monotonic() < deadline:
        time.sleep(0.05)
        record = read_record(cluster)
    assert record is not None and record.hold_off > 20, "still early in the hold-off"
    code, status = cluster.leader_status()
    assert code == 0, status
    assert status is not None
    assert status["leader"] == status["holder"]
    assert status["holder"]["nodename"] == worker.nodename
    assert status["holder"]["leading"] is False
    assert roles(cluster) == {worker.nodename: "follower"}
    human = cluster.celery("leader", "status")
    assert human.returncode == 0
    assert "none yet (its holder is holding off, not leading)" in human.stdout, human.stdout
    cluster.leader_worker(timeout=50)  # the hold-off is over: it leads
    code, status = cluster.leader_status()
    assert code == 0, status
    assert status is not None
    assert status["leader"]["nodename"] == worker.nodename
    assert status["leader"]["leading"] is True
    assert roles(cluster) == {worker.nodename: "leader"}


@pytest.mark.slow
def test_status_marks_a_killed_leader_overdue_until_its_lease_ends(cluster_for):  # type: ignore[no-untyped-def]
    """SIGKILL the leader: status names it, exit 0, but says it stopped renewing (overdue)."""
    cluster = cluster_for("redis")
    # A ttl long enough for two `leader status` commands on a loaded machine (each
    # starts a Python process) after the kill: the lease must not run out under them.
    cluster.env["LEADER_TTL"] = "30"
    cluster.env["LEADER_RENEW"] = "2"
    # A store that has seen a term: the worker leads at once, with no hold-off.
    store = open_store(cluster.store.url, timeout=2)
    try:
        assert store.acquire(cluster.name, Holder("warm", "w0@h", "h", 1), ttl=1).acquired
        assert store.release(cluster.name, "warm")
    finally:
        store.close()
    (worker,) = cluster.start(1)
    assert cluster.leader_worker() is worker
    code, status = cluster.leader_status()
    assert code == 0, status
    assert status is not None
    assert status["renew_interval"] == 2
    assert status["leader"]["overdue"] is False
    assert status["leader"]["renewed_ago"] < 2 * 1.5
    worker.signal(signal.SIGKILL)
    killed_at = time.monotonic()
    time.sleep(3.5)  # more than 1.5 renew intervals: overdue, and well inside the 30 s ttl
    code, status = cluster.leader_status()
    assert time.monotonic() - killed_at < 30 - 2, "the lease has not run out yet"
    assert code == 0, "the lease is still held: status still names its holder"
    assert status is not None
    assert status["leader"]["nodename"] == worker.nodename
    assert status["leader"]["overdue"] is True
    assert status["leader"]["renewed_ago"] >= 3.5
    human = cluster.celery("leader", "status")
    assert re.search(r"renewed:    [\d.]+ s ago \(overdue: renews every 2 s\)", human.stdout), (
        human.stdout
    )
