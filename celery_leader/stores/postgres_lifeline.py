"""The PostgreSQL store's lifelines: a session advisory lock the server drops when its process dies.

A holder's lifeline (:class:`~celery_leader.stores.base.Lifeline`) is a
connection of its own (never pooled, autocommit, idle between two
confirmations) that holds one *session* advisory lock. When the process
dies, the kernel closes the socket, the server sees EOF at once and ends
the session, and the lock goes with it (measured here: a waiting session
was granted such a lock 0.05 s after its holder's SIGKILL). A confirmation
is one statement on that connection that answers whether this very
session still holds the lock (``pg_locks``), so an answer proves the
server kept the lifeline at the moment it answered.

A follower's readings go through one connection of their own
(:class:`LifelineReader`): one statement reads, from ``pg_locks``, which of
the followed keys' locks are granted now. The reading's session names the
server process (``pg_postmaster_start_time()``), the reader's backend and a
count of the reader's connections: a new connection (after an error, a
server restart, a failover) is a new session, so a key seen kept on the old
primary and absent on a new one is never taken for ended.

Lock ids: lifelines take the two-``int4`` form of advisory locks, with
:data:`LOCK_SPACE` as the first key and 31 random bits of the lifeline's
key (:func:`lock_of`) as the second; ``pg_locks`` shows them with
``objsubid = 2``. The store's only other advisory lock (the schema's,
``_SCHEMA_LOCK``) is of the one-``bigint`` form (``objsubid = 1``), so the
two cannot meet; an application's own locks meet them only if it uses the
two-``int4`` form with the same first key. The lock is taken with
``pg_try_advisory_lock``: an id already held (another live lifeline drew the
same 31 bits) is never shared, the lifeline draws another key. A key that
ended is never reused (a new lifeline draws a new key).

Safety statement. A reading shows a key gone only when no session holds its
lock, and the lifeline's session holds it for its whole life: a lifeline seen
gone has ended. The converse errs only towards "alive": another live
lifeline whose key drew the same 31 bits (one chance in 2**31 per pair)
makes an ended one read as kept, and its lease then ends at its expiry, as
without a lifeline. What ends a lifeline while its process lives: a server
restart or a failover (a standby never had the lock), ``pg_terminate_backend``,
the session guards of the store (the server's TCP keepalive and
``tcp_user_timeout`` after a partition). The rule in
:mod:`celery_leader.lease.lifeline` keeps each of them safe: the holder
stops acting within its grace after its last confirmation, whether it hears
of the end or not. A holder stopped whole (SIGSTOP) keeps its socket open
and its lock held: it is not taken for dead.

Connection poolers: a session advisory lock belongs to the server session.
PgBouncer in *session* mode gives a client one server session for its whole
connection and runs ``DISCARD ALL`` (which releases advisory locks) when the
client leaves: lifelines work. In *transaction* or *statement* mode a
client's statements go to any server session: the lock stays with the
session that took it, even after the client died. The first lifeline a
store opens checks that a session ends with its connection
(:func:`check_sessions_end`: a probe's lock must go once the probe closed)
and the store refuses every lifeline with :data:`ERR_SESSION_OUTLIVES` when
it does not. Opening a lifeline also checks with a second statement that its
session still holds the lock (:data:`ERR_POOLER`), and every confirmation
checks it again: a pooler that moves the lifeline to another session ends
it, and the holder stops leading within its grace. Point the store's URL at
the server, not at a transaction-mode pooler.
"""

from __future__ import annotations

import os
import selectors
import threading
import time
import uuid
from collections.abc import Callable, Collection
from contextlib import suppress
from typing import Any

from celery_leader.exceptions import StoreCallTimeoutError, StoreError, StoreUnreachableError
from celery_leader.stores.base import LifelineEndedError, LifelineReading

#: The first key of every lifeline's advisory lock (``'clif'``); see the module docstring.
LOCK_SPACE = 0x636C6966

