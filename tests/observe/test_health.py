"""The health verdict, one for worker and beat: each rule, on small stand-ins for a process.

The verdict is pure: it reads the process's managers, its loop's liveness
(a real LoopLiveness on a fake clock here), its watchdog and whether a task
holds its loop. Real workers and beats answer through it in
tests/integration/test_health.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from celery_leader.elections.liveness import CONNECTING, PUBLISHING, LoopLiveness
from celery_leader.observe.health import election_state, verdict

STUCK_AFTER = 60.0
#: Every field of one election in the answer, on a worker and on a beat.
ELECTION_FIELDS = {"state", "role", "store_failures", "token", "expires_in"}
#: The top-level fields of every answer (``dead`` only when lease threads died).
TOP_FIELDS = {"healthy", "status", "election", "role", "loop_age", "store_failures", "elections"}


@dataclass
class Manager:
    """A lease manager as the verdict reads it."""

    name: str
    running: bool = True
    store_failures: int = 0
    leader: bool = False
    holding_off: float | None = None
    token: int | None = None
    left: float | None = None

    def is_leader(self) -> bool:
        return self.leader

    def hold_off_left(self) -> float | None:
        return self.holding_off

    def current_token(self) -> int | None:
        return self.token if self.leader else None

    def time_left(self) -> float | None:
        return self.left if self.leader else None


@dataclass
class Watchdog:
    up: bool = True
    asked: int = 0

    def alive(self) -> bool:
        self.asked += 1
        return self.up


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Process:
    """A worker (with a watchdog) or a beat (without): what ``Observed`` asks for."""

    managers: list[Manager]
    loop: LoopLiveness
    watchdog: Watchdog | None = None
    busy: bool = False
    clock: Clock = field(default_factory=Clock)

    def loop_busy_with_task(self) -> bool:
        return self.busy


def process(*managers: Manager, watchdog: Watchdog | None = None) -> Process:
    """A started process whose loop just ticked."""
    clock = Clock()
    loop = LoopLiveness(5.0, clock=clock)
    loop.start()
    default = (Manager("proj", leader=True, token=7, left=4.25),)
    return Process(list(managers or default), loop, watchdog, clock=clock)


def stall(proc: Process, seconds: float) -> None:
    proc.clock.now += seconds


def test_a_process_that_works_is_ok_as_leader_and_as_follower():
    """200 "ok" whatever the role; the default election's fields as earlier releases had."""
    leading = process()
    following = process(Manager("proj"))
    for proc, role in ((leading, "leader"), (following, "follower")):
        answer = verdict(proc, STUCK_AFTER)
        assert (answer.healthy, answer.status) == (True, "ok")
        body = answer.as_dict()
        assert set(body) == TOP_FIELDS
        assert (body["election"], body["role"], body["store_failures"]) == ("proj", role, 0)
        assert body["loop_age"] == 0.0


def test_every_election_is_reported_with_the_same_fields():
    """Each election by lease name: state, role, store_failures, token, expires_in."""
    proc = process(
        Manager("proj", leader=True, token=7, left=4.2501),
        Manager("proj.billing"),
        Manager("proj.reports", store_failures=3),
        Manager("proj.audit", leader=True, holding_off=2.0, token=9, left=5.0),
    )
    body = verdict(proc, STUCK_AFTER).as_dict()
    assert body["elections"] == {
        "proj": {
            "state": "leading",
            "role": "leader",
            "store_failures": 0,
            "token": 7,
            "expires_in": 4.25,
        },
        "proj.billing": {
            "state": "following",
            "role": "follower",
            "store_failures": 0,
            "token": None,
            "expires_in": None,
        },
        "proj.reports": {
            "state": "store-unreachable",
            "role": "follower",
            "store_failures": 3,
            "token": None,
            "expires_in": None,
        },
        "proj.audit": {
            "state": "holding-off",
            "role": "leader",
            "store_failures": 0,
            "token": 9,
            "expires_in": 5.0,
        },
    }
    assert (body["election"], body["role"]) == ("proj", "leader"), "the first is the default"


def test_an_elections_state_is_the_first_that_holds():
    """not-running before store-unreachable before holding-off before the role."""
    gone = Manager("a", running=False, store_failures=2, holding_off=1.0, leader=True)
    assert election_state(gone)["state"] == "not-running"
    failing = Manager("a", store_failures=2, holding_off=1.0, leader=True)
    assert election_state(failing)["state"] == "store-unreachable"
    assert set(election_state(failing)) == ELECTION_FIELDS


