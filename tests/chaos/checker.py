"""The history checker: what a chaos run must never show, and what it may.

Input: the rows leader tasks append (start, write, end) to a log that lives
outside the lease store, the ``gone`` rows the runner appends when a run's
process died before its end row (killed at the end of its term, or with its
worker), the ``skip`` rows the runner adds for messages the leader
acknowledged without running (below), the indexes of the messages sent, and
the windows in which a worker's whole process group was frozen.

Tasks with an overlap policy (``@leader_only(overlap=...)``): their rows carry
``overlap_key``, the key the gate holds their runs under (task name, or task
name and the values of the ``overlap_key`` arguments); rows without it are
runs of tasks with no policy, never judged per key. A message of such a task
arriving while a run of its key goes on may be **skipped** under
``overlap="skip"``: acknowledged without running, its result state
``SKIPPED``. No task code runs for it, so nothing of it is in the log: the
runner (which knows each message's task id) reads the result backend at the
end and adds a ``skip`` row (``i``, ``task_id``, ``overlap_key``) per message
whose result reads ``SKIPPED``. Such a message is neither started nor lost:
it is counted as skipped. (A message skipped once and run in another
delivery counts as started; its result is the last one written.)

A run is one start row. Its **end** is its ``end`` row, else its ``gone``
row (the first time the runner saw its process gone: an upper bound of the
kill). Rows are matched on (task id, token, pid); the clock is the host's
monotonic clock, the same in every process.

Never allowed:
* a **stale start**: a run that starts under a token lower than a token that
  had already started a run (a term that has ended started new work);
* a **stale write accepted**: a fenced write accepted under a token lower than
  one whose acceptance was already known when this write was sent. A write
  row carries ``sent_at`` (before the fence call) and ``at`` (after it): a
  worker frozen between the two records its write late, so the order of the
  rows is not the order in which the fence saw the writes, and only an
  acceptance that had returned before this write was sent certainly came
  first;
* a **run in flight across a term change**: a run of token T whose end comes
  after the first start of a newer token (the old term's work was not over
  when the next leader's began). Exempt: runs of a worker whose whole process
  group was frozen (SIGSTOP of the group past the ttl) during the run. That
  is a paused leader, outside the guarantee's assumptions; only fencing is
  judged there (stale writes accepted must stay 0), and those runs are
  counted apart;
* a **run never ended**: neither an end row nor a gone row (the runner takes
  a last look at every pid before it kills the workers, so every run has one
  or the other);
* a **message run again while it ran**: a second run of one message (one
  task id) starting before an earlier run of it ended (a broker's
  redelivery after its visibility timeout, started beside the run instead
  of waiting for it). Two messages of one index are not one message: the
  runner sends an index again, under a new task id, when its send raised
  (the broker restarting), and the first send may have landed all the same;
  those two may run side by side, and count as a duplicate.
  Exempt, as above: an earlier run in a worker whose whole process group was
  frozen during it;
* **overlapping runs of one key**: two runs of a task with an overlap policy,
  of the same ``overlap_key`` (two messages, or one message twice), whose
  [start, end] intervals intersect: the later one started before the
  earlier one's end (its end row, else its gone row). The overlap policy's
  guarantee is one run per key at a time, on one leader and across a term
  change (a SIGKILL, a SIGTERM, a store restart or outage). Exempt, as
  above: an earlier run in a worker whose whole process group was frozen
  during it (counted apart; there the old term's run may still be going when
  the next leader starts one of its key, and only fencing is judged). An
  earlier run that never ended is judged as such, not here. One overlap may
  break two rules (a run across a term change, a message run again while it
  ran): each reports it.

Several elections: rows of a named election carry ``election`` (the
default election's carry none). Tokens of two elections mean nothing to
each other, so each election's starts and writes are judged on their own
(stale starts, stale writes, runs in flight across a term change of *that*
election); never-ended runs, reruns, overlapping runs of one key (a key
names its task, and a task belongs to one election), skips, duplicates and
losses are judged over all messages (a message index belongs to one
election).

Counted and reported:
* **runs ended by a kill**: runs whose end is a gone row;
* **duplicates**: messages run more than once (at-least-once delivery);
* **runs with an overlap key**: runs of tasks with an overlap policy;
* **skipped**: messages acknowledged without running (their ``skip`` rows),
  never started;
* **lost**: messages sent and neither started nor skipped.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple


class Freeze(NamedTuple):
    """A worker's whole process group stopped from *start* to *end* (monotonic seconds)."""

    worker: str
    start: float
    end: float


