"""Chaos, short mode (CI): faults in a loop on real workers; the checker judges the history."""

from __future__ import annotations

import pytest

from tests.chaos.checker import Freeze, check
from tests.chaos.run import ChaosConfig, run_chaos

SEED = 20261122


@pytest.mark.slow
@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_short_chaos_run(tmp_path, broker, capsys):
    """50 s of seeded faults, each kind at least once (a broker restart included: for
    RabbitMQ a private node's): no stale start, no stale write accepted, no run of a term
    still in flight when the next term's work began (but in a frozen worker), every run
    ended or gone, no two runs of one overlap key at once; RabbitMQ loses nothing (a
    skipped overlap message is not lost)."""
    summary = run_chaos(ChaosConfig(seconds=50, seed=SEED, broker=broker), tmp_path)
    print(summary.table())
    assert summary.violations() == []
    assert summary.terms >= 3, "the faults changed the leader several times"
    assert summary.overlap_runs > 0 and summary.skipped > 0, "the overlap task ran and skipped"
    if broker == "rabbitmq":
        assert summary.lost == []
    else:
        # kombu's Redis transport loses a message popped by a worker killed
        # before it recorded it as unacked; counted, reported, bounded.
        assert len(summary.lost) <= 3, summary.lost


@pytest.mark.slow
def test_short_chaos_run_with_elections(tmp_path):
    """45 s of the same faults with three elections balanced over the three workers (each
    fault hits the holder of an election drawn from the seed): each election's history,
    judged on its own, has no stale start, no stale write, no run across its term change."""
    config = ChaosConfig(seconds=45, seed=SEED + 1, broker="redis", elections=("a", "b"))
    summary = run_chaos(config, tmp_path)
    print(summary.table())
    assert summary.violations() == []
    assert set(summary.terms_by_election) == {"", "a", "b"}, "every election ran work"
    assert summary.terms >= 5, "the faults changed leaders several times"
    assert len(summary.lost) <= 3, summary.lost


@pytest.mark.slow
def test_short_chaos_run_on_etcd(tmp_path):
    """45 s of the faults on a three-member etcd (the store faults: every member paused past
    the ttl, etcd's leader member killed and restarted, the cluster recreated empty):
    no stale start, no stale write, no run across a term change."""
    config = ChaosConfig(seconds=45, seed=SEED + 2, broker="redis", store="etcd")
    summary = run_chaos(config, tmp_path)
    print(summary.table())
    assert summary.violations() == []
    assert summary.terms >= 3, "the faults changed the leader several times"
    assert len(summary.lost) <= 3, summary.lost


def row(kind, i, token, at, **extra):
    return {"kind": kind, "i": i, "task_id": f"t{i}", "token": token, "at": at, **extra}


def test_checker_flags_a_stale_start():
    """A run starting under an older token after a newer one started is a violation."""
    rows = [row("start", 0, 5, 1.0), row("start", 1, 6, 2.0), row("start", 2, 5, 3.0)]
    summary = check(rows, 3)
    assert len(summary.stale_starts) == 1 and summary.violations()


def test_checker_flags_a_stale_write_accepted_and_counts_refusals():
    """An accepted write with an older token is a violation; a refused one is counted."""
    rows = [
        row("write", 0, 6, 1.0, accepted=True),
        row("write", 1, 5, 2.0, accepted=False),
        row("write", 2, 5, 3.0, accepted=True),
    ]
    summary = check(rows, 0)
    assert summary.writes_refused == 1
    assert len(summary.stale_writes_accepted) == 1


def test_checker_orders_writes_by_the_fence_not_by_the_record():
    """A write recorded late (its worker froze after the fence call) is no violation.

    The older token's call was sent before the newer one's acceptance was
    known, so the fence may well have seen it first; once the newer
    acceptance had returned, the same acceptance is a violation.
    """
    rows = [
        row("write", 0, 6, 2.0, accepted=True, sent_at=1.5),
        row("write", 1, 5, 9.0, accepted=True, sent_at=1.0),
    ]
    assert check(rows, 0).stale_writes_accepted == []
    rows[1]["sent_at"] = 2.5
    assert len(check(rows, 0).stale_writes_accepted) == 1


