"""LeaseManager: one election, one daemon thread, no Celery.

Safety statement
----------------
At any instant at most one manager of an election believes it leads, provided

* the store honours its TTL (expiry no earlier than ``ttl`` after it processed
  a grant), and
* local clocks advance at roughly the same rate as the store's: the drift over
  one ttl stays below ``margin``.

Validity is counted on the lease clock (:mod:`celery_leader.clock`: boot time
on Linux, which keeps counting while the host is suspended) from the moment the acquire or
renew request was *sent*: ``valid_until = t_sent + ttl - margin``. Renewals
start every ``renew_interval``; a renewal is started only when it can finish
before ``valid_until``, and otherwise the lease is declared lost at once.
Every store call is bounded in wall time by ``op_timeout``, whatever the
store client does (:mod:`celery_leader.lease.bounded`): a call that hangs cannot
delay the loss past ``valid_until``. :meth:`LeaseManager.is_leader`
compares the clock with ``valid_until`` on every call, so it turns false on
time even when the manager thread is stuck or the process was paused.

When those assumptions break (a process paused past its lease, a clock that
jumps), fencing tokens still protect downstream writes: every term has a token
strictly greater than all earlier ones, so a store of yours can refuse a write
that carries an older token.

Stop, then release
------------------
A held term is given up in one order on every path: the state turns
"follower", listeners hear ``LOST`` or ``RELEASED`` (and stop the term's
work), the ``release_guard`` confirms that no work of the term still runs,
and only then is the lease released in the store. When the guard says work
still runs, the lease is not released: it ends in the store at its expiry.

Error handling
--------------
Any exception from a store call counts as a failed call, and never leaves
the thread. A leader that cannot renew in time steps
down (``LeaseEvent`` with kind ``LOST``); a follower keeps trying with capped,
jittered exponential backoff. The first error of a streak is logged once, with
secrets masked; recovery is logged too. Listeners run in the manager thread,
outside its lock; one that raises is logged and does not stop the manager.
"""

from __future__ import annotations

import enum
import logging
import math
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from celery_leader import clock as lease_clock
from celery_leader._masking import mask_text
from celery_leader.exceptions import StoreAuthError, StoreError
from celery_leader.lease.bounded import BoundedCaller, store_call
from celery_leader.lease.lifeline import (
    CONFIRM_EVERY,
    OPEN_WAIT,
    TAKEOVER_WAIT,
    HolderLifeline,
    LifelineMonitor,
)
from celery_leader.lease.timing import LeaseTiming
from celery_leader.stores.base import (
    AcquireResult,
    Holder,
    LeaseRecord,
    LeaseStore,
    Lifelines,
    Watch,
)

logger = logging.getLogger(__name__)


#: Seconds before the end of the lease a follower last saw that a take-over must come to
#: count as following a release (the clocks of two reads differ by a little).
RELEASE_SLACK = 0.05
#: Seconds after the lease may have become free (a release heard, the end last seen) past
#: which an attempt held back by a balancer counts as not looking then (a follower tries
#: within its jitter of that moment otherwise).
STALE_LOOK = 0.1
#: Seconds between two looks at whether this process's new lifeline is confirmed, while an
#: attempt to acquire waits for it (at most :data:`~celery_leader.lease.lifeline.REOPEN_WAIT`).
REOPEN_POLL = 0.1


class Role(enum.Enum):
    """Where a manager stands in its election."""

    FOLLOWER = "follower"
    #: The store granted the lease but it lost its data earlier: wait one ttl.
    HOLDING = "holding"
    LEADER = "leader"


class LossReason(str, enum.Enum):
    """Why a leader stopped leading without choosing to."""

    #: The store said the lease is no longer ours (taken over, or data lost).
    RENEW_REJECTED = "renew-rejected"
    #: No renewal could be confirmed before the lease would run out.
    STORE_UNREACHABLE = "store-unreachable"
    #: The manager found its validity already over (process paused, thread stuck).
    EXPIRED = "expired"
    #: The liveness check said the process is not fit to lead.
    NOT_LIVE = "not-live"
    #: The lifeline the term was tied to ended (:mod:`celery_leader.lease.lifeline`).
    LIFELINE_ENDED = "lifeline-ended"


class EventKind(enum.Enum):
    """What happened to a term."""

    ELECTED = "elected"
    RENEWED = "renewed"
    LOST = "lost"
    RELEASED = "released"


@dataclass(frozen=True)
class Term:
    """One leadership term, as this manager sees it (monotonic-clock times)."""

    token: int
    elected_at: float
    valid_until: float


@dataclass(frozen=True)
class LeaseEvent:
    """Sent to listeners when a term begins, is renewed, is lost or is released."""

    kind: EventKind
    name: str
    term: Term
    reason: LossReason | None = None
    at: float = 0.0
    """Monotonic time of the change: for LOST and RELEASED, when the manager
    stopped believing it leads (before any release reached the store)."""
    latency: float | None = None
    """For RENEWED: how long the renewal took, in seconds."""


