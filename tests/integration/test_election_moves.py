"""How named elections move between balanced workers: a step-down, and a worker's death.

Real ``celery worker`` processes of ``tests.integration.electionsapp`` on a
real Redis broker and store: three workers and six elections (the default
one, billing, reports, and audit, export, sync through ``LEADER_RECORDERS``,
each with a task that records its runs), ttl 4 s, so that a standby that
waited out a lease or a balancing pass (renew interval 1.33 s) would miss
the bounds below.
"""

from __future__ import annotations

import re
import signal
import threading
import time

import pytest

from celery_leader.stores import open_store
from tests.integration.test_named_elections import APP, SIX, holders, wait_spread

TTL = 4.0
EXTRA = ("audit", "export", "sync")


def task_of(election: str) -> str:
    return f"{APP}.{election}_record" if election else "tests.integration.leaderapp.leader_record"


def lease_of(cluster, election: str) -> str:
    return f"{cluster.name}.{election}" if election else cluster.name


@pytest.fixture
def six(cluster_for):
    """Three workers leading two of the six elections each, every task routed by name."""
    cluster = cluster_for("redis")
    cluster.env["LEADER_TTL"] = f"{TTL:g}"
    cluster.client.conf.leader_tasks = {
        "tests.integration.leaderapp.*": "",
        **{task_of(e): e for e in SIX if e},
    }
    workers = cluster.start(3, app=APP, env={"LEADER_RECORDERS": ",".join(EXTRA)})
    wait_spread(cluster, workers, 2, 60)
    return cluster, workers


class Watcher:
    """Samples the holders of every election in the store every 20 ms, on a thread."""

    def __init__(self, cluster) -> None:
        self._store = open_store(cluster.env["LEADER_STORE"], timeout=2)
        self._names = {e: lease_of(cluster, e) for e in SIX}
        #: (monotonic time, {election: (nodename, token) of a holder past its hold-off, or None})
        self.samples: list[tuple[float, dict[str, tuple[str, int] | None]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            at = time.monotonic()
            view = {}
            for election, name in self._names.items():
                record = self._store.read(name)
                leads = record is not None and record.hold_off <= 0
                view[election] = (record.nodename, record.token) if leads else None
            self.samples.append((at, view))
            self._stop.wait(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._store.close()

    def unled(self, election: str, token: int) -> tuple[float, tuple[str, int]]:
        """(seconds between the last sample led under *token* and the first led by another
        term, that term's holder)."""
        last = max(at for at, view in self.samples if (view[election] or ("", 0))[1] == token)
        after = [(at, view[election]) for at, view in self.samples if at > last]
        first = next((at, held) for at, held in after if held is not None and held[1] != token)
        return first[0] - last, first[1]


@pytest.mark.slow
def test_a_step_down_moves_one_election_at_once_and_nothing_else(six):
    """step-down --election billing: billing is led again within 1 s of its release (a
    standby woken by the release, not one waiting out the lease or a balancing pass), no
    other election changes holder for 3 ttls after (nor billing again), and the logs name
    the worker that took it and call it a release."""
    cluster, workers = six
    # Steady: the start's hand-overs are done, and each election's successor has looked at
    # its lease since its holder took it (it tries at each lease end).
    time.sleep(2 * TTL)
    before = holders(cluster)
    old_holder, old_token = before["billing"]
    stepping = next(w for w in workers if w.nodename == old_holder)
    watcher = Watcher(cluster)
    try:
        proc = cluster.celery("leader", "step-down", "--election", "billing", app=APP)
        time.sleep(3 * TTL)
    finally:
        watcher.stop()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    gap, (new_holder, new_token) = watcher.unled("billing", old_token)
    assert new_holder != old_holder
    # A tenth of the ttl is plenty here; 1 s leaves room for a loaded machine and still
    # fails a standby that waited for a balancing pass (1.33 s) or the lease (4 s).
    assert gap < 1.0, f"billing was led by nobody for {gap:.2f} s after its release"
    assert f"{old_holder} stepped down (token {old_token})" in proc.stdout
    assert f"now leading: {new_holder} (token {new_token})" in proc.stdout, proc.stdout

    settled = [view for at, view in watcher.samples if at > watcher.samples[-1][0] - 3 * TTL + 2]
    for election in SIX:
        expected = (new_holder, new_token) if election == "billing" else before[election]
        seen = {view[election] for view in settled}
        assert seen == {expected}, f"{election} moved after the step-down: {seen}"

    lease = re.escape(lease_of(cluster, "billing"))
    taker = next(w for w in workers if w.nodename == new_holder)
    assert re.search(
        rf"{re.escape(new_holder)} leads election '{lease}' \(token {new_token}\), after "
        rf"{re.escape(old_holder)} \(token {old_token}\), which released it",
        taker.text(),
    ), taker.text()[-3000:]
    said = stepping.text()
    assert re.search(rf"steps down from election '{lease}' .*to whichever standby takes it", said)
    assert re.search(
        rf"election '{lease}', which this worker gave up, is led by {new_holder}", said
    )
    assert "handing election" not in "".join(
        line for w in workers for line in w.text().splitlines() if "step-down" in line
    )


@pytest.mark.slow
def test_a_killed_worker_with_two_elections_is_replaced_in_each_within_the_ttl(six):
    """SIGKILL a worker leading two elections: each election's first task runs on another
    worker within ttl + 0.5 s of the kill (README: ttl + a little), and within 0.5 s of the
    moment its lease ran out; no standby waits for the dead worker's announcement to expire."""
    cluster, workers = six
    time.sleep(2)  # the spread is settled: no hand-over is under way
    view = holders(cluster)
    victim = workers[0]
    theirs = sorted(
        e for e, held in view.items() if held is not None and held[0] == victim.nodename
    )
    assert len(theirs) == 2, view
    store = open_store(cluster.env["LEADER_STORE"], timeout=2)
    try:
        read_at = time.monotonic()
        ends = {e: read_at + store.read(lease_of(cluster, e)).expires_in for e in theirs}
    finally:
        store.close()
    killed_at = time.monotonic()
    victim.signal(signal.SIGKILL)
    victim.proc.wait(10)
    # Sent once the victim is gone: a message its pending BRPOP popped would be lost (the
    # Redis transport's known gap), and the leader queues wait for the new leaders.
    time.sleep(0.3)
    for election in theirs:
        cluster.client.send_task(task_of(election), args=(1000,))

    def first_runs(rows):
        found = {}
        for row in rows:
            if row["kind"] == "start" and row.get("i") == 1000:
                found.setdefault(row.get("election") or "", row)
        return found

    rows = cluster.wait_history(lambda r: set(first_runs(r)) >= set(theirs), 20)
    found = first_runs(rows)
    assert set(found) >= set(theirs), f"no run of {set(theirs) - set(found)} within 20 s"
    for election in theirs:
        run = found[election]
        assert run["worker"] != victim.nodename
        after_kill = run["at"] - killed_at
        after_end = run["at"] - ends[election]
        assert after_kill < TTL + 0.5, f"{election}: first task {after_kill:.2f} s after the kill"
        assert after_end < 0.5, f"{election}: first task {after_end:.2f} s after its lease ended"
