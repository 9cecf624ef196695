"""Summary statistics shared by the benchmarks."""

from __future__ import annotations

import math
import statistics


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
