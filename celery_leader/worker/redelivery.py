"""A leader message delivered again while its run goes on: it waits, and never runs beside it.

Brokers with a visibility timeout (Redis, SQS) deliver an unacknowledged
message again once the timeout passes, whether or not a worker still runs
it. Leader-only tasks are ``acks_late``, so a leader run longer than the
timeout gets its own message back while it runs; without this module the
leader would start the copy in the next free pool slot, and a copy that
outlasts the timeout again would loop for ever.

The leader is the only consumer of its queue and knows what it runs. For
every ``acks_late`` leader message it hands to the pool, this module keeps
the message's identity until the run settles: its task id and what names
the message across its deliveries on its transport (the id stamped at
publish, else the Redis delivery tag or the SQS MessageId; see
:mod:`celery_leader.worker.message_identity`), never a delivery tag a
transport may reuse (AMQP after a reconnect) or renew (SQS). A message
proven to be one delivered before (the same task id and identity) whose
earlier delivery:

* **runs here now** is *parked*: not run, not acknowledged, and not counted
  against the prefetch limit (as Celery does for ETA messages), so other
  leader work keeps flowing. When the run settles, each parked copy is
  acknowledged without running if the run **completed** (returned) or was
  **superseded** (it retried, was replaced, ignored or rejected its
  message: what comes next has a message of its own), and goes through the
  gate again if the run **failed** (raised, timed out, was killed, or was
  handed back): at most one copy then runs, the others park behind it;
* **completed or was superseded here recently** (the last
  :data:`REMEMBERED` messages) is acknowledged without running.

Another message under the same task id (a retry, a replacement, one sent
again on purpose), and any message nothing names (published where
celery_leader was never imported, on a transport whose tags name nothing),
runs as any message does, but not beside a run of that task id here: it
*waits* for the run, as a parked copy does, and goes through the gate again
when the run settles, whatever its outcome. A message is acknowledged
without running only when the record proves that very message completed:
where nothing proves it, it runs (at least once beats lost).

A reconnect to the broker hands every unacknowledged message back to it,
and the broker delivers them again on the new connection: the copies that
waited are forgotten then (:meth:`Redeliveries.forget_parked`), their new
deliveries go through the gate, and the runs stay recorded.

Assumptions and limits: the record is in the worker's main process only.
A copy that reaches another worker (after a failover, or a restart of this
one) runs there, as any redelivered ``acks_late`` message does; a run that
outlasts the visibility timeout should still have a ``time_limit`` below it
(the worker warns at start when it does not). Task ids are assumed unique
per message except for redeliveries, as Celery assumes; a task that calls
``self.retry()`` sends its retry under the same id, and runs it, since a
retried run has not completed.

Threads: the gate and the hand-back run on the consumer's loop thread;
settlement may be reported from a pool's thread, so state sits under a lock
and the actions go to the loop through the callables given.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeAlias

from celery_leader.worker.message_identity import message_identity

logger = logging.getLogger(__name__)

#: How many settled messages each worker remembers, newest kept.
REMEMBERED = 4096

#: What the gate does with a message: run it, park it (a copy of a running message), let it
#: wait (another message of a running task id), or drop it (acknowledged, not run).
RUN, PARK, WAIT, DROP = "run", "park", "wait", "drop"
#: How a run settled: the copies that waited are dropped after the first two, run after the last.
COMPLETED, SUPERSEDED, FAILED = "completed", "superseded", "failed"


#: One message in the record: (task id, its identity), or (task id, a marker of its own) for a
#: message nothing names (never equal to another's, never remembered as settled).
MessageKey: TypeAlias = tuple[str, Any]


class _Unnamed:
    """Stands for the identity of a message nothing names: equal to nothing but itself."""

    __slots__ = ()


def message_key(request: Any) -> MessageKey:
    """The record's key for *request*: kept on it from its admission, made there if it has none."""
    key: MessageKey | None = getattr(request, "leader_message_key", None)
    if key is None:
        identity = message_identity(request)
        if identity is None:
            key = (request.id, _Unnamed())
        else:
            # The retry count and ETA too: the same on every delivery of one message, and
            # a retry always counts one more, so that no retry is taken for the message it
            # retries even when a publish hook copied that message's id into it.
            headers = getattr(request, "_request_dict", None)
            headers = headers if isinstance(headers, dict) else {}
            key = (request.id, (identity, headers.get("retries"), headers.get("eta")))
        request.leader_message_key = key
    return key


def same_message(request: Any, other: Any) -> bool:
    """True when *request* and *other* are proven deliveries of one message."""
    return message_key(request) == message_key(other)


