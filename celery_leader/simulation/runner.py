"""Many seeds, on every core: the summary and the failing seeds.

Seeds are split into chunks run by worker processes; each seed's outcome
depends on its number alone, so the summary is the same whatever the number
of processes or the order in which chunks finish.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

from celery_leader.simulation.model_store import Broken
from celery_leader.simulation.models import DEFAULT
from celery_leader.simulation.world import SeedResult, quiet_loggers, simulate


@dataclass(frozen=True)
class Summary:
    """The outcome of a run of many seeds."""

    seeds: int
    failures: list[SeedResult]
    seconds: float
    events: int
    terms: int

    @property
    def violations(self) -> int:
        """Seeds with a violation (each seed stops at its first)."""
        return len(self.failures)


@dataclass(frozen=True)
class _Chunk:
    failures: list[SeedResult]
    events: int
    terms: int


def _run_chunk(
    args: tuple[Sequence[int], Broken | None, int, bool, int, str, bool, bool],
) -> _Chunk:
    seeds, broken, trace_limit, every_event, elections, store, gaps, lifelines = args
    failures: list[SeedResult] = []
    events = terms = 0
    with quiet_loggers():
        for seed in seeds:
            result = simulate(
                seed,
                broken=broken,
                trace_limit=trace_limit,
                every_event=every_event,
                elections=elections,
                store=store,
                gaps=gaps,
                lifelines=lifelines,
            )
            events += result.events
            terms += result.terms
            if result.violation is not None:
                failures.append(result)
    return _Chunk(failures, events, terms)


def run_seeds(
    seeds: Sequence[int],
    *,
    broken: Broken | None = None,
    jobs: int | None = None,
    trace_limit: int = 30,
    every_event: bool = False,
    elections: int = 1,
    store: str = DEFAULT,
    gaps: bool = False,
    lifelines: bool = False,
) -> Summary:
    """Run *seeds* on *jobs* processes (default: one per core); see :func:`.world.simulate`."""
    started = time.perf_counter()
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(seeds) or 1))
    # Small chunks keep the processes evenly busy; each chunk is a slice of seeds.
    size = max(1, min(500, len(seeds) // (jobs * 8) or 1))
    chunks = [
        (seeds[i : i + size], broken, trace_limit, every_event, elections, store, gaps, lifelines)
        for i in range(0, len(seeds), size)
    ]
    if jobs == 1:
        done = [_run_chunk(chunk) for chunk in chunks]
    else:
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if "fork" in methods else None)
        with context.Pool(jobs) as pool:
            done = pool.map(_run_chunk, chunks, chunksize=1)
    failures = sorted((f for chunk in done for f in chunk.failures), key=lambda r: r.seed)
    return Summary(
        seeds=len(seeds),
        failures=failures,
        seconds=time.perf_counter() - started,
        events=sum(chunk.events for chunk in done),
        terms=sum(chunk.terms for chunk in done),
    )