#: Said when the lock a lifeline took was not its session's at the next statement.
ERR_POOLER = (
    "its advisory lock was not held by its session at the next statement: a pooler in"
    " transaction mode (PgBouncer?) between the store and the server; lifelines need the"
    " server itself or a session-mode pooler (failover waits for the lease to expire)"
)
#: Said when a session outlived the client connection that opened it (:func:`check_sessions_end`).
ERR_SESSION_OUTLIVES = (
    "a server session outlived the client connection that opened it: a connection pooler in"
    " transaction or statement mode (PgBouncer?) sits between the store and the server, and"
    " a dead process's lifeline would never end; lifelines need the server itself or a"
    " session-mode pooler (failover waits for the lease to expire)"
)
#: Seconds the session of a closed probe connection may take to end (a direct connection's
#: ends within milliseconds of its close).
SESSION_END_WAIT = 2.0
#: Seconds between two looks at whether the probe's session ended.
SESSION_END_POLL = 0.02
#: Said when a confirmation finds the lifeline's session no longer holds its lock.
ERR_LOCK_GONE = "its session no longer holds its advisory lock (a pooler in transaction mode?)"

#: How many keys a lifeline draws before it gives up (each lock id taken by another lifeline).
_DRAWS = 5

#: Which of the lock ids given ($2) of lifelines ($1, LOCK_SPACE) are granted in this
#: database, with the reader's backend and the server's start (the reading's session).
_READ = (
    b"SELECT pg_backend_pid(), pg_postmaster_start_time()::text,"
    b" array_to_string(array(SELECT l.objid FROM pg_locks l WHERE l.locktype = 'advisory'"
    b" AND l.granted AND l.classid = $1::oid AND l.objsubid = 2"
    b" AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    b" AND l.objid = ANY($2::oid[])), ',')"
)
#: Take the lifeline lock ($1 LOCK_SPACE, $2 the key's id) if no session holds it.
_TAKE = b"SELECT pg_try_advisory_lock($1::int4, $2::int4)"
#: Whether any session holds the lifeline lock ($1 LOCK_SPACE, $2 the key's id) in this
#: database now (a lock of the same ids in another database is another lock).
_HELD = (
    b"SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted"
    b" AND classid = $1::oid AND objid = $2::oid AND objsubid = 2"
    b" AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))"
)
#: Whether this very session holds the lifeline lock ($1 LOCK_SPACE, $2 the key's id) now.
_HOLDS = (
    b"SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted"
    b" AND pid = pg_backend_pid() AND classid = $1::oid AND objid = $2::oid AND objsubid = 2)"
)

Describe = Callable[[str, BaseException], str]


def lock_of(key: str) -> int | None:
    """The second key of the advisory lock of lifeline *key*; None when *key* is not one of ours.

    The first 31 bits of the key (a random hex string), so that the id is a
    positive ``int4`` and ``pg_locks`` shows it unchanged as an ``oid``.
    """
    head = key[:8]
    if len(head) < 8 or any(c not in "0123456789abcdef" for c in head):  # noqa: PLR2004
        return None
    return int(head, 16) & 0x7FFFFFFF


def _params(*values: object) -> list[bytes]:
    """Statement parameters in text form."""
    return [str(value).encode() for value in values]


def _round_trip(pgconn: Any, query: bytes, params: list[bytes], timeout: float) -> Any:
    """Send *query* on libpq connection *pgconn*; its result within *timeout* s, or TimeoutError.

    One statement, no helper thread: the wait for the answer is a ``select``
    on the socket with a deadline. After a TimeoutError the statement may
    still be in flight: the caller must not use the connection again.
    Raises ``psycopg.OperationalError`` when the connection is broken.
    """
    deadline = time.monotonic() + timeout
    pgconn.send_query_params(query, params)
    result: Any = None
    with selectors.DefaultSelector() as selector:
        selector.register(pgconn.socket, selectors.EVENT_READ)
        while True:
            pgconn.consume_input()
            while not pgconn.is_busy():
                got = pgconn.get_result()
                if got is None:
                    return result
                result = result if result is not None else got  # one statement: one result
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no answer in {timeout:g} s")
            # Ready or not, the input is read once more before giving up: a process stopped
            # (SIGSTOP) past the deadline finds the answer that came meanwhile.
            selector.select(remaining)


def _failed(result: Any) -> str | None:
    """The error of a statement's *result*, None when it returned rows."""
    from psycopg import pq  # noqa: PLC0415 - an optional extra, there once a store is open

    if result is not None and result.status == pq.ExecStatus.TUPLES_OK:
        return None
    if result is None:
        return "no result"
    text = (result.error_message or b"").decode(errors="replace").strip()
    return text or str(result.status)


