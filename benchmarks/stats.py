"""Summary statistics shared by the benchmarks."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator
from typing import Any


def spread(values: list[float]) -> tuple[float, float, float]:
    """Median, p90 and worst of *values*: the three columns of every timing table."""
    return statistics.median(values), p90(values), max(values)


def p90(values: list[float]) -> float:
    """Nearest-rank 90th percentile: with 10 rounds, the second worst."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def from_json(values: list[float | None]) -> list[float]:
    """Seconds per round as the benchmarks write them (null: reached the cap) as floats (inf)."""
    return [math.inf if value is None else float(value) for value in values]


def to_json(values: list[float]) -> list[float | None]:
    """Seconds per round for JSON: a round that reached the cap (inf) becomes null."""
    return [None if math.isinf(value) else value for value in values]


def fast_failover_rows(
    fast_figures: dict[str, Any] | None,
) -> Iterator[tuple[str, str, dict[str, list[float]]]]:
    """``benchmarks.fast_failover --json`` as (what, store, seconds per round by ttl).

    *what* is ``"workers"`` (every key but ``"beat"`` is a store of the
    workers' figures: to the first leader task) or ``"beat"`` (under
    ``"beat"``: to the standby's first send).
    """
    for store, by_ttl in (fast_figures or {}).items():
        if store != "beat":
            yield "workers", store, by_ttl
    for store, by_ttl in (fast_figures or {}).get("beat", {}).items():
        yield "beat", store, {ttl: found["first_send"] for ttl, found in by_ttl.items()}
