"""Fast failover (``leader_fast_failover``): real workers, a lease of 10 s, a leader that dies.

What each test shows, on real ``celery worker`` processes:

* SIGKILL of the leader's main process, or of its whole process group: the
  next leader runs leader work within a few seconds, far sooner than the
  lease (10 s) would let it, and a ``terminate`` run left in the dead
  leader's pool child is gone before the next leader's first run starts;
* the kernel's OOM killer ending a solo-pool leader (in a memory cgroup)
  whose leader task outgrew its limit: replaced as fast as after SIGKILL;
* SIGSTOP is not death: nobody takes over early;
* ``CLIENT KILL`` (Redis) or ``pg_terminate_backend`` (PostgreSQL) of the
  leader's lifeline connection while the leader lives: it stops leading
  (its terminate run ends), and the next leader starts only after that.
* every lifeline ending at once (Redis restarted empty, every PostgreSQL
  session ended): the next term is tied to its holder's new lifeline, and
  that holder's death is seen as fast.

And on real ``celery beat`` processes (two beats, one worker running what
they send): a killed sending beat is replaced long before its lease ends; a
stopped one is not; one whose lifeline connection is killed stops sending
before the other beat's first send.
"""

from __future__ import annotations

import collections
import os
import signal
import threading
import time

import pytest
import redis

from celery_leader.stores import open_store
from celery_leader.stores.base import LeaseRecord
from celery_leader.stores.postgres_lifeline import LOCK_SPACE, lock_of
from celery_leader.stores.redis_lifeline import client_name
from harness.cluster import Cluster
from harness.oom import MemoryCage
from tests.integration.test_beat import gaps, wait_sending
from tests.lease.test_election import wait_for
from tests.store_matrix import STORES

TTL = 10.0


def _runs(rows, kind="start"):  # type: ignore[no-untyped-def]
    return [r for r in rows if r["kind"] == kind]


class GoneWatch:
    """Watches pids from a thread and records when each was first seen gone (monotonic)."""

    def __init__(self) -> None:
        self.gone: dict[int, float] = {}
        self._pids: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def add(self, pid: int) -> None:
        self._pids.add(pid)

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            for pid in list(self._pids - set(self.gone)):
                if not _alive(pid):
                    self.gone[pid] = time.monotonic()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] not in "ZX"
    except FileNotFoundError:
        return False


def _fast_cluster(cluster_for, store_url: str | None = None):  # type: ignore[no-untyped-def]
    """A cluster (Redis broker) with leader_fast_failover, on *store_url* (default: its Redis).

    The store is primed with a released term of the workers' election and of
    beat's, so the first leader (and the first beat) leads at once.
    """
    cluster = cluster_for("redis")
    cluster.env["LEADER_TTL"] = f"{TTL:g}"
    cluster.env["LEADER_FAST_FAILOVER"] = "1"
    if store_url is not None:
        cluster.env["LEADER_STORE"] = store_url
    cluster.prime_store(cluster.name, cluster.beat_election)
    return cluster


@pytest.fixture
def lifeline_store(request, tmp_path):  # type: ignore[no-untyped-def]
    """The URL of a fresh store of the kind the test is parametrized with (None: the cluster's)."""
    kind = request.param
    if kind == "redis":
        yield None
        return
    (tmp_path / "store").mkdir()
    with (
        pytest.MonkeyPatch.context() as monkeypatch,
        STORES[kind].run(tmp_path / "store", monkeypatch) as running,
    ):
        yield running.url


def _long_run_in_the_leader(cluster):  # type: ignore[no-untyped-def]
    """The leader worker, running a terminate run of 60 s in a pool child; the run's row."""
    leader = cluster.leader_worker(timeout=20)
    cluster.send("slow_terminate", 60, "long")
    rows = cluster.wait_history(lambda r: any(x.get("tag") == "long" for x in _runs(r)), 15)
    (started,) = [x for x in _runs(rows) if x.get("tag") == "long"]
    assert started["worker"] == leader.nodename
    return leader, started


@pytest.mark.slow
def _record(cluster: Cluster, name: str) -> LeaseRecord:
    """The store's record of election *name* (there must be one)."""
    store = open_store(cluster.env["LEADER_STORE"], timeout=2)
    try:
        record = store.read(name)
    finally:
        store.close()
    assert record is not None, f"no record of {name!r} in the store"
    return record


