"""One beat per schedule file: an exclusive lock beside a local schedule file.

PersistentScheduler keeps its entries in a :mod:`shelve` file,
``celerybeat-schedule`` in the working directory unless ``--schedule`` (``-s``)
or ``beat_schedule_filename`` names another. Under ``LeaderScheduler`` every
beat writes that file, standbys too (they tick in ``reserve`` mode, and every
beat saves it at start and stop), so two beats started in one directory
would write one shelve at once, which it does not support. LeaderScheduler,
when it wraps PersistentScheduler or a subclass, therefore holds an exclusive
lock on ``<schedule file>.lock`` before it opens the schedule, and a second
beat on the same file (by any path) stops at start with one line naming the
file and the holder's pid.

Guarantees:

* the lock is ``flock(LOCK_EX | LOCK_NB)``: never waited for, and dropped by
  the kernel when the holding process ends however it ends (SIGKILL, OOM),
  so a beat restarted after a crash takes it again. The lock file stays
  behind; it holds the last holder's pid and means nothing by itself;
* it is held for the rest of the process, by the process: a scheduler built
  again in the same process on the same file (Celery builds a beat's
  scheduler twice, once for its banner) shares it. A child forked from the
  holder closes its copy at once and does not count as holding it;
* the refusal is a :class:`~celery_leader.startup_error.StartupConfigurationError`
  (``celery beat`` prints its one line and exits 1); in ``worker -B``'s beat
  process it is one error line in the worker's log, and that process exits
  (:class:`~celery_leader.beat.unled.BeatRefused`) while the worker runs on;
* a lock file that cannot be opened, or a file system without locks, is
  logged once and not locked: the beat then runs as it would without this
  check. Deleting the lock file while a beat runs defeats the check for the
  next beat.
* The lock is an ``flock``: it holds between processes of one host on a
  local file system. On NFS it may hold on one host only, or not at all.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import threading
from typing import Any

from celery_leader.beat.unled import in_embedded_beat_process, refuse, written
from celery_leader.startup_error import StartupConfigurationError

logger = logging.getLogger(__name__)

#: The lock file is the schedule file's name with this suffix (one shelve never uses).
LOCK_SUFFIX = ".lock"

#: The lock files this process holds: (device, inode) to the open descriptor.
_held: dict[tuple[int, int], int] = {}
#: Lock files this process could not lock and has said so.
_warned: set[str] = set()
_guard = threading.Lock()


def hold_schedule_file(conf: Any, filename: str) -> None:
    """Hold ``<filename>.lock`` exclusively for the rest of this process.

    Returns at once when this process holds it already. Raises
    :class:`~celery_leader.startup_error.StartupConfigurationError` when
    another process holds it; *conf* names ``beat_schedule_filename`` as the
    project writes it.
    """
    path = os.path.realpath(filename)  # a symlinked name locks the same file
    lock_path = path + LOCK_SUFFIX
    with _guard:
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            _not_locked(lock_path, exc)
            return
        status = os.fstat(fd)
        key = (status.st_dev, status.st_ino)
        if key in _held:
            os.close(fd)
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                _not_locked(lock_path, exc)
                return
            by = f" (pid {holder})" if holder else ""
            message = (
                f"celery-leader: the schedule file {path} is in use by another beat{by}: "
                "two beats must not write one schedule file; give each its own with "
                f"--schedule or {written(conf, 'beat_schedule_filename')}"
            )
            if in_embedded_beat_process():
                raise refuse(message) from None  # one line in the worker's log, not a traceback
            raise StartupConfigurationError(message) from None
        _held[key] = fd
        _write_pid(fd)


def _not_locked(lock_path: str, exc: OSError) -> None:
    if lock_path in _warned:
        return  # the same beat builds its scheduler twice
    _warned.add(lock_path)
    logger.warning(
        "celery-leader beat: cannot lock %s (%s): a second beat on the same schedule file "
        "would not be noticed",
        lock_path,
        exc.strerror or exc,
    )


def _read_pid(fd: int) -> int | None:
    """The pid the holder wrote, if it did yet (it writes right after locking)."""
    try:
        return int(os.pread(fd, 32, 0).decode().strip())
    except (OSError, ValueError):
        return None


def _write_pid(fd: int) -> None:
    # Only for the message a refused beat prints: a failure here changes nothing.
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


def _forget_in_child() -> None:
    """A forked child closes its copies: the lock stays the parent's alone.

    Closing a copy does not release an flock while another descriptor of
    the same open file (the parent's) holds it.
    """
    global _guard  # noqa: PLW0603 - a lock held by another thread at the fork stays held here
    _guard = threading.Lock()
    for fd in _held.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


os.register_at_fork(after_in_child=_forget_in_child)
