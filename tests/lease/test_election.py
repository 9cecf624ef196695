"""LeaseManager elections against real stores: exclusion, takeover, handover."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from celery_leader.lease import EventKind, LeaseManager
from celery_leader.lease.timing import LeaseTiming
from celery_leader.stores import open_store
from celery_leader.stores.base import Holder
from tests.history import History

TTL = 1.0
TIMING = LeaseTiming.create(TTL)
ROOT = Path(__file__).resolve().parents[2]


class Cluster:
    """Many managers in this process on one election, each with its own store client."""

    def __init__(self, url: str, count: int, timing: LeaseTiming = TIMING, name: str = "job"):
        self.url, self.name = url, name
        self.history = History()
        self.managers: list[LeaseManager] = []
        for i in range(count):
            store = open_store(url, timeout=timing.op_timeout)
            holder = Holder.for_this_process(f"m{i}")
            manager = LeaseManager(
                store, name, timing, holder=holder, listeners=(self.history.listener(f"m{i}"),)
            )
            self.managers.append(manager)

    def start(self, *, warm: bool = True) -> Cluster:
        if warm:
            warm_store(self.url, self.name)
        for manager in self.managers:
            manager.start()
        return self

    def leaders(self) -> list[LeaseManager]:
        return [m for m in self.managers if m.is_leader()]

    def wait_leader(self, timeout: float, exclude: LeaseManager | None = None) -> LeaseManager:
        """A leader other than *exclude*, once its term is in the history too.

        A manager reports is_leader() a moment before its listeners hear
        ELECTED; a test that reads the history right after must find the term.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leaders = [
                m
                for i, m in enumerate(self.managers)
                if m is not exclude
                and m.is_leader()
                and self.history.has_term(f"m{i}", m.current_token())
            ]
            if leaders:
                return leaders[0]
            time.sleep(0.005)
        raise AssertionError(f"no leader within {timeout} s")

    def stop(self) -> None:
        for manager in self.managers:
            manager.stop()
            manager.store.close()


@pytest.fixture
def cluster_factory():
    clusters: list[Cluster] = []

    def make(url: str, count: int, **kwargs) -> Cluster:
        cluster = Cluster(url, count, **kwargs)
        clusters.append(cluster)
        return cluster.start()

    yield make
    for cluster in clusters:
        cluster.stop()


def warm_store(url: str, name: str = "job") -> None:
    """Give the store a token history, so the first leader need not hold off a ttl."""
    store = open_store(url, timeout=0.5)
    try:
        holder = Holder.for_this_process("warm-up")
        assert store.acquire(name, holder, 1.0).acquired
        assert store.release(name, holder.lease_id)
    finally:
        store.close()


def sample_exclusion(cluster: Cluster, seconds: float, churn) -> int:  # type: ignore[no-untyped-def]
    """Sample is_leader() on all managers while *churn* runs; return the max seen at once."""
    worst = 0
    stop = threading.Event()
    churner = threading.Thread(target=churn, args=(stop,), daemon=True)
    churner.start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        worst = max(worst, len(cluster.leaders()))
        time.sleep(0.002)
    stop.set()
    churner.join(5)
    return worst


def test_twenty_threads_never_two_leaders(store_url, cluster_factory):
    """20 managers with forced handovers: at most one believes it leads, terms never overlap."""
    cluster = cluster_factory(store_url, 20)
    cluster.wait_leader(TTL + 3)
    rng = random.Random(7)

    def churn(stop: threading.Event) -> None:
        while not stop.wait(0.4):
            for manager in cluster.leaders():
                manager.step_down(sit_out=rng.uniform(0, 0.5))

    worst = sample_exclusion(cluster, 6, churn)
    assert worst == 1
    terms = cluster.history.terms()
    assert len(terms) >= 5
    assert cluster.history.overlaps() == []
    assert cluster.history.tokens_in_order() == sorted(cluster.history.tokens_in_order())