class ObservationKind(enum.Enum):
    """What a manager learned of its store, apart from its own terms."""

    #: The store showed a live holder of the lease (this manager or another).
    HOLDER_SEEN = "holder-seen"
    #: A store call failed; :attr:`Observation.error_kind` says how.
    STORE_ERROR = "store-error"


@dataclass(frozen=True)
class Observation:
    """Sent to observers (:meth:`LeaseManager.add_observer`): what the store showed."""

    kind: ObservationKind
    name: str
    error_kind: str | None = None
    """For STORE_ERROR: ``timeout``, ``unreachable``, ``auth`` or ``error``."""


Observer = Callable[[Observation], None]


@dataclass(frozen=True)
class LeaseState:
    """A consistent snapshot of a manager's view."""

    role: Role
    token: int | None
    valid_until: float | None
    """Monotonic end of validity, or None when not holding."""
    hold_until: float | None = None
    """While ``HOLDING``: when the hold-off ends and this holder may lead (same clock)."""
    lifeline: str = ""
    """The key of the lifeline the term is tied to (empty: none); :meth:`LeaseManager.state`
    bounds ``valid_until`` by that lifeline's validity."""

    def is_leader(self, now: float) -> bool:
        """True when this snapshot says "leader" and validity has not run out at *now*."""
        return self.role is Role.LEADER and self.valid_until is not None and now < self.valid_until


_FOLLOWER = LeaseState(Role.FOLLOWER, None, None)

Listener = Callable[[LeaseEvent], None]
#: Runs a store call with a wall-time bound: ``call(fn, timeout, what)``.
StoreCall = Callable[[Callable[[], Any], float, str], Any]


@dataclass
class _Held:
    """What the manager thread knows about a lease it holds (thread-private)."""

    token: int
    valid_until: float
    next_renew_at: float
    hold_until: float
    elected_at: float | None = None
    after: str = ""
    """Whom this term follows, for the log line that announces it (may be empty)."""
    lifeline: str = ""
    """The key of the lifeline this term is tied to (empty: none)."""

    def term(self) -> Term:
        return Term(self.token, self.elected_at or 0.0, self.valid_until)