class Redeliveries:
    """Leader runs of this worker by task id, with the copies that wait for them."""

    def __init__(self, remembered: int = REMEMBERED) -> None:
        self._lock = threading.Lock()
        self._running: dict[MessageKey, weakref.ref[Any]] = {}
        #: The message of each task id that runs here (a key of ``_running``).
        self._running_ids: dict[str, MessageKey] = {}
        self._parked: dict[MessageKey, list[Any]] = {}
        #: Messages whose run completed or was superseded here; only named ones are kept.
        self._done: OrderedDict[MessageKey, None] = OrderedDict()
        self._remembered = remembered

    def admit(self, request: Any) -> str:
        """What the gate does with *request*: RUN (now recorded), PARK or WAIT (kept), DROP."""
        key = message_key(request)
        with self._lock:
            if key in self._done:
                return DROP
            running_key, verdict = key, PARK
            ref = self._running.get(key)
            if ref is None and (other := self._running_ids.get(key[0])) is not None:
                running_key, verdict, ref = other, WAIT, self._running.get(other)
            original = ref() if ref is not None else None
            if original is not None and original is not request and not _settled(original):
                self._parked.setdefault(running_key, []).append(request)
                return verdict
            self._running[key] = weakref.ref(request)
            self._running_ids[key[0]] = key
            return RUN

    def settle(self, request: Any, outcome: str) -> list[Any]:
        """The run of *request* ended (*outcome*); returns the copies that waited for it.

        Idempotent: a second report of the same run returns nothing.
        """
        key = message_key(request)
        with self._lock:
            ref = self._running.get(key)
            if ref is None or ref() is not request:
                return []
            del self._running[key]
            if self._running_ids.get(key[0]) == key:
                del self._running_ids[key[0]]
            if outcome != FAILED and not isinstance(key[1], _Unnamed):
                self._done[key] = None
                while len(self._done) > self._remembered:
                    self._done.popitem(last=False)
            return self._parked.pop(key, [])

    def forget_parked(self) -> list[Any]:
        """Forget every copy that waits for a run: the broker connection they came on is gone.

        A reconnect (or a shutdown) hands every unacknowledged message of the
        old connection back to the broker, which delivers it again on the
        new one: what waited here can be neither acknowledged nor run any
        more. Returns them, for their prefetch slots. The runs stay recorded.
        """
        with self._lock:
            copies = [copy for waiting in self._parked.values() for copy in waiting]
            self._parked.clear()
            return copies

    def parked(self) -> int:
        """How many copies wait for a run."""
        with self._lock:
            return sum(len(copies) for copies in self._parked.values())


def _settled(request: Any) -> bool:
    """True once *request*'s message was acknowledged or rejected (its run is over)."""
    return bool(getattr(request, "acknowledged", False))


def release_copies(
    copies: list[Any],
    outcome: str,
    *,
    run: Any,
    redispatch: Callable[[Any], None],
    unpark: Callable[[Any], None],
) -> None:
    """Settle what waited for *run*: acknowledge its copies, or send them to the gate again.

    Copies of *run*'s own message run again only when it failed; other
    messages of its task id (a delivery tag of their own) always go to the
    gate again. *unpark* gives back the prefetch slot a parked copy was
    lent; *redispatch* hands a copy to the worker again (loop thread).
    """
    for copy in copies:
        unpark(copy)
        if outcome == FAILED or not same_message(copy, run):
            redispatch(copy)
            continue
        logger.info(
            "celery-leader: %s was delivered again while it ran; its run %s, so the copy is "
            "acknowledged without running",
            copy.humaninfo(),
            outcome,
        )
        copy.acknowledge()


def describe_parking(request: Any, verdict: str) -> str:
    """The log line for a copy (:data:`PARK`) or a message (:data:`WAIT`) that waits for a run."""
    if verdict == WAIT:
        return (
            f"celery-leader: {request.humaninfo()} is another message of a task id that runs "
            "here; it waits for that run and then goes through the gate"
        )
    return (
        f"celery-leader: {request.humaninfo()} was delivered again while it runs here (a "
        "visibility timeout passed, or the broker connection was restored); the copy waits "
        "for that run and runs only if the run fails"
    )


#: Brokers that deliver an unacknowledged message again after a visibility timeout,
#: with kombu's default timeout for each, in seconds.
VISIBILITY_DEFAULTS = {"redis": 3600.0, "rediss": 3600.0, "sentinel": 3600.0, "sqs": 1800.0}


def visibility_timeout(app: Any) -> float | None:
    """The broker's visibility timeout in seconds, or None for a broker without one."""
    url = app.conf.broker_url or ""
    first = (url[0] if isinstance(url, (list, tuple)) and url else str(url)).split(";")[0]
    scheme = first.split("://", 1)[0].split("+", 1)[0].lower()
    if scheme not in VISIBILITY_DEFAULTS:
        return None
    options = app.conf.broker_transport_options or {}
    return float(options.get("visibility_timeout", VISIBILITY_DEFAULTS[scheme]))


def outlasting_tasks(app: Any, tasks: list[Any]) -> tuple[float, list[str]] | None:
    """(visibility timeout, names of acks_late leader tasks whose time limit is unset or longer).

    None when the broker has no visibility timeout or every task is bounded below it.
    """
    timeout = visibility_timeout(app)
    if timeout is None:
        return None
    default_limit = app.conf.task_time_limit
    names = sorted(
        task.name
        for task in tasks
        if task.acks_late
        and ((limit := task.time_limit or default_limit) is None or float(limit) >= timeout)
    )
    return (timeout, names) if names else None


#: Task names the start-up warning lists before it says how many more there are.
NAMES_SHOWN = 5


def warn_about_visibility(app: Any, tasks: list[Any]) -> None:
    """Log one warning at start for leader tasks that may outlast the visibility timeout."""
    found = outlasting_tasks(app, tasks)
    if found is None:
        return
    timeout, names = found
    more = len(names) - NAMES_SHOWN
    shown = ", ".join(names[:NAMES_SHOWN]) + (f" and {more} more" if more > 0 else "")
    logger.warning(
        "celery-leader: leader tasks %s have no time_limit below the broker's visibility_timeout "
        "(%g s): a run that lasts longer is delivered again while it runs. This leader keeps the "
        "copy until the run ends, but another worker (after a failover or a restart) would run "
        "it: set time_limit below broker_transport_options['visibility_timeout'], or raise it",
        shown,
        timeout,
    )
