"""Which pool child runs leader work under which term: shared memory for the watchdog.

Made before the pool forks, like :class:`~celery_leader.elections.shared_lease.SharedLease`.
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
pid *and* start time (:mod:`celery_leader.elections.procinfo`), no longer runs:
a definite answer from ``/proc``. While ``/proc`` cannot answer (out of
descriptors or memory), the run counts as running.

A sequence number per slot (odd while a write is in progress) makes a torn
read retry. A writer killed between its first and last write (the watchdog's
kill, the parent's, a hard time limit, the OOM killer) leaves its slot torn:

* the next writer of the slot starts from the next odd number whatever
  parity it finds, so its own record reads whole (a torn slot heals at the
  next write instead of hiding every later run of that pool index);
* every writer names itself (pid, start time, election) in the slot before
  it starts (a run's end is written by the process whose start named it
  already), so a reader that finds a slot torn for good knows who tore it.
  A writer that is gone left nothing running. A writer that still runs is
  inside :meth:`SlotWriter.enter` or :meth:`SlotWriter.leave`, before or after
  a run's body and never in it (a run checks its term again after
  ``enter``), so it is reported as a run of every term of its election
  (:data:`EVERY_TERM`) that the release guard waits for, without the
  ``terminate`` flag: nothing is killed for being slow to write.

A run whose process start time could not be read is recorded with start
time 0; it counts as running while its pid runs and is a child of the
process that made the table (only pool children write), so a pid reused by
an unrelated process is never taken for it.
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import NamedTuple

from celery_leader.elections import procinfo

#: Run slots, one per pool child index (billiard numbers children 0..n-1).
#: A prefork worker with more processes than this is refused at start.
RUN_SLOTS = 1024
#: Kills remembered for the parent, newest last; older ones are overwritten.
KILL_RING = 128

_SLOT = struct.Struct("=q3q5q")  # sequence, writer (3), pid, token, flags, start time, election
_SEQ = struct.Struct("=q")
#: A slot's size in 8-byte words (its sequence number is the first).
_SLOT_WORDS = _SLOT.size // _SEQ.size
#: At offset 8: the process writing (or that last wrote) the slot: pid, start time, election.
_WRITER = struct.Struct("=qqq")
_BODY = struct.Struct("=qqqqq")  # at offset 16: pid, token, flags, start time, election
_KILL = struct.Struct("=qqqq")  # pid, token, start time, election
_HEAD = struct.Struct("=q")  # kills recorded so far
_TERMINATE = 1
_RETRIES = 1000
#: The token of a run whose slot cannot be read: it counts as a run of every term.
EVERY_TERM = 2**63 - 1


class Run(NamedTuple):
    """One slot: a leader run of *election*'s term *token* in process *pid* (since *started*).

    *election* is the index of the election's slot in its
    :class:`~celery_leader.elections.shared_lease.SharedLeases` group; tokens compare
    only within one election.
    """

    slot_index: int
    pid: int
    token: int
    terminate: bool
    started: int
    election: int = 0

    def running(self, owner_pid: int) -> procinfo.Liveness:
        """Whether the process named here still runs (and is the same process).

        With its start time unknown (0), the pid must still run and be a
        child of *owner_pid* (the worker's main process, which made the
        table): fail closed, without taking a reused pid for the run.
        ``UNKNOWN`` when ``/proc`` cannot answer: callers count it as running.
        """
        if not self.started:
            return procinfo.liveness(self.pid, parent=owner_pid)
        return procinfo.liveness(self.pid, self.started)

    def of_term(self, token: int, election: int | None = None) -> bool:
        """True for a run of *election*'s term *token* or an older one (unknown: every term).

        With *election* None, the run's election is not looked at.
        """
        if election is not None and self.election != election:
            return False
        return self.token <= token or self.token == EVERY_TERM


class RunTable:
    """Leader runs of the pool's children, and the watchdog's kills."""

    def __init__(self) -> None:
        self._slots = mmap.mmap(-1, _SLOT.size * RUN_SLOTS)
        # The same memory as 8-byte words: a sequence number is read and written as
        # one word (an aligned 8-byte store, as struct's would be) without a struct
        # call, twice per write. Never closed, so the view never blocks a close.
        self._words = memoryview(self._slots).cast("q")
        # One byte per slot, set before a run is written and cleared after it
        # is emptied: readers find the slots in use with one C-level search
        # instead of unpacking every slot (the watchdog reads 100 times a second).
        self._occupied = mmap.mmap(-1, RUN_SLOTS)
        self._kills = mmap.mmap(-1, _HEAD.size + _KILL.size * KILL_RING)
        #: The process that made the table (the worker's main process): every
        #: writer is its child.
        self.owner_pid = os.getpid()

    # -- slots (each written by its own child) --------------------------------

    def writer(self, index: int, pid: int, started: int) -> SlotWriter:
        """What process *pid* (started at *started*), pool child *index*, writes: see SlotWriter."""
        return SlotWriter(self, index, pid, started)

    def enter(self, index: int, token: int, *, terminate: bool, election: int = 0) -> None:
        """Record that the calling process (pool child *index*) runs *election*'s term *token*."""
        own = self.writer(index, procinfo.own_pid(), procinfo.own_start_time())
        own.enter(token, terminate=terminate, election=election)

    def leave(self, index: int, election: int = 0) -> None:
        """Record that the leader run of pool child *index* (of *election*) ended.

        Called by the process whose :meth:`enter` recorded the run, so the
        slot's writer fields already name it.
        """
        self.writer(index, procinfo.own_pid(), 0).leave(election)

    def _write(  # noqa: PLR0917 - the slot's fields, in their order
        self, index: int, pid: int, token: int, flags: int, started: int, election: int = 0
    ) -> None:
        """Write slot *index* as process *pid* would: a run's start, or with *pid* 0 its end.

        Tests plant the runs of other processes with it. A start names *pid*
        in the slot's writer fields, as a real start does.
        """
        slot = self.writer(index, pid, started)
        if pid:
            slot.enter(token, terminate=bool(flags & _TERMINATE), election=election)
        else:
            slot.leave(election)

    def _read(self, index: int) -> tuple[bool, Run | None]:
        """One read of slot *index*: (consistent, its run); not consistent mid-write."""
        offset = index * _SLOT.size
        seq, *_writer, pid, token, flags, started, election = _SLOT.unpack_from(self._slots, offset)
        if seq % 2 or self._words[index * _SLOT_WORDS] != seq:
            return False, None
        if not pid:
            return True, None
        return True, Run(index, pid, token, bool(flags & _TERMINATE), started, election)

    def slot(self, index: int) -> Run | None:
        """Slot *index*, read consistently; None when empty.

        A slot torn for good (see the module docstring) reads as None when
        its writer is gone, and as a run of :data:`EVERY_TERM` of the
        writer's election, in the writer's process, while that process runs.
        """
        for _ in range(_RETRIES):
            consistent, found = self._read(index)
            if consistent:
                return found
        writer, started, election = _WRITER.unpack_from(self._slots, index * _SLOT.size + _SEQ.size)
        run = Run(index, writer, EVERY_TERM, False, started, election)
        if writer <= 0 or run.running(self.owner_pid) is procinfo.Liveness.GONE:
            return None  # killed mid-write: nothing runs under this slot
        return run

    def busy(self) -> list[Run]:
        """The slots in use (stale ones included), each read consistently.

        The occupancy bytes name the candidate slots (a slot being written,
        or left torn, is occupied too); each is then read with its sequence
        check.
        """
        occupied = self._occupied[:]
        found = []
        index = occupied.find(1)
        while index != -1:
            run = self.slot(index)
            if run is not None:
                found.append(run)
            index = occupied.find(1, index + 1)
        return found

    def running(self, token: int, exclude_pid: int = 0, election: int | None = None) -> list[Run]:
        """Runs of *election*'s term *token* or older whose process still runs.

        Unreadable slots are included, and so are runs whose process
        ``/proc`` cannot tell about (fail closed: only a definite "gone"
        drops a run). With *election* None, runs of every election whose
        token is at most *token*.
        """
        return [
            run
            for run in self.busy()
            if run.of_term(token, election)
            and run.pid != exclude_pid
            and run.running(self.owner_pid) is not procinfo.Liveness.GONE
        ]

    # -- kills (written by the watchdog) --------------------------------------

    def record_kill(self, run: Run) -> None:
        """Remember that the watchdog killed *run* at the end of its term."""
        (head,) = _HEAD.unpack_from(self._kills, 0)
        offset = _HEAD.size + (head % KILL_RING) * _KILL.size
        _KILL.pack_into(self._kills, offset, run.pid, run.token, run.started, run.election)
        _HEAD.pack_into(self._kills, 0, head + 1)

    def was_killed(self, pid: int, token: int, election: int = 0) -> bool:
        """True when the watchdog killed process *pid* running *election*'s term *token*."""
        for index in range(KILL_RING):
            killed_pid, killed_token, _, killed_election = _KILL.unpack_from(
                self._kills, _HEAD.size + index * _KILL.size
            )
            if (killed_pid, killed_token, killed_election) == (pid, token, election):
                return True
        return False


