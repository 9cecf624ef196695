"""The failover chart of docs/benchmarks.md: every round of every system, crash and graceful.

Drawn from the raw figures the benchmarks write as JSON (see
benchmarks/report.py), so it shows the distribution, not just a median: a
box per system and ttl, with each round as a dot. A round that reached the
benchmark's cap is drawn at the cap with a "> cap" note. Needs matplotlib
(the ``bench`` extra); without it nothing is drawn.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple

from benchmarks.stats import fast_failover_rows, from_json

KINDS = ("crash", "graceful")


class Series(NamedTuple):
    """One system at one ttl: seconds per round, per kind of stop."""

    label: str
    crash: list[float]
    graceful: list[float]


def series(
    beat_figures: dict[str, Any],
    workers_figures: dict[str, Any] | None,
    fast_figures: dict[str, Any] | None = None,
) -> list[Series]:
    """Every system and ttl from the benchmarks' JSON, celery-leader's first.

    *fast_figures* (``benchmarks.fast_failover --json``) adds a crash row per store
    and ttl with ``leader_fast_failover``, for workers and (when it holds them) beat.
    """
    rows: list[Series] = []
    if workers_figures is not None:
        for ttl, figures in workers_figures["workers"].items():
            crash, graceful = from_json(figures["crash"]), from_json(figures["graceful"])
            rows.append(Series(f"celery-leader workers, ttl {ttl} s", crash, graceful))
    fast: dict[str, list[Series]] = {"workers": [], "beat": []}
    for what, store, by_ttl in fast_failover_rows(fast_figures):
        for ttl, values in by_ttl.items():
            label = f"celery-leader {what}, fast failover, {store}, ttl {ttl} s"
            fast[what].append(Series(label, list(values), []))
    rows += fast["workers"]
    beat = beat_figures["beat"].values()
    ordered = sorted(beat, key=lambda row: (row["label"] != "celery-leader", row["ttl"] is None))
    for row in ordered:
        if row["label"] != "celery-leader" and fast["beat"]:
            rows += fast["beat"]  # beat's fast failover after celery-leader beat's rows
            fast["beat"] = []
        name = "celery-leader beat" if row["label"] == "celery-leader" else row["label"]
        label = name if row["ttl"] is None else f"{name}, ttl {row['ttl']:g} s"
        rows.append(Series(label, from_json(row["crash"]), from_json(row["graceful"])))
    return rows + fast["beat"]


def _minor_tick(value: float, _pos: int) -> str:
    """Label 2 and 5 of each decade on the log axis, so a short range still has numbers."""
    leading = round(value / 10 ** math.floor(math.log10(value)))
    return f"{value:g}" if leading in (2, 5) else ""


def draw(rows: list[Series], cap: float, path: Path) -> bool:
    """Write the chart to *path*; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(13, 0.45 * len(rows) + 1.8), sharey=True)
    positions = list(range(len(rows)))
    for ax, kind in zip(axes, KINDS, strict=True):
        for y, row in enumerate(rows):
            values: list[float] = getattr(row, kind)
            finite = [v for v in values if math.isfinite(v)]
            colour = "#4c72b0" if row.label.startswith("celery-leader") else "#c44e52"
            if finite:
                ax.boxplot(
                    finite,
                    positions=[y],
                    vert=False,
                    widths=0.5,
                    showfliers=False,
                    medianprops={"color": colour},
                )
                ax.scatter(finite, [y] * len(finite), s=9, color=colour, alpha=0.6, zorder=3)
            if len(finite) < len(values):
                ax.scatter([cap], [y], marker=">", color=colour, zorder=3)
                ax.annotate(f"> {cap:g} s", (cap, y), xytext=(-48, 6), textcoords="offset points")
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:g}"))
        ax.xaxis.set_minor_formatter(FuncFormatter(_minor_tick))
        ax.set_xlabel(f"{kind}: seconds from the signal to the new holder's first work")
        ax.grid(axis="x", which="both", alpha=0.3)
    axes[0].set_yticks(positions, [row.label for row in rows], fontsize=8)
    axes[0].invert_yaxis()
    fig.suptitle("Failover per round, this machine, one run (SIGKILL and SIGTERM)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