class PostgresLifeline:
    """A connection of this process holding one session advisory lock (module docstring)."""

    def __init__(self, conn: Any, key: str, describe: Describe) -> None:
        self.key = key
        self._conn = conn
        self._describe = describe
        self._lock = _params(LOCK_SPACE, lock_of(key))

    @classmethod
    def open(
        cls,
        connect: Callable[[], Any],
        timeout: float,
        describe: Describe,
        *,
        probe: Callable[[], Any] | None = None,
    ) -> PostgresLifeline:
        """Connect, take the lock of a fresh key, and check its session still holds it.

        With *probe* (a connect of its own), first check that a session ends
        with its connection (:func:`check_sessions_end`). Raises
        :class:`~celery_leader.exceptions.StoreError` when the server cannot
        be reached, every lock id drawn was taken, the lock was not the
        session's at the next statement (:data:`ERR_POOLER`), or a session
        outlived its connection (:data:`ERR_SESSION_OUTLIVES`).
        """
        import psycopg  # noqa: PLC0415 - an optional extra, there once a store is open

        try:
            conn = connect()
        except psycopg.Error as exc:
            raise StoreUnreachableError(describe("open lifeline", exc)) from None
        try:
            if probe is not None:
                check_sessions_end(probe, conn.pgconn, timeout, describe)
            key = _take_lock(conn.pgconn, timeout, describe)
        except TimeoutError as exc:
            conn.close()
            raise StoreCallTimeoutError(describe("open lifeline", exc)) from None
        except psycopg.Error as exc:
            conn.close()
            raise StoreUnreachableError(describe("open lifeline", exc)) from None
        except BaseException:
            conn.close()
            raise
        return cls(conn, key, describe)

    def confirm(self, timeout: float) -> None:
        """One statement on the lifeline's connection: its session must still hold the lock.

        See :meth:`~celery_leader.stores.base.Lifeline.confirm`. Any answer
        but "yes" ends the lifeline (:class:`LifelineEndedError`), and so
        does a broken connection; no answer within *timeout* raises
        :class:`~celery_leader.exceptions.StoreCallTimeoutError` and closes
        the connection (the statement may still be in flight on it).
        """
        import psycopg  # noqa: PLC0415 - an optional extra, there once a store is open

        if self._conn.closed:
            raise LifelineEndedError(self._describe("confirm lifeline", RuntimeError("closed")))
        try:
            result = _round_trip(self._conn.pgconn, _HOLDS, self._lock, timeout)
        except TimeoutError as exc:
            self.close()
            raise StoreCallTimeoutError(self._describe("confirm lifeline", exc)) from None
        except psycopg.Error as exc:
            self.close()
            raise LifelineEndedError(self._describe("confirm lifeline", exc)) from None
        error = _failed(result)
        if error is None and result.get_value(0, 0) != b"t":
            error = ERR_LOCK_GONE
        if error is not None:
            self.close()
            raise LifelineEndedError(self._describe("confirm lifeline", RuntimeError(error)))

    def fileno(self) -> int:
        """The connection's socket (-1 once closed)."""
        try:
            return int(self._conn.pgconn.socket)
        except Exception:  # noqa: BLE001 - closed or broken: nothing to drop
            return -1

    def close(self) -> None:
        """Close the connection: the server ends the session, and the lock with it."""
        with suppress(Exception):
            self._conn.close()


def _take_lock(pgconn: Any, timeout: float, describe: Describe) -> str:
    """Take the lock of a fresh key on *pgconn*, and check the next statement still holds it.

    The key's id may be held by another live lifeline: then a new key is drawn.
    """
    for _ in range(_DRAWS):
        key = uuid.uuid4().hex
        lock = _params(LOCK_SPACE, lock_of(key))
        taken = _round_trip(pgconn, _TAKE, lock, timeout)
        _check(taken, describe)
        if taken.get_value(0, 0) == b"t":
            break
    else:
        raise StoreError(describe("open lifeline", RuntimeError("every lock id drawn was taken")))
    # A second statement: a pooler in transaction mode may hand it to another server session
    # than the one that took the lock.
    held = _round_trip(pgconn, _HOLDS, lock, timeout)
    _check(held, describe)
    if held.get_value(0, 0) != b"t":
        raise StoreError(describe("open lifeline", RuntimeError(ERR_POOLER)))
    return key


