"""SQLite lease store (``sqlite:////absolute/path.db``, ``sqlite:///relative.db``): one host.

Safety statement
----------------
What this store guarantees, on one host:

* **Mutual exclusion** under the lease manager's timing assumptions. Every
  operation is one short ``BEGIN IMMEDIATE`` transaction, so the processes of
  the host see a single order of acquires, renewals and releases. Expiry is
  measured on the lease clock (:mod:`celery_leader.clock`: ``CLOCK_BOOTTIME``
  on Linux), the very clock the lease manager counts validity on, so one
  election has one clock end to end: it is shared by all processes of the
  host, keeps counting while the host is suspended and never jumps with the
  wall clock. The boot id is stored with each lease, so that a lease from
  before a reboot counts as expired.
* **Durability of every grant**: the database runs in WAL mode with
  ``PRAGMA synchronous = FULL``, so a committed acquire survives an OS crash or
  power loss (with ``NORMAL`` the last commits could roll back, and a token be
  handed out twice), provided the disk honours ``fsync``.
* **Fencing tokens rise on every acquire**: each token is
  ``max(last + 1, the host's wall clock in microseconds, min_token + 1)``.
  A counter that is missing (a new or deleted file) or behind (a file
  restored from an older copy) cannot produce an earlier token, provided the
  host's wall clock is not stepped back by more than the time between two
  acquisitions (all processes of the host read the same wall clock).
* **A file that changed under the processes is noticed.** A process keeps its
  database file open, so after the file is deleted or replaced (a restore from
  a backup, a new deployment's file) old processes would go on with the old,
  unlinked file while new ones use the new one: two elections. So before
  every operation the store compares the path's identity (device and inode)
  with the file it opened; when they differ, or the file is gone, it closes
  the connection and opens the path again (creating the file when missing).
  A renewal of a lease held in the old file is then refused, so its holder
  steps down at its next renewal, within its validity.
* **A store that forgot makes the next holder hold off one ttl**, since the
  old holder may still trust its local validity that long: a new or deleted
  file (no counter), a file that is not the one the last term was recorded in
  (a replaced or restored file: the counter table records the file's identity
  and the boot), and a lease row that vanished before the end recorded for it
  beside the counter (an operator's DELETE or UPDATE).

What it assumes, and what happens when that does not hold:

* **One host only.** SQLite's locking is not reliable over network file
  systems (NFS, SMB), and the lease clock is per host: several hosts sharing a
  database file can both believe they lead. The store does not claim
  :attr:`~celery_leader.stores.base.Capability.MULTI_HOST`.
* **Delete or replace the file, never write into it in place.** Removing it
  (``rm leader.db*``) or moving another file into its place is noticed as
  above. Copying a backup over the live file (same inode) or restoring into
  it with SQLite's backup API while workers run is not: tokens still rise
  (wall clock), but the next holder does not hold off, and a copy written
  under a running process may corrupt the database.
* **Move a backup into place only with its old ``-wal`` and ``-shm`` files
  gone.** The database runs in WAL mode, and SQLite reads the ``-wal`` file
  beside the path as part of whatever file the path names: moved over the
  live file with the old ``-wal`` still there, the backup is read with the
  running processes' last writes laid over it. Removing all three files and
  then moving the backup in (``rm leader.db*; mv backup.db leader.db``)
  leaves a window: a running process that opens the path between the two
  commands creates a new database there, and its ``-wal`` file stays beside
  the moved backup, which is then read mixed with that new database. The
  store still sees a file that is not the one its counter recorded and
  holds off one ttl, but the mix may also read as malformed, and then every
  operation fails until the files are removed again. To restore a backup
  without that window, stop the workers (and beat) first.
* **No process of the host stops inside a transaction.** Each call is one
  ``BEGIN IMMEDIATE`` transaction, which holds the database's write lock
  until it commits: well under a millisecond on a fast disk, longer where
  the ``fsync`` of ``synchronous = FULL`` is slow. A process stopped in that
  window (SIGSTOP, Ctrl-Z on a worker in the foreground, a frozen cgroup or
  container, a debugger) keeps the lock until it continues: every other
  process's call fails after the store timeout (``busy_timeout``), the
  leader steps down at its next renewal (fail closed), and nobody leads
  until the stopped process continues or dies. One that dies, even by
  SIGKILL, lets go at once (the kernel drops its file locks). SQLite has no
  way to take a lock from a stopped process, so no store on one file avoids
  this; the window is kept to one short transaction per call.
* **A release during a hold-off would pass nothing on** (the next holder
  would not wait out the rest), so the lease manager never releases a term
  in its hold-off: it leaves the lease to expire (celery_leader/lease.py).
* **Linux** (``/proc/sys/kernel/random/boot_id`` and ``CLOCK_BOOTTIME``).
  Elsewhere the lease clock is the monotonic clock, which may stop while the
  host sleeps (guarantee 1 then needs a host that does not suspend), and with
  no boot id a lease row left from before a reboot blocks the election until
  the monotonic clock passes its old end (liveness, not safety: nobody leads).

Release notification: a watcher polls SQLite's ``PRAGMA data_version`` (a
cheap read that changes when another connection commits) every 50 ms and
calls back when the lease is free, so a handover takes tens of milliseconds.

Lifelines (:attr:`~celery_leader.stores.base.Capability.LIFELINE`): each
process holds a ``flock`` on a file of its own in ``.<name>.lifelines/``
beside the database, which the kernel drops the moment the process dies
(:mod:`celery_leader.stores.sqlite_lifeline`); each lease row records the
key of its holder's lifeline. A follower that saw it end takes the term
over (:meth:`SQLiteLeaseStore.take_over`) a fraction of a second later
instead of a ttl later. A holder stopped whole (SIGSTOP) keeps its lock, so
its lease expires as before.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, ClassVar

from celery_leader import clock as lease_clock
from celery_leader.exceptions import StoreError
from celery_leader.stores import rules
from celery_leader.stores.base import (
    AcquireResult,
    Capability,
    Holder,
    LeaseRecord,
    LeaseStoreClass,
    LifelineReading,
    Lifelines,
    Watch,
)
from celery_leader.stores.sqlite_lifeline import (
    LockFileLifeline,
    is_kept,
    lifelines_dir,
    open_lifeline,
    read_lifelines,
)
from celery_leader.stores.sqlite_url import sqlite_path
from celery_leader.stores.watch import poll

logger = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS celery_leader_lease (
    name TEXT PRIMARY KEY,
    lease_id TEXT NOT NULL,
    nodename TEXT NOT NULL,
    hostname TEXT NOT NULL,
    pid INTEGER NOT NULL,
    token INTEGER NOT NULL,
    acquired_at REAL NOT NULL,
    boot_id TEXT NOT NULL,
    expires_at_us INTEGER NOT NULL,
    hold_until_us INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS celery_leader_state (
    name TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (name, key)
);
CREATE TABLE IF NOT EXISTS celery_leader_token (
    name TEXT PRIMARY KEY,
    last_token INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS celery_leader_member (
    grp TEXT NOT NULL,
    member TEXT NOT NULL,
    payload TEXT NOT NULL,
    boot_id TEXT NOT NULL,
    expires_at_us INTEGER NOT NULL,
    PRIMARY KEY (grp, member)
);
"""