@pytest.mark.parametrize(
    ("lifeline_store", "what"),
    [
        ("redis", "main process"),
        ("redis", "process group"),
        ("sentinel", "main process"),
        ("sqlite", "main process"),
        ("postgres", "main process"),
    ],
    indirect=["lifeline_store"],
)
def test_a_killed_leader_is_replaced_before_its_lease_ends(what, lifeline_store, cluster_for):
    cluster = _fast_cluster(cluster_for, lifeline_store)
    cluster.start(2)
    leader, long_run = _long_run_in_the_leader(cluster)
    watch = GoneWatch()
    watch.add(long_run["pid"])
    try:
        killed_at = time.monotonic()
        if what == "main process":
            os.kill(leader.proc.pid, signal.SIGKILL)
        else:
            leader.signal(signal.SIGKILL)
        leader.proc.wait(10)
        cluster.send("leader_record", 1)
        rows = cluster.wait_history(lambda r: any(x.get("i") == 1 for x in _runs(r)), TTL + 10)
    finally:
        watch.close()
    (first,) = [x for x in _runs(rows) if x.get("i") == 1]
    took = first["at"] - killed_at
    assert first["worker"] != leader.nodename
    assert took < TTL / 2, f"first leader task {took:.2f} s after the kill (lease {TTL:g} s)"
    gone_at = watch.gone.get(long_run["pid"])
    assert gone_at is not None, "the dead leader's terminate run still runs"
    assert gone_at < first["at"], "the next leader started while the dead one's run lived"
    assert not [x for x in _runs(rows, "end") if x.get("tag") == "long"]
    print(f"SIGKILL ({what}) -> first leader task on the next worker: {took:.3f} s")


@pytest.mark.slow
def test_a_stopped_leader_is_not_taken_for_dead(cluster_for):
    cluster = _fast_cluster(cluster_for)
    cluster.start(2)
    leader = cluster.leader_worker(timeout=20)
    code, status = cluster.leader_status()
    assert code == 0
    assert status is not None
    assert status["leader"]["lifeline"] is True
    human = cluster.celery("leader", "status").stdout
    assert "if it dies: replaced within about 0.3 s" in human, human
    store = open_store(cluster.env["LEADER_STORE"], timeout=2)
    leader.signal(signal.SIGSTOP)
    try:
        stopped_at = time.monotonic()
        while time.monotonic() - stopped_at < TTL / 2:
            record = store.read(cluster.name)
            assert record is not None
            assert record.nodename == leader.nodename, "a stopped leader was taken over early"
            time.sleep(0.1)
    finally:
        leader.signal(signal.SIGCONT)
        store.close()


def _kill_lifeline_connection(store_url: str, key: str) -> None:
    """What an operator does to one connection: CLIENT KILL, or pg_terminate_backend."""
    if store_url.startswith("redis"):
        admin = redis.Redis.from_url(store_url, decode_responses=True)
        try:
            (connection,) = [c for c in admin.client_list() if c["name"] == client_name(key)]
            admin.client_kill_filter(_id=connection["id"])
        finally:
            admin.close()
        return
    import psycopg

    with psycopg.connect(store_url, autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory'"
            " AND classid = %s AND objid = %s AND objsubid = 2 AND granted",
            (LOCK_SPACE, lock_of(key)),
        ).fetchone()
    assert row is not None and row[0] == 1, f"no session holds the lifeline's lock: {row}"


