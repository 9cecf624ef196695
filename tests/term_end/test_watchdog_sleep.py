"""The watchdog sleeps instead of polling, and still ends every run on time.

Each test runs a real forked watchdog against real child processes. Tests
that need the wake-ups give the watchdog a heartbeat of 5 s: without a
wake-up it would not look again for that long, so a kill well before then
shows the wake-up (or the deadline it slept until) did it.
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import suppress
from pathlib import Path

from celery_leader import clock
from celery_leader.elections.shared_lease import SharedLease
from celery_leader.term_end.watchdog import Watchdog

from .test_term_end import record, sleeper

LONG_HEARTBEAT = 5.0


def context_switches(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc status")


def wait_killed(pid: int, timeout: float) -> float | None:
    """Seconds until child *pid* (ours, not a Popen) died by SIGKILL, or None."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
            return time.monotonic() - start
        time.sleep(0.005)
    return None


def test_an_idle_watchdog_sleeps_instead_of_polling():
    """With a valid term and no runs, the watchdog wakes a few times a second, not 100."""
    shared = SharedLease()
    shared.publish(3, clock.now() + 60)
    watchdog = Watchdog(shared)
    watchdog.start()
    try:
        time.sleep(0.3)
        before = context_switches(watchdog.pid)
        time.sleep(2.0)
        woke = context_switches(watchdog.pid) - before
        assert woke <= 30, f"an idle watchdog woke {woke} times in 2 s"
        assert watchdog.alive(), "sleeping, it still passes often enough to count as alive"
    finally:
        watchdog.stop()


def test_a_revocation_wakes_a_sleeping_watchdog():
    """A term revoked while the watchdog sleeps ends its terminate run at once."""
    shared = SharedLease()
    shared.publish(9, clock.now() + 60)
    child = sleeper()
    record(shared, 0, child, 9)
    watchdog = Watchdog(shared, heartbeat=LONG_HEARTBEAT)
    watchdog.start()
    try:
        time.sleep(0.3)  # asleep now, until the term's end in a minute
        assert child.poll() is None
        revoked_at = time.monotonic()
        shared.revoke(9)
        assert child.wait(LONG_HEARTBEAT) == -signal.SIGKILL
        assert time.monotonic() - revoked_at < 0.5
    finally:
        watchdog.stop()
        child.kill()
        child.wait()


def test_a_sleeping_watchdog_kills_at_the_deadline_with_nobody_writing():
    """The watchdog sleeps until the term's published end: a stopped main process writes nothing."""
    shared = SharedLease()
    ends_in = 0.6
    shared.publish(4, clock.now() + ends_in)
    child = sleeper()
    record(shared, 0, child, 4)
    watchdog = Watchdog(shared, heartbeat=LONG_HEARTBEAT)
    started = time.monotonic()
    watchdog.start()
    try:
        assert child.wait(LONG_HEARTBEAT) == -signal.SIGKILL
        took = time.monotonic() - started
        assert ends_in - 0.05 <= took < ends_in + 0.5, took
    finally:
        watchdog.stop()
        child.kill()
        child.wait()


def test_a_run_registered_just_before_its_deadline_wakes_the_watchdog():
    """A pool child registering a terminate run whose term ends before the next look wakes it."""
    from celery_leader.term_end.in_run import watch_run

    shared = SharedLease()
    watchdog = Watchdog(shared, heartbeat=LONG_HEARTBEAT)
    watchdog.start()
    pid = None
    try:
        time.sleep(0.3)  # asleep now, with nothing to guard, for the long heartbeat
        ends_in = 0.5
        shared.publish(6, clock.now() + ends_in)
        registered = time.monotonic()
        pid = os.fork()
        if pid == 0:  # a pool child of this "worker"
            try:
                from billiard.process import current_process

                current_process().index = 0
                watch_run(shared, 6, terminate=True)
                time.sleep(60)
            finally:
                os._exit(0)
        took = wait_killed(pid, LONG_HEARTBEAT)
        assert took is not None, "the run outlived its term: the watchdog slept on"
        assert time.monotonic() - registered < ends_in + 0.5
        pid = None
    finally:
        watchdog.stop()
        if pid is not None:
            with suppress(ProcessLookupError, ChildProcessError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)


def test_a_pass_that_straddles_a_deadline_still_wakes_for_it():
    """A run still valid when the pass decides its kills is the next wake-up, not skipped."""
    from celery_leader.term_end.watchdog import watch_pass

    shared = SharedLease()
    ends_at = clock.now() + 30
    shared.publish(8, ends_at)
    child = sleeper()
    try:
        record(shared, 0, child, 8)
        # Just before the deadline: nothing to kill, and the deadline is when to look again.
        assert watch_pass(shared.group, os.getpid(), set(), ends_at - 1e-6) == ends_at
        assert child.poll() is None
        # At the deadline: killed in this pass.
        watch_pass(shared.group, os.getpid(), set(), ends_at)
        assert child.wait(5) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()


def test_a_watchdog_works_with_descriptors_past_1024_and_closes_its_pipe():
    """Its alarm uses poll(), not select(); stop() closes the pipe: many watchdogs leak nothing."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2048:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(2048, hard), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    child = sleeper()
    try:
        shared = SharedLease()
        shared.publish(5, clock.now() + 60)
        record(shared, 0, child, 5)
        watchdog = Watchdog(shared)
        assert shared.group.wakeup._read_fd >= 1024
        watchdog.start()
        try:
            time.sleep(0.5)
            assert watchdog.alive()
            shared.revoke(5)
            assert child.wait(5) == -signal.SIGKILL
        finally:
            watchdog.stop()
    finally:
        for fd in held:
            os.close(fd)
        child.kill()
        child.wait()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(50):
        spare = Watchdog(SharedLease())
        spare.start()
        spare.stop()
    assert len(os.listdir("/proc/self/fd")) <= before + 2
