"""The dead-man's switch: a process per prefork worker that ends runs at their term's deadline.

See :mod:`celery_leader.term_end` for where it stands among the layers.
"""

from __future__ import annotations

import logging
import math
import mmap
import os
import signal
import struct
import threading
import time
from contextlib import suppress

from celery_leader import clock
from celery_leader.elections.procinfo import Liveness, liveness, process_ended
from celery_leader.elections.run_table import RUN_SLOTS, Run
from celery_leader.elections.shared_lease import SharedLease, SharedLeases
from celery_leader.term_end.alarm import Wakeup

logger = logging.getLogger(__name__)

_BEAT = struct.Struct("=dq")  # last pass (lease clock), passes so far

#: How late after a deadline or a revocation the watchdog may end a run, in seconds:
#: its wake-up and one pass (the simulation models the watchdog on this grid).
WATCH_INTERVAL = 0.01
#: A watchdog whose last pass is older than this (seconds) counts as dead: stopped
#: (SIGSTOP), stuck, or starved so long that it would not end runs on time.
STALE_AFTER = 1.0
#: How long before the end of a published term a watchdog that stopped passing must be
#: replaced at the latest (seconds): the time to end it and fork a new one, with room.
RESTART_ROOM = 0.1
#: The longest the watchdog sleeps with nothing to guard (seconds): it passes this
#: often to show it is alive (well within STALE_AFTER) and to notice its worker is gone.
HEARTBEAT = STALE_AFTER / 4


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


def earliest_deadline(group: SharedLeases, *, now: float | None = None) -> float:
    """The lease-clock time the first ``terminate`` run still in its term is due to end.

    Infinite when there is none. Runs whose term is over already are not
    counted: the pass that saw them acted on them (killed them, or found
    them gone).
    """
    at = clock.now() if now is None else now
    earliest = math.inf
    for run in group.runs.busy():
        if not run.terminate or run.pid <= 0:
            continue
        lease = group.at(run.election)
        if lease is None:
            continue
        token, valid_until = lease.read()
        if token == run.token and at < valid_until < earliest:
            earliest = valid_until
    return earliest