#: Columns of ``celery_leader_token`` beyond the counter, added to files made
#: by earlier versions: the end recorded for the current lease (on the lease
#: clock of ``boot_id``; 0 once released), and the identity of the file the
#: last term was recorded in.
_TOKEN_COLUMNS = {
    "lease_end_us": "INTEGER NOT NULL DEFAULT 0",
    "boot_id": "TEXT NOT NULL DEFAULT ''",
    "file_id": "TEXT NOT NULL DEFAULT ''",
}
#: Columns of ``celery_leader_lease`` beyond the first version's: the lease's
#: length (so the time of its last renewal is ``expires_at_us - ttl_us``; 0
#: when a process of an earlier version took the lease, which then reads as
#: "cannot tell"), and the key of the lifeline the term is tied to (empty when
#: none, or when a process of an earlier version took the lease: no takeover).
_LEASE_COLUMNS = {
    "ttl_us": "INTEGER NOT NULL DEFAULT 0",
    "lifeline": "TEXT NOT NULL DEFAULT ''",
}
#: Every table that earlier versions made with fewer columns, and the columns to add.
_ADDED_COLUMNS = {
    "celery_leader_token": _TOKEN_COLUMNS,
    "celery_leader_lease": _LEASE_COLUMNS,
}

#: How often the watcher looks for a released lease, in seconds.
WATCH_POLL_INTERVAL = 0.05