@dataclass
class Summary:
    sent: int = 0
    started: int = 0
    stale_starts: list[dict[str, Any]] = field(default_factory=list)
    stale_writes_accepted: list[dict[str, Any]] = field(default_factory=list)
    writes_refused: int = 0
    in_flight_overlaps: list[dict[str, Any]] = field(default_factory=list)
    frozen_overlaps: int = 0
    killed: int = 0
    never_ended: list[dict[str, Any]] = field(default_factory=list)
    rerun_while_running: list[dict[str, Any]] = field(default_factory=list)
    duplicates: int = 0
    #: Runs of tasks with an overlap policy (start rows carrying ``overlap_key``).
    overlap_runs: int = 0
    #: Messages acknowledged without running (``skip`` rows, one per message).
    skipped: int = 0
    key_overlaps: list[dict[str, Any]] = field(default_factory=list)
    frozen_key_overlaps: int = 0
    lost: list[int] = field(default_factory=list)
    terms: int = 0
    #: Terms seen per election ("" is the default election).
    terms_by_election: dict[str, int] = field(default_factory=dict)

    def violations(self) -> list[str]:
        found = []
        if self.stale_starts:
            found.append(f"{len(self.stale_starts)} stale starts: {self.stale_starts[:3]}")
        if self.stale_writes_accepted:
            found.append(
                f"{len(self.stale_writes_accepted)} stale writes accepted: "
                f"{self.stale_writes_accepted[:3]}"
            )
        if self.in_flight_overlaps:
            found.append(
                f"{len(self.in_flight_overlaps)} runs in flight across a term change: "
                f"{self.in_flight_overlaps[:3]}"
            )
        if self.never_ended:
            found.append(f"{len(self.never_ended)} runs never ended: {self.never_ended[:3]}")
        if self.rerun_while_running:
            found.append(
                f"{len(self.rerun_while_running)} messages run again while they ran: "
                f"{self.rerun_while_running[:3]}"
            )
        if self.key_overlaps:
            found.append(
                f"{len(self.key_overlaps)} overlapping runs of one key: {self.key_overlaps[:3]}"
            )
        return found

    def table(self) -> str:
        rows = [
            ("messages sent", self.sent),
            ("runs started", self.started),
            ("leader terms seen", self.terms),
            *(
                (f"  of election {name!r}", count)
                for name, count in self.terms_by_election.items()
                if len(self.terms_by_election) > 1
            ),
            ("stale starts (must be 0)", len(self.stale_starts)),
            ("stale fenced writes accepted (must be 0)", len(self.stale_writes_accepted)),
            ("stale fenced writes refused", self.writes_refused),
            ("runs in flight across a term change (must be 0)", len(self.in_flight_overlaps)),
            ("  same, worker's group frozen (fencing judged)", self.frozen_overlaps),
            ("runs ended by a kill (process gone)", self.killed),
            ("runs never ended (must be 0)", len(self.never_ended)),
            ("messages run again while they ran (must be 0)", len(self.rerun_while_running)),
            ("duplicated messages (at-least-once)", self.duplicates),
            ("runs with an overlap key", self.overlap_runs),
            ("overlapping runs of one key (must be 0)", len(self.key_overlaps)),
            ("  same, earlier run's worker group frozen", self.frozen_key_overlaps),
            ("messages skipped (a run of their key went on)", self.skipped),
            ("lost messages (neither started nor skipped)", len(self.lost)),
        ]
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"  {name:<{width}}  {value}" for name, value in rows)


def _key(row: dict[str, Any]) -> tuple[Any, Any, Any]:
    return row["task_id"], row["token"], row.get("pid")


def run_ends(
    starts: list[dict[str, Any]], rows: Iterable[dict[str, Any]]
) -> list[tuple[float, str] | None]:
    """Per start (in the order given, oldest first): (its end, "end" or "gone"), or None.

    A run's end is the first unclaimed end row of its (task id, token, pid)
    at or after its start; without one, the first such gone row.
    """
    closing: dict[str, dict[tuple[Any, Any, Any], list[float]]] = {
        "end": defaultdict(list),
        "gone": defaultdict(list),
    }
    for row in rows:
        if row["kind"] in closing:
            closing[row["kind"]][_key(row)].append(row["at"])
    for by_key in closing.values():
        for times in by_key.values():
            times.sort()
    found: list[tuple[float, str] | None] = []
    for start in starts:
        match: tuple[float, str] | None = None
        for kind in ("end", "gone"):
            times = closing[kind].get(_key(start), [])
            index = bisect_left(times, start["at"])
            if index < len(times):
                match = (times.pop(index), kind)
                break
        found.append(match)
    return found


def _frozen_during(freezes: list[Freeze], run: dict[str, Any], end: float) -> bool:
    """True when *run*'s worker had its whole process group frozen while the run lasted."""
    return any(
        f.worker == run.get("worker") and f.start < end and f.end > run["at"] for f in freezes
    )


def election_of(row: dict[str, Any]) -> str:
    """The election a row belongs to ("" for the default election)."""
    return str(row.get("election") or "")


