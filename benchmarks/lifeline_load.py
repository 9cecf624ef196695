"""What ``leader_fast_failover`` adds to a store's load, per process, as elections grow.

Run from the repository root:
    .venv/bin/python -m benchmarks.lifeline_load [--stores redis postgres]
        [--processes 4 12] [--elections 1 10] [--ttl 10] [--seconds 10]

For each store, number of processes and number of elections: that many
processes (``multiprocessing``, spawned fresh), each taking part in every
election with one lease manager per election, as a worker does. They run
once without lifelines and once with (``manager_options(enabled=True)``:
one lifeline per process, one reading of the others' lifelines per
process, whatever the number of elections). At steady state the store's
own counter is read over *seconds*: Redis commands/s (INFO), PostgreSQL
transactions/s (pg_stat_database).

Prints one table: requests/s without and with lifelines, the difference,
and the difference per process. The design bound: 40 per process and
second on Redis (20 ``PING`` confirmations, 20 ``PUBSUB NUMSUB`` readings),
the same on PostgreSQL (20 confirmations, 20 readings of ``pg_locks``),
whatever the number of elections and of followers.
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.synchronize import Event as EventType
from pathlib import Path

from benchmarks.lease import warm
from benchmarks.stores import Running, postgres_store, redis_store
from celery_leader.lease import LeaseManager, lifeline
from celery_leader.lease.timing import LeaseTiming
from celery_leader.stores import open_store
from celery_leader.stores.base import Holder

_SPAWN = multiprocessing.get_context("spawn")
STORES = {"redis": redis_store, "postgres": postgres_store}


@dataclass(frozen=True)
class _Member:
    """One process: a lease manager for each of *elections*, with or without lifelines."""

    url: str
    elections: tuple[str, ...]
    ttl: float
    index: int
    lifelines: bool


def _member(member: _Member, ready: multiprocessing.Queue, stop: EventType) -> None:  # type: ignore[type-arg]
    timing = LeaseTiming.create(member.ttl)
    managers = []
    for name in member.elections:
        store = open_store(member.url, timeout=timing.op_timeout)
        options = lifeline.manager_options(
            store, member.url, enabled=member.lifelines, label="the benchmark"
        )
        managers.append(
            LeaseManager(
                store,
                name,
                timing,
                holder=Holder.for_this_process(f"p{member.index}"),
                **options,
            )
        )
    for manager in managers:
        manager.start()
    ready.put(member.index)
    stop.wait()
    for manager in managers:
        manager.stop(timeout=2)
        manager.store.close()
    lifeline.close_all()


@contextmanager
def _processes(
    url: str, processes: int, elections: tuple[str, ...], ttl: float, lifelines: bool
) -> Iterator[None]:
    ready: multiprocessing.Queue = _SPAWN.Queue()  # type: ignore[type-arg]
    stop = _SPAWN.Event()
    children = [
        _SPAWN.Process(
            target=_member,
            args=(_Member(url, elections, ttl, index, lifelines), ready, stop),
            daemon=True,
        )
        for index in range(processes)
    ]
    for child in children:
        child.start()
    try:
        for _ in children:
            ready.get(timeout=120)
        yield
    finally:
        stop.set()
        for child in children:
            child.join(30)
            if child.is_alive():
                child.kill()


def load(
    store: Running, processes: int, elections: int, ttl: float, seconds: float
) -> tuple[float, float]:
    """The store's requests/s at steady state, without and with lifelines."""
    found = []
    for lifelines in (False, True):
        names = tuple(f"load-{processes}-{elections}-{lifelines}-{k}" for k in range(elections))
        for name in names:
            warm(store.url, name)
        with _processes(store.url, processes, names, ttl, lifelines):
            time.sleep(ttl + 2)  # past the first-start hold-off: terms renewed, lifelines read
            before, started = store.served(), time.monotonic()
            time.sleep(seconds)
            after, ended = store.served(), time.monotonic()
        found.append((after - before) / (ended - started))
    return found[0], found[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", nargs="+", default=list(STORES), choices=list(STORES))
    parser.add_argument("--processes", nargs="+", type=int, default=[4, 12])
    parser.add_argument("--elections", nargs="+", type=int, default=[1, 10])
    parser.add_argument("--ttl", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="lifeline-load-") as tmp:
        for kind in args.stores:
            (Path(tmp) / kind).mkdir()
            with STORES[kind](Path(tmp) / kind) as store:
                for processes in args.processes:
                    for elections in args.elections:
                        off, on = load(store, processes, elections, args.ttl, args.seconds)
                        rows.append((kind, store.unit, processes, elections, off, on))
                        print(
                            f"{kind} {processes} processes x {elections} elections: "
                            f"{off:.1f} -> {on:.1f} {store.unit}/s",
                            flush=True,
                        )
    print()
    print(f"store load added by lifelines, ttl {args.ttl:g} s, {args.seconds:g} s at steady state")
    print()
    print(
        "| store | processes | elections | without /s | with /s | added /s | added per process /s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kind, unit, processes, elections, off, on in rows:
        print(
            f"| {kind} ({unit}) | {processes} | {elections} | {off:.1f} | {on:.1f} "
            f"| {on - off:.1f} | {(on - off) / processes:.1f} |"
        )


if __name__ == "__main__":
    main()
