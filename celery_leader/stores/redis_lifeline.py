"""The Redis store's lifelines: a subscription the server drops when its process dies.

A holder's lifeline (:class:`~celery_leader.stores.base.Lifeline`) is a
connection of its own, subscribed to the channel
``celery-leader:lifeline:<key>`` and idle otherwise. When the process dies,
the kernel closes the socket and Redis drops the subscription at once
(measured: ``PUBSUB NUMSUB`` read 0 within about 20 ms of a SIGKILL). A
confirmation is a ``PING`` on that connection, which Redis answers in
subscribed mode; nothing else is ever sent on it.

A follower's readings go through one connection of their own
(:class:`LifelineReader`): ``PUBSUB NUMSUB`` of every channel followed, one
command. The reading's session names that connection: a new one (after an
error, a server restart, a failover) is a new session, so a key seen kept on
the old primary and absent on the new one is never taken for ended.

What else ends a subscription while its process lives: a server restart, a
failover (the new primary never had it), ``CLIENT KILL``, the server's TCP
keepalive across a partition (``tcp-keepalive``; the idle ``timeout`` skips
Pub/Sub clients), an output buffer limit (nothing is published on the
channel, so never here). The rule in :mod:`celery_leader.lease.lifeline`
keeps each of them safe: the holder stops acting within its grace after its
last confirmation, whether it hears of the end or not. Not supported: a
proxy that keeps the client's connection while it changes the server behind
it (twemproxy, Envoy's Redis proxy), and Redis Cluster (``PUBSUB NUMSUB``
counts one node's subscribers).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Collection
from contextlib import suppress
from typing import Any

import redis

from celery_leader._masking import mask_text
from celery_leader.exceptions import StoreCallTimeoutError, StoreError, StoreUnreachableError
from celery_leader.stores.base import LifelineEndedError, LifelineReading

CHANNEL_PREFIX = "celery-leader:lifeline:"


def lifeline_channel(key: str) -> str:
    """The channel a holder's lifeline of *key* is subscribed to."""
    return CHANNEL_PREFIX + key


def client_name(key: str) -> str:
    """The client name of the lifeline connection of *key* (``CLIENT LIST`` shows it)."""
    return f"celery-leader-lifeline-{key}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisLifeline:
    """One subscribed connection of this process; see the module docstring."""

    def __init__(self, pool: redis.ConnectionPool, timeout: float, url: str) -> None:
        self.key = uuid.uuid4().hex
        self._url = url
        conn: Any = pool.make_connection()  # its internals (_sock) are read below
        self._conn = conn
        try:
            conn.connect()
            # Named after its key, which the lease record shows anyway: an operator sees in
            # CLIENT LIST whose lifeline a connection is.
            conn.send_command("CLIENT", "SETNAME", client_name(self.key))
            with suppress(redis.ResponseError):  # refused by an ACL: the name stays as it was
                conn.read_response(timeout=timeout)
            conn.send_command("SUBSCRIBE", lifeline_channel(self.key))
            # RESP3 sends the confirmation as a push message; RESP2 as a reply.
            reply = conn.read_response(timeout=timeout, push_request=True)
        except (redis.RedisError, OSError) as exc:
            conn.disconnect()
            raise StoreUnreachableError(self._message("open lifeline", exc)) from None
        if not isinstance(reply, list) or _text(reply[0]).lower() != "subscribe":
            conn.disconnect()
            raise StoreError(f"lease store {url}: open lifeline failed: unexpected reply")

    def _message(self, what: str, exc: BaseException) -> str:
        detail = mask_text(str(exc)) or type(exc).__name__
        return f"lease store {self._url}: {what} failed: {detail}"

    def confirm(self, timeout: float) -> None:
        """``PING`` on the subscribed connection (:class:`~celery_leader.stores.base.Lifeline`)."""
        if self._conn._sock is None:  # never reconnect: a new connection is a new lifeline
            raise LifelineEndedError(f"lease store {self._url}: the lifeline's connection closed")
        try:
            self._conn.send_command("PING")
            reply = self._conn.read_response(timeout=timeout, push_request=True)
        except redis.TimeoutError as exc:
            raise StoreCallTimeoutError(self._message("confirm lifeline", exc)) from None
        except (redis.RedisError, OSError) as exc:
            raise LifelineEndedError(self._message("confirm lifeline", exc)) from None
        # RESP2 answers a subscribed PING with ["pong", ""], RESP3 with PONG.
        answer = reply[0] if isinstance(reply, list) and reply else reply
        if _text(answer).lower() != "pong":
            raise LifelineEndedError(f"lease store {self._url}: the lifeline answered {reply!r}")

    def fileno(self) -> int:
        """The subscribed socket's descriptor (-1 when closed)."""
        sock = self._conn._sock
        return -1 if sock is None else int(sock.fileno())

    def close(self) -> None:
        """Close the connection: Redis drops the subscription."""
        self._conn.disconnect()


class LifelineReader:
    """A follower's readings of lifelines, on one connection of their own (thread-safe)."""

    def __init__(self, pool: redis.ConnectionPool, timeout: float, url: str) -> None:
        self._pool = pool
        self._timeout = timeout
        self._url = url
        self._lock = threading.Lock()
        self._conn: Any = None
        self._generation = 0

    def read(self, keys: Collection[str]) -> LifelineReading:
        """Which of *keys* are subscribed now: one ``PUBSUB NUMSUB``."""
        channels = [lifeline_channel(key) for key in keys]
        with self._lock:
            if self._conn is None or self._conn._sock is None:
                if self._conn is not None:
                    self._conn.disconnect()
                # A new connection is a new session: nothing seen before it counts.
                self._conn = self._pool.make_connection()
                self._generation += 1
            session = f"{id(self)}:{self._generation}"
            try:
                if self._conn._sock is None:
                    # Connect here, not in send_command: redis-py 8 connects a Sentinel
                    # connection there to its default address (localhost:6379), not to the
                    # primary the sentinels name.
                    self._conn.connect()
                self._conn.send_command("PUBSUB", "NUMSUB", *channels)
                flat = self._conn.read_response(timeout=self._timeout)
            except (redis.RedisError, OSError) as exc:
                self._conn.disconnect()
                self._conn = None
                detail = mask_text(str(exc)) or type(exc).__name__
                message = f"lease store {self._url}: read lifelines failed: {detail}"
                raise StoreError(message) from None
        if isinstance(flat, dict):  # RESP3: a map
            counts = {_text(k): int(v) for k, v in flat.items()}
        else:
            counts = {_text(flat[i]): int(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}
        alive = frozenset(k for k, c in zip(keys, channels, strict=True) if counts.get(c, 0) > 0)
        return LifelineReading(session, alive)

    def close(self) -> None:
        """Close the reader's connection."""
        with self._lock:
            if self._conn is not None:
                self._conn.disconnect()
                self._conn = None