def check_sessions_end(
    connect: Callable[[], Any], pgconn: Any, timeout: float, describe: Describe
) -> None:
    """Raise StoreError (:data:`ERR_SESSION_OUTLIVES`) unless a session ends with its connection.

    A probe connection takes a lock of a fresh key and closes; *pgconn*
    (another connection) then looks until no session holds that lock, for
    :data:`SESSION_END_WAIT` at most. The server ends a direct
    connection's session at its close (and a session-mode pooler releases
    advisory locks with ``DISCARD ALL`` when its client leaves); a pooler in
    transaction or statement mode keeps the server session, lock and all,
    for its next client: a lifeline would then outlive its dead holder, and
    no follower would ever see it end. Raises ``psycopg.Error`` and
    ``TimeoutError`` as :func:`_round_trip` does.
    """
    probe = connect()
    try:
        key = _take_lock(probe.pgconn, timeout, describe)
    finally:
        probe.close()
    lock = _params(LOCK_SPACE, lock_of(key))
    deadline = time.monotonic() + SESSION_END_WAIT
    while True:
        # Refused only on a look sent once the wait was over: a process stalled (the GIL, a
        # starved CPU) after a look sent while the probe's session was still ending looks again.
        last = time.monotonic() >= deadline
        held = _round_trip(pgconn, _HELD, lock, timeout)
        _check(held, describe)
        if held.get_value(0, 0) != b"t":
            return
        if last:
            raise StoreError(describe("open lifeline", RuntimeError(ERR_SESSION_OUTLIVES)))
        time.sleep(SESSION_END_POLL)


def _check(result: Any, describe: Describe) -> None:
    error = _failed(result)
    if error is not None:
        raise StoreError(describe("open lifeline", RuntimeError(error)))


class LifelineReader:
    """A follower's readings of lifelines, on one connection of their own (thread-safe).

    The connection is opened at the first reading and again after any
    error; each opening starts a new session of readings.
    """

    def __init__(self, connect: Callable[[], Any], timeout: float, describe: Describe) -> None:
        self._connect = connect
        self._timeout = timeout
        self._describe = describe
        self._lock = threading.Lock()
        self._conn: Any = None
        self._pid = os.getpid()
        self._opened = 0

    def read(self, keys: Collection[str]) -> LifelineReading:
        """Which of *keys* have their lock held now: one statement (``pg_locks``)."""
        import psycopg  # noqa: PLC0415 - an optional extra, there once a store is open

        locks = {key: lock_of(key) for key in keys}
        ids = sorted({lock for lock in locks.values() if lock is not None})
        if not self._lock.acquire(timeout=self._timeout):
            busy = TimeoutError("another reading is in flight")
            raise StoreCallTimeoutError(self._describe("read lifelines", busy))
        try:
            if self._pid != os.getpid():
                # Inherited over fork: the parent's session, neither to use nor to close.
                self._pid, self._conn = os.getpid(), None
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = self._connect()
                    self._opened += 1  # a new connection: nothing seen before it counts
                array = "{" + ",".join(map(str, ids)) + "}"
                result = _round_trip(
                    self._conn.pgconn, _READ, _params(LOCK_SPACE, array), self._timeout
                )
            except TimeoutError as exc:
                self._drop()
                raise StoreCallTimeoutError(self._describe("read lifelines", exc)) from None
            except psycopg.Error as exc:
                self._drop()
                raise StoreUnreachableError(self._describe("read lifelines", exc)) from None
            error = _failed(result)
            if error is not None:
                self._drop()
                raise StoreError(self._describe("read lifelines", RuntimeError(error)))
            pid, started, held = (result.get_value(0, i).decode() for i in range(3))
            session = f"{id(self):x}:{self._opened}:{pid}:{started}"
        finally:
            self._lock.release()
        granted = {int(lock) for lock in held.split(",") if lock}
        alive = frozenset(key for key, lock in locks.items() if lock in granted)
        return LifelineReading(session, alive)

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with suppress(Exception):
                conn.close()

    def close(self) -> None:
        """Close the reader's connection."""
        with self._lock:
            if self._pid == os.getpid():
                self._drop()
            self._conn = None
