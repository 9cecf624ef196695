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


SIX = tuple(f"app.e{i}" for i in range(6))


def worker_of_six(nodename: str, leading: tuple[str, ...]) -> Worker:
    elections = {name: Election(name, Manager(name in leading)) for name in SIX}
    return Worker(nodename, elections)  # type: ignore[arg-type]


def test_the_successor_of_an_election_left_with_its_holder_tries_at_once(store):
    """Six elections, two each: for each of w1's elections exactly one other worker (the plan
    without w1) does not wait, so a dead w1 is replaced as soon as its leases run out."""
    w1 = worker_of_six("w1", ("app.e0", "app.e1"))
    w2 = worker_of_six("w2", ("app.e2", "app.e3"))
    w3 = worker_of_six("w3", ("app.e4", "app.e5"))
    balancers = [balancer(store, w) for w in (w1, w2, w3)]
    for _ in range(2):
        for each in balancers:
            each.run_pass()
    _, b2, b3 = balancers
    for name in ("app.e0", "app.e1"):
        assert b2.planned(name) == "w1" == b3.planned(name), "left with its holder"
        successor = b2.successor(name)
        assert successor in ("w2", "w3") and b3.successor(name) == successor
        delays = {"w2": b2.acquire_delay(name), "w3": b3.acquire_delay(name)}
        assert delays[successor] == 0.0
        assert all(d > 0 for who, d in delays.items() if who != successor), delays
    assert {b2.successor("app.e0"), b2.successor("app.e1")} == {"w2", "w3"}, "spread"


def stable(*balancers: Balancer, passes: int = STABLE_PASSES + 1) -> None:
    for _ in range(passes):
        for each in balancers:
            each.run_pass()


def test_nothing_is_handed_over_while_two_workers_announce_one_election(store):
    """A dead worker's announcement outlives its leases: while it and the one that took its
    election both announce it, the view is in transition and nothing is handed over."""
    loaded = worker("w1", leading=NAMES)
    joined = worker("w2", leading=("app.c",))  # took app.c; w1 still announces it too
    b1, b2 = balancer(store, loaded), balancer(store, joined)
    stable(b2, b1)
    assert sum(e.handed_over for e in loaded.elections.values()) == 0
    loaded.elections["app.c"].manager.leading = False  # w1's announcement catches up
    stable(b1, b2)
    assert sum(e.handed_over for e in loaded.elections.values()) == 1, "then the surplus goes"


def test_a_step_down_holds_balancing_back_until_a_worker_joins_or_leaves(store):
    """w2 gave app.e2 up on request and w1 took it (4 against 2): nothing else moves; once
    a third worker joins, balancing resumes."""
    w1 = worker_of_six("w1", ("app.e0", "app.e1", "app.e4"))
    w2 = worker_of_six("w2", ("app.e2", "app.e3", "app.e5"))
    b1, b2 = balancer(store, w1), balancer(store, w2)
    stable(b1, b2)
    assert sum(e.handed_over for w in (w1, w2) for e in w.elections.values()) == 0
    b2.note_step_down("app.e2")  # the worker's step-down, then w1 takes it
    w2.elections["app.e2"].manager.leading = False
    w1.elections["app.e2"].manager.leading = True
    stable(b1, b2, passes=STABLE_PASSES + 3)
    assert sum(e.handed_over for e in w1.elections.values()) == 0, "the step-down stands"
    assert b2.me_now().yielded == {"app.e2"}
    b3 = balancer(store, worker_of_six("w3", ()))
    stable(b3, b2, b1)
    assert b2.me_now().yielded == set(), "the set of workers changed"
    stable(b3, b2, b1)
    assert sum(e.handed_over for e in w1.elections.values()) >= 1, "balancing resumed"
