"""Which pool child runs leader work under which term: shared memory for the watchdog.

Made before the pool forks, like :class:`~celery_leader.shared_lease.SharedLease`.
Every leader run in a prefork child is written here before its body starts,
whatever its ``on_loss`` policy, so two readers see runs the parent may not
know of yet (a child that started a job before the parent read its
acknowledgement):

* the **watchdog** kills ``terminate`` runs whose term is over, and records
  each kill in a ring the parent reads, so the parent hands the message back
  instead of recording a failure even when a late renewal was published
  after the kill;
* the **release guard** waits until no run of the term is left here.

Writers: a slot is written only by the child that owns that pool index (one
child per index at a time), the kill ring only by the watchdog. Nobody
clears another process's slot, so no write can race another. A slot left by
a child that died stays until the next child of that index overwrites it;
readers recognise it as stale because the process it names, identified by
pid *and* start time (:mod:`celery_leader.procinfo`), no longer runs.

A sequence number per slot (odd while a write is in progress) makes a torn
read retry.
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import NamedTuple

from celery_leader import procinfo

#: Run slots, one per pool child index (billiard numbers children 0..n-1).
#: A prefork worker with more processes than this is refused at start.
RUN_SLOTS = 1024
#: Kills remembered for the parent, newest last; older ones are overwritten.
KILL_RING = 128

_SLOT = struct.Struct("=qqqqq")  # sequence, pid, token, flags, start time
_KILL = struct.Struct("=qqq")  # pid, token, start time
_HEAD = struct.Struct("=q")  # kills recorded so far
_TERMINATE = 1
_RETRIES = 1000


class Run(NamedTuple):
    """One slot: a leader run of term *token* in process *pid* (started at *started*)."""

    slot_index: int
    pid: int
    token: int
    terminate: bool
    started: int

    def running(self) -> bool:
        """True while the process named here still runs (and is the same process)."""
        return procinfo.is_running(self.pid, self.started)


class RunTable:
    """Leader runs of the pool's children, and the watchdog's kills."""

    def __init__(self) -> None:
        self._slots = mmap.mmap(-1, _SLOT.size * RUN_SLOTS)
        self._kills = mmap.mmap(-1, _HEAD.size + _KILL.size * KILL_RING)

    # -- slots (each written by its own child) --------------------------------

    def _write(self, index: int, pid: int, token: int, flags: int, started: int) -> None:
        offset = index * _SLOT.size
        (seq,) = struct.unpack_from("=q", self._slots, offset)
        struct.pack_into("=q", self._slots, offset, seq + 1)  # odd: write in progress
        struct.pack_into("=qqqq", self._slots, offset + 8, pid, token, flags, started)
        struct.pack_into("=q", self._slots, offset, seq + 2)

    def enter(self, index: int, token: int, *, terminate: bool) -> None:
        """Record that the calling process (pool child *index*) runs leader work of *token*."""
        flags = _TERMINATE if terminate else 0
        self._write(index, os.getpid(), token, flags, procinfo.own_start_time())

    def leave(self, index: int) -> None:
        """Record that the leader run of pool child *index* ended."""
        self._write(index, 0, 0, 0, 0)

    def slot(self, index: int) -> Run | None:
        """Slot *index*, read consistently; None when empty."""
        offset = index * _SLOT.size
        for _ in range(_RETRIES):
            seq, pid, token, flags, started = _SLOT.unpack_from(self._slots, offset)
            if seq % 2 == 0 and struct.unpack_from("=q", self._slots, offset)[0] == seq:
                return Run(index, pid, token, bool(flags & _TERMINATE), started) if pid else None
        # A writer that never finishes died mid-write; the process it named is
        # unknown, so the slot reads as a run of every term (fail closed).
        return Run(index, -1, 2**63 - 1, False, 0)

    def busy(self) -> list[Run]:
        """The slots in use (stale ones included), each read consistently.

        One bulk copy finds candidate slots cheaply; each is then re-read
        with its sequence check.
        """
        found = []
        for index, (_, candidate, *_rest) in enumerate(_SLOT.iter_unpack(bytes(self._slots))):
            if candidate:
                run = self.slot(index)
                if run is not None:
                    found.append(run)
        return found

    def running(self, token: int, exclude_pid: int = 0) -> list[Run]:
        """Runs of term *token* or older whose process still runs."""
        return [
            run
            for run in self.busy()
            if run.token <= token and run.pid != exclude_pid and (run.pid < 0 or run.running())
        ]

    # -- kills (written by the watchdog) --------------------------------------

    def record_kill(self, run: Run) -> None:
        """Remember that the watchdog killed *run* at the end of its term."""
        (head,) = _HEAD.unpack_from(self._kills, 0)
        offset = _HEAD.size + (head % KILL_RING) * _KILL.size
        _KILL.pack_into(self._kills, offset, run.pid, run.token, run.started)
        _HEAD.pack_into(self._kills, 0, head + 1)

    def was_killed(self, pid: int, token: int) -> bool:
        """True when the watchdog killed process *pid* running term *token*."""
        for index in range(KILL_RING):
            killed_pid, killed_token, _ = _KILL.unpack_from(
                self._kills, _HEAD.size + index * _KILL.size
            )
            if killed_pid == pid and killed_token == token:
                return True
        return False
