"""SQLite lease store (``sqlite:///absolute/path.db``): one host only.

Safety statement
----------------
Every operation is one short ``BEGIN IMMEDIATE`` transaction, so processes on
the same host see a single order of acquires, renewals and releases. Expiry is
measured on the host's boot-time clock (``CLOCK_BOOTTIME``), which all
processes on one host share and which never jumps with wall-clock changes; the
boot id is stored beside it so that a lease from before a reboot counts as
expired. On systems without ``CLOCK_BOOTTIME`` the wall clock is used, and a
wall-clock step backwards can stretch a lease.

**One host only.** SQLite's locking is not reliable over network file systems
(NFS, SMB): several hosts sharing a database file can both believe they lead.

Fencing tokens come from a counter table. When the counter is missing (a new
or deleted database file) it restarts from the wall clock in microseconds and
the first holder is told to hold off one ttl, as with any store that forgot.

Release notification: a watcher polls SQLite's ``PRAGMA data_version`` (a
cheap read that changes when another connection commits) every 50 ms and
calls back when the lease is free, so a handover takes tens of milliseconds.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from celery_leader.exceptions import ConfigurationError, StoreError
from celery_leader.stores.base import AcquireResult, Capability, Holder, LeaseRecord, Watch

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
"""

#: How often the watcher looks for a released lease, in seconds.
WATCH_POLL_INTERVAL = 0.05


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


_CLOCK_ID = getattr(time, "CLOCK_BOOTTIME", None)


def host_clock_us() -> int:
    """Microseconds on a clock that all processes on this host share."""
    if _CLOCK_ID is not None:
        return time.clock_gettime_ns(_CLOCK_ID) // 1000
    return time.time_ns() // 1000