def enforce_deadlines(
    shared: SharedLease | SharedLeases,
    worker_pid: int,
    done: set[tuple[int, int]] | None = None,
    *,
    now: float | None = None,
    unsure: list[Run] | None = None,
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
    start time)`` already killed or found gone, across passes. *now* is the
    lease-clock time to judge at (default: the lease clock). Returns the pids
    killed.

    A run whose process ``/proc`` cannot tell about (out of descriptors or
    memory) is neither killed nor done: it is added to *unsure* and judged
    again at the next pass, which :func:`watch_pass` makes come within
    :data:`WATCH_INTERVAL`. Only a definite answer (gone, or its pid now names
    another process) lets a run go unkilled for good.
    """
    group = shared if isinstance(shared, SharedLeases) else shared.group
    killed = []
    done = set() if done is None else done
    for run in group.runs.busy():
        if (run.pid, run.started) in done or not past_deadline(group, run, now=now):
            continue
        # One read: the same process (start time, when known) and the worker's child.
        state = liveness(run.pid, run.started, parent=worker_pid)
        if state is Liveness.UNKNOWN:
            if unsure is not None:
                unsure.append(run)
            continue  # not done: looked at again next pass
        if state is Liveness.RUNNING:
            group.runs.record_kill(run)  # before the kill: the parent may see the death first
            with suppress(ProcessLookupError):
                os.kill(run.pid, signal.SIGKILL)
                killed.append(run.pid)
        done.add((run.pid, run.started))
    if len(done) > 4 * RUN_SLOTS:
        done.clear()  # kept small; a stale entry only costs one more /proc read
    return killed


def watch_pass(
    group: SharedLeases, worker_pid: int, done: set[tuple[int, int]], now: float
) -> float:
    """One pass at lease-clock time *now*: the kills due, then when the next one is due.

    Both halves judge at the same *now*: a run still valid when the kills
    are decided is counted for the next wake-up, however late in the pass
    its deadline falls, so no run is slept past. Returns the lease-clock
    time of the next deadline (infinite when none), or *now* plus
    :data:`WATCH_INTERVAL` when a run due to end could not be judged
    (``/proc`` did not answer): it is judged again then.
    """
    unsure: list[Run] = []
    enforce_deadlines(group, worker_pid, done, now=now, unsure=unsure)
    due = earliest_deadline(group, now=now)
    return min(due, now + WATCH_INTERVAL) if unsure else due


class Watchdog:
    """A small process per prefork worker that ends runs at their term's deadline.

    It is forked from the worker's main process before the pool. It sleeps
    until the earliest deadline of the ``terminate`` runs it guards (at most
    :data:`HEARTBEAT`), and is woken early when a term is revoked, a term
    with a sooner end is published, or a run is registered whose term ends
    before its next look (:mod:`celery_leader.term_end.alarm`). Each pass
    SIGKILLs the pool children whose run's term was revoked or ran out
    (:func:`enforce_deadlines`). A deadline needs no wake-up, so a stopped
    or stuck main process cannot delay a kill. Being its own process, it
    acts when the main process is stopped or stuck, when the lease thread
    waits on a store call, and when the run holds the GIL in C code. It
    exits when the worker's main process is gone (noticed within
    :data:`HEARTBEAT`). Idle, it passes four times a second.
    """

    def __init__(self, shared: SharedLease | SharedLeases, heartbeat: float = HEARTBEAT) -> None:
        self._shared = shared if isinstance(shared, SharedLeases) else shared.group
        self._heartbeat_every = heartbeat
        self.pid: int | None = None
        # Made before the pool forks, so every child can nudge the watchdog.
        existing = self._shared.wakeup
        self._wakeup = existing if isinstance(existing, Wakeup) else Wakeup()
        self._shared.wakeup = self._wakeup
        # The lease-clock time of the watchdog's last pass and the number of passes,
        # written by it after each pass: a process that exists but no longer passes
        # is as good as dead.
        self._heartbeat = mmap.mmap(-1, _BEAT.size)
        #: Held while a dead watchdog is replaced: every election's lease thread may ask.
        self._replacing = threading.Lock()
        #: Watchdogs started by :meth:`replace_if_dead` because the one before died (or
        #: stopped passing for good); read by the metrics when scraped.
        self.replacements = 0
        #: True from :meth:`stop` until the next :meth:`start`: ended on purpose (the
        #: worker shuts down), not dead; the metrics then report no watchdog at all.
        self.stopped = False

    def start(self) -> None:
        """Fork the watchdog (call before the pool forks, with as few threads as possible)."""
        if self._wakeup.closed:  # started again after stop()
            self._wakeup = self._shared.wakeup = Wakeup()
        self.stopped = False
        worker_pid = os.getpid()
        _BEAT.pack_into(self._heartbeat, 0, clock.now(), 0)  # the new one's grace to start
        pid = os.fork()
        if pid == 0:  # the watchdog
            code = 0
            try:
                for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1"):
                    signal.signal(getattr(signal, name), signal.SIG_IGN)
                self._watch(worker_pid)
            except BaseException:  # noqa: BLE001 - never run the worker's cleanup here
                code = 1
            finally:
                os._exit(code)
        self.pid = pid
        logger.info("celery-leader: run watchdog started (pid %d)", pid)

    def _watch(self, worker_pid: int) -> None:
        done: set[tuple[int, int]] = set()
        passes = 0
        while os.getppid() == worker_pid:
            # From here to the sleep, any nudge wakes the next sleep: a run
            # registered while this pass reads the table is never slept past.
            self._wakeup.awake()
            now = clock.now()
            until = now + self._heartbeat_every
            try:
                until = min(until, watch_pass(self._shared, worker_pid, done, now))
            except Exception:  # noqa: BLE001 - one bad pass must not end the watch: retry soon
                until = now + WATCH_INTERVAL
            passes += 1
            _BEAT.pack_into(self._heartbeat, 0, clock.now(), passes)
            try:
                self._wakeup.sleep_until(until)
            except Exception:  # noqa: BLE001 - an alarm that fails must not end the watch
                time.sleep(WATCH_INTERVAL)

    def passes(self) -> int:
        """How many passes the running watchdog made (for tests and benchmarks)."""
        return int(_BEAT.unpack_from(self._heartbeat, 0)[1])

    def last_pass_age(self) -> float:
        """Seconds since the watchdog's last pass (since its start, before the first)."""
        last, _ = _BEAT.unpack_from(self._heartbeat, 0)
        return max(0.0, clock.now() - float(last))

    def alive(self) -> bool:
        """True while the watchdog runs and passes (its last pass within :data:`STALE_AFTER`)."""
        if self.pid is None or process_ended(self.pid):
            return False
        return self.last_pass_age() < STALE_AFTER

    def passes_again(self, within: float = STALE_AFTER / 2) -> bool:
        """True when a watchdog that stopped passing (not :meth:`alive`) passes again, nudged.

        A worker stopped whole (SIGSTOP of its process group, a frozen
        container, a suspended host) finds its watchdog's last pass old
        when it continues, though the watchdog continues with it: the
        watchdog is woken and given up to *within* seconds (a live one
        passes at once) before it counts as dead. One that exited, or is
        still stopped or stuck, does not pass.

        The wait never reaches into the last :data:`RESTART_ROOM` seconds
        of any term published in the group: a watchdog that does not pass
        is then replaced while every published term is still valid, so no
        run outlives its term for want of a watchdog. With less room than
        that, it returns False at once.
        """
        if self.pid is None or process_ended(self.pid):
            return False
        before = self.passes()
        self._wakeup.nudge(-math.inf)
        started = clock.now()
        while True:
            if self.passes() != before and self.alive():
                return True
            # Read again each time: a term published meanwhile may end sooner. A term that
            # ended since the wait began still counts (a late wake-up must not forget it).
            now = clock.now()
            ends = min(
                (until for _, until in map(SharedLease.read, self._shared) if until > started),
                default=math.inf,
            )
            if now >= min(started + within, ends - RESTART_ROOM):
                return False
            time.sleep(WATCH_INTERVAL / 2)

    def replace_if_dead(self) -> bool:
        """True when the watchdog runs; one that died or stopped passing is replaced first.

        One that stopped passing is woken and given a moment first
        (:meth:`passes_again`): stopped with the worker (a frozen container,
        a suspended host), it continues with it, perhaps later than the
        thread that asks. Every election's lease thread asks before each
        renewal; only one replaces. False when no new one could be started:
        the caller then renews nothing, so no validity is published that no
        watchdog enforces.
        """
        if self.alive():
            return True
        with self._replacing:
            if self.alive():
                return True
            if self.passes_again():
                logger.info("celery-leader: the run watchdog passes again after a stop")
                return True
            logger.error("celery-leader: the run watchdog died; starting a new one")
            try:
                self.restart()
            except OSError:
                logger.exception("celery-leader: cannot start a new run watchdog; not renewing")
                return False
            self.replacements += 1
            return self.alive()

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
        """End the watchdog, reap it, and close its alarm's pipe in this process."""
        self.stopped = True
        pid, self.pid = self.pid, None
        if pid is not None:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with suppress(ChildProcessError):
                os.waitpid(pid, 0)
        if self._shared.wakeup is self._wakeup:
            self._shared.wakeup = None
        self._wakeup.close()
