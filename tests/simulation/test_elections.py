"""The simulation with several elections per node, balanced: each election judged on its own."""

from __future__ import annotations

import dataclasses

import pytest

from celery_leader.simulation import Broken, run_seeds, simulate
from celery_leader.simulation.cli import main
from celery_leader.simulation.network import NetworkProfile
from celery_leader.simulation.world import World, quiet_loggers

ELECTIONS = 3


def test_several_balanced_elections_have_no_violations():
    """Every fault of the single-election runs, with three elections balanced over the nodes."""
    summary = run_seeds(range(300), jobs=2, elections=ELECTIONS)
    assert summary.violations == 0, [(r.seed, r.violation) for r in summary.failures]
    assert summary.terms > 300 * ELECTIONS, "every election elects in every seed"


def test_a_balancer_that_acquires_before_the_holder_released_is_caught():
    summary = run_seeds(range(60), broken=Broken.BALANCER_TAKES_EARLY, jobs=1, elections=ELECTIONS)
    assert summary.violations >= 30
    messages = [result.violation or "" for result in summary.failures]
    assert all(message.startswith("election e") for message in messages), messages[:3]
    assert any("two leaders at once" in message for message in messages)
    # The same broken variant with one election has no balancer to break: it passes.
    single = run_seeds(range(60), broken=Broken.BALANCER_TAKES_EARLY, jobs=1)
    assert single.violations == 0


@pytest.mark.parametrize(
    ("broken", "found"),
    [
        (Broken.NO_HOLD_OFF, "two leaders at once"),
        (Broken.COUNTER_ONLY_TOKENS, "granted to"),
    ],
)
def test_a_broken_store_is_caught_in_the_election_it_breaks(broken, found):
    summary = run_seeds(range(150), broken=broken, jobs=1, elections=ELECTIONS)
    assert summary.violations >= 5
    assert any(found in (result.violation or "") for result in summary.failures)
    assert all((result.violation or "").startswith("election e") for result in summary.failures)


def test_tokens_are_judged_per_election():
    """Each election has its own token sequence: equal tokens in two elections are no violation."""
    with quiet_loggers():
        world = World(3, elections=ELECTIONS)
        result = world.run()
    assert result.violation is None
    granted = {name: checker._max_granted for name, checker in world.checkers.items()}
    assert all(token > 0 for token in granted.values()), granted


def _quiet_world(seed: int, elections: int) -> World:
    """Seed *seed*'s nodes (their clocks, starts and work), without faults or message loss."""
    world = World(seed, elections=elections)
    world.plan = dataclasses.replace(world.plan, faults=[])
    world.network.profile = NetworkProfile()
    return world


@pytest.mark.parametrize("seed", [1, 2, 5, 8, 13, 21])
def test_a_quiet_cluster_ends_balanced(seed):
    """No faults: each node leads floor(K/N) or ceil(K/N) of K = 6 elections at the end."""
    with quiet_loggers():
        world = _quiet_world(seed, 6)
        result = world.run()
    assert result.violation is None, result.violation
    led = [
        sum(node.manager.is_leader() for node in process.nodes)
        for process in world.slots
        if process is not None
    ]
    assert sum(led) == 6, led
    assert max(led) - min(led) <= 1, led


def test_balancing_hands_elections_over():
    """Nodes start at once and one of them takes several: the balancer moves the surplus."""
    with quiet_loggers():
        traces = [simulate(seed, full_trace=True, elections=ELECTIONS).trace for seed in range(8)]
    hand_overs = [line for trace in traces for line in trace if "hand-over (balancing)" in line]
    assert hand_overs, "no seed handed an election over"


def test_the_command_takes_the_number_of_elections(capsys):
    assert main(["--seeds", "4", "--jobs", "1", "--elections", "2"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("4 seeds, 0 violations")
    assert main(["--seeds", "4", "--elections", "0"]) == 2
    assert "--elections=0 is not allowed" in capsys.readouterr().out