@pytest.mark.slow
@pytest.mark.parametrize("lifeline_store", ["redis", "postgres"], indirect=True)
def test_a_killed_lifeline_connection_ends_the_term_before_the_next_begins(
    lifeline_store, cluster_for
):
    cluster = _fast_cluster(cluster_for, lifeline_store)
    cluster.start(2)
    leader, long_run = _long_run_in_the_leader(cluster)
    record = _record(cluster, cluster.name)
    assert record.lifeline, "the leader's term is not tied to a lifeline"
    watch = GoneWatch()
    watch.add(long_run["pid"])
    try:
        _kill_lifeline_connection(cluster.env["LEADER_STORE"], record.lifeline)
        ended = wait_for(lambda: "lifeline-ended" in leader.text(), timeout=10)
        assert ended, "the leader did not hear that its lifeline ended"
        cluster.send("leader_record", 1)
        rows = cluster.wait_history(
            lambda r: any(x["token"] != long_run["token"] for x in _runs(r)), TTL + 10
        )
    finally:
        watch.close()
    # The first run of a later term (a run of the same term may start before the end is heard).
    later = [x for x in _runs(rows) if x["token"] != long_run["token"]]
    assert later, "no later term ran the task"
    assert later[0]["token"] > long_run["token"]
    gone_at = watch.gone.get(long_run["pid"])
    assert gone_at is not None, "the run of the term whose lifeline ended still runs"
    assert gone_at < later[0]["at"], "the next term began while the last one's run lived"
    assert not [x for x in _runs(rows, "end") if x.get("tag") == "long"]
    assert leader.proc.poll() is None, "the worker itself must live on"


@pytest.mark.slow
def test_a_killed_beat_is_replaced_before_its_lease_ends(cluster_for):
    """Two beats, an entry every second, a 10 s lease: SIGKILL the sending one; the other sends
    within a few seconds, and no slot is sent twice."""
    cluster = _fast_cluster(cluster_for)
    cluster.env["LEADER_BEAT_EVERY"] = "1"
    cluster.start(1)
    beats = [cluster.start_beat() for _ in range(2)]
    old = wait_sending(cluster, beats, timeout=TTL + 20)
    time.sleep(3)
    killed_at = time.monotonic()
    old.signal(signal.SIGKILL)
    new = wait_sending(cluster, beats, timeout=TTL + 5, exclude=old)
    time.sleep(3)
    sends = cluster.beat_sends()
    after = [s for s in sends if s["at"] > killed_at]
    before = [s for s in sends if s["at"] <= killed_at]
    assert new is not old
    assert after, "the standby sends after the kill"
    took = after[0]["at"] - killed_at
    assert took < TTL / 2, f"first send {took:.2f} s after the kill (lease {TTL:g} s)"
    assert min(s["token"] for s in after) > max(s["token"] for s in before)
    assert min(gaps(sends)) > 0.5, "no slot sent twice across the failover"
    print(f"beat SIGKILL -> first send by the standby: {took:.3f} s")


def _beats_sending(cluster_for, every: float):  # type: ignore[no-untyped-def]
    """A fast-failover cluster, one worker, two beats (an entry every *every* s); the sending
    beat and its term's token, once that term is tied to a lifeline."""
    cluster = _fast_cluster(cluster_for)
    cluster.env["LEADER_BEAT_EVERY"] = f"{every:g}"
    cluster.start(1)
    for _ in range(2):
        cluster.start_beat()
    sending, token = cluster.sending_beat(timeout=30)
    record = _record(cluster, cluster.beat_election)
    assert record.token == token
    assert record.lifeline, "the beat's term is not tied to a lifeline"
    return cluster, sending, token, record.lifeline


def _sent_once(sends) -> None:  # type: ignore[no-untyped-def]
    counts = collections.Counter(s["occurrence"] for s in sends)
    assert not [o for o, n in counts.items() if n > 1], "a slot sent twice"


@pytest.mark.slow
def test_a_stopped_beat_is_not_taken_for_dead(cluster_for):
    """SIGSTOP the sending beat for half its lease: its lifeline stays kept (the process
    lives), so nobody takes over and nothing is sent until it is continued."""
    cluster, old, token, _ = _beats_sending(cluster_for, every=0.5)
    (other,) = [b for b in cluster.beats if b is not old]
    time.sleep(1)
    store = open_store(cluster.env["LEADER_STORE"], timeout=2)
    old.signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        while time.monotonic() - stopped_at < TTL / 2:
            record = store.read(cluster.beat_election)
            assert record is not None
            assert record.token == token, "a stopped beat was taken over early"
            time.sleep(0.1)
    finally:
        continued_at = time.monotonic()
        standby_log = other.text()
        old.signal(signal.SIGCONT)
        store.close()
    time.sleep(2)
    sends = cluster.beat_sends()
    # A send published just before the stop may reach the worker a moment later.
    during = [s for s in sends if stopped_at + 0.2 < s["at"] < continued_at]
    assert not during, f"sent while the sending beat was stopped: {during}"
    assert [s for s in sends if s["at"] < stopped_at], "nothing sent before the stop"
    assert "this beat sends now" not in standby_log, "the standby sent while the beat was stopped"
    later = [s["token"] for s in sends if s["at"] > continued_at]
    assert later == sorted(later) and min(later, default=token) >= token
    _sent_once(sends)


