"""Spreading a worker's elections over the workers (``leader_balance``): one thread per worker.

Once per renew interval the balancer announces this worker in the lease
store (the elections it may lead and those it leads) and reads every live
worker's announcement in the same round trip
(:class:`~celery_leader.stores.base.Presence`). From them it computes the
plan every worker computes alike (:func:`celery_leader.elections.balance.plan`)
and acts on it in two ways only, delaying acquires and asking for releases:

* **Acquiring waits for the planned worker.** Each election's lease manager
  asks :meth:`Balancer.acquire_delay` before it tries to acquire: a worker
  that is not the planned one waits while the planned one is alive, so a
  free election (a dead worker's, or one handed over) goes to the least
  loaded. A worker that waited two ttls tries anyway: an election is never
  left without a leader because of a plan.
* **Its successor tries at once.** For an election the plan leaves with
  the worker that holds it, every worker also computes who would take it
  if that holder went (the plan without it:
  :func:`~celery_leader.elections.balance.successors`). That one worker
  does not wait: it tries whenever the lease may be free (its end, a
  release notification), so a dead holder's elections are taken the moment
  their leases run out, each by its planned successor and all at once, not
  once the dead worker's announcement expired (up to a ttl later) and a
  pass planned them anew; and an election stepped down is taken as soon as
  its release is heard. The others wait as before. While the holder lives,
  the successor's attempts fail like any follower's, one per renew
  interval, in the worker's one batched call on its renew grid (with a
  store that batches; see ``renew_grid`` of
  :class:`~celery_leader.lease.LeaseManager`).
* **A surplus is handed over.** A worker that leads an election planned for
  another live worker hands it over (stops taking its work, lets its runs
  end within ``leader_stop_grace``, releases, sits out one ttl), once the
  set of workers has not changed for two passes, and then not again for a
  ttl, so workers coming and going cause no thrashing. It hands over its
  whole surplus in one round (the plan is sticky: only the surplus moves),
  so a worker joining many elections gets its share within seconds, not
  one election per ttl; an election with runs in progress waits for a
  later round. Nothing is handed over while two workers announce that they
  lead the same election (one of them is dead or lost it, and its
  announcement has not caught up: a plan made from it could send an
  election to a dead worker), nor while any worker announces a step-down.
* **A step-down moves one election.** An election given up on request
  (``celery leader step-down --election NAME``) goes to its successor, and
  the worker that gave it up announces it as *yielded* until the set of
  workers changes: meanwhile no surplus is handed over, so the step-down
  leaves the load uneven by one election instead of moving others to even
  it out. Balancing resumes when a worker joins or leaves.

A worker does not announce an election it gave up (stepping down, sitting
out) or cannot acquire (its manager's last attempt failed in the store:
:meth:`~celery_leader.lease.LeaseManager.acquire_failing`), so the plan never
names it there: without that, a worker that keeps announcing but cannot take
one election is planned for it after every takeover, and each time the others
wait two ttls. It announces it again once an attempt gets an answer (its
manager still tries every two ttls, as any worker not planned does).

The worker that gives an election up cannot know who takes it: its log
says "to whichever standby takes it", and a later pass logs the worker
that announces it leads it.

Timing: a dead worker's elections are led again within ttl + a little of
its death (its leases run out; the successors try at once), as with one
election.

Safety does not depend on any of it: the lease decides who leads, a plan
only delays an acquire or asks for a release.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from celery_leader.elections.balance import Member, plan, successors
from celery_leader.exceptions import StoreError
from celery_leader.lease import LeaseManager
from celery_leader.stores.base import Presence

logger = logging.getLogger(__name__)

#: Passes with the same set of workers before a surplus is handed over.
STABLE_PASSES = 2
#: How old (seconds) the view may be when an election is found free and planned for another.
FRESH_VIEW = 0.1


class BalancedElection(Protocol):
    """One election of the worker, as the balancer sees it."""

    @property
    def name(self) -> str:
        """The election's lease name."""

    @property
    def manager(self) -> LeaseManager:
        """Its lease manager (asked ``is_leader()``, ``sitting_out()``, ``acquire_failing()``)."""

    @property
    def stepping_down(self) -> bool:
        """True while it gives its term up (a step-down or a hand-over in progress)."""

    def hand_over(self) -> bool:
        """Give the term to another worker gently; False when it cannot now."""


