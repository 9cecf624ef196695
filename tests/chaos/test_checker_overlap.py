"""The checker's overlap rules on hand-built histories: one run per key at a time, skips."""

from __future__ import annotations

from tests.chaos.checker import Freeze, check

KEY = "tests.integration.leaderapp.chaos_overlap"


def run(i, token, start, end, account=0, *, pid=None, worker="w0", end_kind="end", **extra):
    """The start row and the end (or gone) row of one run of message *i*."""
    fields = {"task_id": f"t{i}", "token": token, "pid": pid if pid is not None else 100 + i}
    keyed = {"overlap_key": f"{KEY}[{account}]", "account": account} if account is not None else {}
    return [
        {"kind": "start", "i": i, "at": start, "worker": worker, **fields, **keyed, **extra},
        {"kind": end_kind, "i": i, "at": end, **fields, **({} if end_kind == "gone" else keyed)},
    ]


def skip(i, account=0):
    return {"kind": "skip", "i": i, "task_id": f"t{i}", "overlap_key": f"{KEY}[{account}]"}


def table_of(summary):
    return dict(line.rsplit(None, 1) for line in summary.table().splitlines())


def test_two_overlapping_runs_of_one_key_are_flagged():
    """A run of account 0 starting while another run of account 0 goes on is a violation."""
    rows = [*run(0, 5, 1.0, 2.0), *run(1, 5, 1.5, 2.5)]
    summary = check(rows, 2)
    assert [r["i"] for r in summary.key_overlaps] == [1]
    assert summary.key_overlaps[0]["earlier_i"] == 0
    assert summary.key_overlaps[0]["earlier_ended"] == 2.0
    assert summary.overlap_runs == 2
    assert any("overlapping runs of one key" in v for v in summary.violations())
    assert table_of(summary)["  overlapping runs of one key (must be 0)"] == "1"


def test_runs_of_two_keys_may_overlap_and_runs_of_one_key_may_follow_each_other():
    """Accounts 0 and 1 side by side are fine; so is account 0 again after its run ended."""
    rows = [*run(0, 5, 1.0, 2.0, 0), *run(1, 5, 1.5, 2.5, 1), *run(2, 5, 2.1, 3.0, 0)]
    summary = check(rows, 3)
    assert summary.key_overlaps == []
    assert summary.violations() == []
    assert summary.overlap_runs == 3


def test_runs_without_an_overlap_key_are_not_judged_per_key():
    """Runs of a task with no overlap policy (no overlap_key) overlap freely, as before."""
    rows = [*run(0, 5, 1.0, 2.0, None), *run(1, 5, 1.5, 2.5, None)]
    summary = check(rows, 2)
    assert summary.violations() == []
    assert summary.overlap_runs == 0


def test_an_overlap_across_a_term_change_is_flagged_with_the_killed_runs_gone_row():
    """A killed run ends at its gone row: the next term's run of its key must start after it."""
    earlier = run(0, 5, 1.0, 2.05, end_kind="gone", worker="w0")
    later = run(1, 6, 2.0, 2.5, worker="w1")
    summary = check([*earlier, *later], 2)
    assert [r["i"] for r in summary.key_overlaps] == [1]
    assert summary.killed == 1
    assert len(summary.in_flight_overlaps) == 1, "the term rule sees it too"
    fine = check([*run(0, 5, 1.0, 1.95, end_kind="gone"), *later], 2)
    assert fine.key_overlaps == []
    assert fine.violations() == []


def test_one_message_run_twice_at_once_is_an_overlap_of_its_key_too():
    """A redelivered copy started beside its run: run again while it ran, and a key overlap."""
    rows = [*run(0, 5, 1.0, 3.0, pid=10), *run(0, 5, 2.0, 4.0, pid=11)]
    summary = check(rows, 1)
    assert [r["pid"] for r in summary.key_overlaps] == [11]
    assert [r["pid"] for r in summary.rerun_while_running] == [11]


