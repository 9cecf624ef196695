"""The watchdog's alarm clock: it sleeps until the earliest deadline it guards, and is woken early.

The watchdog (:mod:`celery_leader.term_end.watchdog`) must end a
``terminate`` run within moments of its term's deadline or revocation. It
does not poll for that. It publishes here the lease-clock time it will next
look (``wake_at``) and sleeps until then on a pipe. Whoever makes a deadline
earlier than ``wake_at`` writes one byte to the pipe:

* the worker's main process when it revokes a term or publishes a validity
  that ends sooner (:meth:`SharedLease.revoke`, :meth:`SharedLease.publish`);
* a pool child that registers a ``terminate`` run whose term ends before
  ``wake_at``.

While the watchdog is in a pass, ``wake_at`` is infinite, so a run
registered during the pass (and perhaps missed by it) always wakes the next
sleep. A deadline needs no wake-up: the watchdog sleeps no later than the
earliest deadline it saw, so a stopped or stuck main process, which writes
nothing, cannot delay a kill.

The pipe and the shared ``wake_at`` are made before the pool forks (every
child inherits them); a write never blocks (a full pipe already means
"wake up"), and never lands elsewhere: a process that closed the inherited
pipe and got its number back for another file writes nothing.

Assumptions. A child writes its run and then reads ``wake_at``; the
watchdog writes ``wake_at`` and then reads the runs. Neither side can put a
memory fence between its write and its read, so in theory each could miss
the other's write (the store-buffer pattern). A CPU holds a write back for
nanoseconds; each side runs many Python instructions (microseconds) between
the two, so in practice both writes are visible. Sleeps are measured on
``CLOCK_MONOTONIC``, deadlines on the lease clock (``CLOCK_BOOTTIME``): after
a host suspend the watchdog finishes its sleep (at most its heartbeat)
before it looks again.
"""

from __future__ import annotations

import math
import mmap
import os
import select
import struct
from contextlib import suppress

from celery_leader import clock

_WAKE_AT = struct.Struct("=d")


class Wakeup:
    """A pipe and a shared ``wake_at`` time: one sleeper, any number of nudgers."""

    def __init__(self) -> None:
        self._wake_at = mmap.mmap(-1, _WAKE_AT.size)
        _WAKE_AT.pack_into(self._wake_at, 0, math.inf)
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        # Which pipe the write end is, so a reused descriptor number is never written to.
        found = os.fstat(self._write_fd)
        self._pipe = (found.st_dev, found.st_ino)
        self.closed = False
        # poll(), not select(): select() refuses descriptors numbered 1024 and above.
        self._poller = select.poll()
        self._poller.register(self._read_fd, select.POLLIN)

    @property
    def wake_at(self) -> float:
        """The lease-clock time the sleeper will next look (infinite while it is awake)."""
        return float(_WAKE_AT.unpack_from(self._wake_at, 0)[0])

    def nudge(self, deadline: float) -> bool:
        """Wake the sleeper when *deadline* (lease clock) comes before its next look.

        Returns True when it wrote the wake-up byte. Any process may call it.
        """
        if deadline >= self.wake_at or self.closed:
            return False
        # A full pipe already wakes the sleeper; a closed one means no sleeper is left.
        with suppress(BlockingIOError, OSError):
            found = os.fstat(self._write_fd)
            if (found.st_dev, found.st_ino) == self._pipe:
                os.write(self._write_fd, b"\0")
        return True

    def awake(self) -> None:
        """The sleeper starts a pass: every nudge wakes its next sleep."""
        _WAKE_AT.pack_into(self._wake_at, 0, math.inf)

    def sleep_until(self, until: float) -> bool:
        """Sleep until lease-clock time *until* or a nudge, whichever is first; True if nudged.

        *until* is published before the sleep, so a nudge for a deadline
        before it, sent at any moment after, ends the sleep at once.
        """
        _WAKE_AT.pack_into(self._wake_at, 0, until)
        timeout = max(0.0, until - clock.now())
        # Milliseconds, rounded up: waking a little late is fine, a busy loop is not.
        ready = self._poller.poll(math.ceil(timeout * 1000) if math.isfinite(timeout) else None)
        if not ready:
            return False
        with suppress(BlockingIOError, OSError):
            while os.read(self._read_fd, 512):
                pass
        return True

    def close(self) -> None:
        """Close both ends of the pipe in this process (once; nudges then do nothing)."""
        if self.closed:
            return
        self.closed = True
        with suppress(KeyError, ValueError):
            self._poller.unregister(self._read_fd)
        for fd in (self._read_fd, self._write_fd):
            with suppress(OSError):
                os.close(fd)
