"""Who a process is, read from ``/proc`` (Linux): its parent and its start time.

A pid alone does not name a process for long: once a process is reaped its
pid can be given to another. Its start time (clock ticks since boot, field
22 of ``/proc/<pid>/stat``) does not repeat for one pid, so ``(pid, start
time)`` names one process for good.

Three answers, never two: ``/proc`` can fail to answer (out of descriptors,
``ENFILE``/``EMFILE``; out of memory under a cgroup's pressure, ``ENOMEM``),
and such a failure says nothing about the process. Only ``ENOENT`` or
``ESRCH`` (no such process), a zombie, or a start time or parent that
differs (the pid now names another process) is a definite "gone". So:

* :func:`liveness` answers :class:`Liveness` (``RUNNING``, ``GONE`` or
  ``UNKNOWN``); a ``Liveness`` has no truth value, so no caller can take
  ``UNKNOWN`` for ``GONE`` by testing it as a bool;
* the readers of one value (:func:`parent_of`, :func:`start_time`,
  :func:`has_ended`) raise :class:`ProcUnreadableError` when ``/proc`` cannot
  answer.

Callers that decide a run's fate treat ``UNKNOWN`` as running: they keep the
run and look again (the watchdog at its next pass, the parent's kill until it
has an answer).

Testing: with the environment variable :data:`FAULT_ENV` set when this
module is imported, every read first checks the file it names; see
:class:`_Fault`. Without it, no read looks at anything but ``/proc``.
"""

from __future__ import annotations

import enum
import errno
import os
import time
from typing import NoReturn

#: Test-only: the path of a file that makes ``/proc`` reads fail for a while (see _Fault).
FAULT_ENV = "CELERY_LEADER_TEST_PROC_FAULT"


class Liveness(enum.Enum):
    """Whether a process runs: ``RUNNING``, ``GONE`` (a definite answer) or ``UNKNOWN``.

    Compare with ``is``; a truth test raises :class:`TypeError`, since
    ``UNKNOWN`` is neither true nor false.
    """

    RUNNING = "running"
    GONE = "gone"
    UNKNOWN = "unknown"

    def __bool__(self) -> NoReturn:
        raise TypeError("a Liveness has no truth value: compare it with RUNNING, GONE or UNKNOWN")


class ProcUnreadableError(RuntimeError):
    """``/proc`` could not say whether a process runs (not "gone": unknown)."""

    def __init__(self, pid: int, cause: BaseException) -> None:
        super().__init__(f"cannot read /proc/{pid}/stat: {cause}")
        self.pid = pid


class _Fault:
    """Test-only: ``/proc`` reads fail for a window after the file at *path* is written.

    The file holds ``<milliseconds> <errno name>`` (``"100 EMFILE"``). Each
    process starts its own window at its first read after the file was
    written (a new inode or modification time), so a window opens where the
    reads happen (after a revocation, in the parent and in the watchdog),
    not when the test wrote it. Each process that opens a window appends its
    pid to ``<path>.opened``, so a test can tell the failure was met.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._armed: tuple[int, int, int] | None = None
        self._until = 0.0
        self._errno = errno.EMFILE

    def check(self) -> None:
        """Raise the armed error while this process's window lasts."""
        try:
            info = os.stat(self.path)
            with open(self.path) as spec:
                text = spec.read().split()
        except OSError:
            return
        key = (os.getpid(), info.st_ino, info.st_mtime_ns)
        if key != self._armed and text:
            millis, name = text
            self._armed = key
            self._until = time.monotonic() + float(millis) / 1000
            self._errno = int(getattr(errno, name))
            with open(f"{self.path}.opened", "a") as opened:
                opened.write(f"{os.getpid()}\n")
        if time.monotonic() < self._until:
            raise OSError(self._errno, os.strerror(self._errno))


_fault: _Fault | None = _Fault(os.environ[FAULT_ENV]) if os.environ.get(FAULT_ENV) else None


def _stat_fields(pid: int) -> list[bytes] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (state is index 0).

    None when the process is gone (``ENOENT``, ``ESRCH``); raises
    :class:`ProcUnreadableError` for any other failure.
    """
    try:
        if _fault is not None:
            _fault.check()
        with open(f"/proc/{pid}/stat", "rb") as stat:
            raw = stat.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError as exc:
        raise ProcUnreadableError(pid, exc) from exc
    # The command name is in parentheses and may hold spaces or ")": split after the last.
    fields = raw.rsplit(b")", 1)[-1].split()
    if len(fields) <= _START_TIME:
        raise ProcUnreadableError(pid, ValueError("short stat line"))
    return fields


#: Index of the start time among the fields after the command name (field 22 of stat).
_START_TIME = 19
#: Index of the parent pid among the fields after the command name (field 4 of stat).
_PARENT = 1


def _number(pid: int, fields: list[bytes], index: int) -> int:
    try:
        return int(fields[index])
    except ValueError as exc:
        raise ProcUnreadableError(pid, exc) from exc


def parent_of(pid: int) -> int | None:
    """The parent pid of *pid*, or None when it is gone.

    Raises :class:`ProcUnreadableError` when ``/proc`` cannot answer.
    """
    fields = _stat_fields(pid)
    return None if fields is None else _number(pid, fields, _PARENT)


def start_time(pid: int) -> int | None:
    """When *pid* started, in clock ticks since boot, or None when it is gone.

    Raises :class:`ProcUnreadableError` when ``/proc`` cannot answer.
    """
    fields = _stat_fields(pid)
    return None if fields is None else _number(pid, fields, _START_TIME)


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
        try:
            started = start_time(_own_pid)
        except ProcUnreadableError:
            return 0
        if started is None:
            return 0
        _own_start = started
    return _own_start


def _ended(fields: list[bytes] | None) -> bool:
    """True for a process gone from ``/proc`` or a zombie (it ended; nobody reaped it yet)."""
    return fields is None or fields[0] in (b"Z", b"X")


def has_ended(pid: int) -> bool:
    """True when *pid* no longer runs: exited, or a zombie its stopped parent cannot reap.

    Raises :class:`ProcUnreadableError` when ``/proc`` cannot answer.
    """
    return _ended(_stat_fields(pid))


def liveness(pid: int, started: int = 0, parent: int = 0) -> Liveness:
    """Whether process *pid* runs, is the one that started at *started*, and is *parent*'s child.

    *started* 0 and *parent* 0 are not checked. ``GONE`` when the pid is
    not a process, is a zombie, or names another process (another start
    time, or another parent); ``UNKNOWN`` when ``/proc`` cannot answer;
    never raises.
    """
    if pid <= 0:
        return Liveness.GONE
    try:
        fields = _stat_fields(pid)
        if _ended(fields):
            return Liveness.GONE
        assert fields is not None
        if started and _number(pid, fields, _START_TIME) != started:
            return Liveness.GONE
        if parent and _number(pid, fields, _PARENT) != parent:
            return Liveness.GONE
    except ProcUnreadableError:
        return Liveness.UNKNOWN
    return Liveness.RUNNING


def process_ended(pid: int) -> bool:
    """True when our child *pid* has exited, reaped or not (its owner still reaps it)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True  # already reaped
    except OSError:
        return False
    return info is not None
