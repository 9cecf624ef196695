"""The headline of docs/benchmarks.md: failover side by side, as ratios ours / theirs.

Reads the raw figures that ``benchmarks.beat --json`` and
``benchmarks.workers --json`` write, and makes one markdown table: per
system, the median seconds from the signal to the first work of the new
holder, for each ttl and for crash (SIGKILL) and graceful (SIGTERM) stops,
with celery-leader beat's median divided by each peer's (below 1:
celery-leader is faster). A peer at its defaults ignores the ttl, so the
same figures stand in every ttl column; a round that reached the cap is
null in the JSON, a median that did is shown as "> cap" and its ratio as
"< ours / cap".
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from benchmarks.stats import fast_failover_rows, from_json

KINDS = ("crash", "graceful")
OURS = "celery-leader"


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def _seconds(value: float, cap: float) -> str:
    if math.isnan(value):
        return "n/a"
    return f"> {cap:g} s" if math.isinf(value) else f"{value:.2f} s"


def _ratio(ours: float, theirs: float, cap: float) -> str:
    if math.isnan(ours) or math.isnan(theirs) or theirs == 0:
        return "n/a"
    if math.isinf(theirs):
        return f"< {ours / cap:.2f}"
    return f"{ours / theirs:.2f}"


def _beat_row(beat: dict[str, Any], label: str, ttl: float) -> dict[str, Any] | None:
    """The beat figures of *label* at *ttl*, or its defaults row (which holds at any ttl)."""
    for row in beat.values():
        if row["label"] == label and row["ttl"] in (ttl, None):
            return dict(row)
    return None


def _fast_lines(
    fast: list[tuple[str, str, dict[str, list[float]]]],
    what: str,
    columns: list[tuple[float, str]],
    cap: float,
) -> list[str]:
    """The fast-failover rows of *what* (workers or beat): crash medians; graceful as above."""
    lines = []
    for kind_of, store, by_ttl in fast:
        if kind_of != what:
            continue
        cells = [f"{OURS} {what}, fast failover ({store})"]
        for ttl, kind in columns:
            values = by_ttl.get(f"{ttl:g}", []) if kind == "crash" else None
            cells += ["as above" if values is None else _seconds(_median(values), cap), ""]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def headline(
    beat_figures: dict[str, Any],
    workers_figures: dict[str, Any] | None,
    fast_figures: dict[str, Any] | None = None,
) -> str:
    """The markdown table (and a line on how to read it) from the benchmarks' JSON.

    *fast_figures* (``benchmarks.fast_failover --json``: store, ttl, seconds per round)
    adds a row per store with ``leader_fast_failover``: the workers' under the workers'
    row and, when it holds them, beat's (to the standby's first send) under celery-leader
    beat's row. Their graceful columns are the row's above (a release does not change
    with the setting), shown as "as above".
    """
    beat: dict[str, Any] = beat_figures["beat"]
    cap = float(beat_figures["cap"])
    ttls = sorted({row["ttl"] for row in beat.values() if row["ttl"] is not None})
    labels = list(dict.fromkeys(row["label"] for row in beat.values()))
    columns = [(ttl, kind) for ttl in ttls for kind in KINDS]
    head = ["system"]
    for ttl, kind in columns:
        head += [f"ttl {ttl:g} s, {kind}", "ours / theirs"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (2 * len(columns))]
    if workers_figures is not None:
        cells = [f"{OURS} workers (first leader task)"]
        for ttl, kind in columns:
            values = workers_figures["workers"].get(f"{ttl:g}", {}).get(kind, [])
            cells += [_seconds(_median(from_json(values)), cap), ""]
        lines.append("| " + " | ".join(cells) + " |")
    fast = list(fast_failover_rows(fast_figures))
    lines += _fast_lines(fast, "workers", columns, cap)
    for label in labels:
        cells = [f"{label} beat" if label == OURS else label]
        for ttl, kind in columns:
            row = _beat_row(beat, label, ttl)
            ours = _beat_row(beat, OURS, ttl)
            theirs = _median(from_json(row[kind])) if row else math.nan
            mine = _median(from_json(ours[kind])) if ours else math.nan
            cells += [_seconds(theirs, cap), "" if label == OURS else _ratio(mine, theirs, cap)]
        lines.append("| " + " | ".join(cells) + " |")
        if label == OURS:  # beat's fast failover under beat's row, which "as above" names
            lines += _fast_lines(fast, "beat", columns, cap)
    return "\n".join(
        [
            *lines,
            "",
            "Median seconds from the signal (SIGKILL of the process group, or SIGTERM) to the "
            "first work of the new holder, on this machine in one run. ours / theirs: "
            f"{OURS} beat's median over the peer's (below 1: {OURS} is faster; "
            f"'< x': the peer reached the {cap:g} s cap). Rows at a peer's defaults ignore the "
            "ttl: the same run stands in every column.",
        ]
    )
