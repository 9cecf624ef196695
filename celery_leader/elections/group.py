"""The elections of one process, keyed by name.

One :class:`ElectionGroup` per process holds every :class:`Election` it
takes part in, with one block of shared memory (a slot per election) and one
run table for all of them, made before the pool forks. A second election is
a new entry here, not a new code path: every reader of shared memory, the
run table, the watchdog and the gate look an election up by name or index.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from celery_leader.elections.election import Election
from celery_leader.elections.shared_lease import SharedLeases
from celery_leader.lease.timing import LeaseTiming
from celery_leader.stores.base import LeaseStore


class ElectionGroup:
    """The elections of this process; see the module docstring."""

    def __init__(self) -> None:
        #: Every election's slot, and the run table they share.
        self.shared = SharedLeases()
        self._elections: dict[str, Election] = {}

    def add(self, name: str, store: LeaseStore, timing: LeaseTiming, **options: Any) -> Election:
        """Take part in election *name* (before the pool forks); options go to :class:`Election`."""
        if name in self._elections:
            raise ValueError(f"this process takes part in election {name!r} already")
        election = Election(store, self.shared.add(name), timing, **options)
        self._elections[name] = election
        return election

    def get(self, name: str) -> Election | None:
        """Election *name*, or None when this process does not take part in it."""
        return self._elections.get(name)

    def __iter__(self) -> Iterator[Election]:
        return iter(list(self._elections.values()))
