"""Beat in single-active-scheduler mode: ``celery_leader.beat:LeaderScheduler``.

Run ``celery beat`` on as many hosts as you like (or ``worker -B`` on every
worker): only the instance holding beat's lease sends. Beat's election is its
own, ``"<leader_name>.beat"``, so beat can run where no worker runs, and a
worker leader and the beat leader may be different processes.

``LeaderScheduler`` wraps the scheduler class named by ``leader_beat_scheduler``
(``celery.beat:PersistentScheduler`` by default; RedBeat and
django-celery-beat's ``DatabaseScheduler`` work too): it builds a subclass of
that class with the leader logic mixed in front, so everything else about the
wrapped scheduler (its entries, its storage) stays as it was.

Standbys, and what keeps them in step (``leader_beat_standby``):

* ``"reserve"`` (schedulers with local state, such as PersistentScheduler):
  standbys tick as usual and advance each due entry without sending, so a new
  leader neither bursts nor starts from a stale schedule.
* ``"idle"`` (any scheduler; the only mode for schedulers with shared state,
  RedBeat and django-celery-beat's DatabaseScheduler): standbys do not tick at
  all; the leader advances the state. RedBeat's own lock is switched off: the
  lease replaces it. ``"reserve"`` with a shared-state scheduler is refused at
  start: its standbys would advance the shared schedule without sending.
* ``"auto"`` (default): ``"idle"`` for shared-state schedulers, ``"reserve"``
  otherwise.

Every beat writes a PersistentScheduler's schedule file, so each needs its
own: a second beat on the same file stops at start
(:mod:`celery_leader.beat.schedule_file`).

Around a failover the time of each entry's last send is shared through the
lease store. The lease holder writes it with its token *after* the publish
succeeded, and only while it still holds the lease. On taking over, a new
leader counts each entry from the previous leaders' last send (the later of
that mark and the scheduler's own shared record, see
:mod:`celery_leader.beat.state`), so it neither sends early nor skips; a slot
that passed while nobody led is sent once, skipped, or sent only within a
catch-up window by the missed policy: ``leader_beat_missed`` (a dict of entry
name to ``"once"``, ``"skip"`` or seconds) with ``leader_beat_missed_default``
(``"once"``); see :mod:`celery_leader.beat.catch_up`. It never sends an entry whose
last send (by anyone) already covers the current slot. RedBeat writes its own
last runs to Redis before each publish and needs none of this.

What each policy guarantees. A publish and its mark are two writes to two
systems, so a window of milliseconds between them cannot be closed. An old
leader that published and died inside it (or whose mark the store did not
take within ``leader_store_timeout``) leaves the slot unmarked.
``"once"`` then sends that slot again: at least once per slot. ``"skip"``
does not: at most once per slot. Outside that window, no slot is sent before
its time, none twice, and none skipped.

Liveness: beat's lease is coupled to beat's own health, as a worker's is to
its loop. A beat whose ticks stop, or whose last publish failed (the broker
is gone while the store is reachable), releases the lease so that another
beat sends. It does not compete again for one ttl.

Every message beat sends carries the beat term's fencing token in the header
``leader_beat_token``, and its occurrence in ``leader_occurrence`` (the entry and
the slot it was due: :mod:`celery_leader.beat.occurrence`); the leader
re-checks its lease right before each send.
From before that check until the send's mark is written, the lease is never
released (it can only expire, one ttl after its last renewal), so no other
beat takes over while the send may still land unmarked. Beat's own store
calls (reading the marks, writing one) are bounded by ``leader_store_timeout``
like the lease thread's: a slow or hung store holds beat's tick no longer
than that per call.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import queue
import signal
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any, TypeVar

from celery.beat import PersistentScheduler
from celery.utils.imports import load_extension_class_names, symbol_by_name

from celery_leader.beat.catch_up import catch_up
from celery_leader.beat.controls import RAN_PREFIX, RESERVED_PREFIX, RunRequest, ran_value
from celery_leader.beat.occurrence import (
    OCCURRENCE_HEADER,
    due_slot,
    manual_occurrence,
    occurrence_of,
)
from celery_leader.beat.schedule_file import hold_schedule_file
from celery_leader.beat.state import ScheduleState, schedule_time, state_of
from celery_leader.beat.steering import Steering, last_sent
from celery_leader.elections.election import Election
from celery_leader.elections.shared_lease import SharedLease
from celery_leader.exceptions import ConfigurationError, StoreCallTimeoutError, StoreError
from celery_leader.lease import lifeline
from celery_leader.lease.bounded import BoundedCaller, store_call
from celery_leader.observe.extra import check_metrics_extra
from celery_leader.settings import (
    BeatSettings,
    LeaderSettings,
    app_settings,
    spelled,
    spelled_in,
    step_down_slot,
)
from celery_leader.skip_reasons import SLOT_PAUSED, SLOT_WINDOW
from celery_leader.startup_error import StartupConfigurationError
from celery_leader.stores import open_store
from celery_leader.stores.base import Holder
from celery_leader.stores.server_limits import check_server_limits

logger = logging.getLogger(__name__)

T = TypeVar("T")

TOKEN_HEADER = "leader_beat_token"  # noqa: S105 - a header name, not a secret
#: The longest the leader sleeps between ticks (beat's loop sleeps uninterruptibly).
MAX_TICK = 0.5
#: The longest a standby sleeps between ticks. It sleeps in its tick, on the election's
#: event, so winning the lease ends the sleep at once (see _standby_sleep).
STANDBY_TICK = 0.1
#: What a standby leaves beat's loop to sleep after its own sleep in the tick (s).
STANDBY_REST = 0.001
#: A send counts as covering the current slot when less than this fraction of
#: the period was left after it (ticks jitter by milliseconds).
SLOT_TOLERANCE = 0.1


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
    """Beat's lease: a LeaseManager plus the shared last-send marks.

    Beat's own store calls (reading the marks, writing one) run from beat's
    loop, not from the lease thread, and are bounded in wall time by
    ``leader_store_timeout`` as the lease thread's are
    (:mod:`celery_leader.lease.bounded`): a slow or hung store holds beat's tick for
    at most that long per call.
    """

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
        self._last_tick = time.monotonic()
        self._publish_failed_at: float | None = None
        #: When the publish now in flight began (monotonic), or None.
        self._publishing_since: float | None = None
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
        #: True while Celery connects to the broker for this beat (it may retry for minutes).
        self.connecting = False
        #: When this beat began taking a term over (reading a long schedule), or None.
        self.taking_over_since: float | None = None
        # Beat's loop sleeps up to MAX_TICK between ticks; allow a few missed.
        self._tick_window = max(2 * settings.timing.renew_interval, 4 * MAX_TICK)
        self.marks: dict[str, dict[str, Any]] = {}
        #: Beat's own state as read at the last takeover (marks, view, run-now records).
        self.own_state: dict[str, str] = {}
        self._own_state_lock = threading.Lock()
        #: Pauses and run-now requests, and the view this beat publishes while it leads.
        self.steering = Steering(settings.name, self.read_state, self._write_steering)
        #: The metric families, when metrics are on.
        self.metrics: Any = None
        #: The token of the term this beat took over as leader (marks read, entries anchored).
        self.seen_token: int | None = None
        self._started = False
        self._lock = threading.Lock()
        if settings.metrics.enabled:
            from celery_leader.observe.metrics import enable_metrics  # noqa: PLC0415 - optional extra

            self.metrics = enable_metrics(settings.metrics, self.manager)
        metrics = settings.metrics
        if metrics.port is not None:  # last: a probe may come at once
            from celery_leader.observe.endpoint import serve_at_start  # noqa: PLC0415 - only with a port
            from celery_leader.observe.health import beat_verdict  # noqa: PLC0415

            serve_at_start(metrics, lambda: beat_verdict(self, metrics.stuck_after))

    def start(self) -> None:
        """Start competing (once)."""
        with self._lock:
            if not self._started:
                self._started = True
                self.manager.start()

    def stop(self) -> None:
        """Stop leading, release, and close the store."""
        self.steering.stop()  # first: nothing more is written, the release follows
        with self._lock:
            if self._started:
                self.manager.stop(release=True)
                self._started = False
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

    # -- liveness -------------------------------------------------------------

    def ticked(self) -> None:
        """Beat's loop ran a tick."""
        self._last_tick = time.monotonic()

    def loop_age(self) -> float:
        """Seconds since beat's loop last ticked."""
        return time.monotonic() - self._last_tick

    @property
    def started(self) -> bool:
        """True once this beat competes for the lease."""
        return self._started

    def publishing(self) -> None:
        """A send may begin: until :meth:`published`, the lease is not released.

        Called *before* :meth:`leading` is read (see :meth:`no_publish_in_flight`).
        Beat's loop does not tick until the send is over.
        """
        self._publishing_since = time.monotonic()

    def published(self, ok: bool | None) -> None:
        """The send announced by :meth:`publishing` is over.

        *ok* is True when it was published (and its mark written or given
        up on), False when the publish failed, None when nothing was
        published (this beat did not lead).
        """
        self._publishing_since = None
        if ok is not None:
            self._publish_failed_at = None if ok else time.monotonic()

    def is_live(self) -> bool:
        """True while this beat can send: it ticks, and its last publish did not fail lately.

        A publish in flight counts as a tick for one ttl: a broker that is
        slow to confirm must not cost the lease mid-send. A publish blocked
        longer than that makes the beat not live, and it hands over.
        """
        now = time.monotonic()
        for since in (self._publishing_since, self.taking_over_since):
            if since is not None and now - since <= self.settings.timing.ttl:
                return True
        if now - self._last_tick > self._tick_window:
            return False
        failed_at = self._publish_failed_at
        return failed_at is None or now - failed_at > self.settings.timing.ttl

    def waiting_on_broker(self) -> bool:
        """True while beat connects to the broker or a publish (with its mark) is in flight."""
        return self.connecting or self._publishing_since is not None

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
        if self._publishing_since is not None:
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


