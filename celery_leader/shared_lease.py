"""The lease as the places where work runs see it: token and validity in shared memory.

Prefork children are forked copies: they cannot see the parent's lease
manager. The worker creates one :class:`SharedLease` before the pool forks;
the parent publishes every change (elected, renewed, revoked) into it and
children read it. Reads never block and take no lock: a sequence counter
(even = stable) makes a torn read retry.

Guarantees:

* **Validity ends by itself.** A term is valid only until the ``valid_until``
  last published for it; nobody has to write anything for it to end.
* **Revocation is sticky.** Once term ``T`` is revoked, no later
  :meth:`SharedLease.publish` of ``T`` (or of any older term) makes it valid
  again: a renewal that races a step-down cannot undo it.

Times are ``time.monotonic()`` values, comparable across processes on one
host (Linux ``CLOCK_MONOTONIC`` is system-wide).
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time

_LAYOUT = struct.Struct("=qqdq")  # sequence, token, valid_until, revoked_through
_RETRIES = 1000


class SharedLease:
    """Token and validity of the current term, shared with forked children.

    Only the worker's main process writes (under a thread lock); any process
    may read. A token of 0 means "no valid lease".
    """

    def __init__(self) -> None:
        # An anonymous mapping is MAP_SHARED: forked children see our writes.
        self._mem = mmap.mmap(-1, _LAYOUT.size)
        self._write_lock = threading.Lock()
        self._mem[:] = _LAYOUT.pack(0, 0, 0.0, 0)
        #: The process that writes (the worker's main process).
        self.owner_pid = os.getpid()
        #: Which pool child runs which term, for the watchdog.
        self.runs = RunTable()

    def _write(self, token: int, valid_until: float, revoked_through: int) -> None:
        seq = _LAYOUT.unpack(self._mem[:])[0]
        self._mem[0:8] = struct.pack("=q", seq + 1)  # odd: write in progress
        self._mem[8 : _LAYOUT.size] = struct.pack("=qdq", token, valid_until, revoked_through)
        self._mem[0:8] = struct.pack("=q", seq + 2)

    def publish(self, token: int, valid_until: float) -> bool:
        """Announce that term *token* is valid until *valid_until* (monotonic).

        Returns False, changing nothing, when *token* was revoked already.
        """
        with self._write_lock:
            _, _, _, revoked_through = self._read_raw()
            if token <= revoked_through:
                return False
            self._write(token, valid_until, revoked_through)
            return True

    def revoke(self, token: int | None = None) -> None:
        """End term *token* (default: the current one) and every older term, for good."""
        with self._write_lock:
            current, _, _, revoked_through = self._read_raw()
            ended = max(revoked_through, current if token is None else token)
            self._write(0, 0.0, ended)

    def _read_raw(self) -> tuple[int, int, float, int]:
        for _ in range(_RETRIES):
            raw = _LAYOUT.unpack(self._mem[:])
            if raw[0] % 2 == 0 and _LAYOUT.unpack(self._mem[:])[0] == raw[0]:
                return raw
        return (0, 0, 0.0, 2**63 - 1)  # a writer that never finishes: fail closed

    def read(self) -> tuple[int, float]:
        """The current ``(token, valid_until)``; ``(0, 0.0)`` when none is valid."""
        _, token, valid_until, _ = self._read_raw()
        return token, valid_until

    def valid_for(self, token: int | None) -> bool:
        """True while *token* is the current term's and its validity has not run out."""
        current, valid_until = self.read()
        return bool(token) and current == token and time.monotonic() < valid_until


_SLOT = struct.Struct("=qqq")  # sequence, pid, token
#: Run slots, one per pool child index (billiard numbers children 0..n-1).
RUN_SLOTS = 256


class RunTable:
    """Which pool child runs a ``terminate`` leader task under which term.

    Shared memory made before the pool forks. A child writes only its own
    slot, the one of its billiard process index. The watchdog reads every
    slot, and clears the slot of a child it killed. A slot is read
    consistently (a sequence number makes a torn read retry) before anyone
    acts on it.
    """

    def __init__(self) -> None:
        self._mem = mmap.mmap(-1, _SLOT.size * RUN_SLOTS)

    def _write(self, index: int, pid: int, token: int) -> None:
        offset = index * _SLOT.size
        (seq,) = struct.unpack_from("=q", self._mem, offset)
        struct.pack_into("=q", self._mem, offset, seq + 1)  # odd: write in progress
        struct.pack_into("=qq", self._mem, offset + 8, pid, token)
        struct.pack_into("=q", self._mem, offset, seq + 2)

    def enter(self, index: int, token: int) -> None:
        """Record that the calling process (pool child *index*) runs a task of *token*."""
        self._write(index, os.getpid(), token)

    def leave(self, index: int) -> None:
        """Record that the leader run of pool child *index* ended."""
        self._write(index, 0, 0)

    def clear(self, index: int, pid: int) -> None:
        """Forget slot *index* if it still names *pid* (its process is gone)."""
        if self.slot(index)[0] == pid:
            self._write(index, 0, 0)

    def slot(self, index: int) -> tuple[int, int]:
        """``(pid, token)`` of slot *index*, read consistently; ``(0, 0)`` when empty."""
        offset = index * _SLOT.size
        for _ in range(_RETRIES):
            seq, pid, token = _SLOT.unpack_from(self._mem, offset)
            if seq % 2 == 0 and struct.unpack_from("=q", self._mem, offset)[0] == seq:
                return pid, token
        return 0, 0

    def busy(self) -> list[tuple[int, int, int]]:
        """``(index, pid, token)`` of the slots in use, each read consistently.

        One bulk copy finds candidate slots cheaply; each is then re-read
        with its sequence check.
        """
        found = []
        for index, (_, candidate, _) in enumerate(_SLOT.iter_unpack(bytes(self._mem))):
            if candidate:
                pid, token = self.slot(index)
                if pid:
                    found.append((index, pid, token))
        return found
