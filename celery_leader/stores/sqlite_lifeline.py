"""The SQLite store's lifelines: a lock file per process, which the kernel drops when it dies.

SQLite has no server; on one host the kernel is the server. A lifeline
(:class:`~celery_leader.stores.base.Lifeline`) is a file in a directory
beside the database, named by the lifeline's random key, on which its
process holds ``flock(LOCK_EX)``. The kernel drops a ``flock`` when the last
descriptor of its open file is closed, which happens at once when the
process dies, whatever killed it.

Guarantees, on one host (Linux):

* **A file at a key's path is locked from the moment it appears.** The
  holder creates it under a temporary name, locks it, then renames it into
  place, so a reader never takes a live holder's fresh file for a dead one.
  Keys are 128 random bits and never reused, so nothing else ever appears at
  that path.
* **A reader reads "kept" only while a process holds the lock.** It opens
  the path read-only (never creating anything), and asks for a shared lock
  without waiting: refused means kept; granted or no file means not kept.
  The kernel answers every reader of the host in one order, so a key read
  kept and then not kept ended in between (the reading's ``session`` names
  the lifelines directory and the boot).
* **The holder's confirmation fails once the lifeline no longer protects
  it.** :meth:`LockFileLifeline.confirm` checks that the path still names
  the file its descriptor locked (not deleted, not replaced) and, where
  ``/proc/self/fdinfo`` shows file locks, that the lock is still held by its
  open file (a forked child that unlocked its inherited copy would drop it).
  Whatever makes a reader see the key gone also makes the holder's next
  confirmation fail, which is what rule 1 of
  :mod:`celery_leader.lease.lifeline` needs.

What it assumes:

* **Forked children let go of their copy.** ``flock`` belongs to the open
  file, which a forked child shares: a child that outlives its parent would
  keep the lock alive. :mod:`celery_leader.lease.lifeline` points the
  child's copy at ``/dev/null`` at fork (through :meth:`fileno`); a lifeline
  opened outside it has no such hook. A child never unlinks its parent's
  file (:meth:`LockFileLifeline.close` does so only in the process that
  opened it), and the descriptor is close-on-exec, so exec'd programs never
  get it.
* **Everyone can write the directory** who opens a lifeline there: a
  process that cannot gets a :class:`~celery_leader.exceptions.StoreError`
  and its terms fall back to expiry. Readers need only read access.
* **Stale files are cleaned up by whoever sees them**: a reader that finds a
  key's file unlocked removes it, and opening a lifeline removes every
  unlocked file of the directory (temporary ones only after
  :data:`STALE_TEMP_AFTER` seconds, since a holder may be between creating
  and locking one).

The directory is hidden (``.<database name>.lifelines``) so that the
documented way to drop or restore a database, ``rm leader.db*``, does not
meet a directory it cannot remove.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Collection
from contextlib import suppress
from pathlib import Path

from celery_leader.exceptions import StoreError
from celery_leader.stores.base import LifelineEndedError

#: A lifeline key: 128 random bits in hex. Anything else in a lease row is not a key of
#: ours, and is read as "not kept" without touching the file system.
_KEY = re.compile(r"[0-9a-f]{32}\Z")
#: The suffix of a lifeline's file before it is locked and renamed into place.
_TEMP_SUFFIX = ".tmp"
#: Seconds after which an unlocked temporary file is taken for a holder that died between
#: creating and renaming it (a live one holds it for microseconds).
STALE_TEMP_AFTER = 60.0

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def lifelines_dir(database: Path) -> Path:
    """The directory of the lifelines of the database at *database*.

    Beside the database's real path (symbolic links resolved), so that
    every process that reaches the file by another name finds the same
    directory.
    """
    real = Path(os.path.realpath(database))
    return real.parent / f".{real.name}.lifelines"


def _identity(path: Path) -> tuple[int, int] | None:
    """The (device, inode) of the file at *path* (links not followed); None when there is none."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (st.st_dev, st.st_ino)


def _fdinfo_locks(fd: int) -> list[str] | None:
    """The ``lock:`` lines of ``/proc/self/fdinfo/<fd>``: the locks this open file holds.

    None when the file cannot be read (no /proc).
    """
    try:
        with open(f"/proc/self/fdinfo/{fd}", encoding="ascii", errors="replace") as info:
            return [line for line in info if line.startswith("lock:")]
    except OSError:
        return None


def _holds_exclusive_flock(fd: int) -> bool | None:
    """Whether the open file of *fd* holds an exclusive ``flock``; None: the kernel won't say."""
    locks = _fdinfo_locks(fd)
    if locks is None:
        return None
    return any("FLOCK" in line and "WRITE" in line for line in locks)


