"""The simulation with lifelines: the server's model, take-overs, faults, the checker's teeth."""

from __future__ import annotations

import dataclasses
import gc
import random
from collections import Counter

import greenlet
import pytest

from celery_leader.exceptions import StoreCallTimeoutError
from celery_leader.lease.lifeline import TAKEOVER_WAIT
from celery_leader.simulation import Broken, run_seeds, simulate
from celery_leader.simulation.cli import main
from celery_leader.simulation.failover import measure
from celery_leader.simulation.faults import Fault, Kind
from celery_leader.simulation.lifelines import LifelineServer, StepThread
from celery_leader.simulation.model_store import ModelStore
from celery_leader.simulation.network import Network, NetworkProfile, NoReply
from celery_leader.simulation.scheduler import Halt, Scheduler
from celery_leader.simulation.trace import Trace
from celery_leader.simulation.world import World, quiet_loggers
from celery_leader.stores.base import Holder, LifelineEndedError


def _holder(name: str, lifeline: str = "") -> Holder:
    return Holder(lease_id=f"{name}-id", nodename=name, hostname="sim", pid=1, lifeline=lifeline)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# -- the server's lifelines ---------------------------------------------------------


def test_the_server_keeps_a_lifeline_until_it_is_closed_or_its_process_is_gone():
    server = LifelineServer()
    first, second = server.open("n0"), server.open("n0")
    other = server.open("n1")
    assert len({first, second, other}) == 3, "a key is never used twice"
    server.confirm(first)
    server.close(first)
    with pytest.raises(LifelineEndedError):
        server.confirm(first)
    server.drop_process("n0", "its process died")
    assert not server.keeps(second)
    assert server.keeps(other)


def test_a_reading_names_the_server_incarnation_and_the_connection():
    """Readings of one session are comparable; a restart changes every session."""
    server = LifelineServer()
    key = server.open("n0")
    before = server.read([key, "n9~1"], "n1#0")
    assert before.alive == frozenset({key})
    assert server.read([key], "n2#0").session != before.session
    server.restart()
    after = server.read([key], "n1#0")
    assert after.alive == frozenset()
    assert after.session != before.session, "a key gone across a restart proves nothing"


def test_an_admin_kill_whose_news_is_lost_leaves_the_holder_unanswered():
    server = LifelineServer()
    told, silent = server.open("n0"), server.open("n1")
    assert server.kill("n0", silent=False)
    assert server.kill("n1", silent=True)
    assert not server.keeps(told)
    assert not server.keeps(silent)
    with pytest.raises(LifelineEndedError):
        server.confirm(told)
    with pytest.raises(NoReply):
        server.confirm(silent)
    assert not server.kill("n1", silent=True), "nothing left to kill"


# -- the store model's take-over --------------------------------------------------


def test_lease_records_carry_the_holders_lifeline():
    store = ModelStore(_Clock())
    store.acquire("sim", _holder("a", "a~1"), 3.0)
    record = store.read("sim")
    assert record is not None
    assert record.lifeline == "a~1"
    refused = store.acquire("sim", _holder("b", "b~1"), 3.0)
    assert refused.holder is not None
    assert refused.holder.lifeline == "a~1"


def test_take_over_is_a_compare_and_set_on_token_and_lifeline():
    clock = _Clock()
    store = ModelStore(clock)
    taken: list[str] = []
    store.on_take_over = taken.append
    store.acquire("sim", _holder("x"), 3.0)  # a clean earlier term: no hold-off after it
    store.release("sim", "x-id")
    clock.now = 1.0
    store.acquire("sim", _holder("a", "a~1"), 3.0)
    dead = store.read("sim")
    assert dead is not None
    clock.now = 1.5
    wrong_key = dataclasses.replace(dead, lifeline="a~2")
    assert not store.take_over("sim", _holder("b"), 3.0, wrong_key).acquired
    wrong_token = dataclasses.replace(dead, token=dead.token - 1)
    assert not store.take_over("sim", _holder("b"), 3.0, wrong_token).acquired
    assert taken == []
    result = store.take_over("sim", _holder("b", "b~1"), 3.0, dead)
    assert result.acquired
    assert result.token is not None
    assert result.token > dead.token
    assert result.hold_off == 0.0, "the store forgot nothing: no hold-off"
    assert taken == ["a~1"]
    # The same dead term again: no longer the live one, so an acquire, refused.
    again = store.take_over("sim", _holder("c"), 3.0, dead)
    assert not again.acquired
    assert again.holder is not None
    assert again.holder.nodename == "b"


def test_a_take_over_after_the_store_forgot_holds_off_as_an_acquire_would():
    clock = _Clock()
    store = ModelStore(clock, keep_history=True)
    clock.now = 1.0
    store.acquire("sim", _holder("a", "a~1"), 3.0)
    clock.now = 2.0
    store.restore(as_of=1.5)  # a's lease again, under a new epoch
    dead = store.read("sim")
    assert dead is not None
    result = store.take_over("sim", _holder("b"), 3.0, dead)
    assert result.acquired
    assert result.hold_off == 3.0


