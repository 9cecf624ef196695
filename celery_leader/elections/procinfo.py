"""Who a process is, read from ``/proc`` (Linux): its parent and its start time.

A pid alone does not name a process for long: once a process is reaped its
pid can be given to another. Its start time (clock ticks since boot, field
22 of ``/proc/<pid>/stat``) does not repeat for one pid, so ``(pid, start
time)`` names one process for good. Every reader returns None when the
process is gone or ``/proc`` cannot be read, and never raises.
"""

from __future__ import annotations

import os


def _stat_fields(pid: int) -> list[bytes] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (state is index 0)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            raw = stat.read()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces or ")": split after the last.
    return raw.rsplit(b")", 1)[-1].split()


#: Index of the start time among the fields after the command name (field 22 of stat).
_START_TIME = 19


def parent_of(pid: int) -> int | None:
    """The parent pid of *pid*, or None when it is gone."""
    fields = _stat_fields(pid)
    try:
        return int(fields[1]) if fields else None
    except (IndexError, ValueError):
        return None


def start_time(pid: int) -> int | None:
    """When *pid* started, in clock ticks since boot, or None when it is gone."""
    fields = _stat_fields(pid)
    try:
        return int(fields[_START_TIME]) if fields else None
    except (IndexError, ValueError):
        return None


#: This process's pid and start time, reset in every child forked by ``os.fork``.
_own_pid = os.getpid()
_own_start: int | None = None


def _forked() -> None:
    global _own_pid, _own_start  # noqa: PLW0603 - a per-process cache, reset in each fork
    _own_pid = os.getpid()
    _own_start = None


os.register_at_fork(after_in_child=_forked)


def own_pid() -> int:
    """The calling process's pid, without a system call per read.

    Kept current in children made by ``os.fork`` (billiard's prefork pool,
    multiprocessing's fork start method); a leader run reads it several times.
    """
    return _own_pid


def own_start_time() -> int:
    """The calling process's start time (0 when unknown).

    Read once per process, and again on the next call as long as a read
    failed (out of descriptors, say): an unknown start time is never cached.
    """
    global _own_start  # noqa: PLW0603 - a per-process cache, reset in each fork
    if _own_start is None:
        started = start_time(_own_pid)
        if started is None:
            return 0
        _own_start = started
    return _own_start


def _ended(fields: list[bytes] | None) -> bool:
    """True for a process gone from ``/proc`` or a zombie (it ended; nobody reaped it yet)."""
    return not fields or fields[0] in (b"Z", b"X")


def has_ended(pid: int) -> bool:
    """True when *pid* no longer runs: exited, or a zombie its stopped parent cannot reap."""
    return _ended(_stat_fields(pid))


def is_running(pid: int, started: int) -> bool:
    """True while the process *pid* that started at *started* runs (a zombie has ended)."""
    fields = _stat_fields(pid)
    if not started or _ended(fields) or len(fields or ()) <= _START_TIME:
        return False
    assert fields is not None
    return fields[_START_TIME] == str(started).encode()


def process_ended(pid: int) -> bool:
    """True when our child *pid* has exited, reaped or not (its owner still reaps it)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True  # already reaped
    except OSError:
        return False
    return info is not None
