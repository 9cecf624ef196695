"""The lease store on PostgreSQL (``postgresql://user:password@host:port/dbname``).

Install with ``pip install 'celery-leader[postgres]'`` (psycopg 3). The
tables are created on first use; teams that manage schemas can create them
beforehand with :data:`DDL` (the docs print it), and the store then needs
only SELECT, INSERT, UPDATE, DELETE on them and USAGE on the sequence.

How: one row per election in ``celery_leader_lease``, expiry on the
server's clock (``clock_timestamp()``, in microseconds), acquire as one
statement that calls the server-side function ``celery_leader_acquire()``
(it locks the election's row and applies :mod:`celery_leader.stores.rules`
in SQL; ``tests/stores/test_rules_oracle.py`` holds it to them), renew and
release as single compare-and-set ``UPDATE`` statements, a member's
announce as one statement too. Tokens come from the sequence
``celery_leader_token_seq`` (never rolled back, kept on disk) as
``max(nextval, server time in us, min + 1)``. A release sends
``NOTIFY celery_leader_release`` with the election's name; each process
keeps one ``LISTEN`` connection per database, whatever the number of
elections it watches, so 200 followers in 10 processes use 10 listening
connections plus one each for their calls.

Data loss: older data can come back under the lease (a file-system snapshot
restored, a dump loaded, a failover to an asynchronous standby that missed
the last commits, a crash of a server run with ``synchronous_commit = off``).
The store records with each acquire the data's incarnation: the cluster's
system identifier, its current timeline (a promotion or a recovery starts a
new one) and the server's start time. An acquire that finds another cluster
or timeline, no record of the election (first use, or a database without
its row), or a lease gone before its recorded end (deleted by hand) holds
the new holder off one ttl. One that finds only another start time (a
restart: the rows prove the earlier terms, but a file-system snapshot of
the same cluster started in the server's place looks the same) holds it off
until one ttl after the server started, and not at all once that passed: a
holder of a term such a snapshot lacks renewed it before the server
stopped (:func:`celery_leader.stores.rules.hold_off`). That assumes no two
servers took writes for the data at once (see failover below). The store's
sessions commit synchronously whatever the server's default. Not told
apart: a dump loaded into the same running server.

Nothing held between two round trips: a row lock lasts until its
transaction ends, and a client that stops (SIGSTOP, a paused container) or
is cut off between two statements of a transaction leaves its session "idle
in transaction", holding the lock until the server notices. Every call of
the store is one statement in its own transaction, so the server runs it to
the end and lets go of its locks whether or not the client is still there:
a follower frozen in its acquire cannot stall the leader's renewals. (Only
the creation of a missing schema is a transaction of two statements.)

Session guards, set on every connection the store opens (as startup
options, so they hold whatever the server's defaults are; the bound is the
store's timeout, ``leader_store_timeout``, which is below the ttl):

* ``statement_timeout`` and ``lock_timeout``: a slow statement, or one
  waiting on a lock, ends within the bound.
* ``idle_in_transaction_session_timeout`` (the bound, at least 1 s): the
  server ends a session whose transaction sits idle, its client stopped or
  cut off between two statements, and its locks go with it.
* ``tcp_keepalives_idle``/``_interval``/``_count`` (1 s, 1 s, 3) and
  ``tcp_user_timeout`` (the bound, at least 1 s), on the server's side: a
  client whose host died or was cut off is noticed in seconds, not after the
  two hours of the OS's keepalive defaults, whether its session was idle or
  had data in flight. A stopped process on a live host still answers
  keepalives: the statement and idle-transaction bounds cover it.
* ``keepalives``, ``keepalives_idle``/``_interval``/``_count`` and
  ``tcp_user_timeout`` in libpq's conninfo, on the client's side: the same
  for a server that vanished. A call that gets no answer at all (a paused
  server, a partition TCP has not noticed yet) is ended by shutting its
  socket down at the deadline.

Lifelines (:attr:`~celery_leader.stores.base.Capability.LIFELINE`): each
process holds a session advisory lock on a connection of its own, which the
server drops when the process dies, and each acquire records the key of the
holder's lifeline with the term (the ``lifeline`` column, schema 3). A
follower that saw the lock go takes the dead term over at once
(``celery_leader_acquire()`` told that term: a compare-and-set on its token
and key, in the same single statement).
:mod:`celery_leader.stores.postgres_lifeline` says how, which lock ids,
and what a connection pooler does to it: PgBouncer in transaction mode breaks
session locks (a lifeline refuses to open when it notices, else the fast
failover is lost, never the lease's safety). A schema this role may not bring
up to date works without them (leases then end at their expiry).

Clocks and failover: expiry runs on the server's wall clock, so a step
forward of the server's clock ends every lease early, while its holder
still trusts it (as on Redis: slew the server's clock, never step it).
Replication is asynchronous: a holder cut off together with the old primary
can go on renewing there while a standby is promoted (two holders at once;
the hold-off on the new timeline covers the old holder only if the old
primary takes no write after the promotion). The failover manager must
fence the old primary (demote or stop it first: Patroni with its watchdog,
pg_auto_failover), or only a synchronous standby
(``synchronous_standby_names``) may be promoted: the store commits with
``synchronous_commit = on``, so a primary cut off from it acknowledges no
renewal.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import Any, ClassVar
from urllib.parse import parse_qsl, unquote

from celery_leader._masking import mask_text, mask_url
from celery_leader.exceptions import StoreCallTimeoutError, StoreError, StoreUnreachableError
from celery_leader.stores.base import (
    AcquireResult,
    Capability,
    Holder,
    LeaseRecord,
    LeaseStoreClass,
    Lifeline,
    LifelineReading,
    MissingExtraError,
    Watch,
)
from celery_leader.stores.postgres_lifeline import (
    ERR_POOLER,
    ERR_SESSION_OUTLIVES,
    LifelineReader,
    PostgresLifeline,
)
from celery_leader.stores.watch import Fanout, shared_fanout

logger = logging.getLogger(__name__)

#: The channel releases are announced on; the payload is the election's name.
CHANNEL = "celery_leader_release"

#: The schema, created on first use (under an advisory lock, so two workers starting at
#: once do not race). Idempotent.
DDL = """
CREATE SEQUENCE IF NOT EXISTS celery_leader_token_seq;
CREATE TABLE IF NOT EXISTS celery_leader_lease (
    name text PRIMARY KEY,
    lease_id text,
    nodename text,
    hostname text,
    pid integer,
    token bigint,
    acquired_at double precision,
    expires_at_us bigint NOT NULL DEFAULT 0,
    hold_until_us bigint NOT NULL DEFAULT 0,
    ttl_us bigint NOT NULL DEFAULT 0,
    lease_end_us bigint NOT NULL DEFAULT 0,
    incarnation text
);
-- Since schema 3: the key of the lifeline the holder tied its term to ('' for none).
ALTER TABLE celery_leader_lease ADD COLUMN IF NOT EXISTS lifeline text NOT NULL DEFAULT '';
CREATE TABLE IF NOT EXISTS celery_leader_state (
    name text NOT NULL,
    key text NOT NULL,
    value text NOT NULL,
    PRIMARY KEY (name, key)
);
CREATE OR REPLACE FUNCTION celery_leader_now_us() RETURNS bigint LANGUAGE sql VOLATILE
    AS $$ SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint $$;