def test_a_take_over_of_a_term_in_its_hold_off_keeps_the_rest_of_it():
    """The dead term held off for a holder the store forgot: its successor waits as long."""
    clock = _Clock()
    store = ModelStore(clock)
    clock.now = 1.0
    first = store.acquire("sim", _holder("a", "a~1"), 3.0)
    assert first.hold_off == 3.0  # a store with no record of earlier terms
    dead = store.read("sim")
    assert dead is not None
    clock.now = 1.4
    result = store.take_over("sim", _holder("b", "b~1"), 3.0, dead)
    assert result.acquired
    assert result.hold_off == pytest.approx(2.6)


def test_a_take_over_of_a_free_lease_is_an_acquire():
    clock = _Clock()
    store = ModelStore(clock)
    store.acquire("sim", _holder("a", "a~1"), 3.0)
    dead = store.read("sim")
    assert dead is not None
    clock.now = 5.0  # expired
    result = store.take_over("sim", _holder("b"), 3.0, dead)
    assert result.acquired
    assert result.hold_off == 0.0


# -- the network's partitions ------------------------------------------------------


def test_a_partition_loses_the_requests_and_replies_of_the_process_cut_off():
    class Caller:
        name, rate, paused_until = "n0", 1.0, 0.0

    sched = Scheduler()
    network = Network(sched, ModelStore(lambda: sched.now), _rng(), NetworkProfile(), Trace(None))
    caller = Caller()
    applied: list[float] = []
    network.cut(caller, until=1.0)
    with pytest.raises(StoreCallTimeoutError):
        network.call(caller, lambda: applied.append(sched.now), 0.5, "ping")
    network.send(caller, lambda: applied.append(sched.now), "close")
    sched.run_until(1.0)
    assert applied == []
    assert network.call(caller, lambda: "pong", 0.5, "ping") == "pong"


def test_a_lifeline_threads_call_never_makes_another_call_return_late():
    """Its calls suspend it (a greenlet): an unanswered one does not hold up a node's call."""

    class Node:
        name, rate, paused_until = "n0", 1.0, 0.0

    sched = Scheduler()
    profile = NetworkProfile(min_delay=0.01, max_delay=0.01)
    network = Network(sched, ModelStore(lambda: sched.now), _rng(), profile, Trace(None))
    outcomes: list[tuple[str, float]] = []

    def unanswered() -> float | None:
        try:
            network.call(thread, _no_reply, 0.25, "lifeline confirmation")
        except StoreCallTimeoutError:
            outcomes.append(("thread timed out", sched.now))
        return None

    thread = StepThread("n1/lifeline", 1.0, sched, _rng(), body=unanswered, after=lambda: None)
    thread.start(0.005)  # while the node's call is out

    def node_call() -> None:
        network.call(Node(), lambda: None, 0.5, "renew")
        outcomes.append(("node's call returned", sched.now))

    sched.at(0.0, node_call)
    sched.run_until(1.0)
    assert outcomes == [
        ("node's call returned", pytest.approx(0.02)),
        ("thread timed out", pytest.approx(0.255)),
    ]


def _no_reply() -> None:
    raise NoReply


def _rng():
    return random.Random(7)


# -- whole runs ------------------------------------------------------------------------

#: The lifeline seeds CI runs (each about three times the work of a seed without).
CI_SEEDS = range(300)


@pytest.mark.slow
def test_the_redis_model_with_lifelines_has_no_violations():
    """The CI run of the simulation with lifelines (`./run.sh simulate --lifelines`)."""
    summary = run_seeds(CI_SEEDS, jobs=2, lifelines=True)
    assert summary.violations == 0, [(r.seed, r.violation) for r in summary.failures]


@pytest.mark.parametrize(("store", "elections"), [("redis", 3), ("postgres", 1), ("sentinel", 1)])
def test_other_models_and_balanced_elections_with_lifelines_have_no_violations(store, elections):
    summary = run_seeds(range(15), jobs=1, lifelines=True, store=store, elections=elections)
    assert summary.violations == 0, [(r.seed, r.violation) for r in summary.failures]


def test_lifeline_runs_suffer_every_fault_that_ends_a_lifeline_and_take_over():
    seen: Counter[str] = Counter()
    marks = (
        "dropped (its process died)",
        "killed by an admin (its holder told)",
        "killed by an admin (its holder not told)",
        "dropped (the server's keepalive gave up)",
        "cut off from the store",
        "paused for",
        "answered late",
        "saw lifeline",
        "take-over by",
        "(lifeline-ended)",
    )
    with quiet_loggers():
        for seed in range(40):
            for line in simulate(seed, lifelines=True, full_trace=True).trace:
                seen.update(mark for mark in marks if mark in line)
    assert set(seen) == set(marks), seen
    assert seen["take-over by"] >= 10, seen