def test_checker_counts_lost_and_duplicated_messages():
    """Lost and duplicated messages are counted, and are no violation."""
    rows = [
        row("start", 0, 5, 1.0),
        row("end", 0, 5, 1.2),
        row("start", 1, 5, 2.0),
        row("end", 1, 5, 2.2),
        row("start", 1, 5, 3.0),
        row("end", 1, 5, 3.2),
    ]
    summary = check(rows, 3)
    assert summary.lost == [2]
    assert summary.duplicates == 1
    assert summary.never_ended == []
    assert summary.violations() == []


def test_checker_flags_a_run_that_ends_after_a_newer_term_started():
    """An end row later than the first start of a newer token is an overlap violation."""
    rows = [row("start", 0, 5, 1.0), row("start", 1, 6, 2.0), row("end", 1, 6, 2.1)]
    assert check([*rows, row("end", 0, 5, 1.9)], 2).violations() == []
    summary = check([*rows, row("end", 0, 5, 2.5)], 2)
    assert len(summary.in_flight_overlaps) == 1
    assert summary.in_flight_overlaps[0]["newer_token"] == 6
    assert summary.violations()


def test_checker_ends_a_killed_run_at_its_gone_row():
    """A run with no end row ends at its gone row: before the newer term is fine, after is not."""
    rows = [row("start", 0, 5, 1.0, pid=41), row("start", 1, 6, 2.0), row("end", 1, 6, 2.1)]
    summary = check([*rows, row("gone", 0, 5, 1.95, pid=41)], 2)
    assert summary.killed == 1
    assert summary.violations() == []
    summary = check([*rows, row("gone", 0, 5, 2.05, pid=41)], 2)
    assert summary.in_flight_overlaps[0]["ended_by"] == "gone"


def test_checker_takes_the_end_row_over_a_gone_row():
    """A run that wrote its end row ended then, whenever its process died afterwards."""
    rows = [
        row("start", 0, 5, 1.0),
        row("end", 0, 5, 1.5),
        row("gone", 0, 5, 3.0),
        row("start", 1, 6, 2.0),
        row("end", 1, 6, 2.1),
    ]
    summary = check(rows, 2)
    assert summary.killed == 0
    assert summary.violations() == []


def test_checker_matches_end_and_gone_rows_by_pid_and_start_order():
    """A pool child's gone row belongs to its open run, not to an ended run of the same task."""
    rows = [
        row("start", 0, 5, 1.0, pid=7),  # ran to its end in child 7
        row("end", 0, 5, 1.2, pid=7),
        row("start", 0, 5, 1.3, pid=8),  # the same message again, killed in child 8
        row("start", 0, 5, 1.4, pid=7),  # and again in child 7, ended
        row("end", 0, 5, 1.6, pid=7),
        row("gone", 0, 5, 2.5, pid=8),
        row("start", 1, 6, 2.0),
        row("end", 1, 6, 2.1),
    ]
    summary = check(rows, 2)
    assert summary.killed == 1
    assert [r["pid"] for r in summary.in_flight_overlaps] == [8]


def test_checker_exempts_runs_of_a_worker_frozen_during_the_run():
    """A frozen worker's run across a term change is counted apart; other workers' are not."""
    rows = [
        row("start", 0, 5, 1.0, worker="a"),
        row("start", 1, 6, 4.0, worker="b"),
        row("end", 1, 6, 4.1, worker="b"),
        row("end", 0, 5, 5.0, worker="a"),
    ]
    summary = check(rows, 2, [Freeze("a", 1.5, 4.5)])
    assert summary.frozen_overlaps == 1
    assert summary.violations() == []
    for freeze in (Freeze("b", 1.5, 4.5), Freeze("a", 5.5, 8.0), Freeze("a", 0.1, 0.9)):
        summary = check(rows, 2, [freeze])
        assert summary.frozen_overlaps == 0
        assert len(summary.in_flight_overlaps) == 1, freeze


def test_checker_frozen_worker_is_still_judged_by_its_fenced_writes():
    """The freeze exemption covers the overlap only: a stale write accepted stays a violation."""
    rows = [
        row("start", 0, 5, 1.0, worker="a"),
        row("start", 1, 6, 4.0, worker="b"),
        row("write", 1, 6, 4.1, accepted=True, sent_at=4.05, worker="b"),
        row("end", 1, 6, 4.2, worker="b"),
        row("write", 0, 5, 4.9, accepted=True, sent_at=4.8, worker="a"),
        row("end", 0, 5, 5.0, worker="a"),
    ]
    summary = check(rows, 2, [Freeze("a", 1.5, 4.5)])
    assert summary.frozen_overlaps == 1
    assert len(summary.stale_writes_accepted) == 1
    assert summary.violations()


