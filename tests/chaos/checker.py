"""The history checker: what a chaos run must never show, and what it may.

Input: the rows leader tasks append (start, write, end) to a log that lives
outside the lease store, and the ids of the messages sent.

Never allowed:
* a **stale start**: a run that starts under a token lower than a token that
  had already started a run (a term that has ended started new work);
* a **stale write accepted**: a fenced write accepted under a token lower than
  one whose acceptance was already known when this write was sent. A write
  row carries ``sent_at`` (before the fence call) and ``at`` (after it): a
  worker frozen between the two records its write late, so the order of the
  rows is not the order in which the fence saw the writes, and only an
  acceptance that had returned before this write was sent certainly came
  first.

Counted and reported:
* **in-flight overlaps**: runs of an older term still executing when a newer
  term started (runs caught by a freeze; fencing is what stops their writes);
* **duplicates**: messages run more than once (at-least-once delivery);
* **lost**: messages sent and never started.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Summary:
    sent: int = 0
    started: int = 0
    stale_starts: list[dict[str, Any]] = field(default_factory=list)
    stale_writes_accepted: list[dict[str, Any]] = field(default_factory=list)
    writes_refused: int = 0
    in_flight_overlaps: int = 0
    duplicates: int = 0
    lost: list[int] = field(default_factory=list)
    terms: int = 0

    def violations(self) -> list[str]:
        found = []
        if self.stale_starts:
            found.append(f"{len(self.stale_starts)} stale starts: {self.stale_starts[:3]}")
        if self.stale_writes_accepted:
            found.append(
                f"{len(self.stale_writes_accepted)} stale writes accepted: "
                f"{self.stale_writes_accepted[:3]}"
            )
        return found

    def table(self) -> str:
        rows = [
            ("messages sent", self.sent),
            ("runs started", self.started),
            ("leader terms seen", self.terms),
            ("stale starts (must be 0)", len(self.stale_starts)),
            ("stale fenced writes accepted (must be 0)", len(self.stale_writes_accepted)),
            ("stale fenced writes refused", self.writes_refused),
            ("runs in flight across a term change", self.in_flight_overlaps),
            ("duplicated messages (at-least-once)", self.duplicates),
            ("lost messages", len(self.lost)),
        ]
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"  {name:<{width}}  {value}" for name, value in rows)


def check(rows: list[dict[str, Any]], sent: int) -> Summary:
    """Check a chaos history; see the module docstring for the rules."""
    summary = Summary(sent=sent)
    starts = sorted((r for r in rows if r["kind"] == "start"), key=lambda r: r["at"])
    writes = sorted((r for r in rows if r["kind"] == "write"), key=lambda r: r["at"])
    ends = {(r["task_id"], r["token"]): r["at"] for r in rows if r["kind"] == "end"}
    summary.started = len(starts)
    summary.terms = len({r["token"] for r in starts})
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
    for row in starts:
        end = ends.get((row["task_id"], row["token"]), float("inf"))
        if any(
            token > row["token"] and row["at"] < began < end
            for token, began in first_start_of_term.items()
        ):
            summary.in_flight_overlaps += 1
    counts = Counter(r["i"] for r in starts)
    summary.duplicates = sum(n - 1 for n in counts.values() if n > 1)
    summary.lost = sorted(set(range(sent)) - set(counts))
    return summary