class SlotWriter:
    """One pool child's writes to its own slot: a run's start and its end.

    The slot's place and the writer's identity (pid, start time) are worked
    out once, when the writer is made (:meth:`RunTable.writer`; a pool child
    keeps its own, see :func:`celery_leader.term_end.in_run.watch_run`). A
    run's start and end come at a pool child's coldest moment (it slept
    until its job came), where each lookup costs a cache miss: what is left
    per run is two word writes around one or two struct writes.

    The write protocol (see the module docstring): the sequence number goes
    odd, the body is written, the number goes even. The first odd number is
    the next one after whatever the slot holds, so a slot left odd by a
    writer killed mid-write reads whole after the next write. A start names
    its writer before the number goes odd; an end leaves the writer fields,
    which the start of the same run wrote.
    """

    __slots__ = (
        "_body_at",
        "_occupied",
        "_seq_at",
        "_slots",
        "_words",
        "_writer_at",
        "index",
        "pid",
        "started",
    )

    def __init__(self, table: RunTable, index: int, pid: int, started: int) -> None:
        self.index, self.pid, self.started = index, pid, started
        offset = index * _SLOT.size
        self._words, self._seq_at = table._words, index * _SLOT_WORDS
        self._slots, self._occupied = table._slots, table._occupied
        self._writer_at = offset + _SEQ.size
        self._body_at = self._writer_at + _WRITER.size

    def enter(self, token: int, *, terminate: bool, election: int) -> None:
        """Record that this writer runs *election*'s term *token*."""
        words, at, pid, started = self._words, self._seq_at, self.pid, self.started
        self._occupied[self.index] = 1
        seq = words[at]
        begin = seq + 1 if seq % 2 == 0 else seq + 2
        _WRITER.pack_into(self._slots, self._writer_at, pid, started, election)
        words[at] = begin  # odd: write in progress
        flags = _TERMINATE if terminate else 0
        _BODY.pack_into(self._slots, self._body_at, pid, token, flags, started, election)
        words[at] = begin + 1

    def leave(self, election: int) -> None:
        """Record that the run this writer entered ended."""
        words, at = self._words, self._seq_at
        seq = words[at]
        begin = seq + 1 if seq % 2 == 0 else seq + 2
        words[at] = begin  # odd: write in progress
        _BODY.pack_into(self._slots, self._body_at, 0, 0, 0, 0, election)
        words[at] = begin + 1
        self._occupied[self.index] = 0