def start_node(
    url: str, name: str, log: Path, nodename: str, ttl: float = TTL
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery_leader.demo.node", url, name, str(ttl), nodename, str(log)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def current_leader(store_url: str, name: str = "job") -> str | None:
    store = open_store(store_url, timeout=0.5)
    try:
        record = store.read(name)
        if record is None or record.hold_off > 0:
            return None
        return record.nodename
    finally:
        store.close()


def wait_for(predicate, timeout: float, step: float = 0.01):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return predicate()


@pytest.mark.slow
def test_five_processes_with_kills_never_overlap(store_url, tmp_path):
    """5 processes, leader SIGKILLed again and again: the recorded terms never overlap."""
    log = tmp_path / "events.jsonl"
    warm_store(store_url)
    procs = {f"p{i}": start_node(store_url, "job", log, f"p{i}") for i in range(5)}
    kills = 0
    try:
        for round_ in range(4):
            leader = wait_for(lambda: current_leader(store_url) in procs, TTL * 3 + 3)
            assert leader, f"no live leader in round {round_}"
            time.sleep(0.5)
            leader = current_leader(store_url)
            if leader not in procs:
                continue
            victim = procs.pop(leader)
            victim.kill()
            victim.wait()
            kills += 1
            name = f"{leader}r{round_}"
            procs[name] = start_node(store_url, "job", log, name)
        time.sleep(TTL * 2)
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            proc.wait(10)
    history = History()
    history.load_jsonl(log)
    assert kills >= 3
    assert len(history.terms()) >= kills + 1
    assert history.overlaps() == []
    tokens = history.tokens_in_order()
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


def test_takeover_after_leader_thread_freezes(store_url, cluster_factory):
    """A leader whose thread hangs stops believing at its validity; another leads in time."""
    cluster = cluster_factory(store_url, 3)
    leader = cluster.wait_leader(TTL + 3)
    frozen = threading.Event()
    release = threading.Event()

    def freeze(event) -> None:  # type: ignore[no-untyped-def]
        if event.kind is EventKind.RENEWED and not frozen.is_set():
            frozen.set()
            release.wait(30)

    leader.add_listener(freeze)
    assert frozen.wait(TTL + 1)
    frozen_at = time.monotonic()
    successor = cluster.wait_leader(TTL + TIMING.renew_interval + 1, exclude=leader)
    took = time.monotonic() - frozen_at
    assert not leader.is_leader(), "a frozen leader must not believe it leads past its validity"
    assert successor is not leader
    assert took < TTL + TIMING.renew_interval + 1
    release.set()
    assert cluster.history.overlaps() == []


def test_takeover_after_leader_process_killed(store_url, tmp_path):
    """SIGKILL the leading process: a follower leads within ttl + renew_interval + 1 s."""
    log = tmp_path / "events.jsonl"
    warm_store(store_url)
    procs = {name: start_node(store_url, "job", log, name) for name in ("a", "b")}
    try:
        leader = wait_for(lambda: current_leader(store_url), TTL * 2 + 3)
        assert leader
        procs[leader].kill()
        killed_at = time.monotonic()
        other = "b" if leader == "a" else "a"
        assert wait_for(lambda: current_leader(store_url) == other, TTL + TIMING.renew_interval + 2)
        took = time.monotonic() - killed_at
        assert took < TTL + TIMING.renew_interval + 1
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


def test_graceful_stop_hands_over_well_before_the_ttl(store_url, cluster_factory):
    """A leader that stops releases; a follower leads at once, not after the ttl.

    The bound is a third of the ttl so a busy machine does not fail it; the
    benchmarks measure the handover itself (milliseconds).
    """
    timing = LeaseTiming.create(10.0)
    cluster = cluster_factory(store_url, 3, timing=timing)
    leader = cluster.wait_leader(timing.ttl + 3)
    old_token = leader.current_token()
    started = time.monotonic()
    leader.stop()
    successor = cluster.wait_leader(timing.ttl / 3, exclude=leader)
    assert time.monotonic() - started < timing.ttl / 3
    assert successor.current_token() > old_token
    kinds = [
        e.kind
        for holder, e in cluster.history.events
        if e.term.token == leader_token(cluster, leader)
    ]
    assert EventKind.RELEASED in kinds


def leader_token(cluster: Cluster, manager: LeaseManager) -> int:
    index = cluster.managers.index(manager)
    return next(
        e.term.token
        for h, e in cluster.history.events
        if h == f"m{index}" and e.kind is EventKind.ELECTED
    )


def test_step_down_sits_out_and_another_leads(store_url, cluster_factory):
    """step_down() releases at once and keeps the old leader out for the sit-out."""
    timing = LeaseTiming.create(10.0)
    cluster = cluster_factory(store_url, 2, timing=timing)
    leader = cluster.wait_leader(timing.ttl + 3)
    assert leader.step_down(sit_out=5)
    # Well under the ttl: only the release notification wakes the follower this soon.
    successor = cluster.wait_leader(timing.ttl / 3, exclude=leader)
    assert successor is not leader
    successor.step_down(sit_out=5)
    time.sleep(1.0)
    assert not leader.is_leader(), "the stepped-down manager sits out"


def test_listener_that_raises_does_not_stop_the_manager(store_url, cluster_factory):
    """A raising listener is logged; the manager keeps leading."""
    cluster = cluster_factory(store_url, 1)

    def boom(event) -> None:  # type: ignore[no-untyped-def]
        raise RuntimeError("listener bug")

    cluster.managers[0].add_listener(boom)
    cluster.wait_leader(TTL + 3)
    time.sleep(TTL * 1.5)
    assert cluster.managers[0].is_leader()
    assert cluster.managers[0].running