_FileIdentity = tuple[int, int]


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def host_clock_us() -> int:
    """Microseconds on the lease clock (:func:`celery_leader.clock.now`), shared by the host."""
    return int(lease_clock.now() * 1_000_000)


def _identity(path: Path) -> _FileIdentity | None:
    """The file's (device, inode), or None when there is no file at *path*."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


class SQLiteLeaseStore:
    """Leases in a SQLite database file shared by processes on one host."""

    schemes: ClassVar[tuple[str, ...]] = ("sqlite:///",)
    extra: ClassVar[str | None] = None
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.RELEASE_NOTIFICATION,
            Capability.LIFELINE,  # a lock file per process, see sqlite_lifeline
        }
    )
    ttl_range: ClassVar[tuple[float | None, float | None]] = (None, None)
    default_renew_fraction: ClassVar[float] = 1 / 3
    option_keys: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        """No keys of its own: everything is in the URL."""

    def __init__(self, path: Path, url: str, timeout: float, *, quiet: bool = False) -> None:
        self.url = url
        self._path = path
        self._timeout = timeout
        self._boot_id = _boot_id()
        self._lock = threading.Lock()
        self._connection: sqlite3.Connection | None = None
        self._identity: _FileIdentity = (0, 0)
        self._quiet = quiet
        self._lifelines = lifelines_dir(path)

    @classmethod
    def from_url(
        cls, url: str, *, timeout: float, options: Mapping[str, Any] | None = None
    ) -> SQLiteLeaseStore:
        """Open (and create when missing) the database named by *url* (see sqlite_url)."""
        path = sqlite_path(url)
        # Said at every start: a relative URL depends on the working directory.
        logger.info("celery-leader: SQLite lease store file %s", path)
        return cls(path, url, timeout)

    @property
    def _conn(self) -> sqlite3.Connection:
        """The connection to the file now at the path (call under ``self._lock``).

        Opening is lazy and its errors are store errors, so that several
        processes starting at once (WAL set-up takes a lock) never fail at
        start: the lease manager retries. When the file at the path is no
        longer the one the connection opened (deleted, replaced), the
        connection is closed and the path opened again.
        """
        if self._connection is not None:
            try:
                current = _identity(self._path)
            except OSError as exc:
                raise StoreError(f"lease store {self.url}: stat failed: {exc}") from None
            if current != self._identity:
                self._reopen_after("deleted" if current is None else "replaced")
        if self._connection is None:
            self._connection, self._identity = self._connect()
        return self._connection

    def _reopen_after(self, what: str) -> None:
        log = logger.debug if self._quiet else logger.warning
        log(
            "celery-leader: the database file of %s was %s under this process; opening it "
            "again (a lease in the old file is lost, and the next holder waits one ttl)",
            self.url,
            what,
        )
        assert self._connection is not None
        with suppress(sqlite3.Error):
            self._connection.close()
        self._connection = None

    def _connect(self) -> tuple[sqlite3.Connection, _FileIdentity]:
        """Open the path; return the connection and the identity of the file it opened.

        The identity is taken before and after opening, and must agree: a
        file replaced meanwhile is opened again. (A file this call created
        is opened a second time, to see it already there.)
        """
        for _ in range(5):
            try:
                before = _identity(self._path)
            except OSError as exc:
                raise StoreError(f"lease store {self.url}: open failed: {exc}") from None
            conn = self._open()
            try:
                after = _identity(self._path)
            except OSError as exc:
                conn.close()
                raise StoreError(f"lease store {self.url}: open failed: {exc}") from None
            if before is not None and before == after:
                return conn, before
            conn.close()
        raise StoreError(f"lease store {self.url}: open failed: the file keeps changing")

    def _open(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self._path, timeout=self._timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise StoreError(f"lease store {self.url}: open failed: {exc}") from None
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._timeout * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            # FULL: a committed acquire survives an OS crash (NORMAL may roll back the
            # last commits in WAL mode, and a token could be handed out twice).
            conn.execute("PRAGMA synchronous = FULL")
            conn.executescript(_SCHEMA)
            self._add_missing_columns(conn)
        except sqlite3.Error as exc:
            conn.close()
            raise StoreError(f"lease store {self.url}: open failed: {exc}") from None
        return conn

    @staticmethod
    def _add_missing_columns(conn: sqlite3.Connection) -> None:
        """Bring tables written by an earlier version up to date (once, atomically)."""

        def missing() -> list[tuple[str, str, str]]:
            absent = []
            for table, columns in _ADDED_COLUMNS.items():
                rows = conn.execute(f"PRAGMA table_info({table})").fetchall()
                present = {str(row[1]) for row in rows}
                absent += [(table, c, kind) for c, kind in columns.items() if c not in present]
            return absent

        if not missing():
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Asked again under the write lock: another process may have added them.
            for table, column, kind in missing():
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    @property
    def _file_id(self) -> str:
        return f"{self._identity[0]}:{self._identity[1]}"

    @contextmanager
    def _transaction(self, what: str) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._conn
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                raise StoreError(f"lease store {self.url}: {what} failed: {exc}") from None

    def _live_row(self, conn: sqlite3.Connection, name: str, now_us: int) -> tuple[Any, ...] | None:
        row = conn.execute(
            "SELECT lease_id, nodename, hostname, pid, token, acquired_at, boot_id,"
            " expires_at_us, hold_until_us, ttl_us, lifeline FROM celery_leader_lease"
            " WHERE name = ?",
            (name,),
        ).fetchone()
        if row is None or row[6] != self._boot_id or row[7] <= now_us:
            return None
        return tuple(row)

    def acquire(self, name: str, holder: Holder, ttl: float, min_token: int = 0) -> AcquireResult:
        """Take the lease when free, expired or ours, with a new token; see the safety statement."""
        with self._transaction("acquire") as conn:
            return self._acquire(conn, name, holder, ttl, min_token=min_token, dead=None)

    def take_over(
        self, name: str, holder: Holder, ttl: float, dead: LeaseRecord, min_token: int = 0
    ) -> AcquireResult:
        """Acquire the lease of *name* from the term of *dead*, whose lifeline ended.

        See :class:`~celery_leader.stores.base.Lifelines`. One transaction,
        as an acquire: only while the lease is still held by the term with
        *dead*'s token and (non-empty) lifeline key, and that lifeline's
        file is not locked now, is the lease freed and acquired by *holder*.
        Freeing it counts as a release: it causes no hold-off by itself,
        but what is left of the dead term's own hold-off carries over (its
        holder never acted; the holder before it, which the store forgot,
        may still act until then). Any other state answers as
        :meth:`acquire`.
        """
        with self._transaction("take over") as conn:
            return self._acquire(conn, name, holder, ttl, min_token=min_token, dead=dead)

    def _acquire(
        self,
        conn: sqlite3.Connection,
        name: str,
        holder: Holder,
        ttl: float,
        *,
        min_token: int,
        dead: LeaseRecord | None,
    ) -> AcquireResult:
        """The acquire (or, with *dead*, the takeover) inside the caller's transaction."""
        ttl_us = int(ttl * 1e6)
        now_us = host_clock_us()
        row = self._live_row(conn, name, now_us)
        own_hold_until = 0
        freed = False
        if row is not None and row[0] != holder.lease_id and self._is_dead(row, dead):
            own_hold_until = int(row[8])  # the dead term's hold-off, if any, runs on
            row, freed = None, True
        if row is not None:
            if row[0] != holder.lease_id:
                return AcquireResult(
                    acquired=False,
                    holder=_record(row, now_us),
                    retry_in=(row[7] - now_us) / 1e6,
                )
            own_hold_until = int(row[8])  # our own lease (a lost reply): its hold-off runs on
        counter = conn.execute(
            "SELECT last_token, lease_end_us, boot_id, file_id"
            " FROM celery_leader_token WHERE name = ?",
            (name,),
        ).fetchone()
        # A counter recorded before a reboot has no holder left to act on it.
        same_boot = counter is not None and counter[2] == self._boot_id
        forgot = rules.store_forgot(
            # A new or deleted database.
            counter_missing=counter is None,
            # A replaced or restored file.
            data_replaced=same_boot and bool(counter[3]) and counter[3] != self._file_id,
            # (A term freed by a takeover is no lease gone behind the store's back.)
            vanished_early=same_boot
            and rules.lease_vanished_early(row is not None or freed, int(counter[1]), now_us),
        )
        hold_until, hold_off_us = rules.hold_off(
            now=now_us, ttl=ttl_us, own_hold_until=own_hold_until, forgot=forgot
        )
        # Tokens on the wall clock (shared by the host's processes, and kept across a
        # reboot), hold-offs on the lease clock.
        token = rules.next_token(
            None if counter is None else int(counter[0]), time.time_ns() // 1000, min_token
        )
        conn.execute(
            "INSERT INTO celery_leader_token (name, last_token, lease_end_us, boot_id,"
            " file_id) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT(name) DO UPDATE SET last_token = excluded.last_token,"
            " lease_end_us = excluded.lease_end_us, boot_id = excluded.boot_id,"
            " file_id = excluded.file_id",
            (name, token, now_us + ttl_us, self._boot_id, self._file_id),
        )
        conn.execute(
            "INSERT OR REPLACE INTO celery_leader_lease (name, lease_id, nodename, hostname,"
            " pid, token, acquired_at, boot_id, expires_at_us, hold_until_us, ttl_us,"
            " lifeline) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                name,
                holder.lease_id,
                holder.nodename,
                holder.hostname,
                holder.pid,
                token,
                time.time(),
                self._boot_id,
                now_us + ttl_us,
                hold_until,
                ttl_us,
                holder.lifeline,
            ),
        )
        return AcquireResult(acquired=True, token=token, hold_off=hold_off_us / 1e6)

    def _is_dead(self, row: tuple[Any, ...], dead: LeaseRecord | None) -> bool:
        """Whether live *row* is the term of *dead*, tied to a lifeline no process holds now.

        The follower saw the lifeline end before it waited its takeover out;
        asking the kernel again here costs one system call and refuses a
        takeover whose reading was wrong.
        """
        return (
            dead is not None
            and bool(dead.lifeline)
            and int(row[4]) == dead.token
            and str(row[10]) == dead.lifeline
            and not is_kept(self._lifelines, dead.lifeline)
        )

    def open_lifeline(self) -> LockFileLifeline:
        """A new lifeline of this process: a locked file beside the database (sqlite_lifeline)."""
        return open_lifeline(self._lifelines)

    def read_lifelines(self, keys: Collection[str]) -> LifelineReading:
        """Which of *keys* a process of this host holds now; one session per directory and boot.

        The kernel answers every reader of the host in one order, so the
        session is the same for every reading of this database's lifelines
        until the host reboots.
        """
        return LifelineReading(
            session=f"{self._lifelines}@{self._boot_id}",
            alive=read_lifelines(self._lifelines, keys),
        )

    def renew(self, name: str, lease_id: str, ttl: float) -> bool:
        """Extend our unexpired lease (and its recorded end); False when it is gone or another's."""
        with self._transaction("renew") as conn:
            now_us = host_clock_us()
            end_us = now_us + int(ttl * 1e6)
            cursor = conn.execute(
                "UPDATE celery_leader_lease SET expires_at_us = ?"
                " WHERE name = ? AND lease_id = ? AND boot_id = ? AND expires_at_us > ?",
                (end_us, name, lease_id, self._boot_id, now_us),
            )
            if cursor.rowcount != 1:
                return False
            conn.execute(
                "UPDATE celery_leader_token SET lease_end_us = ? WHERE name = ?", (end_us, name)
            )
            return True

    def release(self, name: str, lease_id: str) -> bool:
        """Delete our lease; watchers see the change within 50 ms."""
        with self._transaction("release") as conn:
            cursor = conn.execute(
                "DELETE FROM celery_leader_lease WHERE name = ? AND lease_id = ?",
                (name, lease_id),
            )
            if cursor.rowcount != 1:
                return False
            conn.execute("UPDATE celery_leader_token SET lease_end_us = 0 WHERE name = ?", (name,))
            return True

    def announce(self, group: str, member: str, payload: str, ttl: float) -> dict[str, str]:
        """See :class:`~celery_leader.stores.base.Presence`: on the lease clock, one transaction."""
        with self._transaction("presence") as conn:
            now_us = host_clock_us()
            conn.execute(
                "INSERT OR REPLACE INTO celery_leader_member VALUES (?, ?, ?, ?, ?)",
                (group, member, payload, self._boot_id, now_us + int(ttl * 1e6)),
            )
            # A member of another boot counted on another clock: gone with that boot.
            conn.execute(
                "DELETE FROM celery_leader_member WHERE grp = ? AND (expires_at_us <= ?"
                " OR boot_id != ?)",
                (group, now_us, self._boot_id),
            )
            rows = conn.execute(
                "SELECT member, payload FROM celery_leader_member WHERE grp = ?", (group,)
            ).fetchall()
        return {str(m): str(p) for m, p in rows}

    def withdraw(self, group: str, member: str) -> None:
        """See :class:`~celery_leader.stores.base.Presence`."""
        with self._transaction("presence") as conn:
            conn.execute(
                "DELETE FROM celery_leader_member WHERE grp = ? AND member = ?", (group, member)
            )

    def read(self, name: str) -> LeaseRecord | None:
        """The live lease of *name*, or None. A plain read: it takes no write lock."""
        with self._lock:
            try:
                conn = self._conn
                now_us = host_clock_us()
                row = self._live_row(conn, name, now_us)
            except sqlite3.Error as exc:
                raise StoreError(f"lease store {self.url}: read failed: {exc}") from None
        return None if row is None else _record(row, now_us)

    def last_token(self, name: str) -> int | None:
        """The token of the latest term of *name*; None when the counter has none (new file)."""
        with self._lock:
            try:
                row = self._conn.execute(
                    "SELECT last_token FROM celery_leader_token WHERE name = ?", (name,)
                ).fetchone()
            except sqlite3.Error as exc:
                raise StoreError(f"lease store {self.url}: read failed: {exc}") from None
        return None if row is None else int(row[0])

    def get_state(self, name: str) -> dict[str, str]:
        """All state keys of *name*."""
        with self._lock:
            try:
                rows = self._conn.execute(
                    "SELECT key, value FROM celery_leader_state WHERE name = ?", (name,)
                ).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"lease store {self.url}: read state failed: {exc}") from None
        return {str(k): str(v) for k, v in rows}

    def set_state(self, name: str, lease_id: str, key: str, value: str) -> bool:
        """Set one key while our lease is live."""
        with self._transaction("write state") as conn:
            row = self._live_row(conn, name, host_clock_us())
            if row is None or row[0] != lease_id:
                return False
            conn.execute(
                "INSERT INTO celery_leader_state (name, key, value) VALUES (?, ?, ?)"
                " ON CONFLICT(name, key) DO UPDATE SET value = excluded.value",
                (name, key, value),
            )
        return True

    def watch(self, name: str, callback: Callable[[], None]) -> Watch:
        """Poll for a free lease in a daemon thread, with a connection of its own.

        Every :data:`WATCH_POLL_INTERVAL`, a cheap ``PRAGMA data_version``;
        only when another connection committed (or the file was replaced) does
        it read the lease, and it calls back when the lease is then free.
        """
        own = SQLiteLeaseStore(self._path, self.url, self._timeout, quiet=True)
        last_version: tuple[_FileIdentity, int] | None = None

        def freed() -> bool:
            nonlocal last_version
            number = own.data_version()  # may reopen a replaced file: identity after it
            version = (own._identity, number)
            if version == last_version:
                return False
            last_version = version
            return own.lease_is_free(name)

        return poll(
            name,
            callback,
            interval=WATCH_POLL_INTERVAL,
            freed=freed,
            expected=(StoreError, sqlite3.Error),
            on_end=own.close,
        )

    def lease_is_free(self, name: str) -> bool:
        """True when no live lease of *name* exists (used by the watcher)."""
        return self.read(name) is None

    def data_version(self) -> int:
        """SQLite's change counter for commits by other connections (of the file now at the path).

        A reopened file starts a new count, which the watcher takes for a change.
        """
        with self._lock:
            try:
                row = self._conn.execute("PRAGMA data_version").fetchone()
            except sqlite3.Error as exc:
                raise StoreError(f"lease store {self.url}: read failed: {exc}") from None
        return int(row[0])

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None


def _record(row: tuple[Any, ...], now_us: int) -> LeaseRecord:
    # Every renewal sets the end to (its time + ttl): the last one landed ttl before the end.
    ttl_us = int(row[9] or 0)
    return LeaseRecord(
        nodename=row[1],
        hostname=row[2],
        pid=int(row[3]),
        token=int(row[4]),
        acquired_at=float(row[5]),
        expires_in=(row[7] - now_us) / 1e6,
        hold_off=max(0, row[8] - now_us) / 1e6,
        renewed_ago=max(0, ttl_us - (row[7] - now_us)) / 1e6 if ttl_us > 0 else None,
        lifeline=str(row[10] or ""),
    )


#: The class declares what the registry, the settings and the tests read, and its
#: instances offer lifelines, as it claims (both checked by mypy).
_DECLARES: LeaseStoreClass = SQLiteLeaseStore
_OFFERS: type[Lifelines] = SQLiteLeaseStore