def _slot_already_sent(entry: Any, mark: dict[str, Any] | None) -> bool:
    """True when the last send (*mark*) already covers the slot *entry* is due for now."""
    if not mark:
        return False
    last = schedule_time(entry, float(mark["at"]))
    remaining = entry.schedule.remaining_estimate(last).total_seconds()
    elapsed = max(0.0, time.time() - float(mark["at"]))
    return bool(remaining > SLOT_TOLERANCE * (remaining + elapsed))


def _slot_missed(entry: Any, last_sent: float) -> bool:
    """True when at least one slot passed since the last send (unix time *last_sent*)."""
    last = schedule_time(entry, last_sent)
    return bool(entry.schedule.remaining_estimate(last).total_seconds() <= 0)


#: (store URL, ttl) pairs whose server limits this process checked: beat builds its
#: scheduler more than once (lazily for its banner, then to run it).
_limits_checked: set[tuple[str, float]] = set()


def _check_server_limits(conf: Any, settings: LeaderSettings) -> None:
    """Stop beat at start when the store's server would keep beat's lease longer than its ttl.

    See :mod:`celery_leader.stores.server_limits`; once per store and ttl.
    """
    key = (settings.backend_url, settings.timing.ttl)
    if key in _limits_checked:
        return
    try:
        store = open_store(
            settings.backend_url, timeout=settings.timing.op_timeout, options=settings.store_options
        )
        try:
            check_server_limits(store, settings.timing.ttl)
        finally:
            store.close()
    except ConfigurationError as exc:
        raise StartupConfigurationError(f"celery-leader: {spelled_in(conf, str(exc))}") from None
    _limits_checked.add(key)