def test_an_unreachable_store_is_healthy_in_one_election_or_all():
    """A restart does not bring a store back: 200, with each election saying so."""
    proc = process(Manager("proj", store_failures=5), Manager("proj.billing", store_failures=5))
    answer = verdict(proc, STUCK_AFTER)
    assert (answer.healthy, answer.status) == (True, "ok")
    states = {name: e["state"] for name, e in answer.detail["elections"].items()}
    assert states == {"proj": "store-unreachable", "proj.billing": "store-unreachable"}


def test_a_dead_lease_thread_in_any_election_is_503_and_named():
    """``dead`` lists the elections whose lease thread is gone; the others keep their state."""
    proc = process(Manager("proj", leader=True, token=3, left=1.0), Manager("b", running=False))
    answer = verdict(proc, STUCK_AFTER)
    assert (answer.healthy, answer.status) == (False, "lease-thread-dead")
    assert answer.detail["dead"] == ["b"]
    assert set(answer.as_dict()) == TOP_FIELDS | {"dead"}
    assert answer.detail["elections"]["proj"]["state"] == "leading"


def test_a_loop_standing_still_past_the_bound_is_503_unless_a_task_holds_it():
    """loop-stuck past leader_health_stuck_after; a solo worker's task holding it is not."""
    proc = process()
    stall(proc, STUCK_AFTER - 1)
    assert verdict(proc, STUCK_AFTER).status == "ok"
    stall(proc, 2)
    answer = verdict(proc, STUCK_AFTER)
    assert (answer.healthy, answer.status) == (False, "loop-stuck")
    assert answer.detail["loop_age"] == STUCK_AFTER + 1
    proc.busy = True
    assert verdict(proc, STUCK_AFTER).status == "ok"
    proc.busy = False
    proc.loop.tick()
    assert verdict(proc, STUCK_AFTER).status == "ok"


@pytest.mark.parametrize("reason", [CONNECTING, PUBLISHING])
def test_waiting_on_the_broker_is_reconnecting_not_stuck(reason):
    """A worker's consumer reconnecting, beat connecting or publishing: 200 however long."""
    proc = process()
    proc.loop.wait_begins(reason)
    stall(proc, 10 * STUCK_AFTER)
    answer = verdict(proc, STUCK_AFTER)
    assert (answer.healthy, answer.status) == (True, "reconnecting")
    proc.loop.wait_ends(reason)
    assert verdict(proc, STUCK_AFTER).status == "loop-stuck"


def test_a_dead_watchdog_is_503_and_only_asked_after():
    """watchdog-dead comes before a dead lease thread; the verdict never replaces it."""
    watchdog = Watchdog(up=False)
    proc = process(Manager("proj", running=False), watchdog=watchdog)
    answer = verdict(proc, STUCK_AFTER)
    assert (answer.healthy, answer.status) == (False, "watchdog-dead")
    assert watchdog.asked == 1 and watchdog.up is False
    watchdog.up = True
    assert verdict(proc, STUCK_AFTER).status == "lease-thread-dead"


def test_starting_and_stopping_are_healthy_whatever_else_holds():
    """Before the process competes, and once it stops, nothing else is judged: 200."""
    proc = process(Manager("proj", running=False), watchdog=Watchdog(up=False))
    stall(proc, 10 * STUCK_AFTER)
    proc.loop.started = False
    answer = verdict(proc, STUCK_AFTER)
    assert (answer.healthy, answer.status) == (True, "starting")
    proc.loop.start()
    proc.loop.stopping = True
    answer = verdict(proc, STUCK_AFTER)
    assert (answer.healthy, answer.status) == (True, "stopping")


def test_a_worker_and_a_beat_answer_with_the_same_fields():
    """The same function judges both: the key sets of their answers are equal."""
    worker = process(Manager("proj"), Manager("proj.billing"), watchdog=Watchdog())
    beat = process(Manager("proj.beat", leader=True, token=4, left=2.0))
    worker_body = verdict(worker, STUCK_AFTER).as_dict()
    beat_body = verdict(beat, STUCK_AFTER).as_dict()
    assert set(worker_body) == set(beat_body) == TOP_FIELDS
    for body in (worker_body, beat_body):
        for view in body["elections"].values():
            assert set(view) == ELECTION_FIELDS