def test_a_leader_stopped_by_sigstop_keeps_its_lifeline_and_is_not_taken_over():
    """Its connection stays open: followers wait for its lease to expire."""
    for seed in range(6):
        with quiet_loggers():
            world = World(seed, lifelines=True)
            world.plan = dataclasses.replace(
                world.plan,
                duration=20.0,
                faults=[Fault(10.0, Kind.NODE_PAUSE, duration=6.0, leader=True)],
            )
            world.network.profile = NetworkProfile()
            tied: list[str] = []
            world.sched.at(9.99, lambda w=world, t=tied: t.append(_lease_lifeline(w)))
            result = world.run()
        assert result.violation is None, result.violation
        assert tied[0], "the paused leader's term was tied to its lifeline"
        assert world.take_overs == []
        after = [at for at, _, _ in world.elected if at > 10.0]
        assert after, "a follower leads once the lease expired"
        assert after[0] > 10.0 + world.timing.ttl - world.timing.renew_interval


def _lease_lifeline(world: World) -> str:
    record = world.store.read(world.elections[0])
    return "" if record is None else record.lifeline


def test_the_checker_fails_a_take_over_of_a_lifeline_the_server_keeps():
    world = World(0, lifelines=True)
    server = world.lifeline_server
    assert server is not None
    kept = server.open("n0")
    with pytest.raises(Halt):
        world._on_take_over(world.elections[0], kept)
    assert "the server still keeps" in (world.checker.violation or "")


@pytest.mark.parametrize("broken", [Broken.TAKEOVER_WITHOUT_WAIT, Broken.LIFELINE_UNBOUNDED])
def test_a_broken_lifeline_rule_is_caught(broken):
    """A follower that does not wait, or a holder not bounded by its lifeline: two act at once."""
    summary = run_seeds(range(50), broken=broken, jobs=1, lifelines=True)
    assert summary.violations >= 3, summary.violations
    acting_at_once = ("two leaders at once", "overlaps another term", "still executing")
    for result in summary.failures:
        violation = result.violation or ""
        assert any(found in violation for found in acting_at_once), violation


def test_judging_after_node_and_lifeline_events_finds_what_judging_after_every_event_finds():
    for broken in (Broken.TAKEOVER_WITHOUT_WAIT, Broken.LIFELINE_UNBOUNDED):
        with quiet_loggers():
            for seed in range(15):
                fast = simulate(seed, broken=broken, lifelines=True)
                thorough = simulate(seed, broken=broken, lifelines=True, every_event=True)
                assert fast.violation == thorough.violation, (seed, broken)


def test_a_lifeline_seed_replays_the_identical_trace():
    with quiet_loggers():
        first = simulate(5, lifelines=True, full_trace=True)
        second = simulate(5, lifelines=True, full_trace=True)
    assert len(first.trace) > 50
    assert first == second


def _suspended_greenlets() -> int:
    gc.collect()
    return sum(
        1
        for thing in gc.get_objects()
        if isinstance(thing, greenlet.greenlet) and thing.parent is not None and not thing.dead
    )


def test_a_run_leaves_no_lifeline_thread_suspended():
    """A suspended greenlet is never collected, nor the world its frames hold."""
    before = _suspended_greenlets()
    with quiet_loggers():
        for seed in range(10):  # most runs end with some thread inside a call
            simulate(seed, lifelines=True)
    assert _suspended_greenlets() <= before


def test_lifelines_are_refused_where_the_model_has_none_and_broken_rules_need_them():
    with pytest.raises(ValueError, match="no lifelines"):
        World(0, store="etcd", lifelines=True)
    with pytest.raises(ValueError, match="add --lifelines"):
        World(0, broken=Broken.TAKEOVER_WITHOUT_WAIT)


# -- failover, measured --------------------------------------------------------------


def test_failover_after_a_process_death_is_a_fraction_of_a_second_with_lifelines():
    """Without: the rest of the lease (up to a ttl). With: a reading, TAKEOVER_WAIT, a take-over."""
    seeds = range(12)
    without = measure(seeds, lifelines=False)
    with_lifelines = measure(seeds, lifelines=True)
    assert len(without.times) == len(with_lifelines.times) == len(seeds)
    assert with_lifelines.taken_over == len(seeds)
    assert min(without.times) > 1.0
    assert all(TAKEOVER_WAIT < seconds < TAKEOVER_WAIT + 0.3 for seconds in with_lifelines.times)


def test_the_command_takes_lifelines_and_prints_failover_times(capsys):
    assert main(["--seeds", "6", "--jobs", "1", "--lifelines"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "6 seeds, 0 violations"
    assert main(["--seeds", "6", "--broken", "takeover-without-wait"]) == 2
    assert "add --lifelines" in capsys.readouterr().out
    assert main(["--failover", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("failover after the leader's process is killed")
    assert out[2].startswith("off ")
    assert out[3].startswith("on ")
    assert "(3 taken over)" in out[3]
