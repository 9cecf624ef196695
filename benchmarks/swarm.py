"""Many lease managers spread over a few processes, for the store-load benchmark.

A real deployment runs one lease manager per worker process on many hosts;
running 200 of them as threads of one process would share one GIL and one
scheduler slot, and would measure that process more than the store. Here
each of a few child processes (``multiprocessing``, spawned fresh) opens its
share of managers, each with its own connection, then all start at one agreed
wall-clock instant, so "time to elect" is measured from a common start.
"""

from __future__ import annotations

import multiprocessing
import queue
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.synchronize import Event as EventType

from celery_leader.lease import EventKind, LeaseEvent, LeaseManager
from celery_leader.lease.timing import LeaseTiming
from celery_leader.stores import open_store
from celery_leader.stores.base import Holder

_SPAWN = multiprocessing.get_context("spawn")


@dataclass(frozen=True)
class _Share:
    """What one child runs: managers number *first* to *first + count - 1* of one election."""

    url: str
    name: str
    ttl: float
    first: int
    count: int


def _member(
    share: _Share,
    start_at_queue: multiprocessing.Queue,  # type: ignore[type-arg]
    reports: multiprocessing.Queue,  # type: ignore[type-arg]
    stop: EventType,
) -> None:
    """One child: its share of managers, started together at the instant the parent sends."""
    timing = LeaseTiming.create(share.ttl)
    managers = [
        LeaseManager(
            open_store(share.url, timeout=timing.op_timeout),
            share.name,
            timing,
            holder=Holder.for_this_process(f"m{share.first + i}"),
        )
        for i in range(share.count)
    ]

    def on_event(event: LeaseEvent) -> None:
        if event.kind is EventKind.ELECTED:
            reports.put(("elected", time.time()))

    for manager in managers:
        manager.add_listener(on_event)
    reports.put(("ready", share.count))
    start_at: float = start_at_queue.get()
    time.sleep(max(0.0, start_at - time.time()))
    for manager in managers:
        manager.start()
    stop.wait()
    for manager in managers:
        manager.stop(timeout=2)
        manager.store.close()


@dataclass
class Swarm:
    """The running swarm: when it started, and the wall-clock times of its elections."""

    started_at: float
    reports: multiprocessing.Queue  # type: ignore[type-arg]

    def first_election(self, timeout: float) -> float:
        """Seconds from the common start to the first ELECTED in any process."""
        try:
            kind, at = self.reports.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"no leader elected within {timeout:g} s") from None
        if kind != "elected":
            raise RuntimeError(f"unexpected report {kind!r}")
        return float(at) - self.started_at


@contextmanager
def swarm(url: str, name: str, ttl: float, managers: int, processes: int) -> Iterator[Swarm]:
    """Run *managers* lease managers for *name* in *processes* child processes.

    Yields once every child has opened its connections and all managers have
    been told to start at the same instant (about 0.5 s after the last child
    is ready). On exit the children stop their managers (releasing the lease)
    and are joined; one that hangs is killed.
    """
    reports: multiprocessing.Queue = _SPAWN.Queue()  # type: ignore[type-arg]
    start_at: multiprocessing.Queue = _SPAWN.Queue()  # type: ignore[type-arg]  # one get per child
    stop = _SPAWN.Event()
    children = []
    each, extra = divmod(managers, processes)
    first = 0
    for index in range(processes):
        count = each + (1 if index < extra else 0)
        child = _SPAWN.Process(
            target=_member,
            args=(_Share(url, name, ttl, first, count), start_at, reports, stop),
            daemon=True,
        )
        child.start()
        children.append(child)
        first += count
    try:
        for _ in children:
            kind, _count = reports.get(timeout=120)
            if kind != "ready":
                raise RuntimeError(f"unexpected report {kind!r}")
        started_at = time.time() + 0.5
        for _ in children:
            start_at.put(started_at)
        yield Swarm(started_at, reports)
    finally:
        stop.set()
        for child in children:
            child.join(30)
            if child.is_alive():
                child.kill()
                child.join(5)