class LockFileLifeline:
    """A lifeline of this process: an exclusive ``flock`` on a file named by its key.

    Thread-safe: :meth:`confirm` and :meth:`close` may be called from
    different threads; after :meth:`close`, :meth:`confirm` raises
    :class:`~celery_leader.stores.base.LifelineEndedError`.
    """

    def __init__(self, key: str, path: Path, fd: int, *, check_lock: bool) -> None:
        #: Random, unique to this lifeline: the name of its file.
        self.key = key
        self._path = path
        self._fd = fd
        #: Whether /proc/self/fdinfo showed the lock after it was taken: only then is its
        #: absence there news (a kernel that lists no locks would end every lifeline).
        self._check_lock = check_lock
        self._owner = os.getpid()
        self._lock = threading.Lock()

    def confirm(self, timeout: float) -> None:
        """Check that the path still names the locked file, and the lock is still ours.

        Local system calls only; *timeout* bounds nothing here (a file system
        that hangs is not one the store supports). Raises
        :class:`~celery_leader.stores.base.LifelineEndedError` when the file
        was removed or replaced, or its lock let go, and
        :class:`~celery_leader.exceptions.StoreError` when the file system
        answers with another error.
        """
        with self._lock:  # the descriptor cannot be closed (and its number reused) meanwhile
            fd = self._fd
            if fd < 0:
                raise LifelineEndedError(f"lifeline {self._path} was closed")
            try:
                held = os.fstat(fd)
                at_path = _identity(self._path)
            except OSError as exc:
                raise StoreError(f"lifeline {self._path}: {exc.strerror}") from None
            if at_path != (held.st_dev, held.st_ino):
                what = "removed" if at_path is None else "replaced"
                raise LifelineEndedError(f"lifeline file {self._path} was {what}")
            if self._check_lock and not _holds_exclusive_flock(fd):
                raise LifelineEndedError(f"the lock on lifeline file {self._path} was let go")

    def fileno(self) -> int:
        """The locked file's descriptor (-1 once closed); a forked child points its copy away."""
        return self._fd

    def close(self) -> None:
        """Remove the file, then close it (the kernel drops the lock). Idempotent.

        Only the process that opened the lifeline removes the file: a forked
        child's close drops its own copy of the descriptor and nothing else
        (never ``LOCK_UN``, which would unlock the parent's open file too).
        """
        if os.getpid() != self._owner:
            # A forked child has one thread: no lock needed, and the copy of the lock it
            # inherited may be held by a parent's thread that does not exist here.
            fd, self._fd = self._fd, -1
            if fd >= 0:
                with suppress(OSError):
                    os.close(fd)
            return
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd < 0:
            return
        try:
            with suppress(OSError):
                held = os.fstat(fd)
                # Removed first, so that readers see no file rather than an unlocked one.
                if _identity(self._path) == (held.st_dev, held.st_ino):
                    os.unlink(self._path)
        finally:
            with suppress(OSError):
                os.close(fd)


def open_lifeline(directory: Path) -> LockFileLifeline:
    """A new lifeline in *directory* (made when missing; its parent must exist).

    Raises :class:`~celery_leader.exceptions.StoreError` when the file
    cannot be made or locked.
    """
    try:
        directory.mkdir(exist_ok=True)
    except OSError as exc:
        raise StoreError(
            f"cannot make the lifelines directory {directory}: {exc.strerror}"
        ) from None
    key = secrets.token_hex(16)
    path = directory / key
    temp = directory / f"{key}{_TEMP_SUFFIX}"
    try:
        fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise StoreError(f"cannot make a lifeline file in {directory}: {exc.strerror}") from None
    try:
        # Locked before it gets its name: a reader never sees a fresh file unlocked.
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(temp, path)
    except OSError as exc:
        with suppress(OSError):
            os.unlink(temp)
        os.close(fd)
        raise StoreError(f"cannot lock a lifeline file in {directory}: {exc.strerror}") from None
    lifeline = LockFileLifeline(key, path, fd, check_lock=_holds_exclusive_flock(fd) is True)
    with suppress(OSError, StoreError):  # clean-up only: never lose the lifeline over it
        _sweep(directory, keep=key)
    return lifeline


def read_lifelines(directory: Path, keys: Collection[str]) -> frozenset[str]:
    """The keys among *keys* whose file in *directory* a process holds locked.

    Creates nothing. Removes the file of a key read not kept (stale: its
    process died without removing it). Raises
    :class:`~celery_leader.exceptions.StoreError` when a file cannot be
    read (the reading then shows nothing).
    """
    return frozenset(key for key in keys if is_kept(directory, key))


def is_kept(directory: Path, key: str) -> bool:
    """Whether a process holds lifeline *key* of *directory* now (see :func:`read_lifelines`)."""
    if not _KEY.match(key):
        return False  # not a key of ours: never a path to open
    path = directory / key
    try:
        fd = os.open(path, _READ_FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symbolic link: no holder of ours made it
            return False
        raise StoreError(f"cannot read lifeline {path}: {exc.strerror}") from None
    try:
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return False  # no holder of ours made it
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True  # a process holds it exclusively
        except OSError as exc:
            raise StoreError(f"cannot read lifeline {path}: {exc.strerror}") from None
        _remove_if_same(path, st)  # nobody holds it: its process died without removing it
        return False
    finally:
        os.close(fd)  # also drops the shared lock taken above


def _remove_if_same(path: Path, st: os.stat_result) -> None:
    """Remove *path* when it still names the file of *st* (an unlocked, dead lifeline's)."""
    with suppress(OSError):
        if _identity(path) == (st.st_dev, st.st_ino):
            os.unlink(path)


def _sweep(directory: Path, keep: str) -> None:
    """Remove the unlocked lifeline files of *directory* (their processes died); best effort."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if name == keep:
            continue
        if _KEY.match(name):
            with suppress(StoreError):
                is_kept(directory, name)  # removes it when not kept
        elif name.endswith(_TEMP_SUFFIX) and _KEY.match(name[: -len(_TEMP_SUFFIX)]):
            _remove_stale_temp(directory / name)


def _remove_stale_temp(path: Path) -> None:
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or time.time() - st.st_mtime < STALE_TEMP_AFTER:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return
        _remove_if_same(path, st)
    finally:
        os.close(fd)