-- The data's incarnation: the cluster's identity, its timeline and the server's start.
CREATE OR REPLACE FUNCTION celery_leader_incarnation() RETURNS text LANGUAGE sql VOLATILE
    AS $$ SELECT (SELECT system_identifier::text FROM pg_control_system()) || ':'
                 || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) || ':'
                 || pg_postmaster_start_time()::text $$;
CREATE TABLE IF NOT EXISTS celery_leader_member (
    grp text NOT NULL,
    member text NOT NULL,
    payload text NOT NULL,
    expires_at_us bigint NOT NULL,
    PRIMARY KEY (grp, member)
);
-- The acquire, in one statement (celery_leader/stores/rules.py, in SQL), and the takeover
-- of a dead term (Lifelines.take_over: p_dead_token and p_dead_lifeline name the term, ''
-- for none). Dropped first: an earlier version's has fewer OUT columns, which CREATE OR
-- REPLACE cannot change.
DROP FUNCTION IF EXISTS celery_leader_acquire(text, text, text, text, integer, bigint, bigint);
DROP FUNCTION IF EXISTS celery_leader_acquire(
    text, text, text, text, integer, bigint, bigint, text, bigint, text);
CREATE FUNCTION celery_leader_acquire(
    p_name text, p_lease_id text, p_nodename text, p_hostname text, p_pid integer,
    p_ttl_us bigint, p_min_token bigint, p_lifeline text, p_dead_token bigint,
    p_dead_lifeline text,
    OUT o_acquired boolean, OUT o_token bigint, OUT o_hold_off_us bigint,
    OUT o_lease_id text, OUT o_nodename text, OUT o_hostname text, OUT o_pid integer,
    OUT o_held_token bigint, OUT o_acquired_at double precision, OUT o_expires_at_us bigint,
    OUT o_hold_until_us bigint, OUT o_ttl_us bigint, OUT o_now_us bigint,
    OUT o_restarted_us bigint, OUT o_lifeline text)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    r record;
    seen text;
    live boolean;
    taken_over boolean := false;
    own_hold_until bigint := 0;
    forgot boolean;
    hold_until bigint;
    drawn bigint;