@pytest.mark.slow
def test_a_killed_beat_lifeline_connection_ends_its_term_before_the_next_begins(cluster_for):
    """CLIENT KILL of the sending beat's lifeline connection while the beat lives: its term
    ends, and the next term's first send comes after that term's last one, under a higher
    token, with no slot sent twice.

    The beat whose lifeline ended releases the lease once no send of its term is in flight
    and competes again at once, so the next term is most often its own; the other beat takes
    it when it is first (0.3 s after it saw the lifeline end). Either way the two terms'
    sends must not overlap.
    """
    cluster, old, token, lifeline = _beats_sending(cluster_for, every=0.2)
    time.sleep(1)
    admin = redis.Redis.from_url(cluster.env["LEADER_STORE"], decode_responses=True)
    try:
        (connection,) = [c for c in admin.client_list() if c["name"] == client_name(lifeline)]
        killed_at = time.monotonic()
        admin.client_kill_filter(_id=connection["id"])
    finally:
        admin.close()
    assert wait_for(lambda: "lifeline-ended" in old.text(), timeout=10), (
        "the beat did not hear that its lifeline ended"
    )
    new, new_token = cluster.sending_beat(timeout=TTL + 10, after=token)
    time.sleep(2)
    sends = cluster.beat_sends()
    assert new_token > token
    mine = [s for s in sends if s["token"] == token]
    theirs = [s for s in sends if s["token"] != token]
    assert mine and theirs
    assert min(s["token"] for s in theirs) == new_token
    assert max(s["at"] for s in mine) < min(s["at"] for s in theirs), (
        "the killed lifeline's beat sent after the next beat began"
    )
    stopped = max(s["at"] for s in mine) - killed_at
    assert stopped < 1.0, f"the term whose lifeline ended sent {stopped:.2f} s after the kill"
    took = min(s["at"] for s in theirs) - killed_at
    assert took < TTL / 2, f"first send of the next term {took:.2f} s after the kill"
    _sent_once(sends)
    assert old.proc.poll() is None, "the beat itself must live on"
    who = "the same beat" if new is old else "the other beat"
    print(f"beat lifeline killed -> first send of the next term ({who}): {took:.3f} s")


@pytest.mark.slow
def test_a_store_restart_never_lets_two_beat_terms_send_at_once(cluster_for):
    """The lease store restarts empty under two beats: every lifeline ends with it (the sending
    beat's term with its lifeline), and no follower can take over early across a restart (its
    readings start a new session). The next term, after the restarted store's hold-off, sends
    only after the last send of the term before, under a higher token.

    Slots may be sent twice here: the send marks were in the store that lost its data.
    """
    cluster, _old, token, _ = _beats_sending(cluster_for, every=0.2)
    time.sleep(1)
    assert cluster.store is not None
    restarted_at = time.monotonic()
    cluster.store.restart_empty()
    _new, new_token = cluster.sending_beat(timeout=TTL * 3 + 10, after=token)
    time.sleep(1)
    sends = cluster.beat_sends()
    assert new_token > token
    mine = [s for s in sends if s["token"] == token]
    theirs = [s for s in sends if s["token"] != token and s["at"] > restarted_at]
    assert mine and theirs
    assert min(s["token"] for s in theirs) > token, "a term below the one before sent"
    assert max(s["at"] for s in mine) < min(s["at"] for s in theirs), (
        "the term before the restart sent after the next one began"
    )
    stopped = max(s["at"] for s in mine) - restarted_at
    assert stopped < 1.0, f"the term whose store restarted sent {stopped:.2f} s after it"
    took = min(s["at"] for s in theirs) - restarted_at
    assert took >= TTL * 0.9, f"a term sent {took:.2f} s after an empty restart (hold-off {TTL:g})"


