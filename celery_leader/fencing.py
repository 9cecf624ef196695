"""Fenced writes: make downstream writes refuse a stale leader.

A lease cannot stop a process that was paused past its lease (a long GC, a
frozen VM, SIGSTOP) from waking up mid-task and writing. The fencing token
can: every term's token is greater than all earlier ones, so a store that
remembers the highest token it accepted for a resource can refuse a write
that carries a lower one.

Redis, with :class:`RedisFence`::

    fence = RedisFence(redis.Redis.from_url("redis://..."))

    @leader_only
    @app.task(bind=True)
    def compact(self):
        ...
        if not fence.set("daily-totals", "totals:2026-11-22", payload,
                         token=self.request.leader_token):
            return  # a newer leader has written: drop our stale result

SQL, with a ``fence_token`` column on the row you write::

    UPDATE totals SET value = :value, fence_token = :token
     WHERE day = :day AND fence_token <= :token;
    -- 0 rows updated: a newer leader wrote first; roll back.

(Insert the row once with ``fence_token = 0``; the comparison and the write
are one statement, so they are atomic.)

A read-modify-write of several Redis keys, with :meth:`RedisFence.transaction`::

    def add_day(pipe):
        total = int(pipe.get("totals:month") or 0)   # reads run at once
        pipe.multi()                                  # then queue the writes
        pipe.set("totals:month", total + today)
        pipe.delete("pending:today")

    fence.transaction("totals", self.request.leader_token, add_day, "totals:month")

The writes are applied, together with the fence, only if no newer token was
admitted and no watched key changed since the reads; otherwise the function
runs again on fresh reads, or :class:`StaleTokenError` is raised once a newer
leader has been admitted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from celery_leader.exceptions import StaleTokenError

_T = TypeVar("_T")

KEY_PREFIX = "celery-leader:fence:"


def _decimal(token: int) -> str:
    """The token as the canonical decimal string the fence compares."""
    value = int(token)
    if value < 0:
        raise ValueError(f"fencing tokens are positive, got {value}")
    return str(value)


class RedisFence:
    """Per-resource highest accepted token in Redis, checked and written atomically."""

    # KEYS[1] the resource's fence key; KEYS[2] (optional) a key to write.
    # ARGV[1] the writer's token; ARGV[2] the value for KEYS[2].
    # Returns 1 when the token is not older than the highest seen (which it
    # becomes, and the value is written), else 0 and nothing changes.
    # Tokens compare as decimal strings (length, then text): exact at any size,
    # where Lua's numbers are doubles and lose digits past 2^53.
    FENCE_LUA = """
    local highest = redis.call('GET', KEYS[1]) or '0'
    local token = ARGV[1]
    if #token < #highest or (#token == #highest and token < highest) then return 0 end
    redis.call('SET', KEYS[1], ARGV[1])
    if KEYS[2] then redis.call('SET', KEYS[2], ARGV[2]) end
    return 1
    """

    def __init__(self, client: Any, prefix: str = KEY_PREFIX) -> None:
        self._client = client
        self._prefix = prefix
        self._script = client.register_script(self.FENCE_LUA)

    def _fence_key(self, resource: str) -> str:
        return f"{self._prefix}{resource}"

    def admit(self, resource: str, token: int) -> bool:
        """Record *token* for *resource* unless a greater one was seen; True when admitted."""
        return int(self._script(keys=[self._fence_key(resource)], args=[_decimal(token)])) == 1

    def set(self, resource: str, key: str, value: Any, token: int) -> bool:
        """Write *value* to *key* only if *token* is not stale for *resource*."""
        keys = [self._fence_key(resource), key]
        return int(self._script(keys=keys, args=[_decimal(token), value])) == 1

    def require(self, resource: str, token: int) -> None:
        """Like :meth:`admit`, raising :class:`StaleTokenError` when the token is stale."""
        if not self.admit(resource, token):
            raise StaleTokenError(resource, token)

    def highest(self, resource: str) -> int:
        """The highest token admitted for *resource* so far (0 if none)."""
        value = self._client.get(self._fence_key(resource))
        return int(value or 0)

    def transaction(
        self,
        resource: str,
        token: int,
        func: Callable[[Any], _T],
        *watches: str,
    ) -> _T:
        """Run *func*'s writes as one MULTI/EXEC that only lands under a current token.

        *func* receives a redis-py pipeline with the fence key of *resource*
        and every key in *watches* under WATCH. It reads with immediate
        commands, then calls ``pipe.multi()`` and queues its writes (the
        same contract as redis-py's ``Redis.transaction``; a *func* that
        never calls ``multi()`` gets it called after it returns, so it must
        then issue no writes itself). The fence is raised to *token* in the
        same transaction.

        Guarantees: the writes land atomically, and only if *token* was not
        older than the highest admitted for *resource* and neither the fence
        nor a watched key changed between the reads and EXEC. On such a
        change *func* runs again; once a newer token has been admitted,
        :class:`StaleTokenError` is raised and nothing is written. Returns
        what the last run of *func* returned. Assumes every writer of the
        watched keys goes through this fence (or at least changes them
        visibly to WATCH).
        """
        fence_key = self._fence_key(resource)
        decimal = _decimal(token)

        def attempt(pipe: Any) -> _T:
            if int(token) < int(pipe.get(fence_key) or 0):
                raise StaleTokenError(resource, token)
            result = func(pipe)
            if not pipe.explicit_transaction:
                pipe.multi()
            pipe.set(fence_key, decimal)
            return result

        result: _T = self._client.transaction(
            attempt, fence_key, *watches, value_from_callable=True
        )
        return result
