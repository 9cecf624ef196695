"""The dead-man's switch: a process per prefork worker that ends runs at their term's deadline.

See :mod:`celery_leader.term_end` for where it stands among the layers.
"""

from __future__ import annotations

import logging
import mmap
import os
import signal
import struct
import time
from contextlib import suppress

from celery_leader import clock
from celery_leader.elections.procinfo import parent_of, process_ended
from celery_leader.elections.run_table import RUN_SLOTS, Run
from celery_leader.elections.shared_lease import SharedLease, SharedLeases

logger = logging.getLogger(__name__)

_BEAT = struct.Struct("=d")

#: How often the watchdog reads the shared leases and the run table, in seconds.
WATCH_INTERVAL = 0.01
#: A watchdog whose last pass is older than this (seconds) counts as dead: stopped
#: (SIGSTOP), stuck, or starved so long that it would not end runs on time.
STALE_AFTER = 1.0


def past_deadline(group: SharedLeases, run: Run, *, now: float | None = None) -> bool:
    """True when *run* is a ``terminate`` run whose term is not valid at *now*.

    The watchdog's decision, without I/O: *run* is judged against its own
    election's slot in *group*; a run of an election the group does not
    know is never valid (a slot that cannot be read is not a ``terminate``
    run: its writer is before or after a body, never in it). *now* is the
    lease-clock time to judge at (default: the lease clock; the simulation
    passes its virtual clock).
    """
    if not run.terminate or run.pid <= 0:
        return False
    lease = group.at(run.election)
    return lease is None or not lease.valid_for(run.token, now=now)


def enforce_deadlines(
    shared: SharedLease | SharedLeases, worker_pid: int, done: set[tuple[int, int]] | None = None
) -> list[int]:
    """One pass of the watchdog: SIGKILL each ``terminate`` run whose term is not valid now.

    Each run is judged against its own election's slot (*shared* is the
    group, or any slot of it). A run's term stops being valid when it is
    revoked or when its published validity has passed; a run of an election
    the group does not know, or whose slot could not be read, is never
    valid. A run is killed only while its process is the one that wrote the
    slot (same pid and start time, or the pid alone when the start time is
    unknown) and a child of *worker_pid*, so a stale slot whose pid was
    reused by another process is never acted on. Each kill is recorded for
    the parent (:meth:`RunTable.record_kill`). *done* remembers ``(pid,
    start time)`` already killed, across passes. Returns the pids killed.
    """
    group = shared if isinstance(shared, SharedLeases) else shared.group
    killed = []
    done = set() if done is None else done
    for run in group.runs.busy():
        if (run.pid, run.started) in done or not past_deadline(group, run):
            continue
        if run.running(worker_pid) and parent_of(run.pid) == worker_pid:
            group.runs.record_kill(run)  # before the kill: the parent may see the death first
            with suppress(ProcessLookupError):
                os.kill(run.pid, signal.SIGKILL)
                killed.append(run.pid)
        done.add((run.pid, run.started))
    if len(done) > 4 * RUN_SLOTS:
        done.clear()  # kept small; a stale entry only costs one more /proc read
    return killed


class Watchdog:
    """A small process per prefork worker that ends runs at their term's deadline.

    It is forked from the worker's main process before the pool. Every
    :data:`WATCH_INTERVAL` seconds it reads the shared lease and the run
    table, and SIGKILLs the pool children whose run's term was revoked or
    ran out (:func:`enforce_deadlines`). Being its own process, it acts when
    the main process is stopped or stuck, when the lease thread waits on a
    store call, and when the run holds the GIL in C code. It exits when the
    worker's main process is gone.
    """

    def __init__(
        self, shared: SharedLease | SharedLeases, interval: float = WATCH_INTERVAL
    ) -> None:
        self._shared = shared if isinstance(shared, SharedLeases) else shared.group
        self._interval = interval
        self.pid: int | None = None
        # The lease-clock time of the watchdog's last pass, written by it after each
        # pass: a process that exists but no longer passes is as good as dead.
        self._heartbeat = mmap.mmap(-1, _BEAT.size)

    def start(self) -> None:
        """Fork the watchdog (call before the pool forks, with as few threads as possible)."""
        worker_pid = os.getpid()
        _BEAT.pack_into(self._heartbeat, 0, clock.now())  # the new one's grace to start
        pid = os.fork()
        if pid == 0:  # the watchdog
            code = 0
            try:
                for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1"):
                    signal.signal(getattr(signal, name), signal.SIG_IGN)
                done: set[tuple[int, int]] = set()
                while os.getppid() == worker_pid:
                    # One bad pass must not end the watch.
                    with suppress(Exception):
                        enforce_deadlines(self._shared, worker_pid, done)
                    _BEAT.pack_into(self._heartbeat, 0, clock.now())
                    time.sleep(self._interval)
            except BaseException:  # noqa: BLE001 - never run the worker's cleanup here
                code = 1
            finally:
                os._exit(code)
        self.pid = pid
        logger.info("celery-leader: run watchdog started (pid %d)", pid)

    def last_pass_age(self) -> float:
        """Seconds since the watchdog's last pass (since its start, before the first)."""
        (last,) = _BEAT.unpack_from(self._heartbeat, 0)
        return max(0.0, clock.now() - float(last))

    def alive(self) -> bool:
        """True while the watchdog runs and passes (its last pass within :data:`STALE_AFTER`)."""
        if self.pid is None or process_ended(self.pid):
            return False
        return self.last_pass_age() < STALE_AFTER

    def restart(self) -> None:
        """End a watchdog that died or stopped passing, reap it, and fork a new one.

        Forking from a process with threads is safe here because the
        watchdog's loop takes no lock another thread could hold: it reads
        shared memory and ``/proc``, sends signals and sleeps.
        """
        pid, self.pid = self.pid, None
        if pid is not None:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # a stopped or stuck one never exits by itself
            with suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self.start()

    def stop(self) -> None:
        """End the watchdog and reap it."""
        pid, self.pid = self.pid, None
        if pid is None:
            return
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with suppress(ChildProcessError):
            os.waitpid(pid, 0)
