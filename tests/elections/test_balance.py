"""The balancing plan (elections.balance): pure logic that every worker computes alike."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from celery_leader.elections.balance import Member, plan, shares, successors

SIX = frozenset(f"e{i}" for i in range(6))


def members(**held: set[str]) -> dict[str, Member]:
    return {name: Member(name, SIX, frozenset(h)) for name, h in held.items()}


def loads(assignment: dict[str, str]) -> Counter[str]:
    return Counter(assignment.values())


def test_three_workers_and_six_elections_get_two_each():
    assignment = plan(members(w1=set(), w2=set(), w3=set()))
    assert set(assignment) == SIX
    assert sorted(loads(assignment).values()) == [2, 2, 2]


def test_a_joining_worker_takes_its_share_from_the_most_loaded_and_nothing_else_moves():
    before = members(w1={"e0", "e1", "e2"}, w2={"e3", "e4", "e5"})
    joined = {**before, "w3": Member("w3", SIX, frozenset())}
    assignment = plan(joined)
    assert sorted(loads(assignment).values()) == [2, 2, 2]
    moved = {e for e, owner in assignment.items() if owner == "w3"}
    assert len(moved) == 2
    kept = {e: owner for e, owner in assignment.items() if owner != "w3"}
    assert all(e in before[owner].held for e, owner in kept.items()), "only the surplus moves"


def test_a_dead_workers_elections_spread_over_the_survivors():
    survivors = members(w1={"e0", "e1"}, w2={"e2", "e3"})  # w3 held e4, e5 and is gone
    assignment = plan(survivors)
    assert sorted(loads(assignment).values()) == [3, 3]
    assert {assignment["e0"], assignment["e1"]} == {"w1"}, "holders keep theirs"


def test_balance_holds_among_the_eligible_ones():
    view = {
        "w1": Member("w1", frozenset({"a"}), frozenset()),
        "w2": Member("w2", frozenset({"a", "b", "c", "d"}), frozenset({"a", "b", "c", "d"})),
    }
    assignment = plan(view)
    assert assignment == {"a": "w1", "b": "w2", "c": "w2", "d": "w2"}
    assert shares(view) == {"w1": 1, "w2": 3}


def test_an_election_nobody_may_lead_is_not_planned():
    view = {"w1": Member("w1", frozenset({"a"}), frozenset())}
    assert plan(view) == {"a": "w1"}


@pytest.mark.parametrize("seed", range(200))
def test_every_worker_computes_the_same_balanced_plan(seed):
    """Random views: the plan is the same whatever order the members are listed in."""
    rng = random.Random(seed)
    names = [f"w{i}" for i in range(rng.randint(1, 6))]
    elections = [f"e{i}" for i in range(rng.randint(1, 20))]
    held: dict[str, set[str]] = {n: set() for n in names}
    for election in elections:
        if rng.random() < 0.7:
            held[rng.choice(names)].add(election)
    view = {n: Member(n, frozenset(elections), frozenset(held[n])) for n in names}
    first = plan(view)
    for order in itertools.islice(itertools.permutations(names), 5):
        assert plan({n: view[n] for n in order}) == first
    counts = [loads(first).get(n, 0) for n in names]
    assert max(counts) - min(counts) <= 1, counts
    assert set(first) == set(elections)


def test_an_announcement_round_trips_and_a_bad_one_is_ignored():
    member = Member("w1", frozenset({"a", "b"}), frozenset({"a"}))
    assert Member.parse("w1", member.payload()) == member
    assert Member.parse("w1", "not json") is None
    assert Member.parse("w1", '{"eligible": ["a"], "held": ["a", "z"]}').held == {"a"}


def test_successors_are_the_plan_without_the_holder():
    """Each election left with its holder goes, if that holder left, where the plan without
    it puts it: w1's two elections to w2 and w3, one each."""
    view = members(w1={"e0", "e1"}, w2={"e2", "e3"}, w3={"e4", "e5"})
    after = successors(view, plan(view))
    assert set(after) == SIX
    assert {after["e0"], after["e1"]} == {"w2", "w3"}
    without_w1 = plan({name: m for name, m in view.items() if name != "w1"})
    assert {e: after[e] for e in ("e0", "e1")} == {e: without_w1[e] for e in ("e0", "e1")}


def test_an_election_planned_away_from_its_holder_has_no_successor():
    """w1 holds all six and w2 joined: the surplus is planned for w2 (it tries by plan)."""
    view = members(w1=set(SIX), w2=set())
    assigned = plan(view)
    after = successors(view, assigned)
    moving = {e for e, owner in assigned.items() if owner == "w2"}
    assert len(moving) == 3
    assert not moving & set(after), "a planned owner needs no successor"
    assert all(after[e] == "w2" for e in SIX - moving)


def test_a_yielded_election_survives_the_payload():
    """yielded goes into the announcement only when there is one; older payloads parse."""
    member = Member("w1", frozenset({"a", "b"}), frozenset({"a"}), frozenset({"b"}))
    assert Member.parse("w1", member.payload()) == member
    plain = Member("w1", frozenset({"a"}), frozenset())
    assert "yielded" not in plain.payload()
    assert Member.parse("w1", '{"eligible": ["a"], "held": []}') == plain