def check(rows: list[dict[str, Any]], sent: int, freezes: Iterable[Freeze] = ()) -> Summary:
    """Check a chaos history; see the module docstring for the rules."""
    summary = Summary(sent=sent)
    freezes = [Freeze(*f) for f in freezes]
    starts = sorted((r for r in rows if r["kind"] == "start"), key=lambda r: r["at"])
    summary.started = len(starts)
    ends = run_ends(starts, rows)
    elections = sorted({election_of(r) for r in rows if r["kind"] in ("start", "write")})
    for election in elections:
        _check_election(
            summary,
            [
                (row, end)
                for row, end in zip(starts, ends, strict=True)
                if election_of(row) == election
            ],
            [r for r in rows if r["kind"] == "write" and election_of(r) == election],
            freezes,
        )
        summary.terms_by_election[election] = len(
            {r["token"] for r in starts if election_of(r) == election}
        )
    summary.terms = sum(summary.terms_by_election.values())
    runs_of_message: dict[Any, list[tuple[dict[str, Any], float]]] = defaultdict(list)
    for row, ended in zip(starts, ends, strict=True):
        if ended is None:
            summary.never_ended.append(row)
            continue
        end, how = ended
        for earlier, earlier_end in runs_of_message[row["task_id"]]:
            if earlier_end > row["at"] and not _frozen_during(freezes, earlier, earlier_end):
                summary.rerun_while_running.append(
                    {**row, "earlier_pid": earlier.get("pid"), "earlier_ended": earlier_end}
                )
                break
        runs_of_message[row["task_id"]].append((row, end))
        summary.killed += how == "gone"
    _check_keys(summary, starts, ends, freezes)
    counts = Counter(r["i"] for r in starts)
    summary.duplicates = sum(n - 1 for n in counts.values() if n > 1)
    skipped = {r["i"] for r in rows if r["kind"] == "skip"} - set(counts)
    summary.skipped = len(skipped)
    summary.lost = sorted(set(range(sent)) - set(counts) - skipped)
    return summary


def _check_keys(
    summary: Summary,
    starts: list[dict[str, Any]],
    ends: list[tuple[float, str] | None],
    freezes: list[Freeze],
) -> None:
    """Overlapping runs of one key: *starts* oldest first, *ends* theirs (see run_ends)."""
    # Per key, the runs (start row, end) whose end is later than the latest start seen:
    # starts come in order, so a run that ended before one start ended before all later ones.
    open_runs: dict[str, list[tuple[dict[str, Any], float]]] = defaultdict(list)
    for row, ended in zip(starts, ends, strict=True):
        key = row.get("overlap_key")
        if key is None:
            continue
        summary.overlap_runs += 1
        earlier = [(run, end) for run, end in open_runs[key] if end > row["at"]]
        open_runs[key] = earlier
        judged = [(run, end) for run, end in earlier if not _frozen_during(freezes, run, end)]
        if judged:
            run, end = judged[0]
            summary.key_overlaps.append(
                {
                    **row,
                    "earlier_task_id": run["task_id"],
                    "earlier_i": run.get("i"),
                    "earlier_pid": run.get("pid"),
                    "earlier_worker": run.get("worker"),
                    "earlier_started": run["at"],
                    "earlier_ended": end,
                }
            )
        elif earlier:
            summary.frozen_key_overlaps += 1
        if ended is not None:  # a run never ended is judged as such
            earlier.append((row, ended[0]))


def _check_election(
    summary: Summary,
    runs: list[tuple[dict[str, Any], tuple[float, str] | None]],
    write_rows: list[dict[str, Any]],
    freezes: list[Freeze],
) -> None:
    """The rules on one election's tokens: its starts (with their ends) and its writes."""
    starts = [row for row, _ in runs]
    writes = sorted(write_rows, key=lambda r: r["at"])
    highest = 0
    for row in starts:
        if row["token"] < highest:
            summary.stale_starts.append(row)
        highest = max(highest, row["token"])
    accepted = [r for r in writes if r["accepted"]]  # in the order their fence calls returned
    summary.writes_refused = len(writes) - len(accepted)
    returned_at = [r["at"] for r in accepted]
    highest_returned: list[int] = []  # [k]: the highest token among accepted[0..k]
    highest = 0
    for row in accepted:
        highest = max(highest, row["token"])
        highest_returned.append(highest)
    for row in accepted:
        known = bisect_left(returned_at, row.get("sent_at", row["at"]))
        if known and highest_returned[known - 1] > row["token"]:
            summary.stale_writes_accepted.append(row)
    first_start_of_term: dict[int, float] = {}
    for row in starts:
        first_start_of_term.setdefault(row["token"], row["at"])
    for row, ended in runs:
        if ended is None:
            continue  # judged with every election's runs
        end, how = ended
        newer = [
            (began, token)
            for token, began in first_start_of_term.items()
            if token > row["token"] and began < end
        ]
        if not newer:
            continue
        began, token = min(newer)
        if _frozen_during(freezes, row, end):
            summary.frozen_overlaps += 1
            continue
        summary.in_flight_overlaps.append(
            {**row, "ended": end, "ended_by": how, "newer_token": token, "newer_began": began}
        )
