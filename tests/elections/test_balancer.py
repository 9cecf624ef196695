"""The balancer thread's decisions, on the in-memory store (real Presence, stand-in worker)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from celery_leader.elections.balancer import STABLE_PASSES, Balancer
from celery_leader.stores import open_store
from celery_leader.stores.memory import reset_memory_stores


@dataclass
class Manager:
    leading: bool = False
    failing: bool = False

    def is_leader(self) -> bool:
        return self.leading

    def sitting_out(self) -> bool:
        return False

    def acquire_failing(self) -> bool:
        return self.failing


@dataclass
class Election:
    name: str
    manager: Manager = field(default_factory=Manager)
    handed_over: int = 0
    stepping_down: bool = False

    def hand_over(self) -> bool:
        self.handed_over += 1
        self.stepping_down = True
        return True


@dataclass
class Worker:
    """Stands for the Coordinator: what the balancer reads of it."""

    nodename: str
    elections: dict[str | None, Election]
    shutting_down: bool = False

    def is_live(self) -> bool:
        return True


NAMES = ("app", "app.a", "app.b", "app.c")


def worker(nodename: str, leading: tuple[str, ...] = ()) -> Worker:
    elections = {name: Election(name, Manager(name in leading)) for name in NAMES}
    return Worker(nodename, elections)  # type: ignore[arg-type]


@pytest.fixture
def store():
    reset_memory_stores()
    made = open_store("memory://balance", timeout=1)
    yield made
    made.close()


def balancer(store, of: Worker, ttl: float = 2.0, clock=None) -> Balancer:
    """A balancer for *of* on a client of its own (a balancer closes its client when stopped)."""
    own = open_store(store.url, timeout=1)
    options = {} if clock is None else {"clock": clock}
    return Balancer(of, own, "app.members", interval=0.5, ttl=ttl, **options)  # type: ignore[arg-type]


def planned_pair(store, clock=None) -> tuple[Balancer, Balancer]:
    """Two workers that both announced and have seen each other."""
    b1, b2 = balancer(store, worker("w1"), clock=clock), balancer(store, worker("w2"), clock=clock)
    b1.run_pass()
    b2.run_pass()
    b1.run_pass()
    return b1, b2


def test_a_worker_not_planned_waits_and_the_planned_one_does_not(store):
    b1, b2 = planned_pair(store)
    for name in NAMES:
        delays = sorted((b1.acquire_delay(name), b2.acquire_delay(name)))
        assert delays[0] == 0.0 and delays[1] > 0, (name, delays)


def test_an_election_handed_over_is_not_announced_as_eligible(store):
    """Else the plan would give it straight back, and the others would wait for nothing."""
    one = worker("w1", leading=NAMES)
    b1 = balancer(store, one)
    assert b1.me_now().eligible == set(NAMES)
    one.elections["app.a"].hand_over()
    assert b1.me_now().eligible == set(NAMES) - {"app.a"}


def test_an_election_this_worker_fails_to_acquire_is_not_announced_as_eligible(store):
    """Else the plan names it round after round, and the others wait two ttls each time."""
    one = worker("w1", leading=("app.b",))
    b1 = balancer(store, one)
    one.elections["app.a"].manager.failing = True
    one.elections["app.b"].manager.failing = True  # a leader keeps what it leads
    assert b1.me_now().eligible == set(NAMES) - {"app.a"}
    one.elections["app.a"].manager.failing = False
    assert b1.me_now().eligible == set(NAMES)


def test_a_waiting_worker_tries_anyway_after_two_ttls(store):
    now = [1000.0]
    b1, _ = planned_pair(store, clock=lambda: now[0])
    waiting = next(name for name in NAMES if b1.acquire_delay(name) > 0)
    now[0] += 2.0
    assert b1.acquire_delay(waiting) > 0
    now[0] += 2 * 2.0 + 0.1
    assert b1.acquire_delay(waiting) == 0.0, "the planned worker never took it"


def test_the_most_loaded_worker_hands_its_surplus_over_once_the_view_is_stable(store):
    loaded = worker("w1", leading=NAMES)
    joined = worker("w2")
    b1, b2 = balancer(store, loaded), balancer(store, joined)
    b2.run_pass()
    for _ in range(STABLE_PASSES):
        b1.run_pass()
        assert sum(e.handed_over for e in loaded.elections.values()) == 0, "not stable yet"
    b1.run_pass()
    handed = sorted(e.name for e in loaded.elections.values() if e.handed_over)
    assert len(handed) == 2, f"the whole surplus (2 of 4) at once: {handed}"
    b1.run_pass()
    assert sum(e.handed_over for e in loaded.elections.values()) == 2, "no more within a ttl"


def test_a_stopped_balancer_leaves_the_group(store):
    _, b2 = planned_pair(store)
    b2.stop()
    assert set(store.announce("app.members", "w1", "{}", 2.0)) == {"w1"}
