"""Two ways balanced elections move, on real workers, measured (a test and a benchmark run them).

Three ``celery worker`` processes of ``tests.integration.electionsapp`` in
six elections (the default one, billing, reports, and audit, export, sync
through ``LEADER_RECORDERS``, each with a task that records its runs), on a
Redis broker and store, with a ttl of :data:`TTL`:

* :func:`step_down_one`: ``celery leader step-down --election billing``;
  how long billing was led by nobody, who took it, and every holder of
  every election sampled afterwards;
* :func:`kill_one_with_two`: SIGKILL of a worker leading two elections; for
  each, when its first task ran on another worker, after the kill and after
  the moment its lease ran out.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass

from celery_leader.stores import open_store
from harness.cluster import Cluster, Worker
from harness.holders import Held, HolderSampler

APP = "tests.integration.electionsapp"
#: The elections ("" is the default one).
SIX = ("", "billing", "reports", "audit", "export", "sync")
#: Long enough that waiting out a lease (4 s) or a balancing pass (1.33 s) shows.
TTL = 4.0


def task_of(election: str) -> str:
    """The recording task of *election*."""
    if election:
        return f"{APP}.{election}_record"
    return "tests.integration.leaderapp.leader_record"


def lease_of(cluster: Cluster, election: str) -> str:
    return f"{cluster.name}.{election}" if election else cluster.name


def holders(cluster: Cluster) -> dict[str, Held]:
    """Election -> its holder past its hold-off (or None), read from the store now."""
    store = open_store(cluster.env["LEADER_STORE"], timeout=2)
    try:
        found: dict[str, Held] = {}
        for election in SIX:
            record = store.read(lease_of(cluster, election))
            leads = record is not None and record.hold_off <= 0
            found[election] = (record.nodename, record.token) if leads else None
        return found
    finally:
        store.close()


def start_six(cluster: Cluster, timeout: float = 60) -> list[Worker]:
    """Three workers of the six elections, once each leads two; every task routed by name."""
    cluster.env["LEADER_TTL"] = f"{TTL:g}"
    cluster.client.conf.leader_tasks = {
        "tests.integration.leaderapp.*": "",
        **{task_of(e): e for e in SIX if e},
    }
    workers = cluster.start(3, app=APP, env={"LEADER_RECORDERS": "audit,export,sync"})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = holders(cluster)
        counts = [sum(1 for h in view.values() if h and h[0] == w.nodename) for w in workers]
        if all(view.values()) and counts == [2, 2, 2]:
            return workers
        time.sleep(0.1)
    raise AssertionError(f"not spread two each within {timeout} s: {holders(cluster)}")


@dataclass
class StepDown:
    """What :func:`step_down_one` saw."""

    command: subprocess.CompletedProcess[str]
    before: dict[str, Held]
    #: Seconds billing was led by nobody, and who led it next (nodename, token).
    gap: float
    successor: tuple[str, int]
    #: Per election, every holder sampled from billing's next term on.
    seen_after: dict[str, set[Held]]


def step_down_one(cluster: Cluster, observe: float = 3 * TTL) -> StepDown:
    """Step billing's holder down with the CLI; watch every election for *observe* s after."""
    before = holders(cluster)
    old = before["billing"]
    assert old is not None
    sampler = HolderSampler(cluster.env["LEADER_STORE"], {e: lease_of(cluster, e) for e in SIX})
    try:
        command = cluster.celery("leader", "step-down", "--election", "billing", app=APP)
        time.sleep(observe)
    finally:
        sampler.stop()
    last, first, successor = sampler.next_term("billing", old[1])
    return StepDown(command, before, first - last, successor, sampler.seen_since(first))


@dataclass
class Takeover:
    """One election of the killed worker: its first task after the kill."""

    election: str
    worker: str
    after_kill: float
    after_lease_end: float


def kill_one_with_two(cluster: Cluster, workers: Iterable[Worker]) -> tuple[Worker, list[Takeover]]:
    """SIGKILL the first of *workers* leading two elections; each one's first task after."""
    view = holders(cluster)
    victim = next(
        w for w in workers if sum(1 for h in view.values() if h and h[0] == w.nodename) == 2
    )
    theirs = sorted(e for e, h in view.items() if h and h[0] == victim.nodename)
    store = open_store(cluster.env["LEADER_STORE"], timeout=2)
    try:
        ends = {}
        for election in theirs:
            read_at = time.monotonic()
            record = store.read(lease_of(cluster, election))
            assert record is not None
            ends[election] = read_at + record.expires_in
    finally:
        store.close()
    killed_at = time.monotonic()
    victim.signal(signal.SIGKILL)
    victim.proc.wait(10)
    # Sent once the victim is gone: a message its pending BRPOP popped would be lost (the
    # Redis transport's known gap); the leader queues keep them for the new leaders.
    time.sleep(0.3)
    for election in theirs:
        cluster.client.send_task(task_of(election), args=(1000,))

    def first_runs(rows: list[dict]) -> dict[str, dict]:
        found: dict[str, dict] = {}
        for row in rows:
            if row["kind"] == "start" and row.get("i") == 1000:
                found.setdefault(row.get("election") or "", row)
        return found

    found = first_runs(cluster.wait_history(lambda r: set(first_runs(r)) >= set(theirs), 20))
    missing = set(theirs) - set(found)
    assert not missing, f"no run of {missing} within 20 s of the kill"
    return victim, [
        Takeover(e, found[e]["worker"], found[e]["at"] - killed_at, found[e]["at"] - ends[e])
        for e in theirs
    ]