def _check_metrics_extra(conf: Any, settings: LeaderSettings) -> None:
    """Stop beat at start, with one line, when its metrics are on and the extra is missing."""
    try:
        check_metrics_extra(settings.metrics)
    except ConfigurationError as exc:
        raise StartupConfigurationError(f"celery-leader: {spelled_in(conf, str(exc))}") from None


class LeaderSchedulerMixin:
    """The leader logic, mixed in front of the wrapped scheduler class."""

    _leader_election: BeatElection | None = None
    _leader_mode = "reserve"

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        try:
            settings = app_settings(app, fresh=True)
        except ConfigurationError as exc:
            raise StartupConfigurationError(f"celery-leader: {exc}") from None
        # Beat's election, with beat's own metrics port: it may share a host (or, under
        # worker -B, a process tree) with a worker serving leader_metrics_port.
        self._leader_settings = settings.beat_election
        self._leader_beat: BeatSettings = settings.beat
        wrapped = type(self).__mro__[2]
        self._leader_state: ScheduleState = state_of(wrapped)
        self._leader_mode = _standby_mode(app.conf, self._leader_beat, wrapped, self._leader_state)
        # Here, not when competing begins: beat's banner builds the scheduler (lazily) before
        # beat runs it, and an error there is one line, not a logged traceback.
        _check_server_limits(app.conf, self._leader_settings)
        _check_metrics_extra(app.conf, self._leader_settings)
        filename = kwargs.get("schedule_filename")
        if filename and issubclass(wrapped, PersistentScheduler):
            # Before the wrapped scheduler opens the file, and also when built lazily
            # (beat's banner): a second beat on it then stops before anything is written.
            hold_schedule_file(app.conf, str(filename))
        super().__init__(app, *args, **kwargs)  # type: ignore[call-arg]
        if getattr(self, "lock_key", None):
            logger.info("celery-leader beat: RedBeat's lock is off; the beat lease replaces it")
            self.lock_key = None

    # -- lifecycle ------------------------------------------------------------

    def _election(self) -> BeatElection:
        if self._leader_election is None:
            self._leader_election = BeatElection(self._leader_settings)
        return self._leader_election

    def setup_schedule(self) -> None:
        """Set up the wrapped schedule, then start competing for beat's lease."""
        super().setup_schedule()  # type: ignore[misc]
        _exit_cleanly_on_sigterm()
        self._election().start()
        logger.info(
            "celery-leader beat: election %r on %s (standby mode %s)",
            self._leader_settings.name,
            self._leader_settings.masked_backend_url,
            self._leader_mode,
        )

    def close(self) -> None:
        """Save the leader's runs, release beat's lease, then close the wrapped scheduler.

        Saved before the release: the next leader then reads them, instead
        of a save landing over its own later.
        """
        election = self._leader_election
        if election is not None:
            if election.leading() is not None:
                try:
                    self.sync()  # type: ignore[attr-defined]
                except Exception:
                    logger.exception("celery-leader beat: could not save the schedule")
            election.stop()
        super().close()  # type: ignore[misc]

    def _ensure_connected(self, *args: Any, **kwargs: Any) -> Any:
        """Celery's broker connection for beat, which may retry for minutes: say so meanwhile."""
        election = self._election()
        election.connecting = True
        try:
            return super()._ensure_connected(*args, **kwargs)  # type: ignore[misc]
        finally:
            election.connecting = False

    # -- ticking --------------------------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One pass of the wrapped scheduler, as leader or standby."""
        election = self._election()
        election.start()
        election.ticked()
        election.forget_elections()  # a term begun from here on ends a standby's sleep
        if election.metrics is not None:  # each entry's series exists before its first send
            names = self._leader_state.entry_names(self)
            election.metrics.beat_entries(self._leader_settings.name, names)
        token = election.token()
        if token is None and election.seen_token is not None:
            # The term ended: what this beat had not saved is older than what the
            # next leader saves.
            election.seen_token = None
            election.steering.term_over()
            self._leader_state.forget_unsaved(self)
        if token is not None and token != election.seen_token:
            # Reading a long schedule is work, not a stuck loop (for one ttl at most).
            election.taking_over_since = time.monotonic()
            try:
                if not self._on_elected(token):
                    return STANDBY_TICK  # nothing sent before the last sends are known: retry
            finally:
                election.taking_over_since = None
                election.ticked()
            election.seen_token = token
        self._leader_step_down_if_asked(election, token)
        if token is not None and token == election.seen_token:
            self._leader_steer(election, token)
        if token is None and self._leader_mode == "idle":
            return _standby_sleep(election, STANDBY_TICK)
        interval = super().tick(*args, **kwargs)  # type: ignore[misc]
        if not interval:
            return float(interval or 0)
        if token is not None:
            return float(min(interval, MAX_TICK))
        return _standby_sleep(election, float(min(interval, STANDBY_TICK)))

    def _on_elected(self, token: int) -> bool:
        """Count every entry from the previous leaders' last send, by the missed policy.

        A slot that passed while nobody led is then due: the next tick sends
        it once (the scheduler's own checks, such as a one-off entry already
        run, still apply), or, under ``"skip"``, the entry counts from now.
        False when the last sends could not be read: nothing is sent until
        they are.
        """
        election = self._election()
        if not election.refresh_marks():
            return False
        if not election.steering.take_over(election.own_state, election.manager.holder.lease_id):
            return False  # a pause must hold across failovers: nothing sent before it is known
        logger.info("celery-leader beat: this beat sends now (token %d)", token)
        state = self._leader_state
        state.reload(self)
        if not state.uses_marks:
            # The scheduler's shared state already holds every leader's sends.
            self._leader_window_on_own_record()
            return True
        entries = list(self.schedule.values())  # type: ignore[attr-defined]
        marks = {
            entry.name: float(election.marks[entry.name]["at"])
            for entry in entries
            if entry.name in election.marks
        }
        try:
            last_sent = state.last_sent(self, marks)
        except Exception as exc:  # noqa: BLE001 - a database hiccup must not stop beat
            logger.warning(
                "celery-leader beat: could not read the schedule's last runs (%s); counting "
                "from the lease store's record",
                exc,
            )
            last_sent = marks
        for entry in entries:
            if entry.name in last_sent:
                try:
                    self._take_over(entry, last_sent[entry.name])
                except Exception:
                    logger.exception("celery-leader beat: could not take %s over", entry.name)
        self._save_anchors()
        return True

    def _save_anchors(self) -> None:
        try:
            self._leader_state.save_anchors(self)
        except Exception as exc:  # noqa: BLE001 - the scheduler's own sync tries again
            logger.warning("celery-leader beat: could not save the re-anchored entries: %s", exc)

    def _take_over(self, entry: Any, last_sent: float) -> None:
        """Count *entry* from *last_sent*, or from now if its missed slot is out of its window.

        See :mod:`celery_leader.beat.catch_up`: ``"once"`` sends the missed
        slot whatever its age, ``"skip"`` never, a window in seconds only
        when the latest missed slot is that young.
        """
        state = self._leader_state
        state.note_sent(self, entry, last_sent)
        if _slot_missed(entry, last_sent) and not self._leader_catch_up(entry, last_sent):
            if self._leader_mode != "reserve":  # a reserving standby already moved on
                state.anchor(self, entry, time.time())
            return
        # Carry on from the last send, not from this beat's own record of the
        # entry (a standby's, which may lie almost a period later, or a
        # database's, which may be minutes old).
        state.anchor(self, entry, last_sent)

    def _leader_catch_up(self, entry: Any, last_sent: float) -> bool:
        """*entry* missed a slot since *last_sent*: True to send it once, by its missed policy."""
        if self._election().steering.paused_until(entry.name) is not None:
            logger.info("celery-leader beat: %s missed a slot; it is paused", entry.name)
            return True  # counted from its last send; its paused slots are consumed as they come
        window = self._leader_beat.catch_up_window(entry.name)
        if catch_up(entry, last_sent, window, time.time()):
            logger.info("celery-leader beat: %s missed a slot; sending it once", entry.name)
            return True
        logger.info(
            "celery-leader beat: %s missed a slot; none within its catch-up window (%s): "
            "skipped, counting from now",
            entry.name,
            "skip" if window == 0 else f"{window:g} s",
        )
        self._leader_count_skip(entry.name, SLOT_WINDOW)
        return False

    def _leader_window_on_own_record(self) -> None:
        """For schedulers that keep their own last runs (RedBeat): the missed policy on those.

        Their standbys do not tick, so at takeover an entry whose last run is
        a slot or more behind is due; under ``"skip"`` or a window it is
        moved on to now unless a slot fell within the window. ``"once"``
        leaves the scheduler to send it, as it would.
        """
        entries = self._leader_entries()
        for entry in (entries or {}).values():
            if math.isinf(self._leader_beat.catch_up_window(entry.name)):
                continue
            last = getattr(entry, "last_run_at", None)
            if not isinstance(last, dt.datetime):
                continue
            if last.tzinfo is None:
                last = last.replace(tzinfo=dt.timezone.utc)
            sent = last.timestamp()
            try:
                if _slot_missed(entry, sent) and not self._leader_catch_up(entry, sent):
                    self._leader_state.anchor(self, entry, time.time())
            except Exception:
                logger.exception("celery-leader beat: could not take %s over", entry.name)

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        """Send when leading and the slot is not sent yet; a standby only keeps in step."""
        election = self._election()
        token = election.leading()
        if token is None:
            logger.debug("celery-leader beat: standby, not sending %s", entry.name)
            return
        if self._leader_skip_paused(election, entry, token):
            return
        mark = election.marks.get(entry.name)
        if self._leader_state.uses_marks and _slot_already_sent(entry, mark):
            assert mark is not None
            by = "this beat" if mark.get("token") == token else "an earlier beat leader"
            logger.info(
                "celery-leader beat: %s was sent for this slot already, by %s (token %s); "
                "its schedule now counts from that send",
                entry.name,
                by,
                mark.get("token"),
            )
            self._leader_state.anchor(self, entry, float(mark["at"]))
            self._save_anchors()
            return
        super().apply_entry(entry, producer=producer)  # type: ignore[misc]

    def apply_async(
        self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        """Send *entry* if this beat leads now (apply_entry has checked the slot).

        From before the lead is checked until the send's mark is written (or
        given up on at the store timeout), the lease is not released: no
        other beat can take over while this send may still land unmarked.
        """
        election = self._election()
        # Raised before leading() is read: raised after, the lease thread could
        # find no send in flight and release between the read and the flag,
        # and this send would land under another beat's lease.
        election.publishing()
        outcome: bool | None = None
        try:
            token = election.leading()
            if token is None:
                return self.reserve(entry) if advance and self._leader_mode == "reserve" else None  # type: ignore[attr-defined]
            manual = self._leader_manual
            slot = None if manual is not None else due_slot(entry)  # before reserve() moves it
            if advance:
                entry = self.reserve(entry)  # type: ignore[attr-defined]
            if manual is None and self._leader_skip_paused(election, entry, token):
                return None  # RedBeat's path: it sends without apply_entry
            occurrence = manual or occurrence_of(entry, slot)
            sending = _shallow_copy(entry)
            options = dict(entry.options)
            options["headers"] = {
                **(options.get("headers") or {}),
                TOKEN_HEADER: token,
                OCCURRENCE_HEADER: occurrence,
            }
            sending.options = options
            sent_at = time.time()
            try:
                result = super().apply_async(sending, producer=producer, advance=False, **kwargs)  # type: ignore[misc]
            except Exception:
                outcome = False
                raise
            outcome = True
            if manual is not None:
                # Recorded before the guard is lowered, as a send's mark is: a release
                # must not let the next leader find the request still undone.
                self._leader_sent_manual = (occurrence, sent_at, token)
                request = self._leader_manual_request
                if request is not None:
                    election.write_state(
                        f"{RAN_PREFIX}{request.entry}",
                        ran_value(request.id, occurrence, sent_at, token),
                        "record the run-now send",
                    )
                return result  # a run-now send moves no slot: no mark
            # Marked only once it is out: a loss before this line leaves the slot
            # unmarked, and the next leader's missed policy decides (see module doc).
            election.mark_sent(entry.name, token, sent_at)
            election.steering.sent()
            if election.metrics is not None and slot is not None:
                election.metrics.beat_sent(
                    self._leader_settings.name, entry.name, sent_at - slot.timestamp()
                )
            return result
        finally:
            # Lowered only now: lowered before the mark, a release could let the
            # next leader read marks that lack this send, and send it again.
            election.published(outcome)

    # -- schedule controls (``celery leader schedule ...``, see beat.steering) ---

    #: The manual occurrence of the run-now send in progress (apply_async reads it).
    _leader_manual: str | None = None
    #: (occurrence, sent_at, token) of the last run-now send, set by apply_async.
    _leader_sent_manual: tuple[str, float, int] | None = None
    #: The run-now request being carried out (apply_async records it as done).
    _leader_manual_request: RunRequest | None = None

    def _leader_skip_paused(self, election: BeatElection, entry: Any, token: int) -> bool:
        """True when *entry* is paused: its slot is consumed (marked) without a send.

        The entry has moved on already (Celery reserved it), so the slots it
        misses while paused are never sent; the mark keeps a takeover from
        sending them either.
        """
        if election.steering.paused_until(entry.name) is None:
            return False
        logger.info("celery-leader beat: %s is paused; slot skipped", entry.name)
        election.publishing()  # the mark is written under the publish guard, as a send's
        try:
            # Read again under the flag (raised first, as for a send): a term that ended
            # meanwhile writes no mark.
            if election.leading() == token:
                election.mark_sent(entry.name, token, time.time(), skipped=SLOT_PAUSED)
        finally:
            election.published(None)
        election.steering.sent()
        self._leader_count_skip(entry.name, SLOT_PAUSED)
        return True

    def _leader_count_skip(self, entry_name: str, reason: str) -> None:
        metrics = self._election().metrics
        if metrics is not None:
            metrics.beat_skipped(self._leader_settings.name, entry_name, reason)

    def _leader_steer(self, election: BeatElection, token: int) -> None:
        """Send what was asked to run now; publish the view (when due). Never waits on the store."""
        pending = election.steering.pending_runs()
        entries: dict[str, Any] | None = None
        if pending:
            entries = self._leader_entries()
            if entries is not None:
                for request in pending:
                    self._leader_run_now(election, request, entries.get(request.entry), token)
        if election.steering.publish_due():
            # Marked published before the view is built: a change read meanwhile
            # makes it due again, and is not lost with this one.
            election.steering.publishing()
            if entries is None:
                entries = self._leader_entries()
            if entries is not None:  # a failed read keeps the last good view
                self._leader_publish_view(election, entries, token)

    def _leader_entries(self) -> dict[str, Any] | None:
        """Every entry of the schedule by name; None when they could not be read."""
        try:
            return self._leader_state.entries(self)
        except Exception:
            logger.exception("celery-leader beat: could not read the schedule's entries")
            return None

    def _leader_run_now(
        self, election: BeatElection, request: RunRequest, entry: Any, token: int
    ) -> None:
        """Send *entry* once for the run-now *request*, as a manual occurrence."""
        # Done in this term whatever happens next: a send that raises is not retried
        # at every tick (the broker is gone: this beat hands over, and the next
        # leader, finding no record, tries once more).
        election.steering.attempted(request)
        if entry is None:
            logger.warning(
                "celery-leader beat: asked to run %r now, but the schedule has no such entry",
                request.entry,
            )
            return
        self._leader_manual = manual_occurrence(
            entry.name, dt.datetime.fromtimestamp(request.at, tz=dt.timezone.utc)
        )
        self._leader_manual_request = request
        self._leader_sent_manual = None
        try:
            self.apply_async(entry, producer=self.producer, advance=False)  # type: ignore[attr-defined]
        except Exception:
            logger.exception("celery-leader beat: could not send %s now", entry.name)
            return
        finally:
            self._leader_manual = None
            self._leader_manual_request = None
        sent = self._leader_sent_manual
        if sent is not None:
            logger.info("celery-leader beat: %s sent now, as asked (%s)", entry.name, sent[0])
            election.steering.sent()

    def _leader_publish_view(
        self, election: BeatElection, entries: dict[str, Any], token: int
    ) -> None:
        def describe(entry: Any) -> dict[str, Any]:
            task = self.app.tasks.get(entry.task)  # type: ignore[attr-defined]
            overlap = getattr(task, "leader_overlap", None) if task is not None else None
            missed = self._leader_beat.missed_policy(entry.name)
            return {"overlap": str(getattr(overlap, "value", overlap or "allow")), "missed": missed}

        wrapped = type(self).__mro__[2]
        view = {
            "election": self._leader_settings.name,
            "token": token,
            "holder": election.holder.nodename,
            "scheduler": f"{wrapped.__module__}:{wrapped.__qualname__}",
            "published_at": time.time(),
            "entries": election.steering.view(entries.values(), election.marks, describe),
        }
        election.steering.publish(view)

    # -- step-down through the lease store (``celery leader step-down --beat``) --

    #: When this beat last looked for a step-down request (monotonic clock).
    _leader_step_down_looked_at = 0.0
    #: The term this beat was asked to end (it asks the lease thread once per term).
    _leader_step_down_token: int | None = None

    def _leader_step_down_if_asked(self, election: BeatElection, token: int | None) -> None:
        """Give beat's lease up when ``celery leader step-down --beat`` asked this term to.

        Beat consumes no broker queue, so the request comes through the lease
        store (see :func:`step_down_channel`). While this beat sends, it looks
        at most every :data:`STEP_DOWN_POLL` seconds, one store call bounded by
        ``leader_store_timeout``. A request naming this term's token makes it
        save its schedule (as at shutdown) and ask the lease thread to release
        and sit out one ttl: the release guard still holds the lease while a
        send may land unrecorded, so no slot is sent twice, and another beat
        takes over at once. A request for any other term is ignored.
        """
        now = time.monotonic()
        # At most once a renew interval (and a second): one read each time, per beat leader.
        every = max(STEP_DOWN_POLL, election.settings.timing.renew_interval)
        if (
            token is None
            or token == self._leader_step_down_token
            or now - self._leader_step_down_looked_at < every
        ):
            return
        self._leader_step_down_looked_at = now
        channel = step_down_channel(election.settings.name)
        try:
            # Bounded like beat's other store calls: a hung store holds the tick that long.
            state = election.read_step_down_requests(channel)
        except StoreError:
            return  # looked for again at the next poll
        if requested_token(state) != token:
            return
        self._leader_step_down_token = token
        sit_out = election.settings.timing.ttl
        logger.warning(
            "celery-leader beat: asked to step down (token %d): releasing beat's lease, then "
            "sitting out %g s",
            token,
            sit_out,
        )
        try:
            self.sync()  # type: ignore[attr-defined]
        except Exception:
            logger.exception("celery-leader beat: could not save the schedule")
        # Off beat's loop: the lease thread releases once no send is in flight.
        threading.Thread(
            target=election.manager.step_down,
            kwargs={"sit_out": sit_out},
            name="celery-leader-beat-step-down",
            daemon=True,
        ).start()


def _shallow_copy(entry: Any) -> Any:
    """A copy of *entry* to send with extra headers, leaving the schedule's entry alone.

    Not ``copy.copy``: ScheduleEntry's ``__reduce__`` passes positional
    arguments that subclasses (RedBeat's) do not accept.
    """
    clone = object.__new__(type(entry))
    clone.__dict__.update(entry.__dict__)
    return clone


def _standby_sleep(election: BeatElection, seconds: float) -> float:
    """A standby's sleep between ticks, taken in the tick: it ends as soon as a term begins.

    Celery's beat loop sleeps what the tick returns, and nothing wakes it.
    Sleeping here instead, on the election's event, lets a standby that
    just won the lease send its first slot at once, not up to
    :data:`STANDBY_TICK` later. Returns the rest for beat's loop: nothing
    when elected (the next tick leads), else a millisecond, so that Celery
    still looks at its sync interval after the sleep.
    """
    if seconds <= 0:
        return seconds  # due now (the wrapped scheduler's interval may be negative): no sleep
    return 0.0 if election.wait_for_election(seconds) else STANDBY_REST


def _standby_mode(conf: Any, beat: BeatSettings, wrapped: type, state: ScheduleState) -> str:
    """The standby mode to run: ``auto`` resolved; ``reserve`` refused for shared state."""
    mode = beat.standby
    if mode == "auto":
        return state.auto_mode
    if mode == "reserve" and state.shared:
        raise StartupConfigurationError(
            f"celery-leader: {spelled(conf, 'leader_beat_standby')}='reserve' is not allowed "
            f"with {wrapped.__module__}:{wrapped.__qualname__}: its schedule is shared, and a "
            "standby that ticks would advance it without sending; use auto or idle"
        )
    return str(mode)


def _exit_cleanly_on_sigterm() -> None:
    """In an embedded beat (``worker -B``), make SIGTERM run beat's cleanup.

    The worker stops its beat process with SIGTERM, whose default action ends
    it at once: no release, so a standby would wait a whole ttl. Standalone
    ``celery beat`` installs its own handler, which is left alone.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):

        def _exit(signum: int, frame: Any) -> None:
            raise SystemExit(0)

        signal.signal(signal.SIGTERM, _exit)


_classes: dict[type, type] = {}


def leader_scheduler_class(wrapped: type) -> type:
    """The class that runs *wrapped* under beat's lease (made once per wrapped class)."""
    if wrapped not in _classes:
        _classes[wrapped] = type(
            f"Leader{wrapped.__name__}",
            (LeaderSchedulerMixin, wrapped),
            {"__module__": __name__},
        )
    return _classes[wrapped]


class LeaderScheduler:
    """``beat_scheduler = "celery_leader.beat:LeaderScheduler"``: the wrapped scheduler, led.

    Calling it builds the wrapped scheduler (``leader_beat_scheduler``) with
    the leader logic mixed in; see the module docstring.
    """

    def __new__(cls, app: Any, *args: Any, **kwargs: Any) -> Any:
        """Build the wrapped scheduler class, led, for *app*."""
        try:
            name = app_settings(app, fresh=True).beat.scheduler
        except ConfigurationError as exc:
            raise StartupConfigurationError(f"celery-leader: {exc}") from None
        aliases = dict(load_extension_class_names("celery.beat_schedulers"))
        try:
            wrapped = symbol_by_name(name, aliases=aliases)
        except (ImportError, AttributeError, ValueError) as exc:
            raise StartupConfigurationError(
                f"celery-leader: {spelled(app.conf, 'leader_beat_scheduler')}={name!r} cannot "
                f"be loaded: {exc}"
            ) from None
        if wrapped is cls or (
            isinstance(wrapped, type) and issubclass(wrapped, LeaderSchedulerMixin)
        ):
            raise StartupConfigurationError(
                "celery-leader: leader_beat_scheduler names LeaderScheduler itself; name the "
                "scheduler to wrap, e.g. celery.beat:PersistentScheduler"
            )
        return leader_scheduler_class(wrapped)(app, *args, **kwargs)


# -- the step-down request (written by ``celery leader step-down --beat``) ----

#: The state key of the step-down request in its slot.
STEP_DOWN_KEY = "request"
#: The longest a sending beat goes between two looks for a step-down request, seconds.
STEP_DOWN_POLL = 1.0


def step_down_channel(beat_election: str) -> str:
    """The request slot beside beat's election *beat_election*: a lease name of its own.

    The command writes a request into the slot's state (anyone may, by taking
    the slot's lease for the moment of the write); the beat leader reads it.
    Beat's own lease and state stay the beat holder's alone. The name is
    derived in :func:`celery_leader.settings.step_down_slot`.
    """
    return step_down_slot(beat_election)


def step_down_request(token: int, by: str) -> str:
    """The request to end the beat term *token*, as stored (*by* names who asked)."""
    return json.dumps({"token": token, "by": by, "at": time.time()})


def requested_token(state: dict[str, str]) -> int | None:
    """The term the slot's *state* asks to end, or None."""
    try:
        token = json.loads(state[STEP_DOWN_KEY])["token"]
    except (KeyError, TypeError, ValueError):
        return None
    return token if isinstance(token, int) and not isinstance(token, bool) else None
