"""The example's tasks: events in on any worker, totals out on the leader alone.

Data, in the Redis at ``PROJ_DATA_URL`` (default ``redis://127.0.0.1:6379/2``):

* ``proj:events``: a list of JSON events ``{"seq", "kind", "amount", "at"}``,
  appended by :func:`record_event`. ``seq`` is unique and the list is in
  ``seq`` order (number and append are one atomic script).
* ``proj:archive``: what :func:`compact` folded away,
  ``{"upto": seq, "count": n, "totals": {kind: amount}}``, written through the
  fence ``events``.
* ``proj:totals``: what :func:`aggregate` computed last, written through the
  fence ``totals``.

Guarantees:

* ``aggregate`` and ``compact`` run only on the worker holding the lease
  (celery-leader), one term at a time under normal clocks.
* Even a leader paused past its lease (the case a lease alone cannot stop) never
  overwrites newer data: every write goes through a :class:`RedisFence` that
  refuses a token older than one it has seen for that resource.
* Totals count every event exactly once: the archive's totals plus the listed
  events with ``seq`` above the archive's ``upto``, both read in one
  transaction, so a compaction cut short between its two steps changes nothing.
"""

from __future__ import annotations

import functools
import json
import os
import time
from typing import Any, TypedDict

import redis
from celery import Task

from celery_leader import check_leadership, leader_only
from celery_leader.exceptions import StaleTokenError
from celery_leader.fencing import RedisFence
from example_project.proj.celery import app

DEFAULT_DATA_URL = "redis://127.0.0.1:6379/2"
EVENTS_KEY = "proj:events"
SEQ_KEY = "proj:events:seq"
ARCHIVE_KEY = "proj:archive"
TOTALS_KEY = "proj:totals"
#: Fence resources; their highest tokens live at ``celery-leader:fence:<resource>``.
TOTALS_FENCE = "totals"
EVENTS_FENCE = "events"

# Numbering and appending in one script keeps the list in seq order, which
# compaction relies on when it treats "seq <= upto" as "already folded".
APPEND_LUA = """
local event = cjson.decode(ARGV[1])
event['seq'] = redis.call('INCR', KEYS[1])
redis.call('RPUSH', KEYS[2], cjson.encode(event))
return event['seq']
"""


class Event(TypedDict):
    """One recorded event."""

    seq: int
    kind: str
    amount: int
    at: float


class Archive(TypedDict):
    """Events folded away by compaction: every seq up to ``upto``."""

    upto: int
    count: int
    totals: dict[str, int]


@functools.cache
def data(url: str | None = None) -> redis.Redis:
    """The data Redis (``PROJ_DATA_URL``); redis-py reconnects in forked pool children."""
    return redis.Redis.from_url(
        url or os.environ.get("PROJ_DATA_URL") or DEFAULT_DATA_URL, decode_responses=True
    )


@functools.cache
def fence(url: str | None = None) -> RedisFence:
    """The fence kept next to the data it protects."""
    return RedisFence(data(url))


def _archive(raw: str | None) -> Archive:
    if not raw:
        return {"upto": 0, "count": 0, "totals": {}}
    loaded: Archive = json.loads(raw)
    return loaded


def _fold(archive: Archive, events: list[Event]) -> Archive:
    """*archive* plus the *events* it does not cover yet."""
    totals = dict(archive["totals"])
    upto, count = archive["upto"], archive["count"]
    for event in events:
        if event["seq"] > archive["upto"]:
            totals[event["kind"]] = totals.get(event["kind"], 0) + event["amount"]
            upto, count = max(upto, event["seq"]), count + 1
    return {"upto": upto, "count": count, "totals": totals}


def _read(client: redis.Redis, stop: int) -> tuple[Archive, list[str], int]:
    """The archive, the raw events ``0..stop`` and the list's length, in one transaction."""
    pipe = client.pipeline(transaction=True)
    pipe.get(ARCHIVE_KEY)
    pipe.lrange(EVENTS_KEY, 0, stop)
    pipe.llen(EVENTS_KEY)
    raw_archive, raw_events, length = pipe.execute()
    return _archive(raw_archive), list(raw_events), int(length)