class BalancedWorker(Protocol):
    """The worker as the balancer sees it: the worker's ``Coordinator``, a simulated process."""

    @property
    def nodename(self) -> str:
        """The name the worker announces."""

    @property
    def shutting_down(self) -> bool:
        """True once the worker is leaving."""

    @property
    def elections(self) -> Mapping[str | None, BalancedElection]:
        """Every election the worker takes part in."""

    def is_live(self) -> bool:
        """True while the worker is fit to lead (its loop turns)."""


class Balancer:
    """Announces this worker and hands surplus elections over; see the module docstring.

    *clock* (monotonic seconds) and *event_factory* are the thread's; the
    simulation passes its virtual clock and a wake event that schedules a pass.
    """

    def __init__(
        self,
        worker: BalancedWorker,
        store: Presence,
        group: str,
        *,
        interval: float,
        ttl: float,
        clock: Callable[[], float] = time.monotonic,
        event_factory: Callable[[], threading.Event] = threading.Event,
    ) -> None:
        self.worker = worker
        self.store = store
        self.group = group
        self.interval = interval
        self.ttl = ttl
        self.me = worker.nodename
        self._clock = clock
        self._plan: dict[str, str] = {}
        #: Per election the plan leaves with another worker holding it: who takes it after.
        self._successors: dict[str, str] = {}
        #: Elections this worker gave up on request since the set of workers last changed.
        self._yielded: set[str] = set()
        #: Elections this worker gave up, and since when: a pass logs who took each.
        self._given_up: dict[str, float] = {}
        #: True while hand-overs wait (a step-down, or a view in transition), to log it once.
        self._held_back = False
        #: Elections another live worker announced it leads, as of the last pass.
        self._held_by_others: frozenset[str] = frozenset()
        self._live: frozenset[str] = frozenset()
        self._same_for = 0
        self._last_hand_over = -float("inf")
        self._waiting_since: dict[str, float] = {}
        self._stop = threading.Event()
        self._wake = event_factory()
        self._last_pass = -float("inf")
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- the lease managers' question ------------------------------------------

    def acquire_delay(self, election: str) -> float:
        """Seconds the manager of *election* should wait before trying to acquire (0: try now)."""
        with self._lock:
            owner = self._plan.get(election)
            successor = self._successors.get(election)
            live = self._live
            held_elsewhere = election in self._held_by_others
        now = self._clock()
        if owner is None or owner == self.me or owner not in live or successor == self.me:
            self._waiting_since.pop(election, None)
            return 0.0
        since = self._waiting_since.setdefault(election, now)
        if since == now and not held_elsewhere and now - self._last_pass > FRESH_VIEW:
            # No other worker said it leads this election, and the plan names someone
            # else: look again now (that worker may have just left) instead of at the next
            # interval. Not for an election another worker leads: its followers' periodic
            # attempts would each cost an extra announcement.
            self._wake.set()
            return FRESH_VIEW
        if now - since > 2 * self.ttl:
            self._waiting_since.pop(election, None)
            return 0.0  # the planned worker did not take it: never leave it leaderless
        return self.interval

    def planned(self, election: str) -> str | None:
        """The worker the current plan names for *election* (None before the first pass)."""
        with self._lock:
            return self._plan.get(election)

    def successor(self, election: str) -> str | None:
        """Who takes *election* when its holder lets it go (None: no such plan now)."""
        with self._lock:
            return self._successors.get(election)

    def note_step_down(self, election: str) -> None:
        """Announce that this worker gives *election* up on request, so that nothing else moves.

        See the module docstring (a step-down moves one election). Any thread.
        """
        with self._lock:
            self._yielded.add(election)
            self._given_up[election] = self._clock()
        logger.info(
            "celery-leader: stepping down from election %r on request: no other election is "
            "moved to even out the load until a worker joins or leaves",
            election,
        )

    # -- the thread ------------------------------------------------------------

    def start(self) -> None:
        """Announce at once, then every interval, on a thread of its own.

        Until the first pass lands there is no plan, and every election's
        manager tries to acquire at once, as without balancing.
        """
        self._thread = threading.Thread(
            target=self._run, name="celery-leader-balancer", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop announcing, leave the group (others plan without this worker at once), close."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 1)
        try:
            self.store.withdraw(self.group, self.me)
        except StoreError:
            logger.debug("celery-leader: could not withdraw from %r", self.group, exc_info=True)
        finally:
            close = getattr(self.store, "close", None)  # the balancer's own client
            if close is not None:
                close()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.run_pass()
            except Exception:
                logger.exception("celery-leader: balancing pass failed")
            self._wake.wait(self.interval)

    def me_now(self) -> Member:
        """The announcement of this worker now."""
        worker = self.worker
        elections = list(worker.elections.values())
        able = worker.is_live() and not worker.shutting_down
        # An election this worker gave up (stepping down, or sitting out after it), or
        # cannot acquire (its last attempt failed in the store), is not announced: the plan
        # would hand it straight back and keep the others waiting, round after round.
        eligible = (
            frozenset(
                e.name
                for e in elections
                if not e.stepping_down
                and not e.manager.sitting_out()
                and (e.manager.is_leader() or not e.manager.acquire_failing())
            )
            if able
            else frozenset()
        )
        held = frozenset(e.name for e in elections if e.manager.is_leader())
        with self._lock:
            yielded = frozenset(self._yielded)
        return Member(self.me, eligible, held & eligible, yielded)

    def run_pass(self) -> None:
        """Announce, read the others, update the plan, hand over one surplus election if due."""
        me = self.me_now()
        try:
            payloads = self.store.announce(self.group, self.me, me.payload(), self.ttl)
        except StoreError as exc:
            logger.debug("celery-leader: balancing skipped a pass: %s", exc)
            return
        members = {
            name: member
            for name, payload in payloads.items()
            if (member := Member.parse(name, payload)) is not None
        }
        members[self.me] = me
        self._last_pass = self._clock()
        planned = plan(members)
        after = successors(members, planned)
        live = frozenset(members)
        held_by_others = frozenset(
            e for name, member in members.items() if name != self.me for e in member.held
        )
        with self._lock:
            changed = live != self._live
            self._same_for = 0 if changed else self._same_for + 1
            if changed:
                self._yielded.clear()  # a worker joined or left: balancing resumes
            self._plan, self._live = planned, live
            self._successors = after
            self._held_by_others = held_by_others
        self._report_takers(members)
        self._hand_over_surplus(me, planned, live, self._hold_back(members))

    def _hold_back(self, members: Mapping[str, Member]) -> str | None:
        """Why no surplus may be handed over now (None: it may)."""
        yielded = sorted((name, e) for name, m in members.items() for e in m.yielded)
        if yielded:
            name, election = yielded[0]
            return f"{name} stepped down from election {election!r} on request"
        claimed: dict[str, str] = {}
        for name, member in sorted(members.items()):
            for election in member.held:
                if election in claimed:
                    return f"{claimed[election]} and {name} both announce they lead {election!r}"
                claimed[election] = name
        return None

    def _report_takers(self, members: Mapping[str, Member]) -> None:
        """Log who took each election this worker gave up, once another announces it leads it."""
        with self._lock:
            given_up = dict(self._given_up)
        if not given_up:
            return
        now = self._clock()
        for election, since in given_up.items():
            takers = sorted(
                name for name, m in members.items() if name != self.me and election in m.held
            )
            if takers:
                logger.info(
                    "celery-leader: election %r, which this worker gave up, is led by %s now",
                    election,
                    takers[0],
                )
            elif now - since <= 2 * self.ttl + self.interval:
                continue
            with self._lock:
                self._given_up.pop(election, None)

    def _hand_over_surplus(
        self, me: Member, planned: dict[str, str], live: frozenset[str], hold_back: str | None
    ) -> None:
        now = self._clock()
        if self._same_for < STABLE_PASSES or now - self._last_hand_over < self.ttl + self.interval:
            return
        surplus = [
            name
            for name in sorted(me.held)
            if (owner := planned.get(name)) is not None and owner != self.me and owner in live
        ]
        if surplus and hold_back is not None:
            if not self._held_back:
                logger.info(
                    "celery-leader: not handing over %s for balance while %s",
                    ", ".join(repr(name) for name in surplus),
                    hold_back,
                )
            self._held_back = True
            return
        self._held_back = False
        for name in surplus:
            election = next((e for e in self.worker.elections.values() if e.name == name), None)
            if election is not None and election.hand_over():
                self._last_hand_over = now
                with self._lock:
                    self._given_up[name] = now
                logger.info(
                    "celery-leader: handing election %r over to whichever standby takes it "
                    "(balancing %d workers; the plan names %s)",
                    name,
                    len(live),
                    planned[name],
                )
