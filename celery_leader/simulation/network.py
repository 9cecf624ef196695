"""Messages between the nodes and the store: delay, loss, duplication, late delivery.

A store call of node A at real time ``t`` (see :meth:`Network.call`):

1. the request is sent: it reaches the store at ``t + d_request`` unless it
   is lost; a duplicate may arrive later again and is applied again. A
   paused store queues what arrives and applies it, in order, when it
   resumes; a restart loses that queue (the connections die with the
   process) and refuses connections while it is down;
2. the store applies it (calls the lease manager's own closure, which calls
   the model store) and sends the reply, which reaches A ``d_reply`` later
   unless it is lost (an event owned by A, held back while A is paused);
3. meanwhile A waits: the scheduler runs the rest of the world, nested,
   until the reply comes or A's timeout (``timeout`` on A's clock) passes,
   whichever is first. On timeout the call raises
   :class:`~celery_leader.lease.bounded.StoreCallTimeoutError`, exactly like
   :class:`~celery_leader.lease.bounded.BoundedCaller`; the request may still be
   applied afterwards ("executed after its client gave up").

A call can return later than its reply when another node's call is nested
inside it (at most that call's timeout later, per level of nesting): that is
a thread scheduled late, which the manager must tolerate. A
:class:`SuspendingThread` (the lifeline threads) waits by suspending
instead: its calls run nothing nested, so they never make another call late.

Release notifications (Redis pub/sub, PostgreSQL ``NOTIFY``, etcd's watch,
which also reports an expiry) travel the same way: at most once, with the
reply delay, to every watch that is up.

A store whose processes keep something across calls (etcd: the highest
revision seen, see :class:`CallWitness`) makes its calls through that: it
sees each reply that reaches its caller.

With lifelines (:mod:`.lifelines`) there is more: a one-way message
(:meth:`Network.send`: a connection closed, whose FIN the server reads),
a request the server never answers (:class:`NoReply`: a connection the
server dropped without its client hearing of it), and a partition of one
process (:meth:`Network.cut`): while it lasts, its requests and the replies
and notifications to it are lost.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from celery_leader.exceptions import StoreCallTimeoutError, StoreError
from celery_leader.simulation.model_store import LeaseModel, ModelStore
from celery_leader.simulation.scheduler import Owner, Scheduler
from celery_leader.simulation.trace import Trace
from celery_leader.stores.base import AcquireResult, Holder, LeaseRecord, Watch


@dataclass(frozen=True)
class NetworkProfile:
    """How messages behave in one run (chosen per seed, see :mod:`.faults`)."""

    #: Usual one-way delay: uniform in [min_delay, max_delay] seconds.
    min_delay: float = 0.0005
    max_delay: float = 0.005
    #: Probability that a message is slow, and the largest slow delay (s).
    slow: float = 0.0
    slow_max: float = 0.0
    #: Probability that a request, or a reply, is lost.
    loss_request: float = 0.0
    loss_reply: float = 0.0
    #: Probability that a request arrives twice (the copy up to dup_max s later).
    duplicate: float = 0.0
    dup_max: float = 0.0
    #: Probability that a request is held back until after its client gave up.
    late: float = 0.0
    late_max: float = 0.0


class Caller(Owner, Protocol):
    """The node side of a call (see :class:`celery_leader.simulation.node.Node`)."""

    name: str
    rate: float


class CallWitness(Protocol):
    """What a worker process keeps across its store calls (etcd: the revisions it saw)."""

    def call(
        self, network: Network, caller: Caller, fn: Callable[[], Any], timeout: float, what: str
    ) -> Any:
        """Make the call through *network* (as :meth:`Network.call`), seeing its reply."""


class SuspendingThread:
    """A caller with a stack of its own (:class:`~.lifelines.StepThread` is one).

    It waits for a call's outcome by suspending, and the world goes on
    outside it, instead of running the world nested inside its call: a
    call of such a thread never makes another caller's call return late.
    """

    name: str
    rate: float
    paused_until: float

    def suspend(self) -> None:
        """Give control back to the world until :meth:`resume`."""
        raise NotImplementedError

    def resume(self) -> None:
        """Continue after :meth:`suspend` (from an event of the world)."""
        raise NotImplementedError


class _Pending:
    """One call in flight: its outcome, once a reply or the timeout decided it."""

    __slots__ = ("decided", "error", "resume", "timed_out", "value")

    def __init__(self) -> None:
        self.decided = False
        self.timed_out = False
        self.value: Any = None
        self.error: BaseException | None = None
        #: Continues a suspended caller once decided (None: the caller runs the world).
        self.resume: Callable[[], None] | None = None


class _StoreDownError(StoreError):
    """The store is restarting: connection refused."""


class ProcessKilled(BaseException):
    """The caller's process was killed while its call was out: its thread ends here.

    Raised to a caller that has ``killed`` set (a node of a run with
    lifelines, see :meth:`.node.Node.request_crash`) when its call returns;
    a BaseException, so that no ``except Exception`` of the code under test
    lets the dead thread go on.
    """


class NoReply(Exception):  # noqa: N818 - not an error of the caller: the server stays silent
    """Raised by a store operation that sends no reply at all (the caller times out)."""


class Network:
    """Carries requests, replies and notifications; all randomness from one rng."""

    def __init__(
        self,
        sched: Scheduler,
        store: LeaseModel[Any],
        rng: random.Random,
        profile: NetworkProfile,
        trace: Trace,
    ) -> None:
        self.sched = sched
        self.store = store
        self.rng = rng
        self.profile = profile
        self.trace = trace
        #: While true, the store refuses connections (it is restarting).
        self.store_down = False
        #: The store applies nothing before this time (it is paused).
        self.store_paused_until = 0.0
        #: What reached a paused store, in order of arrival.
        self._queued: list[Callable[[], None]] = []
        #: The nodes inside a call, outermost first (the nesting of the scheduler).
        self.callers: list[Caller] = []
        #: Callers partitioned from the store, and until when (real time).
        self._cut: dict[object, float] = {}

    def delay(self) -> float:
        """One message's one-way delay."""
        p, rng = self.profile, self.rng
        if p.slow and rng.random() < p.slow:
            return rng.uniform(p.max_delay, p.slow_max)
        return rng.uniform(p.min_delay, p.max_delay)

    def call(self, node: Caller, fn: Callable[[], Any], timeout: float, what: str) -> Any:
        """Send *fn* to the store for *node*; wait for the reply at most *timeout* (local s)."""
        sched, p, rng = self.sched, self.profile, self.rng
        now = sched.now
        pending = _Pending()
        copies = 0 if p.loss_request and rng.random() < p.loss_request else 1
        if copies and p.duplicate and rng.random() < p.duplicate:
            copies = 2
        if copies and self.is_cut(node):
            copies = 0
            self.trace.add(now, node.name, "%s request lost (partitioned)", what)
        elif not copies:
            self.trace.add(now, node.name, "%s request lost", what)
        for copy in range(copies):
            delay = self.delay()
            if copy:
                delay += rng.uniform(0.0, p.dup_max)
            elif p.late and rng.random() < p.late:
                delay = timeout / node.rate + rng.uniform(0.0, p.late_max)
            sched.at(now + delay, lambda: self._arrive(node, pending, fn, what))
        # The caller's wait is measured on its own clock.
        sched.at(now + max(timeout, 0.0) / node.rate, lambda: _time_out(pending), node)
        self._wait(node, pending)
        if pending.timed_out:
            self.trace.add(sched.now, node.name, "%s timed out", what)
            raise StoreCallTimeoutError(f"{what} timed out after {timeout:.3g} s")
        if pending.error is not None:
            raise pending.error
        return pending.value

    def _wait(self, node: Caller, pending: _Pending) -> None:
        """Until *pending* is decided: suspended, or running the world nested (see above)."""
        if isinstance(node, SuspendingThread):
            pending.resume = node.resume
            node.suspend()  # the world goes on; the reply or the timeout resumes it
            return
        self.callers.append(node)
        try:
            while not pending.decided:
                self.sched.run_one()
        finally:
            self.callers.pop()
        if getattr(node, "killed", False):  # only nodes are ever killed mid-call
            raise ProcessKilled

    def send(self, node: Owner, fn: Callable[[], None], what: str) -> None:
        """A one-way message from *node* (a connection closed): *fn* runs at the store.

        It travels as a request does (delay, a paused store queues it), is
        lost while *node* is partitioned, and is moot while the store is
        down (its connections died with it). It is never lost otherwise: a
        FIN is retransmitted until it arrives.
        """
        now = self.sched.now
        if self.is_cut(node):
            self.trace.add(now, getattr(node, "name", "?"), "%s lost (partitioned)", what)
            return

        def arrive() -> None:
            if self.sched.now < self.store_paused_until:
                self._queued.append(deliver)
            else:
                deliver()

        def deliver() -> None:
            if not self.store_down:
                fn()

        self.sched.at(now + self.delay(), arrive)

    def cut(self, node: object, until: float) -> None:
        """Partition *node* from the store until real time *until*."""
        self._cut[node] = max(self._cut.get(node, 0.0), until)

    def is_cut(self, node: object) -> bool:
        """True while *node* is partitioned from the store."""
        return bool(self._cut) and self.sched.now < self._cut.get(node, 0.0)

    def holds_up_others(self, node: Caller) -> bool:
        """True when *node* is inside a call that other nodes' calls are nested under.

        Such a node's call must end before theirs can return, so pausing it
        now would pause them too; the simulation starts its pause after its
        step instead.
        """
        return node in self.callers and self.callers[0] is not node

    # -- the store's side ---------------------------------------------------------

    def pause_store(self, duration: float) -> None:
        """The store stops (SIGSTOP, a long fork): what arrives waits until it resumes."""
        now = self.sched.now
        if now + duration > self.store_paused_until:
            self.store_paused_until = now + duration
            self.sched.at(self.store_paused_until, self._resume)

    def _resume(self) -> None:
        if self.sched.now < self.store_paused_until:
            return  # paused again meanwhile: a later resume drains the queue
        queued, self._queued = self._queued, []
        for apply in queued:
            apply()

    def restart_store(self) -> int:
        """The store process goes down: queued requests are lost; returns how many."""
        lost = len(self._queued)
        self._queued = []
        self.store_paused_until = 0.0  # a killed process is no longer paused
        self.store_down = True
        return lost

    def _arrive(self, node: Caller, pending: _Pending, fn: Callable[[], Any], what: str) -> None:
        if self.sched.now < self.store_paused_until:
            self._queued.append(lambda: self._apply(node, pending, fn, what))
        else:
            self._apply(node, pending, fn, what)

    def _apply(self, node: Caller, pending: _Pending, fn: Callable[[], Any], what: str) -> None:
        """The request is taken by the store: apply it, send the reply."""
        value: Any = None
        error: BaseException | None = None
        if self.store_down:
            error = _StoreDownError(f"{what}: connection refused (store restarting)")
        else:
            try:
                value = fn()
            except NoReply:
                return
            except Exception as exc:  # noqa: BLE001 - the reply carries it to the caller
                error = exc
        p, rng = self.profile, self.rng
        if p.loss_reply and rng.random() < p.loss_reply:
            self.trace.add(self.sched.now, node.name, "%s reply lost", what)
            return
        if self.is_cut(node):
            self.trace.add(self.sched.now, node.name, "%s reply lost (partitioned)", what)
            return
        self.sched.at(self.sched.now + self.delay(), lambda: _deliver(pending, value, error), node)

    def notify(self, node: Owner, callback: Callable[[], None]) -> None:
        """Deliver one release notification to *node*, at most once."""
        p, rng = self.profile, self.rng
        if p.loss_reply and rng.random() < p.loss_reply:
            return
        if self.is_cut(node):
            return
        self.sched.at(self.sched.now + self.delay(), callback, node)


