"""One simulated worker: the real LeaseManager, its clock, its thread, its work view.

A node is one process with one :class:`~celery_leader.lease.LeaseManager`
(never started: no thread) driven the way its thread would drive it:

* **the thread** is a chain of step events: ``step()`` runs, and the next
  step is scheduled after the delay it returned (on the node's clock), or at
  once when the manager's wake event was set meanwhile (a release
  notification, ``step_down()``), as ``Event.wait`` would return at once;
* **the clock** is local: ``offset + rate * real time``, the rate drifting
  from the store's by at most the configured bound (the manager's timing
  assumption is that drift over one ttl stays below its ``margin``);
* **the store calls** go through :class:`~.network.Network` (delay, loss,
  timeouts);
* **the work view** is a real :class:`~celery_leader.elections.shared_lease.SharedLease`,
  fed as the worker's coordinator feeds it: publish on ELECTED and RENEWED,
  revoke on LOST and RELEASED. The checker reads it on this node's clock, as
  pool children would;
* **the work** is a :class:`~.pool.Pool`: leader runs in pool children,
  the run table, the watchdog; on LOST and RELEASED the parent's kill, and
  the release guard reads the table, as the worker's ``TermEnd`` does.

A pause (SIGSTOP, a GC, a frozen VM) holds back every event of the node (its
steps, its replies, its notifications, its gate) until it ends; its
``is_leader()`` and its work view are still judged at every instant, on its
clock, since a paused process's pool children, its watchdog and its callers
do not wait for it.

Stop, step-down and crash are requests from outside the thread: a node that
is inside a step (waiting for a store call) takes them when the step
returns, as the real thread would at its next loop turn. With lifelines a
crash is taken when the call returns instead (the rest of the step never
runs): the process's death is what its followers act on, within a fraction
of a second, and a step that went on after it would act for a dead process.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

from celery_leader.elections.election import Election
from celery_leader.elections.shared_lease import SharedLease
from celery_leader.lease import LeaseEvent, Term
from celery_leader.lease.lifeline import OPEN_WAIT, HolderLifeline, LifelineMonitor
from celery_leader.lease.timing import LeaseTiming
from celery_leader.simulation.network import (
    CallWitness,
    Network,
    ProcessKilled,
    StoreClient,
    WatchEntry,
)
from celery_leader.simulation.pool import Judge, Pool, WorkProfile
from celery_leader.simulation.scheduler import Scheduler
from celery_leader.simulation.trace import Trace
from celery_leader.stores.base import Holder

#: Wake-up latency of a thread whose wait ended: uniform in [0, this] seconds.
#: Also keeps virtual time moving when a step asks to run again at once.
SCHEDULING_LATENCY = 0.001
_MIN_LATENCY = 1e-6

ELECTION = "sim"


class WakeEvent(threading.Event):
    """The manager's wake event: setting it makes the node's next step due now."""

    def __init__(self, on_set: Callable[[], None]) -> None:
        super().__init__()
        self._on_set = on_set

    def set(self) -> None:
        """Make the owner's next step due now (the flag itself stays clear)."""
        self._on_set()