def _end_every_postgres_session(url: str) -> None:
    """What a PostgreSQL restart does to its clients, the data kept: every session ends."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE pid <> pg_backend_pid() AND datname = current_database()"
        )


@pytest.mark.slow
@pytest.mark.parametrize("lifeline_store", ["redis", "postgres"], indirect=True)
def test_the_term_after_a_store_restart_is_tied_to_a_lifeline(lifeline_store, cluster_for):
    """Every lifeline ends at once (Redis restarts empty; PostgreSQL ends every session, its
    data kept), and the next term begins only once its holder's new lifeline is confirmed,
    so a death ends that term fast too (without the wait, the term won in the second before
    the lifelines reopen had none, and its holder's death waited out the lease)."""
    cluster = _fast_cluster(cluster_for, lifeline_store)
    cluster.start(2)
    cluster.leader_worker(timeout=20)

    def read() -> LeaseRecord | None:
        store = open_store(cluster.env["LEADER_STORE"], timeout=2)
        try:
            record = store.read(cluster.name)
        finally:
            store.close()
        return record

    before = read()
    assert before is not None
    restarted_at = time.monotonic()
    if lifeline_store is None:
        cluster.store.restart_empty()
    else:
        _end_every_postgres_session(lifeline_store)

    def next_term() -> LeaseRecord | None:
        # PostgreSQL keeps its data: the term before the restart is read until the next one
        # begins (its holder's lifeline ended: it gives it up).
        record = read()
        return record if record is not None and record.token > before.token else None

    record = wait_for(next_term, TTL + 5, step=0.05)
    assert record is not None, "nobody took the lease after the restart"
    assert record.lifeline, f"the term after the restart is tied to no lifeline: {record}"
    # Past a restarted store's hold-off (one ttl after the restart), the holder leads.
    time.sleep(max(0.0, restarted_at + TTL + 1 - time.monotonic()))
    leader = cluster.leader_worker(timeout=TTL)
    assert leader.nodename == record.nodename
    killed_at = time.monotonic()
    os.kill(leader.proc.pid, signal.SIGKILL)
    leader.proc.wait(10)
    cluster.send("leader_record", 1)
    rows = cluster.wait_history(lambda r: any(x.get("i") == 1 for x in _runs(r)), TTL + 10)
    (first,) = [x for x in _runs(rows) if x.get("i") == 1]
    took = first["at"] - killed_at
    assert first["worker"] != leader.nodename
    assert took < TTL / 2, f"first leader task {took:.2f} s after the kill (lease {TTL:g} s)"


@pytest.mark.slow
def test_a_leader_killed_by_the_oom_killer_is_replaced_before_its_lease_ends(cluster_for):
    """The kernel's OOM killer, not a signal of ours: a solo-pool leader (its tasks run in its
    main process) in a memory cgroup runs a leader task that outgrows the cgroup's limit."""
    cluster = _fast_cluster(cluster_for)
    cluster.start(2, pool="solo")
    leader = cluster.leader_worker(timeout=20)
    with MemoryCage(limit_bytes=200 * 1024 * 1024) as cage:
        cage.add(leader.proc.pid)
        cluster.send("grow_memory", "oom")
        leader.proc.wait(30)
        killed_at = time.monotonic()
        assert leader.proc.returncode == -signal.SIGKILL, leader.proc.returncode
        assert cage.oom_kills() >= 1, "the leader died, but not by the OOM killer"
    cluster.send("leader_record", 1)
    rows = cluster.wait_history(lambda r: any(x.get("i") == 1 for x in _runs(r)), TTL + 10)
    (first,) = [x for x in _runs(rows) if x.get("i") == 1]
    (grew,) = [x for x in _runs(rows) if x.get("tag") == "oom"]
    assert grew["worker"] == leader.nodename
    assert not [x for x in _runs(rows, "end") if x.get("tag") == "oom"]
    took = first["at"] - killed_at
    assert first["worker"] != leader.nodename
    assert took < TTL / 2, f"first leader task {took:.2f} s after the OOM kill (lease {TTL:g} s)"
    print(f"OOM kill -> first leader task on the next worker: within {took:.3f} s")
