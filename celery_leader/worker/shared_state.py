"""The lease as pool children see it: token and validity in shared memory.

Prefork children are forked copies: they cannot see the parent's lease
manager. The worker creates one :class:`SharedLease` before the pool forks;
the parent publishes every change (elected, renewed, lost) into it and
children read it. Reads never block and take no lock: a sequence counter
(even = stable) makes a torn read retry.

Times are ``time.monotonic()`` values, comparable across processes on one
host (Linux ``CLOCK_MONOTONIC`` is system-wide).
"""

from __future__ import annotations

import mmap
import struct
import threading
import time

_LAYOUT = struct.Struct("=qqd")  # sequence, token, valid_until
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
        self._mem[:] = _LAYOUT.pack(0, 0, 0.0)

    def publish(self, token: int, valid_until: float) -> None:
        """Announce that term *token* is valid until *valid_until* (monotonic)."""
        with self._write_lock:
            seq = _LAYOUT.unpack(self._mem[:])[0]
            self._mem[0:8] = struct.pack("=q", seq + 1)  # odd: write in progress
            self._mem[8 : _LAYOUT.size] = struct.pack("=qd", token, valid_until)
            self._mem[0:8] = struct.pack("=q", seq + 2)

    def revoke(self) -> None:
        """Announce that no term is valid any more."""
        self.publish(0, 0.0)

    def read(self) -> tuple[int, float]:
        """The current ``(token, valid_until)``; ``(0, 0.0)`` when none is valid."""
        for _ in range(_RETRIES):
            seq, token, valid_until = _LAYOUT.unpack(self._mem[:])
            if seq % 2 == 0 and _LAYOUT.unpack(self._mem[:])[0] == seq:
                return token, valid_until
        return 0, 0.0  # a writer that never finishes: fail closed

    def valid_for(self, token: int | None) -> bool:
        """True while *token* is the current term's and its validity has not run out."""
        current, valid_until = self.read()
        return bool(token) and current == token and time.monotonic() < valid_until

    def time_left(self, token: int | None) -> float:
        """Seconds left in term *token*, or 0 when it is not the valid term."""
        current, valid_until = self.read()
        if not token or current != token:
            return 0.0
        return max(0.0, valid_until - time.monotonic())