class _WatchedLease(SharedLease):
    """The node's shared lease: tells its watchdog of every publish and revoke."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.on_change: Callable[[], None] | None = None

    def publish(self, token: int, valid_until: float) -> bool:
        published = super().publish(token, valid_until)
        if self.on_change is not None:
            self.on_change()
        return published

    def revoke(self, token: int | None = None) -> None:
        super().revoke(token)
        if self.on_change is not None:
            self.on_change()


class Node:
    """One incarnation of a worker process (a restart is a new Node of the same slot)."""

    def __init__(
        self,
        *,
        name: str,
        slot: int,
        rate: float,
        offset: float,
        sched: Scheduler,
        network: Network,
        timing: LeaseTiming,
        rng: random.Random,
        trace: Trace,
        after_code: Callable[[], None],
        on_elected: Callable[[Node, LeaseEvent], None],
        work: WorkProfile,
        work_rng: random.Random,
        judge: Judge,
        new_pid: Callable[[], int],
        release_guard_ok: bool = True,
        torn_slot_hides_runs: bool = False,
        election: str = ELECTION,
        client_factory: Callable[[Node, list[WatchEntry]], StoreClient] | None = None,
        acquire_delay: Callable[[], float] | None = None,
        witness: CallWitness | None = None,
        lifeline: HolderLifeline | None = None,
        lifelines: LifelineMonitor | None = None,
        dies_at_once: bool = False,
    ) -> None:
        self.name = name
        #: Killed while inside a store call (see :meth:`request_crash`).
        self.killed = False
        self._dies_at_once = dies_at_once
        #: The election (its lease name) this node competes in.
        self.election_name = election
        self.slot = slot
        self.rate = rate
        self.offset = offset
        self.paused_until = 0.0
        self._sched = sched
        self._network = network
        self._trace = trace
        self._after_code = after_code
        self._on_elected = on_elected
        self._rng = rng
        #: What its process keeps across store calls (etcd: the revisions it saw), if anything.
        self._witness = witness
        #: The manager runs (False once stopped or crashed).
        self.alive = True
        #: The process is gone (its published validity is still judged until it ends).
        self.crashed = False
        self.unfit_until = 0.0
        self.release_guard_ok = release_guard_ok
        self._busy = False
        self._gen = 0
        self._wake_pending = False
        self._stop_pending: bool | None = None  # release flag of a requested stop
        self._crash_pending = False
        self._pause_pending = 0.0
        #: Waiting for the lifeline's first confirmation before the first step.
        self._waiting = False
        #: Called once the thread ended by a stop (the process exits after its last one).
        self.on_exit: Callable[[], None] | None = None
        #: The process's lifeline (:mod:`.lifelines`), which every term is tied to; or None.
        self._lifeline = lifeline
        self.watches: list[WatchEntry] = []
        self.client = (
            StoreClient(network, self, self.watches)
            if client_factory is None
            else client_factory(self, self.watches)
        )
        #: A hand-over was asked of this node (see :meth:`hand_over`).
        self._handing_over = False
        shared = _WatchedLease(election)
        self.pool = Pool(
            node=self,
            name=name,
            shared=shared,
            sched=sched,
            trace=trace,
            rng=work_rng,
            profile=work,
            local_now=self.local_now,
            real_time_of=self.real_time_of,
            rate=rate,
            new_pid=new_pid,
            judge=judge,
            owner_pid=new_pid(),
            torn_slot_hides_runs=torn_slot_hides_runs,
        )
        shared.on_change = self.pool.on_shared_change
        # The unit the worker uses: the same publish and revoke of each term.
        self.election = Election(
            self.client,
            shared,
            timing,
            holder=Holder(lease_id=f"{name}-first", nodename=name, hostname="sim", pid=slot),
            liveness=self._live,
            release_guard=self._guard,
            on_elected=self._on_elected_event,
            on_ended=self._on_ended_event,
            clock=self.local_now,
            rand=rng.random,
            event_factory=lambda: WakeEvent(self.wake),
            call=self._call,
            acquire_delay=acquire_delay,
            lifeline=lifeline,
            lifelines=lifelines,
        )
        self.shared = self.election.shared
        self.manager = self.election.manager

    # -- clock and callbacks handed to the manager ---------------------------------

    def local_now(self) -> float:
        """The lease clock of this node: ``offset + rate * real time``."""
        return self.offset + self.rate * self._sched.now

    def real_time_of(self, local: float) -> float:
        """The real time at which this node's clock reads *local*."""
        return (local - self.offset) / self.rate

    def _call(self, fn: Callable[[], Any], timeout: float, what: str) -> Any:
        if self._witness is not None:
            return self._witness.call(self._network, self, fn, timeout, what)
        return self._network.call(self, fn, timeout, what)

    def _live(self) -> bool:
        return self._sched.now >= self.unfit_until

    def _guard(self, term: Term) -> bool:
        # TermEnd.work_stopped: the run table shows no run of the term (the
        # parent's kill just ran); a node whose guard is not ok always says one runs.
        stopped = self.release_guard_ok and self.pool.work_stopped(term.token)
        if not stopped:
            self._trace.add(self._sched.now, self.name, "guard: work of %d still runs", term.token)
        return stopped

    def _on_elected_event(self, event: LeaseEvent) -> None:
        # After the Election published the term, as the worker's coordinator does.
        self._trace.add(self._sched.now, self.name, "ELECTED token %d", event.term.token)
        self._on_elected(self, event)
        self.pool.on_elected()

    def _on_ended_event(self, event: LeaseEvent) -> None:
        # The term a hand-over was asked for has ended: a later term is not handed over
        # until asked again (as the worker's hand-over clears its flag when it is done).
        self._handing_over = False
        reason = f" ({event.reason.value})" if event.reason is not None else ""
        kind = event.kind.name
        self._trace.add(self._sched.now, self.name, "%s token %d%s", kind, event.term.token, reason)
        # After the Election revoked the term: TermEnd.end's kill of its runs.
        self.pool.parent_kill(event.term.token, kind)

    # -- the thread -------------------------------------------------------------

    def start(self, at: float) -> None:
        """Begin competing at real time *at*: subscribe, then the first step."""

        def begin() -> None:
            self._trace.add(self._sched.now, self.name, "starts (clock rate %.5f)", self.rate)
            self.manager._open_watch()  # the thread's first actions (LeaseManager._run)
            lifeline = self._lifeline
            if lifeline is None or lifeline.wait_opened(0):
                if lifeline is not None:
                    lifeline.add_listeners(ended=self.manager._on_own_lifeline_ended)
                self._schedule(self._sched.now)
                return
            lifeline.add_listeners(ended=self.manager._on_own_lifeline_ended)
            self._wait_for_lifeline(lifeline)

        self._sched.at(at, begin, self)

    def _wait_for_lifeline(self, lifeline: HolderLifeline) -> None:
        """LeaseManager._run: the first step after the first confirmation, or OPEN_WAIT.

        Wake-ups meanwhile (the watch's first call-back) change nothing: the
        thread clears its wake event after the wait.
        """
        self._waiting = True

        def go() -> None:
            lifeline.remove_listeners(confirmed=go)
            if self._waiting:
                self._waiting = False
                self.wake()

        lifeline.add_listeners(confirmed=go)
        self._sched.at(self._sched.now + OPEN_WAIT / self.rate, go, self)

    def _schedule(self, at: float) -> None:
        self._gen += 1
        gen = self._gen
        self._sched.at(at, lambda: self._step(gen), self)

    def wake(self) -> None:
        """The manager's wake event was set: step now (or right after the current step)."""
        if not self.alive or self._waiting:
            return
        if self._busy:
            self._wake_pending = True
        else:
            self._schedule(self._sched.now)

    def _step(self, gen: int) -> None:
        if gen != self._gen or not self.alive:
            return  # superseded by an earlier wake-up, or stopped
        self._busy = True
        self._wake_pending = False
        try:
            delay = self.manager.step()
        except ProcessKilled:
            self._busy = False
            self._die()  # killed while a call was out: the rest of the step never ran
            self._after_code()
            return
        finally:
            self._busy = False
        self._after_code()
        if self._take_requests():
            return
        if self._wake_pending:
            delay = 0.0
        latency = _MIN_LATENCY + self._rng.random() * SCHEDULING_LATENCY
        self._schedule(self._sched.now + max(delay, 0.0) / self.rate + latency)

    def _take_requests(self) -> bool:
        """Handle what was asked for during a step; True when the thread ended."""
        if self._pause_pending:
            self.pause(self._pause_pending)
            self._pause_pending = 0.0
        if self._crash_pending:
            self._die()
            return True
        if self._stop_pending is not None:
            self._stop(self._stop_pending)
            return True
        return False

    # -- requests from outside -------------------------------------------------

    def pause(self, duration: float) -> None:
        """Stop the process for *duration* seconds (SIGSTOP, a GC, a frozen VM).

        Its events wait. A node whose call other nodes' calls are nested
        under is paused when its step ends instead (see
        :meth:`Network.holds_up_others`): otherwise they would wait too.
        """
        now = self._sched.now
        if self._network.holds_up_others(self):
            self._pause_pending = max(self._pause_pending, duration)
            self._trace.add(now, self.name, "pause of %.3f s: after this step", duration)
            return
        self.paused_until = max(self.paused_until, now + duration)
        self._trace.add(now, self.name, "paused for %.3f s", duration)

    def request_stop(self, *, release: bool) -> None:
        """``manager.stop(release=...)``, taken at the thread's next loop turn."""
        if not self.alive:
            return
        if self._busy:
            self._stop_pending = release
        else:
            self._stop(release)

    def _stop(self, release: bool) -> None:
        self._trace.add(self._sched.now, self.name, "stop(release=%s)", release)
        self.alive = False  # before stop(): the wake it sets must not schedule a step
        self.manager.stop(release=release)  # no thread: only sets the flags
        if self._lifeline is not None:
            # _run adds it again and removes it in its `finally`: not twice.
            self._lifeline.remove_listeners(ended=self.manager._on_own_lifeline_ended)
        self._busy = True
        try:
            # The thread's body: with _stopping set it goes straight to its
            # `finally`, which gives the term up (and releases) and closes the watch.
            self.manager._run()
        finally:
            self._busy = False
        for entry in self.watches:
            entry.close()
        self.pool.exit("worker exit")  # the term's end was handled: the process exits
        self._after_code()
        if self.on_exit is not None:
            self.on_exit()

    def request_step_down(self) -> None:
        """``manager.step_down()``; the thread does it at its next step."""
        if not self.alive:
            return
        self._trace.add(self._sched.now, self.name, "step_down()")
        # timeout=0: do not block waiting for the thread (there is none); the
        # request is taken by the next step, which the wake event makes due now.
        self.manager.step_down(timeout=0)

    @property
    def stepping_down(self) -> bool:
        """A hand-over was asked and the term has not ended yet."""
        return self._handing_over and self.alive and self.manager.is_leader()

    def hand_over(self) -> bool:
        """The balancer's move: step down between runs, as the worker's ``hand_over`` does.

        Declines (False) when this node does not lead, is already handing
        over, or has leader runs in progress (the worker lets them finish
        first and hands over at a later pass).
        """
        if not self.alive or self.stepping_down or not self.manager.is_leader():
            return False
        if self.pool.busy():
            return False
        self._handing_over = True
        self._trace.add(self._sched.now, self.name, "hand-over (balancing)")
        self.request_step_down()
        return True

    def request_crash(self) -> None:
        """SIGKILL: the manager is gone; the published validity still ends by itself.

        A node inside a step dies when its step returns; with *dies_at_once*
        (a run with lifelines, where the death itself is what followers act
        on) when its store call returns, so the rest of the step never runs.
        """
        if not self.alive:
            return
        if self._busy:
            self._crash_pending = True
            self.killed = self._dies_at_once
        else:
            self._die()

    def _die(self) -> None:
        self._trace.add(self._sched.now, self.name, "crash (SIGKILL)")
        self.alive = False
        self.crashed = True
        for entry in self.watches:
            entry.close()
        self.pool.exit("crash of the main process")  # billiard ends the children with it