def test_an_earlier_run_in_a_frozen_worker_is_exempt_and_counted_apart():
    """The earlier run's worker's whole group frozen during it: counted apart, no violation.

    A freeze of the other worker, or one outside the earlier run, exempts nothing.
    """
    rows = [*run(0, 5, 1.0, 5.0, worker="a"), *run(1, 6, 4.0, 4.5, worker="b")]
    summary = check(rows, 2, [Freeze("a", 1.5, 4.2)])
    assert summary.key_overlaps == []
    assert summary.frozen_key_overlaps == 1
    assert summary.violations() == []
    assert table_of(summary)["    same, earlier run's worker group frozen"] == "1"
    for freeze in (Freeze("b", 1.5, 4.2), Freeze("a", 5.5, 8.0), Freeze("a", 0.1, 0.9)):
        summary = check(rows, 2, [freeze])
        assert summary.frozen_key_overlaps == 0
        assert [r["i"] for r in summary.key_overlaps] == [1], freeze


def test_a_frozen_earlier_run_does_not_hide_another_earlier_run():
    """Two runs in flight when a third starts: the frozen one is exempt, the other is not."""
    rows = [
        *run(0, 5, 1.0, 6.0, worker="a"),  # frozen during it
        *run(1, 6, 4.0, 5.5, worker="b"),  # beside it: exempt
        *run(2, 6, 5.0, 5.2, worker="b"),  # beside both: run 1 was not frozen
    ]
    summary = check(rows, 3, [Freeze("a", 1.5, 4.2)])
    assert [(r["i"], r["earlier_i"]) for r in summary.key_overlaps] == [(2, 1)]
    assert summary.frozen_key_overlaps == 1


def test_a_run_that_never_ended_is_judged_as_such_not_as_an_overlap():
    """An earlier run with neither an end nor a gone row: 'never ended', not a key overlap."""
    rows = [run(0, 5, 1.0, 0)[0], *run(1, 5, 2.0, 2.5)]
    summary = check(rows, 2)
    assert [r["i"] for r in summary.never_ended] == [0]
    assert summary.key_overlaps == []


def test_skipped_messages_are_counted_and_not_lost():
    """A skip row makes its message skipped, not lost; a message with neither row is lost."""
    rows = [*run(0, 5, 1.0, 2.0), skip(1), skip(2, account=1), *run(3, 5, 2.5, 3.0)]
    summary = check(rows, 5)
    assert summary.skipped == 2
    assert summary.lost == [4]
    assert summary.violations() == []
    table = table_of(summary)
    assert table["  messages skipped (a run of their key went on)"] == "2"
    assert table["  lost messages (neither started nor skipped)"] == "1"


def test_a_message_skipped_once_and_run_once_counts_as_started():
    """A message skipped in one delivery and run in another is a run, not a skip."""
    rows = [*run(0, 5, 1.0, 2.0), skip(0)]
    summary = check(rows, 1)
    assert summary.skipped == 0
    assert summary.lost == []


def test_a_history_of_the_other_rules_still_passes_beside_overlap_runs():
    """The chaos traffic as before (no overlap key) with overlap runs interleaved: clean."""
    plain = [
        {"kind": "start", "i": 0, "task_id": "p0", "token": 5, "at": 1.0},
        {"kind": "write", "i": 0, "task_id": "p0", "token": 5, "at": 1.1, "accepted": True},
        {"kind": "end", "i": 0, "task_id": "p0", "token": 5, "at": 1.2},
        {"kind": "start", "i": 1, "task_id": "p1", "token": 6, "at": 3.0},
        {"kind": "end", "i": 1, "task_id": "p1", "token": 6, "at": 3.2},
    ]
    keyed = [*run(2, 5, 1.05, 1.5, 0), *run(3, 5, 1.1, 1.6, 1), *run(4, 6, 3.05, 3.4, 0)]
    summary = check([*plain, *keyed, skip(5)], 6)
    assert summary.violations() == []
    assert summary.lost == []
    assert summary.terms == 2
    assert (summary.overlap_runs, summary.skipped) == (3, 1)
