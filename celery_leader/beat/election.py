"""Beat's election: its lease, its liveness, the send marks and beat's calls to the store.

One :class:`BeatElection` per beat process, built on first use by the
scheduler (:mod:`celery_leader.beat.scheduler`). Beat's election is its
own, ``"<leader_name>.beat"``: the same
:class:`~celery_leader.elections.election.Election` unit the worker uses,
with beat's liveness and beat's release guard.

Send marks. Around a failover the time of each entry's last send is shared
through the lease store, in beat's own state (keys are entry names). The
lease holder writes a mark with its token *after* the publish succeeded,
and only while it still holds the lease (the write is fenced by the term's
lease id); a new leader reads them all (:meth:`BeatElection.refresh_marks`)
before it sends anything (:mod:`celery_leader.beat.leading`).

The publish guard. From before the leader re-checks its lease for a send
(:meth:`BeatElection.publishing`) until the send's mark is written, the
lease is never released (it can only expire, one ttl after its last
renewal), so no other beat takes over while the send may still land
unmarked. A mark given up on at its bound that may still land holds the
release back too (:class:`_MarkWrite`).

Liveness: beat's lease is coupled to beat's own health, as a worker's is to
its loop. A beat whose ticks stop, or whose last publish failed (the broker
is gone while the store is reachable), releases the lease so that another
beat sends. It does not compete again for one ttl. A publish in flight, or
a takeover reading a long schedule, counts as a tick for one ttl.

Beat's own store calls (reading the marks, writing one, the step-down and
control slots) are bounded by ``leader_store_timeout`` like the lease
thread's: a slow or hung store holds beat's tick no longer than that per
call. Each reader has helper threads of its own, so a stalled store cannot
let one use up the budget another needs.

Metrics and the health endpoint are turned on here, once, through
:func:`celery_leader.observe.wiring.observe`, as the worker does.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Any, TypeVar

from celery_leader.beat.controls import RESERVED_PREFIX
from celery_leader.beat.steering import Steering, last_sent
from celery_leader.elections.election import Election
from celery_leader.elections.liveness import PUBLISHING, LoopLiveness
from celery_leader.elections.shared_lease import SharedLease
from celery_leader.exceptions import StoreCallTimeoutError, StoreError
from celery_leader.lease import LeaseManager, lifeline
from celery_leader.lease.bounded import BoundedCaller, store_call
from celery_leader.observe.wiring import observe
from celery_leader.settings import LeaderSettings
from celery_leader.stores import open_store
from celery_leader.stores.base import Holder

if TYPE_CHECKING:
    from celery_leader.observe.metrics import LeaderMetrics

#: The logger beat's lines have always had (logging configurations name it).
logger = logging.getLogger("celery_leader.beat.scheduler")

T = TypeVar("T")

#: The longest the leader sleeps between ticks (beat's loop sleeps uninterruptibly).
MAX_TICK = 0.5


class _MarkWrite:
    """One send mark on its way from beat's loop to the store.

    The write is fenced by the lease id it names (the store refuses it once
    that lease is gone). One given up on at its bound may still land later;
    until it has landed or failed, that lease must not be released: released
    first, the late write would be refused and the next leader would find no
    mark for a slot that was sent.
    """

    def __init__(self, lease_id: str) -> None:
        self.lease_id = lease_id
        self._lock = threading.Lock()
        self._begun = False
        self._given_up = False
        self._finished = threading.Event()

    def run(self, write: Callable[[], bool]) -> bool:
        """Run *write* (on the helper thread), unless the caller gave up before it began."""
        with self._lock:
            if self._given_up:
                raise StoreCallTimeoutError("send mark not written: given up before it began")
            self._begun = True
        try:
            return write()
        finally:
            self._finished.set()

    def give_up(self) -> bool:
        """The caller stops waiting for the write; True when it may still land."""
        with self._lock:
            self._given_up = True
            return self._begun and not self._finished.is_set()

    @property
    def may_land(self) -> bool:
        """True until the write has returned (landed, refused or failed)."""
        return not self._finished.is_set()


class BeatElection:
    """Beat's lease: a LeaseManager plus the shared last-send marks; see the module docstring.

    Beat's own store calls (reading the marks, writing one) run from beat's
    loop, not from the lease thread, and are bounded in wall time by
    ``leader_store_timeout`` as the lease thread's are
    (:mod:`celery_leader.lease.bounded`): a slow or hung store holds beat's tick for
    at most that long per call.

    It is also the process as beat's health probe sees it
    (:class:`celery_leader.observe.health.Observed`): its one election, its
    loop, no run watchdog.
    """

    #: Beat has no run watchdog: its runs are its sends.
    watchdog: None = None

    def __init__(self, settings: LeaderSettings) -> None:
        self.settings = settings
        #: One item per term begun, put by the lease thread: a standby's wait ends at once.
        #: A SimpleQueue, not an Event: its put never waits on a lock that beat's loop
        #: may hold when a signal handler stops beat from that loop's thread.
        self._elected: queue.SimpleQueue[None] = queue.SimpleQueue()
        self.store = open_store(
            settings.backend_url,
            timeout=settings.timing.op_timeout,
            options=settings.store_options,
        )
        self.holder = Holder.for_this_process(f"beat-{Holder.for_this_process().nodename}")
        # The unit the worker uses; beat's runs are its sends, so nothing reads the slot yet.
        self.election = Election(
            self.store,
            SharedLease(settings.name),
            settings.timing,
            holder=self.holder,
            liveness=self.is_live,
            release_guard=self.no_publish_in_flight,
            on_elected=lambda _event: self._elected.put(None),
            **lifeline.manager_options(
                self.store,
                settings.masked_backend_url,
                enabled=settings.fast_failover,
                label="beat",
            ),
        )
        self.manager = self.election.manager
        #: Beat's loop: its ticks, started, stopping, and its waits on the broker (connecting,
        #: a publish in flight). It sleeps up to MAX_TICK between ticks; a few may be missed.
        self.loop = LoopLiveness(max(2 * settings.timing.renew_interval, 4 * MAX_TICK))
        self._publish_failed_at: float | None = None
        #: Send marks given up on at their bound that may still land (see _MarkWrite).
        self._landing: list[_MarkWrite] = []
        self._landing_lock = threading.Lock()
        #: Runs beat's store calls, each bounded by the store timeout.
        self._calls = BoundedCaller(f"{settings.name}:beat-loop")
        # Looks for step-down requests have helpers of their own: a stalled store
        # must not let them use up the budget that the send marks need.
        self._request_calls = BoundedCaller(f"{settings.name}:beat-step-down")
        # The schedule controls, likewise: a hung read of them must not hold the marks back.
        self._control_calls = BoundedCaller(f"{settings.name}:beat-controls")
        #: When this beat began taking a term over (reading a long schedule), or None.
        self.taking_over_since: float | None = None
        self.marks: dict[str, dict[str, Any]] = {}
        #: Beat's own state as read at the last takeover (marks, view, run-now records).
        self.own_state: dict[str, str] = {}
        self._own_state_lock = threading.Lock()
        #: Pauses and run-now requests, and the view this beat publishes while it leads.
        self.steering = Steering(settings.name, self.read_state, self._write_steering)
        #: The token of the term this beat took over as leader (marks read, entries anchored).
        self.seen_token: int | None = None
        self._lock = threading.Lock()
        # Last: the metrics of beat's election, then its endpoint (a probe may come at once).
        #: The metric families, when metrics are on (beat counts its sends there).
        self.metrics: LeaderMetrics | None = observe(settings.metrics, self)

    @property
    def managers(self) -> tuple[LeaseManager]:
        """Beat's one election, as the health probe reads it."""
        return (self.manager,)

    def loop_busy_with_task(self) -> bool:
        """Beat runs no task on its loop: never busy, for the health probe."""
        return False

    def start(self) -> None:
        """Start competing (once; not again once stopping)."""
        with self._lock:
            if not self.loop.started and not self.loop.stopping:
                self.loop.start()
                self.manager.start()

    def stop(self) -> None:
        """Stop leading, release, and close the store."""
        self.loop.stopping = True
        self.steering.stop()  # first: nothing more is written, the release follows
        with self._lock:
            if self.loop.started:
                self.manager.stop(release=True)
        self._calls.close()
        self._request_calls.close()
        self._control_calls.close()
        self.store.close()

    def forget_elections(self) -> None:
        """Forget the terms begun so far (beat's tick, before it reads the token)."""
        with suppress(queue.Empty):
            while True:
                self._elected.get_nowait()

    def wait_for_election(self, timeout: float) -> bool:
        """Block beat's loop up to *timeout* s; True as soon as a term begins.

        A term begun since :meth:`forget_elections` counts (it returns at once).
        """
        try:
            self._elected.get(timeout=timeout)
        except queue.Empty:
            return False
        return True

    # -- liveness (beat's loop ticks self.loop) -------------------------------

    def publishing(self) -> None:
        """A send may begin: until :meth:`published`, the lease is not released.

        Called *before* :meth:`leading` is read (see :meth:`no_publish_in_flight`).
        Beat's loop does not tick until the send is over: the send is a wait on
        the broker (:data:`~celery_leader.elections.liveness.PUBLISHING`).
        """
        self.loop.wait_begins(PUBLISHING)

    def published(self, ok: bool | None) -> None:
        """The send announced by :meth:`publishing` is over.

        *ok* is True when it was published (and its mark written or given
        up on), False when the publish failed, None when nothing was
        published (this beat did not lead).
        """
        self.loop.wait_ends(PUBLISHING)
        if ok is not None:
            self._publish_failed_at = None if ok else time.monotonic()

    def is_live(self) -> bool:
        """True while this beat can send: it ticks, and its last publish did not fail lately.

        A publish in flight counts as a tick for one ttl: a broker that is
        slow to confirm must not cost the lease mid-send. A publish blocked
        longer than that makes the beat not live, and it hands over.
        """
        now = time.monotonic()
        for since in (self.loop.waiting_since(PUBLISHING), self.taking_over_since):
            if since is not None and now - since <= self.settings.timing.ttl:
                return True
        if not self.loop.turning():
            return False
        failed_at = self._publish_failed_at
        return failed_at is None or now - failed_at > self.settings.timing.ttl

    def no_publish_in_flight(self, term: Any) -> bool:
        """The release guard: never hand the lease over while a send, or its mark, may still land.

        With a send in flight (from :meth:`publishing` to :meth:`published`,
        which spans reading :meth:`leading`, the publish and writing its
        mark), or with a mark given up on at its bound that may still land
        under the lease being released, the lease is not released; it ends
        in the store at its expiry, so the next beat starts at least one ttl
        later and, if the mark landed, reads it.

        Why no send can slip past: the lease thread turns the term over (so
        :meth:`leading` returns None) *before* it asks this guard, and beat
        raises its flag *before* it reads :meth:`leading`. Either the guard
        sees the flag, or beat's read sees the term over.
        """
        if self.loop.waiting_since(PUBLISHING) is not None:
            return False
        # The lease id is new for every term and is replaced only at the next
        # acquire: here it is the one of the term being released.
        lease_id = self.manager.holder.lease_id
        with self._landing_lock:
            self._landing = [write for write in self._landing if write.may_land]
            return not any(write.lease_id == lease_id for write in self._landing)

    def token(self) -> int | None:
        """The beat term's token while leading with validity left, else None."""
        return self.manager.current_token()

    def _store_call(self, what: str, fn: Callable[[], T]) -> T:
        """Run *fn* within ``leader_store_timeout``; any error it raises is a StoreError.

        A call given up on keeps running on its helper thread until the store
        client returns; its result is dropped (see :mod:`celery_leader.lease.bounded`).
        """
        return store_call(
            self._calls.call, fn, self.settings.timing.op_timeout, what, self.store.url
        )

    def read_step_down_requests(self, channel: str) -> dict[str, str]:
        """The state of the step-down slot *channel*, within ``leader_store_timeout``."""
        return self._read_state(self._request_calls, channel, "read step-down requests")

    def refresh_marks(self) -> bool:
        """Load every entry's last send from the store; False when it could not be read.

        Returns within ``leader_store_timeout`` whatever the store does.
        """
        name = self.settings.name
        try:
            raw = self._store_call("read last sends", lambda: self.store.get_state(name))
        except StoreError as exc:
            logger.warning("celery-leader beat: could not read last sends: %s", exc)
            return False
        marks = {}
        for key, value in raw.items():
            if key.startswith(RESERVED_PREFIX):
                continue  # the view and the run-now records (beat.controls), not marks
            try:
                mark = json.loads(value)
            except ValueError:
                continue
            if isinstance(mark, dict) and "at" in mark:
                marks[key] = mark
        self.marks = marks
        self.own_state = raw
        return True

    def leading(self) -> int | None:
        """The token to send under now: this beat leads and took the term over, else None."""
        token = self.token()
        return token if token is not None and token == self.seen_token else None

    def mark_sent(
        self, entry_name: str, token: int, sent_at: float, *, skipped: str | None = None
    ) -> bool:
        """Record that *entry_name* was published at *sent_at* under *token*.

        Called after the publish succeeded, while the send is still in
        flight (so the lease is not released before the mark is written).
        With *skipped* (a reason: ``"paused"``), the slot was consumed at
        *sent_at* without a send: the mark counts the schedule from there and
        keeps the time of the last real send. Returns within
        ``leader_store_timeout`` whatever the store does; False when the
        lease no longer allows the write or it did not finish in time.
        """
        mark: dict[str, Any] = {"at": sent_at, "token": token}
        if skipped is not None:
            mark["skipped"] = skipped
            previous = self.marks.get(entry_name)
            mark["sent"] = last_sent(previous)
        if not self.write_state(entry_name, json.dumps(mark), "write the send mark"):
            return False
        self.marks[entry_name] = mark
        return True

    def write_state(self, key: str, value: str, what: str) -> bool:
        """Write *key* of beat's own state under this term's lease; False when refused or late.

        Returns within ``leader_store_timeout`` whatever the store does. A
        write given up on that may still land holds the release of its lease
        back until it returns (see :meth:`no_publish_in_flight`).
        """
        # Bound now, as the lease thread does: the write names this term's lease.
        write = _MarkWrite(self.manager.holder.lease_id)
        try:
            return self._store_call(
                what,
                lambda: write.run(lambda: self._set_own_state(write.lease_id, key, value)),
            )
        except StoreError as exc:
            if write.give_up():
                with self._landing_lock:
                    self._landing.append(write)
            logger.warning("celery-leader beat: could not %s (%s): %s", what, key, exc)
            return False

    def _write_steering(self, lease_id: str, key: str, value: str) -> bool:
        """Write *key* of beat's own state under *lease_id* (the steering thread), bounded."""
        return store_call(
            self._control_calls.call,
            lambda: self._set_own_state(lease_id, key, value),
            self.settings.timing.op_timeout,
            f"write {key}",
            self.store.url,
        )

    def _set_own_state(self, lease_id: str, key: str, value: str) -> bool:
        """One write of beat's own state at a time (on a store helper thread).

        Beat's loop (send marks) and the steering thread (view, run-now
        records) both write it; a store that rewrites the whole state on each
        write (Azure's blob) would otherwise lose one of two writes at once.
        """
        with self._own_state_lock:
            return self.store.set_state(self.settings.name, lease_id, key, value)

    def read_state(self, name: str) -> dict[str, str]:
        """The state of lease name *name*, within ``leader_store_timeout`` (any thread)."""
        return self._read_state(self._control_calls, name, f"read the state of {name}")

    def _read_state(self, calls: BoundedCaller, name: str, what: str) -> dict[str, str]:
        """One bounded read of *name*'s state through *calls* (each reader has its own)."""
        return store_call(
            calls.call,
            lambda: self.store.get_state(name),
            self.settings.timing.op_timeout,
            what,
            self.store.url,
        )