class SQLiteLeaseStore:
    """Leases in a SQLite database file shared by processes on one host."""

    capabilities = frozenset({Capability.RELEASE_NOTIFICATION})
    ttl_range: tuple[float | None, float | None] = (None, None)

    def __init__(self, path: Path, url: str, timeout: float) -> None:
        self.url = url
        self._path = path
        self._timeout = timeout
        self._boot_id = _boot_id()
        self._lock = threading.Lock()
        self._connection: sqlite3.Connection | None = None

    @classmethod
    def from_url(
        cls, url: str, *, timeout: float, options: Mapping[str, Any] | None = None
    ) -> SQLiteLeaseStore:
        """Open (and create when missing) the database named by *url*."""
        path = urlsplit(url).path
        if not path or path == "/":
            raise ConfigurationError(
                f"leader_backend_url={url!r} is not allowed: a SQLite store needs an "
                "absolute file path, as in sqlite:///var/lib/app/leader.db"
            )
        if not Path(path).parent.is_dir():
            raise ConfigurationError(
                f"leader_backend_url={url!r} is not allowed: the directory "
                f"{str(Path(path).parent)!r} does not exist"
            )
        return cls(Path(path), url, timeout)

    @property
    def _conn(self) -> sqlite3.Connection:
        """The connection, opened on first use (under ``self._lock``).

        Opening is lazy and its errors are store errors, so that several
        processes starting at once (WAL set-up takes a lock) never fail at
        start: the lease manager retries.
        """
        if self._connection is None:
            self._connection = self._connect()
        return self._connection

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self._path, timeout=self._timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise StoreError(f"lease store {self.url}: open failed: {exc}") from None
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._timeout * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            conn.close()
            raise StoreError(f"lease store {self.url}: open failed: {exc}") from None
        return conn

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
            " expires_at_us, hold_until_us FROM celery_leader_lease WHERE name = ?",
            (name,),
        ).fetchone()
        if row is None or row[6] != self._boot_id or row[7] <= now_us:
            return None
        return tuple(row)

    def acquire(self, name: str, holder: Holder, ttl: float, min_token: int = 0) -> AcquireResult:
        """Take the lease when free, expired or ours, with a new token."""
        with self._transaction("acquire") as conn:
            now_us = host_clock_us()
            row = self._live_row(conn, name, now_us)
            hold_until = 0
            if row is not None:
                if row[0] != holder.lease_id:
                    return AcquireResult(
                        acquired=False,
                        holder=_record(row, now_us),
                        retry_in=(row[7] - now_us) / 1e6,
                    )
                hold_until = row[8]
            last = conn.execute(
                "SELECT last_token FROM celery_leader_token WHERE name = ?", (name,)
            ).fetchone()
            if last is None:
                floor = max(time.time_ns() // 1000, min_token)
                hold_until = now_us + int(ttl * 1e6)
            else:
                floor = max(int(last[0]), min_token)
            token = floor + 1
            conn.execute(
                "INSERT INTO celery_leader_token (name, last_token) VALUES (?, ?)"
                " ON CONFLICT(name) DO UPDATE SET last_token = excluded.last_token",
                (name, token),
            )
            conn.execute(
                "INSERT OR REPLACE INTO celery_leader_lease (name, lease_id, nodename, hostname,"
                " pid, token, acquired_at, boot_id, expires_at_us, hold_until_us)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    name,
                    holder.lease_id,
                    holder.nodename,
                    holder.hostname,
                    holder.pid,
                    token,
                    time.time(),
                    self._boot_id,
                    now_us + int(ttl * 1e6),
                    hold_until,
                ),
            )
        return AcquireResult(acquired=True, token=token, hold_off=max(0, hold_until - now_us) / 1e6)

    def renew(self, name: str, lease_id: str, ttl: float) -> bool:
        """Extend our unexpired lease; False when it is gone or another's."""
        with self._transaction("renew") as conn:
            now_us = host_clock_us()
            cursor = conn.execute(
                "UPDATE celery_leader_lease SET expires_at_us = ?"
                " WHERE name = ? AND lease_id = ? AND boot_id = ? AND expires_at_us > ?",
                (now_us + int(ttl * 1e6), name, lease_id, self._boot_id, now_us),
            )
            return cursor.rowcount == 1

    def release(self, name: str, lease_id: str) -> bool:
        """Delete our lease; watchers see the change within 50 ms."""
        with self._transaction("release") as conn:
            cursor = conn.execute(
                "DELETE FROM celery_leader_lease WHERE name = ? AND lease_id = ?",
                (name, lease_id),
            )
            return cursor.rowcount == 1

    def read(self, name: str) -> LeaseRecord | None:
        """The live lease of *name*, or None. A plain read: it takes no write lock."""
        with self._lock:
            try:
                now_us = host_clock_us()
                row = self._live_row(self._conn, name, now_us)
            except sqlite3.Error as exc:
                raise StoreError(f"lease store {self.url}: read failed: {exc}") from None
        return None if row is None else _record(row, now_us)

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
        """Poll for a free lease in a daemon thread."""
        return _FreeLeaseWatch(self, name, callback)

    def lease_is_free(self, name: str) -> bool:
        """True when no live lease of *name* exists (used by the watcher)."""
        return self.read(name) is None

    def data_version(self) -> int:
        """SQLite's change counter for commits by other connections."""
        with self._lock:
            row = self._conn.execute("PRAGMA data_version").fetchone()
        return int(row[0])

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None


def _record(row: tuple[Any, ...], now_us: int) -> LeaseRecord:
    return LeaseRecord(
        nodename=row[1],
        hostname=row[2],
        pid=int(row[3]),
        token=int(row[4]),
        acquired_at=float(row[5]),
        expires_in=(row[7] - now_us) / 1e6,
        hold_off=max(0, row[8] - now_us) / 1e6,
    )


class _FreeLeaseWatch:
    """Calls back when another connection commits and the lease is then free."""

    def __init__(self, store: SQLiteLeaseStore, name: str, callback: Callable[[], None]) -> None:
        self._store = SQLiteLeaseStore(store._path, store.url, store._timeout)
        self._name = name
        self._callback = callback
        self._closed = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"celery-leader-watch[{name}]", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        last_version: int | None = None
        try:
            while not self._closed.wait(WATCH_POLL_INTERVAL):
                try:
                    version = self._store.data_version()
                    if version != last_version:
                        last_version = version
                        if self._store.lease_is_free(self._name) and not self._closed.is_set():
                            self._callback()
                except (StoreError, sqlite3.Error):
                    continue
                except Exception:
                    logger.exception("release watch callback failed")
        finally:
            self._store.close()

    def close(self) -> None:
        """Stop polling."""
        self._closed.set()