class LeaseManager:
    """Runs one election against a lease store in a daemon thread.

    Use :meth:`start` once, read :meth:`is_leader` / :meth:`state` from any
    thread, and :meth:`stop` (which releases the lease) at the end.
    """

    def __init__(
        self,
        store: LeaseStore,
        name: str,
        timing: LeaseTiming,
        *,
        holder: Holder | None = None,
        listeners: tuple[Listener, ...] = (),
        liveness: Callable[[], bool] | None = None,
        release_guard: Callable[[Term], bool] | None = None,
        clock: Callable[[], float] = lease_clock.now,
        rand: Callable[[], float] = random.random,
        event_factory: Callable[[], threading.Event] = threading.Event,
        thread_factory: Callable[..., threading.Thread] = threading.Thread,
        call: StoreCall | None = None,
        acquire_delay: Callable[[], float] | None = None,
        renew_grid: float | None = None,
        lifeline: HolderLifeline | None = None,
        lifelines: LifelineMonitor | None = None,
    ) -> None:
        self.store = store
        #: With a lifeline (:mod:`celery_leader.lease.lifeline`), every term is tied to this
        #: process's lifeline, and a holder whose lifeline a follower saw end is taken over
        #: after TAKEOVER_WAIT instead of at its lease's expiry. Both or neither.
        if (lifeline is None) != (lifelines is None):
            raise ValueError("lifeline and lifelines go together")
        self._lifeline = lifeline
        self._lifelines = lifelines
        #: The lifeline key a follower reads (the holder last seen), and the key of a
        #: lifeline of ours that ended (set by the lifeline's thread).
        self._followed_key = ""
        self._own_ended: str | None = None
        #: When a takeover's lifeline was seen ended, for the log line of the term it began.
        self._took_over_seen_at: float | None = None
        #: With a grid (seconds), renewals land on its multiples of the lease clock, never
        #: later than without it: the leases of one worker renew together, so a store
        #: that batches renews them in one call (see celery_leader.stores.batch).
        if renew_grid is not None and not 0 < renew_grid <= timing.renew_interval:
            raise ValueError(
                f"renew_grid={renew_grid!r} must be > 0 and at most the renew interval "
                f"({timing.renew_interval:g} s)"
            )
        self._renew_grid = renew_grid
        #: Asked before each attempt to acquire: seconds to wait first (0: try now).
        #: Named elections' balancer uses it; it only ever delays an attempt.
        self._acquire_delay = acquire_delay
        self.name = name
        self.timing = timing
        self._holder = holder or Holder.for_this_process()
        self._term_ended = False
        self._listeners: list[Listener] = list(listeners)
        self._observers: list[Observer] = []
        self._liveness = liveness
        self._release_guard = release_guard
        self._caller = BoundedCaller(name) if call is None else None
        self._call: StoreCall = self._caller.call if self._caller is not None else call  # type: ignore[assignment]
        self._clock = clock
        self._rand = rand
        self._thread_factory = thread_factory
        self._lock = threading.Lock()
        self._state = _FOLLOWER
        self._wake = event_factory()
        self._stopping = False
        self._release_on_stop = True
        self._step_down: tuple[float, threading.Event] | None = None
        self._sit_out_until = 0.0
        self._held: _Held | None = None
        self._max_token = 0
        self._failures = 0
        self._last_error: str | None = None
        #: The last attempt to acquire got no answer (an error, a timeout); cleared by one that did.
        self._acquire_failing = False
        self._foreign_logged = False
        #: The last holder a failed acquire saw (thread-private), and when the store
        #: first announced a release since (None: not yet): the story the logs tell.
        self._seen: LeaseRecord | None = None
        self._seen_until = 0.0
        self._looked_at = 0.0
        #: An attempt was held back (a balancer's delay, not fit to lead) since the last look.
        self._held_back = False
        self._release_heard_at: float | None = None
        self._thread: threading.Thread | None = None

    # -- reading (any thread) -------------------------------------------------

    @property
    def holder(self) -> Holder:
        """Who this manager is in the store; its ``lease_id`` is new for every term.

        A fresh lease id per term means that a store call of an earlier term
        that lands late (a release or renewal given up at its deadline, still
        on its way) can never touch a later term's lease of this manager.
        """
        return self._holder

    def state(self) -> LeaseState:
        """A snapshot of role, token and validity (bounded by the term's lifeline, if any)."""
        with self._lock:
            state = self._state
        bound = self._lifeline_bound(state)
        if bound is None or state.valid_until is None or bound >= state.valid_until:
            return state
        return replace(state, valid_until=bound)

    def _lifeline_bound(self, state: LeaseState) -> float | None:
        """Until when the lifeline of *state*'s term lets it act; None: no lifeline bound."""
        if not state.lifeline or self._lifeline is None:
            return None
        return self._lifeline.valid_until(state.lifeline)

    def is_leader(self) -> bool:
        """True while this manager leads and its validity has not run out."""
        return self.state().is_leader(self._clock())

    def current_token(self) -> int | None:
        """The fencing token of the current term, or None when not leading.

        Asked by the gate for every leader message: the snapshot is read
        without the lock (it is immutable and replaced whole, so one read of
        the attribute is as consistent as :meth:`state`).
        """
        state = self._state
        now = self._clock()
        if not state.is_leader(now):
            return None
        lifeline = self._lifeline
        if state.lifeline and lifeline is not None and now >= lifeline.valid_until(state.lifeline):
            return None
        return state.token

    def time_left(self) -> float | None:
        """Seconds of validity left when leading, else None."""
        state = self.state()
        now = self._clock()
        if not state.is_leader(now) or state.valid_until is None:
            return None
        return state.valid_until - now

    def sitting_out(self) -> bool:
        """True while a step-down's sit-out lasts: this manager does not try to acquire."""
        return self._clock() < self._sit_out_until

    def acquire_failing(self) -> bool:
        """True while this manager cannot acquire: its last attempt failed in the store.

        Failed: a store error or a timeout instead of an answer (a key the
        store's user may not write, a client wedged on a member it cannot
        reach). An attempt that gets an answer, acquired or refused, clears it.
        The balancer does not plan such an election for this worker.
        """
        return self._acquire_failing

    def hold_off_left(self) -> float | None:
        """Seconds until a lease held in its hold-off may lead; None when not holding off."""
        state = self.state()
        if state.role is not Role.HOLDING or state.hold_until is None:
            return None
        return max(0.0, state.hold_until - self._clock())

    def add_listener(self, listener: Listener) -> None:
        """Call *listener* with every :class:`LeaseEvent` from now on.

        Listeners run on the manager's thread just after the state changed:
        :meth:`is_leader` is already true when ELECTED is delivered (and may
        be true a moment before it is), and already false when LOST is.
        """
        self._listeners.append(listener)

    def add_observer(self, observer: Observer) -> None:
        """Call *observer* with every :class:`Observation` from now on, on the manager's thread.

        A follower sees the holder each time it looks at the store (about
        once per ttl, sooner after a release); the leader at each renewal.
        Observers must return quickly; what they raise is logged.
        """
        self._observers.append(observer)

    @property
    def store_failures(self) -> int:
        """Store calls failed in a row (0 once one succeeds)."""
        return self._failures

    @property
    def running(self) -> bool:
        """True between :meth:`start` and the end of :meth:`stop`."""
        return self._thread is not None and self._thread.is_alive()

    # -- control (any thread) -------------------------------------------------

    def start(self) -> None:
        """Start competing. Returns at once; the first attempt runs in the thread."""
        if self._thread is not None:
            raise RuntimeError("LeaseManager.start() called twice")
        self._thread = self._thread_factory(
            target=self._run, name=f"celery-leader[{self.name}]", daemon=True
        )
        self._thread.start()

    def stop(self, *, release: bool = True, timeout: float | None = None) -> None:
        """Stop competing; when leading, stop leading and (by default) release.

        Blocks until the thread ended, at most *timeout* seconds (default: a
        few store timeouts). Listeners see ``RELEASED`` for a held term.
        """
        self._release_on_stop = release
        self._stopping = True
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.timing.op_timeout * 3 + 1 if timeout is None else timeout)

    def step_down(self, sit_out: float | None = None, timeout: float | None = None) -> bool:
        """Release the lease if held, then sit out *sit_out* seconds (default one ttl).

        Returns True when a held lease was given up (within *timeout*).
        """
        done = threading.Event()
        with self._lock:
            was_holding = self._state.role is not Role.FOLLOWER
            self._step_down = (self.timing.ttl if sit_out is None else sit_out, done)
        self._wake.set()
        finished = done.wait(self.timing.op_timeout * 3 + 1 if timeout is None else timeout)
        return was_holding and finished

    def wait_for_leadership(self, timeout: float) -> bool:
        """Block until this manager leads, at most *timeout* seconds (for tests, demos)."""
        deadline = self._clock() + timeout
        while self._clock() < deadline:
            if self.is_leader():
                return True
            time.sleep(0.01)
        return self.is_leader()

    # -- the thread -----------------------------------------------------------

    def _run(self) -> None:
        watch = self._open_watch()
        if self._lifeline is not None:
            self._lifeline.add_listeners(ended=self._on_own_lifeline_ended)
        try:
            if self._lifeline is not None and not self._stopping:
                # The process's lifeline starts with its first manager (after the worker
                # forked its watchdog). Only a term acquired while the lifeline is confirmed
                # is tied to it: without this wait a worker's first term, often its longest,
                # has no fast failover.
                self._lifeline.start()
                self._lifeline.wait_opened(OPEN_WAIT)
            while not self._stopping:
                self._wake.clear()
                try:
                    delay = self.step()
                except Exception:  # the thread must survive anything a store does
                    logger.exception("celery-leader: unexpected error in election %r", self.name)
                    delay = self.timing.renew_interval
                if delay > 0 and not self._stopping:
                    self._wake.wait(delay)
        finally:
            self._give_up(release=self._release_on_stop)
            self._follow("")
            if self._lifeline is not None:
                self._lifeline.remove_listeners(ended=self._on_own_lifeline_ended)
            if watch is not None:
                watch.close()
            if self._caller is not None:
                self._caller.close()

    def _open_watch(self) -> Watch | None:
        try:
            return self.store.watch(self.name, self._on_store_change)
        except Exception:
            logger.warning(
                "celery-leader: release notifications for %r unavailable; followers will "
                "wait for expiry",
                self.name,
                exc_info=True,
            )
            return None

    def _on_own_lifeline_ended(self, key: str) -> None:
        """The lifeline's thread: the lifeline *key* ended; the term tied to it ends."""
        self._own_ended = key
        self._wake.set()

    def _on_followed_lifeline_ended(self) -> None:
        """The monitor's thread: the lifeline of the holder last seen ended."""
        self._wake.set()

    def _follow(self, key: str) -> None:
        """Read lifeline *key* (the holder's) from now on, and no other; "" reads none."""
        monitor = self._lifelines
        if monitor is None or key == self._followed_key:
            return
        if self._followed_key:
            monitor.unfollow(self._followed_key, self._on_followed_lifeline_ended)
        self._followed_key = key
        if key:
            monitor.follow(key, self._on_followed_lifeline_ended)

    def _on_store_change(self) -> None:
        if self._held is None:
            if self._release_heard_at is None:
                self._release_heard_at = self._clock()
            self._wake.set()

    def step(self) -> float:
        """Do what is due now; return seconds until something is due next.

        The manager's thread calls this in a loop. Tests and the simulation
        call it directly, on a manager that was never started, to drive it
        step by step under a virtual clock.
        """
        request = self._step_down
        if request is not None:
            self._step_down = None
            sit_out, done = request
            self._give_up(release=True)
            self._sit_out_until = self._clock() + sit_out
            done.set()
        if self._held is None:
            return self._try_acquire()
        return self._keep()

    def _on_grid(self, wait: float) -> float:
        """*wait*, ended on the renew grid when there is one.

        For the waits that are not tied to a lease's end (sitting out, not
        fit, a balancer's delay): the attempt after them then falls on a grid
        point, where this worker's renewals go too, and a store that batches
        sends them in one call (see :mod:`celery_leader.stores.batch`). A wait
        for the current lease to end is never moved (a failover must not wait
        for the grid), nor a backoff after a store error (its jitter spreads
        the workers), and a release notification still wakes the manager at
        once.
        """
        grid = self._renew_grid
        if not grid or wait <= 0:
            return wait
        now = self._clock()
        return math.ceil((now + wait) / grid) * grid - now

    def _next_look(self, until_end: float) -> float:
        """Seconds until a follower looks again: the lease's end, or an earlier grid point.

        *until_end*: seconds until the lease's end (with the jitter). A live
        holder's lease ends a ttl less one renew interval ahead or later (two
        intervals, with the default interval of a third of the ttl), so with a
        grid a follower's attempts go out on it, in this worker's one call per
        grid point (a store that batches them), not one call at every lease
        end; once the holder stopped renewing, the end comes before the next
        grid point and the attempt goes out at the end, as without a grid:
        never later than without it. A balancer still decides whether the
        follower then tries at all.
        """
        grid = self._renew_grid
        if not grid:
            return until_end
        now = self._clock()
        return min(until_end, (math.floor(now / grid) + 1) * grid - now)

    def _next_renew(self, t_sent: float) -> float:
        """When to renew a lease last confirmed by a call sent at *t_sent*.

        One renew interval later, or with a renew grid the last multiple of
        the grid before that: never later, so every timing guarantee holds.
        """
        due = t_sent + self.timing.renew_interval
        grid = self._renew_grid
        if not grid:
            return due
        on_grid = math.floor(due / grid) * grid
        return on_grid if on_grid > t_sent else due

    def _wait_before_competing(self) -> float:
        """Seconds to wait before an attempt to acquire; 0 to try now.

        A process not fit to lead does not compete; a balancer may ask to
        wait for the worker planned to lead (0 when asking fails: a plan
        never blocks an election).
        """
        if self._liveness is not None and not self._is_live():
            return self.timing.renew_interval
        if self._acquire_delay is None:
            return 0.0
        try:
            return max(0.0, float(self._acquire_delay()))
        except Exception:
            logger.exception("celery-leader: acquire_delay of election %r raised", self.name)
            return 0.0

    def _not_yet(self) -> float | None:
        """Seconds to wait before the next attempt (sitting out, held back); None: try now."""
        now = self._clock()
        if now < self._sit_out_until:
            return self._on_grid(self._sit_out_until - now)
        wait = self._wait_before_competing()
        if wait > 0:
            self._held_back = True  # not looking at the lease meanwhile: the story may go stale
            return self._on_grid(wait)
        reopening = 0.0 if self._lifeline is None else self._lifeline.reopening_in()
        if reopening > 0:
            # This process's lifeline just ended (a store restart, a failover, a killed
            # connection) and a new one opens within the second: a term won before it is
            # tied to none for its whole life, so a death in it would wait out the lease.
            self._held_back = True
            return min(reopening, REOPEN_POLL)
        return None

    def _try_acquire(self) -> float:
        later = self._not_yet()
        if later is not None:
            return later
        if self._term_ended:
            self._term_ended = False
            self._holder = replace(self._holder, lease_id=uuid.uuid4().hex)
        if self._lifeline is not None:
            key = self._lifeline.key()
            if key != self._holder.lifeline:
                # A lease id goes out with one lifeline key only. An attempt that timed out
                # may still reach the store after a later one that won: with the same lease
                # id it would be granted again, and the store would record a key this term
                # is not bounded by (a follower that saw that key end would take over while
                # this holder still leads). With a new id it is refused; at worst an attempt
                # applied after its caller gave up is not adopted, and expires.
                self._holder = replace(self._holder, lifeline=key, lease_id=uuid.uuid4().hex)
        dead = self._dead_holder()
        if isinstance(dead, float):
            return dead
        holder = self._holder
        t_sent = self._clock()
        try:
            result = self._ask_for_lease(holder, dead)
        except StoreError as exc:
            self._acquire_failing = True
            self._store_failed(exc)
            return self.timing.acquire_backoff(self._failures, self._rand())
        t_recv = self._clock()
        self._acquire_failing = False
        self._store_ok()
        jitter = self.timing.follower_jitter(self._rand())
        if not result.acquired:
            if result.foreign and result.retry_in is None:
                if not self._foreign_logged:
                    logger.error(
                        "celery-leader: the lease slot of election %r in %s holds a value "
                        "celery-leader did not write, with no expiry; nobody can lead until "
                        "it is removed",
                        self.name,
                        self.store.url,
                    )
                    self._foreign_logged = True
                return self.timing.ttl
            self._foreign_logged = False
            self._observe(ObservationKind.HOLDER_SEEN)
            self._saw_holder(result.holder, t_sent)
            self._follow(result.holder.lifeline if result.holder is not None else "")
            # Wake when the current lease would end; a release notification
            # wakes us sooner, and so does the renew grid.
            retry_in = self.timing.ttl if result.retry_in is None else result.retry_in
            return self._next_look(max(0.0, retry_in) + 0.005 + jitter)
        assert result.token is not None
        self._observe(ObservationKind.HOLDER_SEEN)
        self._max_token = max(self._max_token, result.token)
        self._took_over_seen_at = None if dead is None else self._dead_seen_at(dead)
        self._follow("")
        held = _Held(
            token=result.token,
            valid_until=self.timing.valid_until(t_sent),
            next_renew_at=self._next_renew(t_sent),
            hold_until=t_recv + result.hold_off,
            after=self._predecessor(t_sent),
            lifeline=holder.lifeline,
        )
        if result.hold_off > 0 and result.restarted_ago is not None:
            # The data is the store's own, only its server restarted: no word of lost data.
            logger.warning(
                "celery-leader: %s holds election %r (token %d); the lease store's server "
                "restarted %.1f s ago: waiting %.1f s before leading, until one ttl after the "
                "restart, in case a leader that renewed just before it still acts",
                self.holder.nodename,
                self.name,
                held.token,
                result.restarted_ago,
                result.hold_off,
            )
        elif result.hold_off > 0:
            logger.warning(
                "celery-leader: %s holds election %r (token %d), but the store has no record "
                "of earlier terms (a new store, or one that lost its data): waiting %.1f s "
                "before leading, in case a leader the store forgot still acts",
                self.holder.nodename,
                self.name,
                held.token,
                result.hold_off,
            )
            self._hold(held)
        self._held = held
        return self._keep()

    def _keep(self) -> float:
        held = self._held
        assert held is not None
        now = self._clock()
        if now >= held.valid_until or self._lifeline_ended(held):
            if self._held is held:
                self._lose(LossReason.EXPIRED)
            return 0.0
        if now >= held.next_renew_at:
            if self._liveness is not None and not self._is_live():
                term = held.term()
                self._lose(LossReason.NOT_LIVE)
                # We can still reach the store: hand the lease over now
                # rather than make everyone wait for it to expire, once the
                # term's work stopped.
                if held.elected_at is None:
                    self._leave_hold_off_to_expire(held)
                else:
                    self._release_after_stop(term)
                return self.timing.renew_interval
            if not self.timing.can_renew_in_time(now, held.valid_until):
                self._lose(LossReason.STORE_UNREACHABLE)
                return 0.0
            if not self._renew(held):
                return 0.0
            now = self._clock()
        if held.elected_at is None and now >= held.hold_until:
            wait = self._end_hold_off(held, now)
            if wait is not None:
                return wait
        wake_at = min(held.next_renew_at, held.valid_until)
        if held.elected_at is None:
            wake_at = min(wake_at, held.hold_until)
        return max(0.0, wake_at - self._clock())

    def _end_hold_off(self, held: _Held, now: float) -> float | None:
        """Elect *held* at the end of its hold-off (None), or seconds until the next look."""
        if now >= held.valid_until or self._lifeline_ended(held):
            # A renewal whose reply came after validity ended (a pause mid-call), or
            # while the term's lifeline ended (a follower may take it over and lead):
            # the term is over before it began. Never elect it.
            if self._held is held:
                self._lose(LossReason.EXPIRED)
            return 0.0
        if self._lifeline_lapsed(held, now):
            # Its lifeline's last confirmation is older than the grace (a slow answer
            # is awaited): the term may not act, and its lifeline may have ended
            # unheard. Elected only once a confirmation comes back; lost if it ends.
            if self._state.role is not Role.HOLDING:
                self._hold(held)
            return min(CONFIRM_EVERY, max(0.0, held.next_renew_at - now))
        self._elect(held, now)
        return None

    def _hold(self, held: _Held) -> None:
        """Show *held* as holding off: the lease is ours in the store, no work runs under it."""
        with self._lock:
            self._state = LeaseState(
                Role.HOLDING,
                held.token,
                held.valid_until,
                hold_until=held.hold_until,
                lifeline=held.lifeline,
            )

    def _lifeline_lapsed(self, held: _Held, now: float) -> bool:
        """True when *held* is tied to a lifeline whose validity ran out (no end heard yet)."""
        lifeline = self._lifeline
        return (
            bool(held.lifeline)
            and lifeline is not None
            and (now >= lifeline.valid_until(held.lifeline))
        )

    def _lifeline_ended(self, held: _Held) -> bool:
        """End *held* when the lifeline it is tied to ended.

        The lifeline's thread says so; and since a key is never reopened, a
        key that is not the open lifeline's any more has ended too, though
        the news of it was overwritten by a later lifeline's end.
        """
        ended, self._own_ended = self._own_ended, None
        lifeline = self._lifeline
        if not held.lifeline or lifeline is None:
            return False
        if ended != held.lifeline and lifeline.is_open(held.lifeline):
            return False
        # A follower may take over once its wait is out; the work stops now, and the
        # lease is handed over (or left to expire) as for a worker not fit to lead.
        term = held.term()
        self._lose(LossReason.LIFELINE_ENDED)
        if held.elected_at is None and self._clock() < held.hold_until:
            self._leave_hold_off_to_expire(held)
        else:
            self._release_after_stop(term)
        return True

    def _is_live(self) -> bool:
        assert self._liveness is not None
        try:
            return bool(self._liveness())
        except Exception:
            logger.exception("celery-leader: liveness check raised; treating as not live")
            return False

    def _renew(self, held: _Held) -> bool:
        """One renewal attempt; False when the lease was lost."""
        # Bound now: a call that starts late must still name this term's lease.
        lease_id = self._holder.lease_id
        t_sent = self._clock()
        try:
            ok = self._store_call(
                "renew",
                lambda: self.store.renew(self.name, lease_id, self.timing.ttl),
                deadline=held.valid_until,
            )
        except StoreError as exc:
            self._store_failed(exc)
            retry_at = self._clock() + self.timing.renew_retry_delay(self._rand())
            if not self.timing.can_renew_in_time(retry_at, held.valid_until):
                # No retry could land before validity ends: lose now, not at the retry.
                self._lose(LossReason.STORE_UNREACHABLE)
                return False
            held.next_renew_at = retry_at
            return True
        latency = self._clock() - t_sent
        self._store_ok()
        if not ok:
            self._lose(LossReason.RENEW_REJECTED)
            return False
        self._observe(ObservationKind.HOLDER_SEEN)
        held.valid_until = self.timing.valid_until(t_sent)
        held.next_renew_at = self._next_renew(t_sent)
        if held.elected_at is not None:
            with self._lock:
                self._state = LeaseState(
                    Role.LEADER, held.token, held.valid_until, lifeline=held.lifeline
                )
            self._emit(EventKind.RENEWED, held.term(), latency=latency)
        else:
            with self._lock:
                self._state = replace(self._state, valid_until=held.valid_until)
        return True

    def _elect(self, held: _Held, now: float) -> None:
        held.elected_at = now
        with self._lock:
            self._state = LeaseState(
                Role.LEADER, held.token, held.valid_until, lifeline=held.lifeline
            )
        logger.info(
            "celery-leader: %s leads election %r (token %d)%s",
            self.holder.nodename,
            self.name,
            held.token,
            held.after,
        )
        self._emit(EventKind.ELECTED, held.term())

    def _saw_holder(self, record: LeaseRecord | None, t_sent: float) -> None:
        """A failed acquire sent at *t_sent* saw *record*: log it when its holder or term is new.

        A release heard after the attempt was sent is kept: the store may have
        answered before that release (the holder seen is the one that released).
        """
        if record is None:
            return
        seen = self._seen
        changed = seen is None or (seen.nodename, seen.token) != (record.nodename, record.token)
        if changed and not self._is_us(record):
            waits = record.hold_off
            logger.info(
                "celery-leader: election %r is led by %s (token %d)%s",
                self.name,
                record.nodename,
                record.token,
                f", holding off {waits:.1f} s before it acts" if waits > 0 else "",
            )
        self._seen = record
        self._seen_until = self._clock() + record.expires_in
        self._looked_at = t_sent
        self._held_back = False
        heard = self._release_heard_at
        self._release_heard_at = heard if heard is not None and heard >= t_sent else None

    def _ask_for_lease(self, holder: Holder, dead: LeaseRecord | None) -> AcquireResult:
        """One acquire, or a takeover of *dead*'s term when its lifeline was seen ended."""
        min_token, ttl = self._max_token, self.timing.ttl
        if dead is None:
            return self._store_call(  # type: ignore[no-any-return]
                "acquire", lambda: self.store.acquire(self.name, holder, ttl, min_token)
            )
        store: Lifelines = self.store  # type: ignore[assignment]
        return self._store_call(  # type: ignore[no-any-return]
            "take over", lambda: store.take_over(self.name, holder, ttl, dead, min_token)
        )

    def _dead_holder(self) -> LeaseRecord | float | None:
        """The holder last seen, once its lifeline ended and the wait is out: take it over.

        A float: seconds still to wait (rule 2 of :mod:`celery_leader.lease.lifeline`).
        None: acquire as usual (no lifeline, or not seen ended).
        """
        seen, monitor = self._seen, self._lifelines
        if monitor is None or seen is None or not seen.lifeline or self._is_us(seen):
            return None
        ended = monitor.ended_at(seen.lifeline)
        if ended is None:
            return None
        wait = ended + TAKEOVER_WAIT - self._clock()
        return wait if wait > 0 else seen

    def _dead_seen_at(self, dead: LeaseRecord) -> float | None:
        """When the lifeline of the holder taken over was seen ended."""
        return None if self._lifelines is None else self._lifelines.ended_at(dead.lifeline)

    def _is_us(self, record: LeaseRecord) -> bool:
        """True when *record* is this process's own (a restart with the same name is not us)."""
        return (record.nodename, record.pid) == (self.holder.nodename, self.holder.pid)

    def _predecessor(self, t_sent: float) -> str:
        """Whom a term acquired by a call sent at *t_sent* follows (empty when unknown)."""
        seen, self._seen = self._seen, None
        if seen is None or self._is_us(seen):
            return ""
        # The lease may have been free from the first release heard since the last look,
        # or from the end that look saw. A follower tries then (within its jitter), unless
        # a balancer held it back: then another term may have come and gone meanwhile, and
        # the holder last seen is only the earliest the predecessor can be.
        heard = self._release_heard_at
        free_from = self._seen_until if heard is None else min(heard, self._seen_until)
        if self._held_back and t_sent > free_from + STALE_LOOK:
            return (
                f", after {seen.nodename} (token {seen.token}) or a later holder: this worker "
                f"had not looked at the lease for {t_sent - self._looked_at:.1f} s"
            )
        # A watch call-back alone proves nothing (a watch also calls back when it
        # reconnects, and a polling one once it finds an expired lease free): released
        # means heard of before the lease's end.
        seen_ended = self._took_over_seen_at
        if seen_ended is not None:
            how = (
                "whose process died: its lifeline ended at least "
                f"{max(0.0, t_sent - seen_ended):.2f} s before this takeover"
            )
        elif not seen.expires_in_exact:
            how = "whose lease ended (released or expired: the store does not say which)"
        elif heard is not None and heard < self._seen_until - RELEASE_SLACK:
            how = "which released it"
        else:
            how = "whose lease expired"
        return f", after {seen.nodename} (token {seen.token}), {how}"

    def _lose(self, reason: LossReason) -> None:
        held = self._held
        self._held = None
        self._term_ended = True
        with self._lock:
            self._state = _FOLLOWER
        stopped_at = self._clock()
        if held is not None and held.elected_at is not None:
            logger.warning(
                "celery-leader: %s lost the lead of election %r (token %d): %s",
                self.holder.nodename,
                self.name,
                held.token,
                reason.value,
            )
            self._emit(EventKind.LOST, held.term(), reason, at=stopped_at)

    def _give_up(self, *, release: bool) -> None:
        """Stop leading, stop the term's work, then release in the store: never the other way."""
        held = self._held
        if held is None:
            return
        self._held = None
        self._term_ended = True
        with self._lock:
            self._state = _FOLLOWER
        stopped_at = self._clock()
        if held.elected_at is not None:
            logger.info(
                "celery-leader: %s released election %r (token %d)",
                self.holder.nodename,
                self.name,
                held.token,
            )
            self._emit(EventKind.RELEASED, held.term(), at=stopped_at)
        if release and held.elected_at is not None:
            self._release_after_stop(held.term())
        elif release:
            self._leave_hold_off_to_expire(held)

    def _leave_hold_off_to_expire(self, held: _Held) -> None:
        """A term given up in its hold-off is never released: it expires in the store.

        The hold-off exists because a holder the store forgot may still act
        until about one ttl after the store forgot. Released early, the next
        acquirer would find a plain free lease and act at once. Left to
        expire, the lease ends no earlier than its acquire plus one ttl,
        which is when the hold-off would have ended.
        """
        logger.info(
            "celery-leader: election %r (token %d) given up in its hold-off; the lease "
            "is left to expire in the store, so the next holder waits it out too",
            self.name,
            held.token,
        )

    def _release_after_stop(self, term: Term) -> None:
        """Release in the store once the guard confirms no work of *term* runs."""
        if self._release_guard is not None:
            try:
                stopped = self._release_guard(term)
            except Exception:
                logger.exception("celery-leader: release guard raised; not releasing")
                stopped = False
            if not stopped:
                logger.warning(
                    "celery-leader: leader work of election %r (token %d) still runs; the "
                    "lease is not released and ends in the store at its expiry",
                    self.name,
                    term.token,
                )
                return
        self._release_quietly()

    def _release_quietly(self) -> None:
        try:
            lease_id = self._holder.lease_id  # bound now, as in _renew
            self._store_call("release", lambda: self.store.release(self.name, lease_id))
        except StoreError as exc:
            logger.warning(
                "celery-leader: could not release election %r (it will expire): %s",
                self.name,
                exc,
            )

    def _emit(
        self,
        kind: EventKind,
        term: Term,
        reason: LossReason | None = None,
        *,
        at: float | None = None,
        latency: float | None = None,
    ) -> None:
        event = LeaseEvent(
            kind, self.name, term, reason, self._clock() if at is None else at, latency
        )
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:
                logger.exception("celery-leader: a %s listener raised", kind.value)

    def _store_call(self, what: str, fn: Callable[[], Any], deadline: float | None = None) -> Any:
        """One store call bounded by ``op_timeout`` (and *deadline*); any error is a StoreError."""
        bound = self.timing.op_timeout
        if deadline is not None:
            bound = min(bound, deadline - self._clock())
        return store_call(self._call, fn, bound, what, self.store.url)

    def _observe(self, kind: ObservationKind, error_kind: str | None = None) -> None:
        observation = Observation(kind, self.name, error_kind)
        for observer in list(self._observers):
            try:
                observer(observation)
            except Exception:
                logger.exception("celery-leader: a %s observer raised", kind.value)

    def _store_failed(self, exc: StoreError) -> None:
        self._failures += 1
        self._observe(ObservationKind.STORE_ERROR, exc.kind)
        message = mask_text(str(exc))
        if message != self._last_error:
            # A store that explains the refusal itself names the setting already.
            hint = (
                " (check the credentials in leader_backend_url)"
                if isinstance(exc, StoreAuthError) and "leader_backend_url" not in message
                else ""
            )
            logger.error(
                "celery-leader: election %r: %s%s; will keep trying", self.name, message, hint
            )
            self._last_error = message
        else:
            logger.debug("celery-leader: election %r: %s (again)", self.name, message)

    def _store_ok(self) -> None:
        if self._last_error is not None:
            logger.info("celery-leader: election %r: lease store reachable again", self.name)
        self._failures = 0
        self._last_error = None
