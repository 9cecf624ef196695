"""The lease as the places where work runs see it: token and validity in shared memory.

Prefork children are forked copies: they cannot see the parent's lease
manager. Before the pool forks, the worker makes one :class:`SharedLeases`
group with one :class:`SharedLease` slot per election it takes part in;
the parent publishes every change of an election's term (elected, renewed,
revoked) into that election's slot and children read it. Reads never block
and take no lock: a sequence counter (even = stable) makes a torn read
retry.

Everything here is keyed by election: tokens of two elections are separate
sequences that mean nothing to each other, so a run is judged only against
its own election's slot (the run table records the election of each run).

Guarantees:

* **Validity ends by itself.** A term is valid only until the ``valid_until``
  last published for it; nobody has to write anything for it to end.
* **Revocation is sticky.** Once term ``T`` is revoked, no later
  :meth:`SharedLease.publish` of ``T`` (or of any older term) makes it valid
  again: a renewal that races a step-down cannot undo it.

The process that writes keeps what it last wrote beside the shared memory
(updated under the same lock, right after the memory) and reads that copy:
the gate in the worker's main process asks on every leader message, and a
read of the shared page there costs several microseconds more (the page and
the struct code are cold after Celery's own work on each message). A fork
drops the copy in the child (``os.register_at_fork``): every other process
reads the shared memory.

Times are on the lease clock (:func:`celery_leader.clock.now`), one clock for
every process of a host.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
import threading
import weakref
from collections.abc import Iterator
from typing import Protocol

from celery_leader import clock
from celery_leader.elections.run_table import RunTable


class Alarm(Protocol):
    """What the group needs of the watchdog's alarm (:mod:`celery_leader.term_end.alarm`).

    Declared here, so that this floor never imports the one above it.
    """

    def nudge(self, deadline: float) -> bool:
        """Wake the watchdog now when it sleeps past *deadline* (lease clock); True if it wrote."""


_LAYOUT = struct.Struct("=qqdq")  # sequence, token, valid_until, revoked_through
_SEQ = struct.Struct("=q")  # the sequence alone: odd while a write is in progress
_RETRIES = 1000
#: Elections one worker process can take part in (slots made before the pool forks).
MAX_ELECTIONS = 128


#: Every slot of this process: a forked child drops their writer's copies.
_WRITERS: weakref.WeakSet[SharedLease] = weakref.WeakSet()


def _forked() -> None:
    for lease in list(_WRITERS):
        lease._written = None


os.register_at_fork(after_in_child=_forked)


class SharedLeases:
    """The shared lease slots of every election of one process, and their run table.

    Slots are added in the process that writes them (the worker's main
    process) before the pool forks; children find them by election name or
    by index (the run table records the index).
    """

    def __init__(self, capacity: int = MAX_ELECTIONS) -> None:
        # An anonymous mapping is MAP_SHARED: forked children see our writes.
        self._mem = mmap.mmap(-1, _LAYOUT.size * capacity)
        self._capacity = capacity
        self._write_lock = threading.Lock()
        self._by_name: dict[str, SharedLease] = {}
        self._by_index: list[SharedLease] = []
        #: The process that writes (the worker's main process).
        self.owner_pid = os.getpid()
        #: Which pool child runs which election's term, for the watchdog.
        self.runs = RunTable()
        #: The watchdog's alarm (:mod:`celery_leader.term_end.alarm`), once one guards the group.
        self.wakeup: Alarm | None = None

    def nudge(self, deadline: float) -> None:
        """Tell the watchdog, if one sleeps, that a term may end at *deadline* (lease clock)."""
        wakeup = self.wakeup
        if wakeup is not None:
            wakeup.nudge(deadline)

    def add(self, name: str) -> SharedLease:
        """The slot of election *name*, made on first use (before the pool forks)."""
        found = self._by_name.get(name)
        return found if found is not None else SharedLease(name, group=self)

    def _register(self, lease: SharedLease) -> int:
        if lease.name in self._by_name:
            raise ValueError(f"election {lease.name!r} has a shared lease slot already")
        if len(self._by_index) >= self._capacity:
            raise ValueError(f"one process takes part in at most {self._capacity} elections")
        self._by_name[lease.name] = lease
        self._by_index.append(lease)
        return len(self._by_index) - 1

    def get(self, name: str) -> SharedLease | None:
        """The slot of election *name*, or None when this process does not take part in it."""
        return self._by_name.get(name)

    def at(self, index: int) -> SharedLease | None:
        """The slot at *index* (as the run table records it), or None."""
        return self._by_index[index] if 0 <= index < len(self._by_index) else None

    def __iter__(self) -> Iterator[SharedLease]:
        return iter(list(self._by_index))


class SharedLease:
    """Token and validity of one election's current term, shared with forked children.

    Only the worker's main process writes (under the group's thread lock);
    any process may read. A token of 0 means "no valid lease". Made alone
    (``SharedLease()``), it is the only election of a group of its own.
    """

    def __init__(self, name: str = "", *, group: SharedLeases | None = None) -> None:
        self.name = name
        self.group = group if group is not None else SharedLeases(capacity=1)
        #: This election's index in its group, recorded with each of its runs.
        self.election = self.group._register(self)
        self._mem = self.group._mem
        self._offset = self.election * _LAYOUT.size
        self._write_lock = self.group._write_lock
        self._mem[self._offset : self._offset + _LAYOUT.size] = _LAYOUT.pack(0, 0, 0.0, 0)
        #: What this process last wrote, read instead of the memory while it is the writer
        #: (None in a forked child: see the module docstring).
        self._written: tuple[int, int, float, int] | None = (0, 0, 0.0, 0)
        _WRITERS.add(self)

    @property
    def owner_pid(self) -> int:
        """The process that writes (the worker's main process)."""
        return self.group.owner_pid

    @property
    def runs(self) -> RunTable:
        """The run table shared by every election of the group."""
        return self.group.runs

    def _write(self, token: int, valid_until: float, revoked_through: int) -> None:
        at = self._offset
        (seq,) = _SEQ.unpack_from(self._mem, at)
        _SEQ.pack_into(self._mem, at, seq + 1)  # odd: write in progress
        struct.pack_into("=qdq", self._mem, at + _SEQ.size, token, valid_until, revoked_through)
        _SEQ.pack_into(self._mem, at, seq + 2)
        if self._written is not None:
            self._written = (seq + 2, token, valid_until, revoked_through)

    def publish(self, token: int, valid_until: float) -> bool:
        """Announce that term *token* is valid until *valid_until* (lease clock).

        Returns False, changing nothing, when *token* was revoked already.
        """
        with self._write_lock:
            _, current, _, revoked_through = self._read_raw()
            if token <= revoked_through:
                return False
            self._write(token, valid_until, revoked_through)
        # Runs of another term end now; a validity that ends before the
        # watchdog's next look must wake it.
        self.group.nudge(-math.inf if current not in (0, token) else valid_until)
        return True

    def revoke(self, token: int | None = None) -> None:
        """End term *token* (default: the current one) and every older term, for good.

        A newer term already published stays valid: revoking an old term
        late (its LOST handled after the next election) must not end it.
        """
        with self._write_lock:
            _, current, valid_until, revoked_through = self._read_raw()
            ended = max(revoked_through, current if token is None else token)
            if current > ended:
                self._write(current, valid_until, ended)
            else:
                self._write(0, 0.0, ended)
        self.group.nudge(-math.inf)  # the revoked term's runs end now

    def _read_raw(self) -> tuple[int, int, float, int]:
        written = self._written
        if written is not None:
            return written
        memory, at = self._mem, self._offset
        for _ in range(_RETRIES):
            raw = _LAYOUT.unpack_from(memory, at)
            if raw[0] % 2 == 0 and _SEQ.unpack_from(memory, at)[0] == raw[0]:
                return raw
        return (0, 0, 0.0, 2**63 - 1)  # a writer that never finishes: fail closed

    def read(self) -> tuple[int, float]:
        """The current ``(token, valid_until)``; ``(0, 0.0)`` when none is valid."""
        _, token, valid_until, _ = self._read_raw()
        return token, valid_until

    def valid_for(self, token: int | None, *, now: float | None = None) -> bool:
        """True while *token* is the current term's and its validity has not run out.

        *now* is the lease-clock time to judge at (default: :func:`clock.now`);
        the simulation passes its virtual clock.
        """
        return self.deadline_of(token, now=now) is not None

    def deadline_of(self, token: int | None, *, now: float | None = None) -> float | None:
        """The ``valid_until`` of term *token* while it is valid (:meth:`valid_for`), else None."""
        _, current, valid_until, _ = self._read_raw()  # not read(): one call less per run
        at = clock.now() if now is None else now
        return valid_until if token and current == token and at < valid_until else None