def _token(task: Task) -> int:
    """The run's fencing token. Eager runs (``apply()``, ``task_always_eager``) have none."""
    token = task.request.leader_token
    if token is None:
        raise RuntimeError(f"{task.name} writes through a fence: run it on a worker, not eagerly")
    return int(token)


@app.task
def record_event(kind: str, amount: int) -> int:
    """Append one event; returns its seq. An ordinary task: runs on any worker."""
    event = json.dumps({"kind": str(kind), "amount": int(amount), "at": time.time()})
    return int(data().eval(APPEND_LUA, 2, SEQ_KEY, EVENTS_KEY, event))


@leader_only
@app.task(bind=True)
def aggregate(self: Task) -> dict[str, Any]:
    """Total the events per kind and write the totals through the ``totals`` fence.

    Runs on the lease holder only. A run cut short by a lost lease is killed
    and runs again on the new leader (prefork's default ``on_loss``). Returns
    what it computed, with ``written`` False when a newer term had already
    written (this result was stale and was dropped).
    """
    token = _token(self)
    archive, raw_events, _ = _read(data(), -1)
    folded = _fold(archive, [json.loads(raw) for raw in raw_events])
    result: dict[str, Any] = {
        "totals": folded["totals"],
        "events": folded["count"],
        "upto": folded["upto"],
        "token": token,
        "worker": self.request.hostname,
        "at": time.time(),
    }
    payload = json.dumps(result, sort_keys=True)
    result["written"] = fence().set(TOTALS_FENCE, TOTALS_KEY, payload, token=token)
    return result


@leader_only(on_loss="cancel")
@app.task(bind=True)
def compact(self: Task, keep: int = 10_000, batch: int = 500) -> dict[str, Any]:
    """Fold all but the newest *keep* events into the archive, *batch* at a time.

    Each batch is one :meth:`RedisFence.transaction` on the ``events`` fence:
    it reads the archive (watched) and the oldest events, then writes the new
    archive and removes exactly the folded events in one MULTI/EXEC, which
    lands only while no newer token was admitted and the archive is as read.
    New events are appended at the other end, so they neither disturb nor
    abort a batch. Between batches ``check_leadership()`` raises ``LeaseLost``
    once the lease is lost (``on_loss="cancel"``): the message goes back to
    the broker and the next leader carries on from the archive. Returns
    ``removed``, ``remaining`` and ``batches``, with ``stale`` True when a
    newer term's token stopped it.
    """
    if keep < 0 or batch < 1:
        raise ValueError(f"keep={keep} must be >= 0 and batch={batch} >= 1")
    token = _token(self)
    client, events_fence = data(), fence()
    result: dict[str, Any] = {"removed": 0, "batches": 0, "token": token, "stale": False}

    def fold_one_batch(pipe: redis.client.Pipeline) -> int:
        # Length first: appends after it only make the list longer, so at
        # least *keep* events stay.
        length = int(pipe.llen(EVENTS_KEY))
        archive = _archive(pipe.get(ARCHIVE_KEY))
        chunk = list(pipe.lrange(EVENTS_KEY, 0, batch - 1))[: max(0, length - keep)]
        if chunk:
            folded = _fold(archive, [json.loads(raw) for raw in chunk])
            pipe.multi()
            pipe.set(ARCHIVE_KEY, json.dumps(folded))
            for raw in chunk:
                pipe.lrem(EVENTS_KEY, 1, raw)
        return len(chunk)

    while True:
        check_leadership()
        try:
            removed = events_fence.transaction(EVENTS_FENCE, token, fold_one_batch, ARCHIVE_KEY)
        except StaleTokenError:
            result["stale"] = True
            break
        if not removed:
            break
        result["removed"] += removed
        result["batches"] += 1
    result["remaining"] = int(client.llen(EVENTS_KEY))
    return result


@app.task
def report() -> dict[str, Any] | None:
    """The totals ``aggregate`` wrote last, or None before its first run. Any worker."""
    raw = data().get(TOTALS_KEY)
    return json.loads(raw) if raw else None
