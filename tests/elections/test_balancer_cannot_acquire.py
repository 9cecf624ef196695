"""Real balancers and lease managers on a real Redis: a worker that cannot acquire one election.

The only stand-in is the fault: worker w2's client of one election refuses
every acquire with a store error (as a Redis ACL that denies that key does);
w2's other elections, its balancer and worker w1 are untouched.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from celery_leader.elections.balancer import Balancer
from celery_leader.exceptions import StoreError
from celery_leader.lease import LeaseManager, LeaseTiming
from celery_leader.stores import Holder, open_store
from harness.servers import RedisServer

TTL = 1.0
NAMES = ("app.a", "app.b", "app.c", "app.d")
#: The last by name: a joining worker is handed the last elections of the loaded one.
DENIED = "app.d"


class Denied:
    """A store client whose calls on :data:`DENIED` fail while *active* is set (the fault)."""

    def __init__(self, store: Any, active: threading.Event) -> None:
        self._store = store
        self._active = active

    def _check(self, name: str) -> None:
        if name == DENIED and self._active.is_set():
            raise StoreError(f"NOPERM this user has no permissions to access the {name} key")

    def acquire(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self._check(name)
        return self._store.acquire(name, *args, **kwargs)

    def renew(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self._check(name)
        return self._store.renew(name, *args, **kwargs)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._store, attr)


class TakingPart:
    """One election of a worker, as the worker's ``WorkerElection`` is to the balancer."""

    def __init__(self, name: str, manager: LeaseManager) -> None:
        self.name = name
        self.manager = manager
        self.stepping_down = False
        self.handed_over = 0

    def hand_over(self) -> bool:
        """Release and sit out one ttl, in the background, as a worker hands an election over."""
        if not self.manager.is_leader() or self.stepping_down:
            return False
        self.stepping_down = True
        self.handed_over += 1

        def finish() -> None:
            try:
                self.manager.step_down(sit_out=TTL)
            finally:
                self.stepping_down = False

        threading.Thread(target=finish, daemon=True).start()
        return True


class Worker:
    """A worker's elections, each a real lease manager, and its real balancer."""

    def __init__(self, url: str, nodename: str, *, denied: threading.Event | None = None) -> None:
        self.nodename = nodename
        self.shutting_down = False
        self.balancer = Balancer(
            self, open_store(url, timeout=1), "app.members", interval=TTL / 3, ttl=TTL
        )
        timing = LeaseTiming.create(TTL)
        self.elections: dict[str | None, TakingPart] = {}
        for name in NAMES:
            store = open_store(url, timeout=1)
            manager = LeaseManager(
                store if denied is None else Denied(store, denied),  # type: ignore[arg-type]
                name,
                timing,
                holder=Holder(uuid.uuid4().hex, nodename, "h", 1),
                acquire_delay=lambda name=name: self.balancer.acquire_delay(name),
            )
            self.elections[name] = TakingPart(name, manager)

    def is_live(self) -> bool:
        return True

    def start(self) -> None:
        self.balancer.start()
        for election in self.elections.values():
            election.manager.start()

    def stop(self) -> None:
        self.balancer.stop()
        for election in self.elections.values():
            election.manager.stop()

    def leads(self) -> set[str]:
        return {e.name for e in self.elections.values() if e.manager.is_leader()}


@pytest.fixture
def redis_url(tmp_path) -> Iterator[str]:
    server = RedisServer(tmp_path).start()
    yield server.url
    server.stop()


def test_an_election_one_worker_cannot_acquire_stays_led_by_another(redis_url):
    """w1 leads all four; w2 joins and cannot acquire app.d: after w2 joined, app.d is never
    left without a leader for long, and is not handed to w2 round after round."""
    w1 = Worker(redis_url, "w1")
    denied = threading.Event()
    denied.set()
    w2 = Worker(redis_url, "w2", denied=denied)
    reader = open_store(redis_url, timeout=1)
    try:
        w1.start()
        deadline = time.monotonic() + 10
        while w1.leads() != set(NAMES) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert w1.leads() == set(NAMES), "w1 alone did not lead every election"
        w2.start()
        unled = unled_time(reader, 15 * TTL)
        shared = (w1.leads(), w2.leads())
        handed = w1.elections[DENIED].handed_over
    finally:
        w2.stop()
        w1.stop()
        reader.close()
    # Without the fix, app.d went to w2 again at every round: about 2 ttls without a leader
    # each time, several times in 15 ttls.
    assert unled <= TTL + 0.5, f"{DENIED} was without a leader {unled:.1f} s of {15 * TTL:g}"
    assert handed <= 1, f"{DENIED} was handed over {handed} times"
    assert DENIED in shared[0] and len(shared[1]) == 2, f"not balanced at the end: {shared}"


def unled_time(reader: Any, seconds: float, step: float = 0.05) -> float:
    """Seconds :data:`DENIED` had no leader past its hold-off, looked at every *step*."""
    unled = 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        record = reader.read(DENIED)
        if record is None or record.hold_off > 0:
            unled += step
        time.sleep(step)
    return unled


def test_an_election_a_worker_can_no_longer_acquire_is_not_handed_back_to_it(redis_url):
    """w2 leads app.d, then can no longer renew or acquire it: after w1 took it over, app.d
    stays led by w1, round after round."""
    w1 = Worker(redis_url, "w1")
    denied = threading.Event()
    w2 = Worker(redis_url, "w2", denied=denied)
    reader = open_store(redis_url, timeout=1)
    try:
        w1.start()
        deadline = time.monotonic() + 10
        while w1.leads() != set(NAMES) and time.monotonic() < deadline:
            time.sleep(0.05)
        w2.start()  # w1 hands its last two elections over, app.d among them
        deadline = time.monotonic() + 20
        while DENIED not in w2.leads() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert DENIED in w2.leads(), "the plan did not give app.d to w2"
        denied.set()
        deadline = time.monotonic() + 10 * TTL
        while DENIED not in w1.leads() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert DENIED in w1.leads(), "nobody took app.d over"
        handed_before = w1.elections[DENIED].handed_over  # w2 had app.d by a hand-over
        unled = unled_time(reader, 15 * TTL)
        handed = w1.elections[DENIED].handed_over - handed_before
    finally:
        w2.stop()
        w1.stop()
        reader.close()
    assert unled <= 1.0, f"{DENIED} was without a leader {unled:.1f} s of {15 * TTL:g} after"
    assert handed == 0, f"{DENIED} was handed back {handed} times"
