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

Times are on the lease clock (:func:`celery_leader.clock.now`), one clock for
every process of a host.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading

from celery_leader import clock
from celery_leader.run_table import RunTable

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
        """Announce that term *token* is valid until *valid_until* (lease clock).

        Returns False, changing nothing, when *token* was revoked already.
        """
        with self._write_lock:
            _, _, _, revoked_through = self._read_raw()
            if token <= revoked_through:
                return False
            self._write(token, valid_until, revoked_through)
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

    def valid_for(self, token: int | None, *, now: float | None = None) -> bool:
        """True while *token* is the current term's and its validity has not run out.

        *now* is the lease-clock time to judge at (default: :func:`clock.now`);
        the simulation passes its virtual clock.
        """
        current, valid_until = self.read()
        at = clock.now() if now is None else now
        return bool(token) and current == token and at < valid_until