BEGIN
    INSERT INTO celery_leader_lease (name) VALUES (p_name) ON CONFLICT DO NOTHING;
    SELECT * INTO STRICT r FROM celery_leader_lease WHERE name = p_name FOR UPDATE;
    o_now_us := celery_leader_now_us();
    seen := celery_leader_incarnation();
    live := r.lease_id IS NOT NULL AND r.expires_at_us > o_now_us;
    IF live AND p_dead_lifeline <> '' AND r.lease_id <> p_lease_id
            AND r.token = p_dead_token AND r.lifeline = p_dead_lifeline THEN
        -- The dead term a takeover names, still held: freed as a release frees it (its
        -- early end is no loss of data), and what is left of its hold-off carries over.
        live := false;
        taken_over := true;
        own_hold_until := r.hold_until_us;
    END IF;
    IF live AND r.lease_id <> p_lease_id THEN
        o_acquired := false;
        o_lease_id := r.lease_id; o_nodename := r.nodename; o_hostname := r.hostname;
        o_pid := r.pid; o_held_token := r.token; o_acquired_at := r.acquired_at;
        o_expires_at_us := r.expires_at_us; o_hold_until_us := r.hold_until_us;
        o_ttl_us := r.ttl_us; o_lifeline := r.lifeline;
        RETURN;
    END IF;
    IF live THEN
        own_hold_until := r.hold_until_us;  -- our own lease (a lost reply): its hold-off runs on
    END IF;
    -- rules.store_forgot: no record (first use, or a database without its row), data of
    -- another cluster or timeline (the incarnation's part before its second colon), or a
    -- lease gone before its recorded end (rules.lease_vanished_early).
    forgot := r.incarnation IS NULL
        OR substring(r.incarnation FROM '^[^:]*:[^:]*') <> substring(seen FROM '^[^:]*:[^:]*')
        OR (NOT live AND NOT taken_over AND r.lease_end_us > o_now_us);
    -- Only the start time differs: the server restarted (rules.hold_off's restarted_at).
    IF NOT forgot AND r.incarnation <> seen THEN
        o_restarted_us := (extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint;
    END IF;
    -- rules.hold_off
    o_hold_off_us := GREATEST(0, own_hold_until - o_now_us);
    hold_until := own_hold_until;
    IF forgot THEN
        hold_until := GREATEST(hold_until, o_now_us + p_ttl_us);
        o_hold_off_us := GREATEST(o_hold_off_us, p_ttl_us);
    ELSIF o_restarted_us IS NOT NULL THEN
        hold_until := GREATEST(hold_until, o_restarted_us + p_ttl_us);
        o_hold_off_us := GREATEST(o_hold_off_us, o_restarted_us + p_ttl_us - o_now_us);
    END IF;
    -- rules.next_token, the sequence's last value being drawn - 1
    drawn := nextval('celery_leader_token_seq');
    o_token := GREATEST(drawn, o_now_us, p_min_token + 1);
    IF o_token <> drawn THEN
        PERFORM setval('celery_leader_token_seq', o_token);
    END IF;
    UPDATE celery_leader_lease SET lease_id = p_lease_id, nodename = p_nodename,
        hostname = p_hostname, pid = p_pid, token = o_token, acquired_at = o_now_us / 1e6,
        expires_at_us = o_now_us + p_ttl_us, hold_until_us = hold_until, ttl_us = p_ttl_us,
        lease_end_us = o_now_us + p_ttl_us, incarnation = seen, lifeline = p_lifeline
        WHERE name = p_name;
    o_acquired := true;
END $$;
-- The acquire as earlier versions call it (a rolling upgrade): no lifeline, and their
-- columns (a statement they prepared keeps its result type). It carries the schema's
-- version, where those versions look for it.
CREATE FUNCTION celery_leader_acquire(
    p_name text, p_lease_id text, p_nodename text, p_hostname text, p_pid integer,
    p_ttl_us bigint, p_min_token bigint,
    OUT o_acquired boolean, OUT o_token bigint, OUT o_hold_off_us bigint,
    OUT o_lease_id text, OUT o_nodename text, OUT o_hostname text, OUT o_pid integer,
    OUT o_held_token bigint, OUT o_acquired_at double precision, OUT o_expires_at_us bigint,
    OUT o_hold_until_us bigint, OUT o_ttl_us bigint, OUT o_now_us bigint,
    OUT o_restarted_us bigint)
LANGUAGE sql VOLATILE AS $$
    SELECT o_acquired, o_token, o_hold_off_us, o_lease_id, o_nodename, o_hostname, o_pid,
        o_held_token, o_acquired_at, o_expires_at_us, o_hold_until_us, o_ttl_us, o_now_us,
        o_restarted_us
    FROM celery_leader_acquire(p_name, p_lease_id, p_nodename, p_hostname, p_pid, p_ttl_us,
        p_min_token, ''::text, 0::bigint, ''::text) $$;
COMMENT ON FUNCTION celery_leader_acquire(text, text, text, text, integer, bigint, bigint)
    IS 'celery-leader schema 3';
"""

#: Three booleans: every object of schema 2 is there (what earlier versions need); the
#: schema is of this version (3, as the comment on the seven-argument acquire says) or a
#: later one; and the objects of lifelines (schema 3) are there. An earlier version's
#: schema is brought up to date by running DDL again.
_SCHEMA_STATE = (
    "SELECT complete, complete AND lifelines AND version >= 3, lifelines FROM (SELECT"
    " to_regclass('celery_leader_token_seq') IS NOT NULL"
    " AND to_regclass('celery_leader_lease') IS NOT NULL"
    " AND to_regclass('celery_leader_state') IS NOT NULL"
    " AND to_regclass('celery_leader_member') IS NOT NULL"
    " AND to_regprocedure('celery_leader_now_us()') IS NOT NULL"
    " AND to_regprocedure('celery_leader_incarnation()') IS NOT NULL"
    " AND to_regprocedure('celery_leader_acquire(text, text, text, text, integer, bigint,"
    " bigint)') IS NOT NULL AS complete,"
    " to_regprocedure('celery_leader_acquire(text, text, text, text, integer, bigint, bigint,"
    " text, bigint, text)') IS NOT NULL AND EXISTS (SELECT 1 FROM pg_attribute"
    " WHERE attrelid = to_regclass('celery_leader_lease') AND attname = 'lifeline'"
    " AND NOT attisdropped) AS lifelines,"
    " coalesce(substring(obj_description(to_regprocedure('celery_leader_acquire(text, text,"
    " text, text, integer, bigint, bigint)'), 'pg_proc')"
    " FROM 'celery-leader schema ([0-9]+)')::int, 1) AS version) AS schema"
)
#: The lease row, in the order _record reads it, then the server's clock and the lifeline.
_READ_LEASE = (
    "SELECT lease_id, nodename, hostname, pid, token, acquired_at, expires_at_us,"
    " hold_until_us, ttl_us, lease_end_us, incarnation, celery_leader_now_us(), lifeline"
    " FROM celery_leader_lease WHERE name = %s"
)
#: The same in an earlier version's schema (no lifeline column).
_READ_LEASE_SCHEMA_2 = _READ_LEASE.replace(", lifeline FROM", ", '' FROM")
_SCHEMA_LOCK = 0x63656C6C  # the advisory lock the schema is created under ("cell")

#: Said when part of the schema is missing and the store's role may not create it (a
#: schema made beforehand by an earlier version, which had no celery_leader_acquire()).
ERR_SCHEMA_INCOMPLETE = (
    "the schema is incomplete (made by an earlier version?) and this role may not"
    " complete it: run celery_leader.stores.postgres.DDL (printed on the docs' PostgreSQL"
    " store page) as the owner of the tables; it keeps what is there"
)


#: Warned once per process when the schema is complete but from an earlier version, and
#: the store's role may not bring it up to date: it works, as that version did.
WARN_SCHEMA_OUTDATED = (
    "celery-leader: the PostgreSQL schema of %s is from an earlier version and this role may "
    "not update it: run celery_leader.stores.postgres.DDL as the owner of the tables (it keeps "
    "what is there). Until then it works as that version did: a leader whose process died is "
    "replaced only when its lease expires, and with a schema older than version 2 a restart "
    "of the server holds the next leader off one whole ttl"
)
_outdated_warned: set[str] = set()


class _SchemaNotCreatableError(Exception):
    """Part of the schema is missing, and the role may not create it."""


def _psycopg() -> Any:
    try:
        import psycopg  # noqa: PLC0415 - an optional extra
    except ImportError:
        raise MissingExtraError("postgresql://", "postgres") from None
    return psycopg


class PostgresLeaseStore:
    """Leases in PostgreSQL rows; see the module docstring for the guarantees."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.RELEASE_NOTIFICATION,
            Capability.SERVER_TIME,
            Capability.FENCING_SURVIVES_DATA_LOSS,
            Capability.MULTI_HOST,
            Capability.LIFELINE,
        }
    )
    schemes: ClassVar[tuple[str, ...]] = ("postgresql://", "postgres://")
    extra: ClassVar[str | None] = "postgres"
    ttl_range: ClassVar[tuple[float | None, float | None]] = (None, None)
    default_renew_fraction: ClassVar[float] = 1 / 3
    option_keys: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        """No options of its own."""

    @classmethod
    def from_url(
        cls, url: str, *, timeout: float, options: Mapping[str, Any] | None = None
    ) -> PostgresLeaseStore:
        """Open a store on *url*; a call gives up after about *timeout* seconds."""
        return cls(url, timeout)

    def __init__(self, url: str, timeout: float) -> None:
        self._psycopg = _psycopg()
        self._dsn = url
        self.url = mask_url(url)
        self._timeout = timeout
        self._shared = _Connection.of(url, timeout)
        self._lifeline_reader = LifelineReader(
            lambda: _connect(url, timeout, "celery-leader-lifelines"), timeout, self._message
        )
        self._closed = False
        #: Whether a session was seen ending with its connection (checked at the first open
        #: of a lifeline), and the refusal when a pooler was found (a session outlived its
        #: connection, or a statement went to another session): a pooler's mode does not
        #: change under a running process, so it is neither probed nor said again.
        self._sessions_end = False
        self._sessions_outlive: str | None = None

    # -- the connection ---------------------------------------------------------

    def _call(self, what: str, body: Callable[[Any], Any]) -> Any:
        """*body* on the process's connection; errors become StoreError naming the store.

        A call never outlasts the timeout by much: ``statement_timeout`` ends
        a slow statement on the server, and a deadline here ends the wait on a
        server that does not answer at all (paused, partitioned: TCP keeps the
        silent connection open) by shutting the connection's socket down.

        A connection that died while idle (a server restart, a proxy's idle
        timeout) is only found out by using it: a call that fails that way on
        a connection opened earlier is tried once more on a new one (never
        after the deadline, nor after an error the server sent). Every call
        here may run twice without harm: a renewal or a release is a
        compare-and-set on the caller's own lease id, an acquire that did land
        finds its own lease and takes it again.
        """
        if self._closed:
            raise StoreError(f"lease store {self.url}: {what} after close()")
        psycopg = self._psycopg
        shared = self._shared
        if not shared.lock.acquire(timeout=self._timeout):
            # Another call of this process holds the connection (a server that hangs).
            raise StoreCallTimeoutError(self._message(what, TimeoutError("connection busy")))
        try:
            for retry in (True, False):
                reused = shared.is_open()
                deadline = _Deadline(self._timeout)
                try:
                    conn = shared.connection()
                    with deadline.on(conn):
                        return body(conn)
                except _SchemaNotCreatableError:
                    raise StoreError(
                        f"lease store {self.url}: {what} failed: {ERR_SCHEMA_INCOMPLETE}"
                    ) from None
                except psycopg.errors.QueryCanceled as exc:
                    shared.drop()
                    raise StoreCallTimeoutError(self._message(what, exc)) from None
                except psycopg.OperationalError as exc:
                    shared.drop()
                    if deadline.passed:
                        raise StoreCallTimeoutError(
                            self._message(what, TimeoutError(f"no answer in {self._timeout:g} s"))
                        ) from None
                    # Client-side failures, connection exceptions (08) and a server
                    # that ended the session (57): the connection had died while idle.
                    lost = exc.sqlstate is None or exc.sqlstate.startswith(("08", "57"))
                    if retry and reused and lost:
                        continue  # once more, on a new connection
                    raise StoreUnreachableError(self._message(what, exc)) from None
                except psycopg.Error as exc:
                    shared.drop()
                    raise StoreError(self._message(what, exc)) from None
            raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises
        finally:
            shared.lock.release()

    def _message(self, what: str, exc: BaseException) -> str:
        text = str(exc).strip()
        detail = text.splitlines()[0] if text else ""
        # libpq may quote parts of the URL back (a badly encoded password): mask them.
        for secret in _secrets_of(self._dsn):
            detail = detail.replace(secret, "***")
        detail = mask_text(detail)
        return f"lease store {self.url}: {what} failed: {detail or type(exc).__name__}"

    # -- the lease --------------------------------------------------------------

    def acquire(self, name: str, holder: Holder, ttl: float, min_token: int = 0) -> AcquireResult:
        """Take the lease when free, expired or ours, with a new token: one statement.

        ``celery_leader_acquire()`` (in :data:`DDL`) applies
        :mod:`celery_leader.stores.rules` on the server, holding the row's lock
        only while it runs: a caller that stops or is cut off after sending it
        holds nothing (``tests/stores/test_rules_oracle.py`` holds the function
        to the rules). The holder's lifeline key is recorded with the term.
        """
        return self._acquire("acquire", name, holder, ttl, min_token, None)

    def take_over(
        self, name: str, holder: Holder, ttl: float, dead: LeaseRecord, min_token: int = 0
    ) -> AcquireResult:
        """See :class:`~celery_leader.stores.base.Lifelines`: one statement, a CAS on the term.

        The same function as :meth:`acquire`, told the dead term (its token
        and lifeline key): only while the row still holds that term is it
        freed, as a release frees it (no hold-off for its early end; what is
        left of its own hold-off carries over), and taken in the same
        statement. Any other row answers as an acquire. A schema this role
        may not bring up to date (no lifelines) answers as an acquire.
        """
        return self._acquire("take over", name, holder, ttl, min_token, dead)

    def _acquire(  # noqa: PLR0917 - acquire's arguments, and the term a takeover names
        self,
        what: str,
        name: str,
        holder: Holder,
        ttl: float,
        min_token: int,
        dead: LeaseRecord | None,
    ) -> AcquireResult:
        def body(conn: Any) -> AcquireResult:
            args: tuple[Any, ...] = (
                name,
                holder.lease_id,
                holder.nodename,
                holder.hostname,
                holder.pid,
                int(ttl * 1e6),
                int(min_token),
            )
            if self._shared.lifelines:
                dead_term = (0, "") if dead is None else (int(dead.token), dead.lifeline)
                sql = (
                    "SELECT * FROM celery_leader_acquire(%s::text, %s::text, %s::text, %s::text,"
                    " %s::integer, %s::bigint, %s::bigint, %s::text, %s::bigint, %s::text)"
                )
                args = (*args, holder.lifeline, *dead_term)
            else:  # an earlier version's schema, as that version called it
                sql = (
                    "SELECT * FROM celery_leader_acquire(%s::text, %s::text, %s::text, %s::text,"
                    " %s::integer, %s::bigint, %s::bigint)"
                )
            row = conn.execute(sql, args).fetchone()
            acquired, token, hold_off_us, now_us = row[0], row[1], row[2], int(row[12])
            # An earlier version's function (a schema this role may not update) has no
            # start-time column: its restarts count as another incarnation.
            restarted_us = row[13] if len(row) > _RESTARTED_COLUMN else None
            if not acquired:
                # The holder's columns, in the order _record reads them.
                held = (row[3], row[4], row[5], row[6], row[7], row[8], row[9], row[10], row[11])
                lifeline = row[_LIFELINE_COLUMN] if len(row) > _LIFELINE_COLUMN else None
                return AcquireResult(
                    acquired=False,
                    holder=_record(held, now_us, lifeline),
                    retry_in=(int(row[9]) - now_us) / 1e6,
                )
            return AcquireResult(
                acquired=True,
                token=int(token),
                hold_off=int(hold_off_us) / 1e6,
                restarted_ago=None if restarted_us is None else (now_us - int(restarted_us)) / 1e6,
            )

        result: AcquireResult = self._call(what, body)
        return result

    def renew(self, name: str, lease_id: str, ttl: float) -> bool:
        """Compare-and-set: extend our live lease (and its recorded end), one statement."""

        def body(conn: Any) -> Any:
            row = conn.execute(
                "UPDATE celery_leader_lease SET expires_at_us = celery_leader_now_us() + %s,"
                " lease_end_us = celery_leader_now_us() + %s"
                " WHERE name = %s AND lease_id = %s AND expires_at_us > celery_leader_now_us()"
                " RETURNING 1",
                (int(ttl * 1e6), int(ttl * 1e6), name, lease_id),
            ).fetchone()
            return row is not None

        answer: bool = self._call("renew", body)
        return answer

    def release(self, name: str, lease_id: str) -> bool:
        """Compare-and-set: end our live lease and announce it (NOTIFY), one statement."""

        def body(conn: Any) -> Any:
            row = conn.execute(
                "WITH ended AS (UPDATE celery_leader_lease SET lease_id = NULL,"
                " expires_at_us = 0, lease_end_us = 0"
                " WHERE name = %s AND lease_id = %s AND expires_at_us > celery_leader_now_us()"
                " RETURNING name)"
                " SELECT pg_notify(%s, name) FROM ended",
                (name, lease_id, CHANNEL),
            ).fetchone()
            return row is not None

        answer: bool = self._call("release", body)
        return answer

    def read(self, name: str) -> LeaseRecord | None:
        """The live lease of *name*, or None."""

        def body(conn: Any) -> Any:
            sql = _READ_LEASE if self._shared.lifelines else _READ_LEASE_SCHEMA_2
            row = conn.execute(sql, (name,)).fetchone()
            if row is None or row[0] is None or row[6] <= row[11] or row[1] is None:
                return None
            return _record(row, row[11], row[12])

        record: LeaseRecord | None = self._call("read", body)
        return record

    def last_token(self, name: str) -> int | None:
        """The token of the last term of *name*, or None when it never had one."""

        def body(conn: Any) -> Any:
            row = conn.execute(
                "SELECT token FROM celery_leader_lease WHERE name = %s", (name,)
            ).fetchone()
            return None if row is None or row[0] is None else int(row[0])

        token: int | None = self._call("read", body)
        return token

    # -- state beside the lease -------------------------------------------------

    def get_state(self, name: str) -> dict[str, str]:
        """Every key stored for *name*."""

        def body(conn: Any) -> Any:
            rows = conn.execute(
                "SELECT key, value FROM celery_leader_state WHERE name = %s", (name,)
            ).fetchall()
            return {str(key): str(value) for key, value in rows}

        state: dict[str, str] = self._call("get_state", body)
        return state

    def set_state(self, name: str, lease_id: str, key: str, value: str) -> bool:
        """Set *key* while *lease_id* holds the live lease (one statement); False otherwise."""

        def body(conn: Any) -> Any:
            row = conn.execute(
                "INSERT INTO celery_leader_state (name, key, value)"
                " SELECT %s, %s, %s WHERE EXISTS (SELECT 1 FROM celery_leader_lease"
                " WHERE name = %s AND lease_id = %s AND expires_at_us > celery_leader_now_us())"
                " ON CONFLICT (name, key) DO UPDATE SET value = EXCLUDED.value RETURNING 1",
                (name, key, value, name, lease_id),
            ).fetchone()
            return row is not None

        answer: bool = self._call("set_state", body)
        return answer

    # -- members (balancing) ----------------------------------------------------

    def announce(self, group: str, member: str, payload: str, ttl: float) -> dict[str, str]:
        """See :class:`~celery_leader.stores.base.Presence`: on the server's clock, one statement.

        The member's row is written, the group's expired rows swept and the
        live ones read by one statement (one clock reading), so a member that
        stops after sending it holds no row another member's sweep needs.
        """

        def body(conn: Any) -> Any:
            rows = conn.execute(
                "WITH clock AS (SELECT celery_leader_now_us() AS now_us),"
                " written AS (INSERT INTO celery_leader_member (grp, member, payload,"
                " expires_at_us) SELECT %(grp)s, %(member)s, %(payload)s, now_us + %(ttl_us)s"
                " FROM clock ON CONFLICT (grp, member) DO UPDATE SET payload = EXCLUDED.payload,"
                " expires_at_us = EXCLUDED.expires_at_us RETURNING member, payload),"
                " swept AS (DELETE FROM celery_leader_member m USING clock WHERE m.grp = %(grp)s"
                " AND m.member <> %(member)s AND m.expires_at_us <= clock.now_us)"
                # The statement's snapshot is from before its own writes: the member's own
                # row comes from `written`, the others' from the table.
                " SELECT member, payload FROM written UNION ALL"
                " SELECT m.member, m.payload FROM celery_leader_member m, clock"
                " WHERE m.grp = %(grp)s AND m.member <> %(member)s"
                " AND m.expires_at_us > clock.now_us",
                {"grp": group, "member": member, "payload": payload, "ttl_us": int(ttl * 1e6)},
            ).fetchall()
            return {str(m): str(p) for m, p in rows}

        members: dict[str, str] = self._call("presence", body)
        return members

    def withdraw(self, group: str, member: str) -> None:
        """See :class:`~celery_leader.stores.base.Presence`."""

        def body(conn: Any) -> Any:
            conn.execute(
                "DELETE FROM celery_leader_member WHERE grp = %s AND member = %s", (group, member)
            )
            return None

        self._call("presence", body)

    # -- lifelines (celery_leader.stores.postgres_lifeline) ----------------------

    def open_lifeline(self) -> Lifeline:
        """A connection of this process holding a session advisory lock of a new key.

        See :mod:`celery_leader.stores.postgres_lifeline`; raises StoreError
        when it cannot (among others behind a pooler in transaction mode).
        """
        if self._closed:
            raise StoreError(f"lease store {self.url}: open lifeline after close()")
        if self._sessions_outlive is not None:
            raise StoreError(self._sessions_outlive)
        try:
            lifeline = PostgresLifeline.open(
                lambda: _connect(self._dsn, self._timeout, "celery-leader-lifeline"),
                self._timeout,
                self._message,
                # Named apart: an operator (or a test) ending lifeline sessions by name
                # never meets a probe that is just closing.
                probe=None
                if self._sessions_end
                else lambda: _connect(self._dsn, self._timeout, "celery-leader-probe"),
            )
        except StoreError as exc:
            if ERR_SESSION_OUTLIVES in str(exc) or ERR_POOLER in str(exc):
                self._sessions_outlive = str(exc)
            raise
        self._sessions_end = True
        return lifeline

    def read_lifelines(self, keys: Collection[str]) -> LifelineReading:
        """Which of *keys* have their lock held now: one statement on the readings' connection."""
        if self._closed:
            raise StoreError(f"lease store {self.url}: read lifelines after close()")
        return self._lifeline_reader.read(keys)

    # -- release notifications --------------------------------------------------

    def watch(self, name: str, callback: Callable[[], None]) -> Watch:
        """Call back on every release of *name*, and once per (re)subscription."""
        fanout = shared_fanout(
            ("postgres", self._dsn, str(self._timeout)),
            lambda: Fanout("postgres", _listen(self._dsn, self._timeout)),
        )
        return fanout.add(name, callback)

    def close(self) -> None:
        """Let go of the process's connection (closed with the last store that used it).

        The readings' connection closes too; a lifeline opened on the store
        stays open until it is closed itself.
        """
        if not self._closed:
            self._closed = True
            self._lifeline_reader.close()
            self._shared.release()


_SHORTEST = 3


def _secrets_of(dsn: str) -> list[str]:
    """The password of *dsn*, as written and decoded (to mask wherever it is quoted)."""
    head = dsn.partition("://")[2].split("?", 1)[0]
    userinfo = head[: head.rfind("@")] if "@" in head else ""
    password = userinfo.partition(":")[2]
    found = [password, unquote(password)] if password else []
    query = dsn.partition("?")[2]
    found += [v for k, v in parse_qsl(query) if k.lower() in ("password", "sslpassword") and v]
    # A password of one or two characters would mask half of every message; it is no
    # secret worth the name either.
    return sorted({secret for secret in found if len(secret) >= _SHORTEST}, key=len, reverse=True)


class _Deadline:
    """Ends a call that has no answer after *seconds* by shutting its socket down."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.passed = False

    @contextmanager
    def on(self, conn: Any) -> Iterator[None]:
        def expire() -> None:
            self.passed = True
            try:
                fd = os.dup(conn.fileno())
            except (OSError, ValueError, Exception):  # noqa: BLE001 - closed meanwhile
                return
            with socket.socket(fileno=fd) as sock, suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

        timer = threading.Timer(self.seconds, expire)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()


def _connect(dsn: str, timeout: float, application: str) -> Any:
    """A connection whose calls and whose silence are bounded by about *timeout* seconds.

    Each setting and what it guards is listed in the module docstring
    (*Session guards*).
    """
    millis = max(1, int(timeout * 1000))
    # On the server: a statement, a lock wait and a transaction left idle (its client
    # stopped or cut off between two statements) end within one call's bound; a silent
    # peer is probed after 1 s and given up after 3 probes, and data it never
    # acknowledges after the same bound. synchronous_commit on: an acquire is acknowledged
    # only once it is on disk (and on synchronous standbys), whatever the server's default.
    guards = {
        "statement_timeout": millis,
        "lock_timeout": millis,
        "idle_in_transaction_session_timeout": max(millis, _GUARD_FLOOR_MS),
        "tcp_keepalives_idle": _KEEPALIVE_IDLE_S,
        "tcp_keepalives_interval": _KEEPALIVE_INTERVAL_S,
        "tcp_keepalives_count": _KEEPALIVE_COUNT,
        "tcp_user_timeout": max(millis, _GUARD_FLOOR_MS),
        "synchronous_commit": "on",
    }
    return _psycopg().connect(
        dsn,
        autocommit=True,
        connect_timeout=max(1, int(timeout + 0.999)),
        options=" ".join(f"-c {name}={value}" for name, value in guards.items()),
        # On the client: the same probes and bound, so a server that vanished is noticed
        # by the client too (a call in flight also ends at its deadline, see _Deadline).
        keepalives=1,
        keepalives_idle=_KEEPALIVE_IDLE_S,
        keepalives_interval=_KEEPALIVE_INTERVAL_S,
        keepalives_count=_KEEPALIVE_COUNT,
        tcp_user_timeout=max(millis, _GUARD_FLOOR_MS),
        application_name=application,
    )


#: TCP keepalive probes (both ends): the first after 1 s of silence, then every second,
#: the peer given up after 3 unanswered ones.
_KEEPALIVE_IDLE_S = 1
_KEEPALIVE_INTERVAL_S = 1
_KEEPALIVE_COUNT = 3
#: The shortest idle-transaction and unacknowledged-data bounds (ms), for tiny timeouts.
_GUARD_FLOOR_MS = 1000


class _Connection:
    """One connection per database per process, shared by every store object on it.

    A worker in many elections (or a benchmark with 200 followers) then uses
    one connection for its calls and one to listen, not one per election:
    PostgreSQL's default ``max_connections`` is 100. Calls take turns (the
    lock); each is short.
    """

    _registry: ClassVar[dict[tuple[str, float], _Connection]] = {}
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, dsn: str, timeout: float) -> None:
        self.key = (dsn, timeout)
        self.lock = threading.Lock()
        self.users = 0
        self._conn: Any = None
        self._pid = os.getpid()
        #: The schema has the objects of lifelines (schema 3): acquires record the holder's
        #: lifeline, reads return it, takeovers can free a dead term. Known once connected.
        self.lifelines = False

    @classmethod
    def of(cls, dsn: str, timeout: float) -> _Connection:
        with cls._registry_lock:
            shared = cls._registry.get((dsn, timeout))
            if shared is None:
                shared = cls._registry[dsn, timeout] = cls(dsn, timeout)
            shared.users += 1
            return shared

    @classmethod
    def forget_all(cls) -> None:
        """In a forked child: the parent's connections are not this process's to use."""
        cls._registry = {}
        cls._registry_lock = threading.Lock()

    def is_open(self) -> bool:
        """A connection was opened and not closed since (it may have died unnoticed)."""
        self._forget_if_forked()
        return self._conn is not None and not self._conn.closed

    def _forget_if_forked(self) -> None:
        # A store object inherited over fork holds the parent's session: never use it (the
        # parent would see its calls answered out of order) nor close it (that ends it).
        if self._pid != os.getpid():
            self._pid, self._conn = os.getpid(), None

    def connection(self) -> Any:
        """The open connection (opened, with the schema made sure of, when needed)."""
        self._forget_if_forked()
        if self._conn is None or self._conn.closed:
            conn = _connect(self.key[0], self.key[1], "celery-leader")
            # Every new connection makes sure of the schema (connections are rare): a
            # database restored or recreated without the tables gets them back. Only what
            # is missing or outdated needs CREATE: a schema made beforehand needs no such
            # privilege.
            try:
                complete, current, self.lifelines = conn.execute(_SCHEMA_STATE).fetchone()
                if not current and self._update_schema(conn, complete):
                    self.lifelines = True
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _update_schema(self, conn: Any, complete: bool) -> bool:
        """Run DDL (under an advisory lock: two workers may start at once); True when it ran.

        IF NOT EXISTS and CREATE OR REPLACE: it keeps the rows, and brings an
        earlier version's schema up to date. A role that may not run it gets
        :class:`_SchemaNotCreatableError` when something is missing; with an
        earlier version's complete schema it goes on as that version did,
        after one warning.
        """
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                conn.execute(DDL)
        except _psycopg().errors.InsufficientPrivilege:
            if not complete:
                raise _SchemaNotCreatableError from None
            where = mask_url(self.key[0])
            if where not in _outdated_warned:
                _outdated_warned.add(where)
                logger.warning(WARN_SCHEMA_OUTDATED, where)
            return False
        return True

    def drop(self) -> None:
        self._forget_if_forked()
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # a broken connection may fail to close
                logger.debug("closing a broken connection failed", exc_info=True)

    def release(self) -> None:
        with self._registry_lock:
            self.users -= 1
            if self.users > 0:
                return
            self._registry.pop(self.key, None)
        # A call that hangs holds the lock until its deadline: wait that long, no longer.
        if self.lock.acquire(timeout=self.key[1] * 2 + 1):
            try:
                self.drop()
            finally:
                self.lock.release()


#: The acquire function's column of the server's start time (since version 2), and of the
#: holder's lifeline (since version 3, the last one).
_RESTARTED_COLUMN = 13
_LIFELINE_COLUMN = 14


def _record(row: Any, now_us: int, lifeline: str | None = None) -> LeaseRecord:
    """The record of a lease row (``lease_id`` first, as :meth:`PostgresLeaseStore.read` reads)."""
    ttl_us = int(row[8] or 0)
    expires_in = (int(row[6]) - now_us) / 1e6
    return LeaseRecord(
        nodename=str(row[1]),
        hostname=str(row[2]),
        pid=int(row[3]),
        token=int(row[4]),
        acquired_at=float(row[5]),
        expires_in=expires_in,
        hold_off=max(0.0, (int(row[7]) - now_us) / 1e6),
        renewed_ago=max(0.0, ttl_us / 1e6 - expires_in) if ttl_us else None,
        lifeline=lifeline or "",
    )


def _listen(dsn: str, timeout: float) -> Callable[[Fanout], None]:
    """The body of the process's listening thread for *dsn* (see :class:`Fanout`).

    Each (re)connection calls every watch back once: a release sent while the
    connection was down reached no one. A failed connection is retried with a
    backoff of up to 2 s.
    """

    def body(fanout: Fanout) -> None:
        failures = 0
        while fanout.keep_running():
            try:
                with _connect(dsn, timeout, "celery-leader-watch") as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    failures = 0
                    fanout.notify(None)
                    while fanout.watching():
                        for notice in conn.notifies(timeout=1.0):
                            fanout.notify(notice.payload)
            except Exception as exc:  # noqa: BLE001 - the watch must outlive any failure
                failures += 1
                logger.debug("release watch interrupted: %s", mask_text(str(exc)))
                threading.Event().wait(min(0.1 * 2**failures, 2.0))

    return body


def _forget_after_fork() -> None:
    _Connection.forget_all()


os.register_at_fork(after_in_child=_forget_after_fork)


#: The class declares what the registry, the settings and the tests read (checked by mypy).
_DECLARES: LeaseStoreClass = PostgresLeaseStore