def test_checker_reports_a_run_that_never_ended_apart_from_overlaps():
    """A run with neither an end nor a gone row is 'never ended', a violation of its own."""
    rows = [row("start", 0, 5, 1.0), row("start", 1, 6, 2.0), row("end", 1, 6, 2.1)]
    summary = check(rows, 2)
    assert [r["i"] for r in summary.never_ended] == [0]
    assert summary.in_flight_overlaps == []
    assert any("never ended" in v for v in summary.violations())
    table = dict(line.rsplit(None, 1) for line in summary.table().splitlines())
    assert table["  runs never ended (must be 0)"] == "1"


def test_checker_names_a_message_run_again_while_it_ran():
    """A redelivered copy started beside its running original is a violation of its own."""
    rows = [
        row("start", 0, 5, 1.0, pid=10, worker="w1"),
        row("start", 0, 5, 2.0, pid=11, worker="w1"),  # the copy, while the first runs
        row("end", 0, 5, 3.0, pid=10),
        row("end", 0, 5, 4.0, pid=11),
        row("start", 1, 5, 5.0, pid=10),
        row("end", 1, 5, 6.0, pid=10),
        row("start", 1, 5, 6.5, pid=10),  # run again after it ended: a duplicate, allowed
        row("end", 1, 5, 7.0, pid=10),
    ]
    summary = check(rows, 2)
    assert [r["pid"] for r in summary.rerun_while_running] == [11]
    assert summary.duplicates == 2
    assert summary.violations() and "run again while they ran" in summary.violations()[0]
    frozen = check(rows, 2, [Freeze("w1", 0.5, 3.5)])
    assert frozen.rerun_while_running == [], "a frozen worker's run is judged by fencing only"


def test_checker_takes_an_index_sent_again_under_a_new_task_id_for_a_second_message():
    """The runner sends an index again (a new task id) when its send raised; the first send
    may have landed too. Those two messages may run side by side: a duplicate, not a rerun."""
    rows = [
        row("start", 0, 5, 1.0, pid=10, worker="w1"),
        {**row("start", 0, 5, 1.5, pid=11, worker="w1"), "task_id": "t0-sent-again"},
        row("end", 0, 5, 2.0, pid=10),
        {**row("end", 0, 5, 2.5, pid=11), "task_id": "t0-sent-again"},
    ]
    summary = check(rows, 1)
    assert summary.rerun_while_running == []
    assert summary.duplicates == 1
    assert not summary.violations()


def test_checker_judges_each_election_on_its_own():
    """Tokens of two elections interleave freely; within one, the rules hold as before."""
    rows = [
        row("start", 0, 100, 1.0),
        row("end", 0, 100, 1.5),
        row("start", 1, 7, 2.0, election="a"),  # far below 100: another election's sequence
        row("write", 1, 7, 2.1, election="a", accepted=True, sent_at=2.05),
        row("end", 1, 7, 2.2, election="a"),
        row("start", 2, 101, 2.5),
        row("end", 2, 101, 3.0),
    ]
    summary = check(rows, 3)
    assert summary.violations() == []
    assert summary.terms_by_election == {"": 2, "a": 1}
    stale = [*rows, row("start", 3, 6, 4.0, election="a"), row("end", 3, 6, 4.1, election="a")]
    found = check(stale, 4)
    assert [r["i"] for r in found.stale_starts] == [3]


def test_checker_flags_an_overlap_within_one_election_only():
    """A run of a's term 7 still going when a's term 8 starts; b's term 9 meanwhile is fine."""
    rows = [
        row("start", 0, 7, 1.0, election="a"),
        row("start", 1, 9, 1.5, election="b"),
        row("end", 1, 9, 1.6, election="b"),
        row("start", 2, 8, 2.0, election="a"),
        row("end", 2, 8, 2.1, election="a"),
        row("end", 0, 7, 3.0, election="a"),
    ]
    summary = check(rows, 3)
    assert [r["i"] for r in summary.in_flight_overlaps] == [0]
    assert summary.in_flight_overlaps[0]["newer_token"] == 8