def _time_out(pending: _Pending) -> None:
    if not pending.decided:
        pending.decided = pending.timed_out = True
        if pending.resume is not None:
            pending.resume()


def _deliver(pending: _Pending, value: Any, error: BaseException | None) -> None:
    if not pending.decided:  # a late or duplicate reply nobody waits for is dropped
        pending.decided = True
        pending.value, pending.error = value, error
        if pending.resume is not None:
            pending.resume()


class WatchEntry:
    """One node's subscription to release notifications."""

    __slots__ = ("callback", "closed", "node")

    def __init__(self, node: Owner, callback: Callable[[], None]) -> None:
        self.node = node
        self.callback = callback
        self.closed = False

    def close(self) -> None:
        """Stop delivering: a notification already on its way is dropped."""
        self.closed = True


class StoreClient:
    """What one node's LeaseManager holds as its store: the model store, plus its watches.

    The operations run where the network applies them (inside the store's
    events), so they simply go to the one model store.
    """

    capabilities = ModelStore.capabilities
    ttl_range = ModelStore.ttl_range

    def __init__(
        self,
        network: Network,
        node: Owner,
        watches: list[WatchEntry],
        store: LeaseModel[Any] | None = None,
    ) -> None:
        self._network = network
        #: The model of this election's lease (one per election; the network's by default).
        self._store = network.store if store is None else store
        self._node = node
        self._watches = watches
        self.url = self._store.url

    def acquire(self, name: str, holder: Holder, ttl: float, min_token: int = 0) -> AcquireResult:
        """See :meth:`LeaseModel.acquire`."""
        return self._store.acquire(name, holder, ttl, min_token)

    def renew(self, name: str, lease_id: str, ttl: float) -> bool:
        """See :meth:`LeaseModel.renew`."""
        return self._store.renew(name, lease_id, ttl)

    def release(self, name: str, lease_id: str) -> bool:
        """See :meth:`LeaseModel.release`."""
        return self._store.release(name, lease_id)

    def read(self, name: str) -> LeaseRecord | None:
        """See :meth:`LeaseModel.read`."""
        return self._store.read(name)

    def take_over(
        self, name: str, holder: Holder, ttl: float, dead: LeaseRecord, min_token: int = 0
    ) -> AcquireResult:
        """See :meth:`LeaseModel.take_over` (with lifelines, see :mod:`.lifelines`)."""
        return self._store.take_over(name, holder, ttl, dead, min_token)

    def get_state(self, name: str) -> dict[str, str]:
        """See :meth:`LeaseModel.get_state`."""
        return self._store.get_state(name)

    def set_state(self, name: str, lease_id: str, key: str, value: str) -> bool:
        """See :meth:`LeaseModel.set_state`."""
        return self._store.set_state(name, lease_id, key, value)

    def watch(self, name: str, callback: Callable[[], None]) -> Watch:
        """Subscribe; like Redis, call back once as soon as the subscription is up."""
        entry = WatchEntry(self._node, callback)
        self._watches.append(entry)
        self._network.notify(self._node, lambda: _fire(entry))
        return entry

    def close(self) -> None:
        """Nothing to close."""


def _fire(entry: WatchEntry) -> None:
    if not entry.closed:
        entry.callback()


def notify_watchers(network: Network, watches: list[WatchEntry]) -> None:
    """A release (or a store restart, which makes every watch resubscribe): tell all."""
    watches[:] = [entry for entry in watches if not entry.closed]
    for entry in watches:
        network.notify(entry.node, partial(_fire, entry))
