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

This module holds that mixin's ticking and its guarded send, and builds the
class. The rest of beat, by job:

* :mod:`~celery_leader.beat.election`: beat's lease, its liveness, the send
  marks and the publish guard (:class:`BeatElection`);
* :mod:`~celery_leader.beat.leading`: taking a term over: the last sends,
  the missed policy and its guarantees;
* :mod:`~celery_leader.beat.steered`: pauses, run-now requests, the view;
* :mod:`~celery_leader.beat.step_down`: ``celery leader step-down --beat``;
* :mod:`~celery_leader.beat.base`: what those parts share.

Every name this module held before the split still imports from here.

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

A standby sleeps in its tick, on its election: winning the lease ends the
sleep at once, so its first send follows without waiting out a tick.

Every beat writes a PersistentScheduler's schedule file, so each needs its
own: a second beat on the same file stops at start
(:mod:`celery_leader.beat.schedule_file`).

Every message beat sends carries the beat term's fencing token in the header
``leader_beat_token``, and its occurrence in ``leader_occurrence`` (the entry and
the slot it was due: :mod:`celery_leader.beat.occurrence`); the leader
re-checks its lease right before each send. From before that check until
the send's mark is written, the lease is never released (the publish guard,
:mod:`celery_leader.beat.election`), so no other beat takes over while the
send may still land unmarked.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery.beat import PersistentScheduler
from celery.utils.imports import load_extension_class_names, symbol_by_name

from celery_leader.beat.base import LeaderSchedulerBase
from celery_leader.beat.controls import RAN_PREFIX, ran_value
from celery_leader.beat.election import MAX_TICK, BeatElection, T, _MarkWrite
from celery_leader.beat.leading import (
    SLOT_TOLERANCE,
    TakingOver,
    _slot_already_sent,
    _slot_missed,
)
from celery_leader.beat.occurrence import OCCURRENCE_HEADER, due_slot, occurrence_of
from celery_leader.beat.schedule_file import hold_schedule_file
from celery_leader.beat.startup import (
    _check_metrics_extra,
    _check_server_limits,
    _exit_cleanly_on_sigterm,
    _limits_checked,
    _standby_mode,
)
from celery_leader.beat.state import ScheduleState, state_of
from celery_leader.beat.steered import Steered
from celery_leader.beat.step_down import (
    STEP_DOWN_KEY,
    STEP_DOWN_POLL,
    StepDownRequests,
    requested_token,
    step_down_channel,
    step_down_request,
)
from celery_leader.elections.liveness import CONNECTING
from celery_leader.exceptions import ConfigurationError
from celery_leader.settings import BeatSettings, app_settings, spelled
from celery_leader.startup_error import StartupConfigurationError

logger = logging.getLogger(__name__)

__all__ = [
    "MAX_TICK",
    "SLOT_TOLERANCE",
    "STANDBY_REST",
    "STANDBY_TICK",
    "STEP_DOWN_KEY",
    "STEP_DOWN_POLL",
    "TOKEN_HEADER",
    "BeatElection",
    "LeaderScheduler",
    "LeaderSchedulerBase",
    "LeaderSchedulerMixin",
    "T",
    "_MarkWrite",
    "_check_metrics_extra",
    "_check_server_limits",
    "_exit_cleanly_on_sigterm",
    "_limits_checked",
    "_slot_already_sent",
    "_slot_missed",
    "_standby_mode",
    "_standby_sleep",
    "leader_scheduler_class",
    "requested_token",
    "step_down_channel",
    "step_down_request",
]

TOKEN_HEADER = "leader_beat_token"  # noqa: S105 - a header name, not a secret
#: The longest a standby sleeps between ticks. It sleeps in its tick, on the election's
#: event, so winning the lease ends the sleep at once (see _standby_sleep).
STANDBY_TICK = 0.1
#: What a standby leaves beat's loop to sleep after its own sleep in the tick (s).
STANDBY_REST = 0.001


class LeaderSchedulerMixin(TakingOver, Steered, StepDownRequests):
    """The leader logic, mixed in front of the wrapped scheduler class.

    Its parts: :class:`~celery_leader.beat.leading.TakingOver`,
    :class:`~celery_leader.beat.steered.Steered`,
    :class:`~celery_leader.beat.step_down.StepDownRequests` (see
    :mod:`celery_leader.beat.base`).
    """

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        try:
            settings = app_settings(app, fresh=True)
        except ConfigurationError as exc:
            raise StartupConfigurationError(f"celery-leader: {exc}") from None
        # Beat's election, with beat's own metrics port: it may share a host (or, under
        # worker -B, a process tree) with a worker serving leader_metrics_port.
        self._leader_settings = settings.beat_election
        self._leader_beat: BeatSettings = settings.beat
        wrapped = self._leader_wrapped()
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
        with self._election().loop.waiting(CONNECTING):
            return super()._ensure_connected(*args, **kwargs)  # type: ignore[misc]

    # -- ticking --------------------------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One pass of the wrapped scheduler, as leader or standby."""
        election = self._election()
        election.start()
        election.loop.tick()
        election.forget_elections()  # a term begun from here on ends a standby's sleep
        if election.metrics is not None:  # each entry's series exists before its first send
            try:
                names = self._leader_state.entry_names(self)
                election.metrics.beat_entries(self._leader_settings.name, names)
            except Exception:  # metrics only: never worth a tick
                logger.exception("celery-leader beat: could not export the entries' series")
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
                election.loop.tick()
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
