"""Lifelines in the simulation: the server's side, and each worker process's two threads.

With ``World(lifelines=True)`` every worker process runs the real
:class:`~celery_leader.lease.lifeline.HolderLifeline` and
:class:`~celery_leader.lease.lifeline.LifelineMonitor` (one of each per
process, shared by its elections, as :func:`~celery_leader.lease.lifeline.for_store`
makes them), each driven as a thread of its own on the process's clock
(:class:`StepThread`), and every election's manager is given them. The
store models take over (:meth:`~.model_store.ModelStore.take_over`).

**The server** (:class:`LifelineServer`, one per store, whatever the number
of elections) keeps a set of lifeline keys per incarnation: a key is kept
from its opening while its process lives and its connection is up. What
ends one:

* the process dies (a crash): the kernel closes its socket, the server
  reads the FIN one message delay later and drops every key of the process;
  a warm stop closes the lifeline the same way, after the terms ended;
* the store restarts or fails over: every key is gone, and the incarnation
  (``boot``) changes, so every reading's session changes with it;
* an admin kills the connection (:meth:`LifelineServer.kill`): dropped at
  once. Either the holder hears of it (its next confirmation fails), or the
  news is lost: its confirmations get no answer at all and time out
  (:class:`~.network.NoReply`);
* the holder times out a confirmation itself (a slow network, a store
  pause, a partition): it closes the connection, which the server reads
  when the FIN arrives (never, while partitioned);
* a partition of the holder's process: its confirmations time out; the
  server may drop the key after a while (its keepalive, :meth:`LifelineServer.drop_process`).

A SIGSTOP of the holder keeps its connection open: its key stays kept.

**A reading's session** names the server's incarnation and the reader's
connection; the reader opens a new connection after a reading that failed.
Two readings of one session are of one server process, in order, as the
rule of :mod:`celery_leader.lease.lifeline` asks.

The deliberately broken variants (:data:`~.model_store.LIFELINE_BREAKS`)
change the worker, not the store: :class:`SimMonitor` with ``no_wait``
reports a key's end :data:`~celery_leader.lease.lifeline.TAKEOVER_WAIT`
earlier than it saw it (the follower takes over at once), and
:class:`SimHolderLifeline` with ``unbounded`` lets terms act until their
lease's validity whatever their lifeline's confirmations.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

from celery_leader.lease.lifeline import (
    CONFIRM_EVERY,
    GRACE,
    TAKEOVER_WAIT,
    HolderLifeline,
    LifelineMonitor,
)
from celery_leader.simulation.model_store import Broken, LeaseModel, Log
from celery_leader.simulation.network import Network, NoReply, SuspendingThread
from celery_leader.simulation.node import SCHEDULING_LATENCY
from celery_leader.simulation.scheduler import Scheduler
from celery_leader.simulation.trace import Trace
from celery_leader.stores.base import (
    AcquireResult,
    Holder,
    LeaseRecord,
    LifelineEndedError,
    LifelineReading,
)

if TYPE_CHECKING:
    import greenlet

_MIN_LATENCY = 1e-6

#: Said when lifelines are asked for and greenlet is missing.
NO_GREENLET = (
    "the simulation runs lifeline threads on greenlets: install greenlet (the test extra, "
    "pip install 'celery-leader[test]', has it)"
)


def _greenlets() -> ModuleType:
    """The greenlet module, imported only by runs with lifelines."""
    try:
        import greenlet  # noqa: PLC0415 - only runs with lifelines need it
    except ImportError as exc:
        raise RuntimeError(NO_GREENLET) from exc
    module: ModuleType = greenlet
    return module


class LifelineServer:
    """The keys a store's server keeps now, and its incarnation; changed by store events only."""

    def __init__(self, log: Log | None = None) -> None:
        #: Counts the server's starts (a restart, a failover): part of every session.
        self.boot = 1
        self._kept: dict[str, str] = {}
        #: Keys dropped by an admin kill whose news the holder never gets.
        self._silent: set[str] = set()
        self._opened: dict[str, int] = {}
        self._log = log

    def _say(self, message: str, *args: object) -> None:
        if self._log is not None:
            self._log(message, args)

    def keeps(self, key: str) -> bool:
        """True while the server keeps *key*."""
        return key in self._kept

    def open(self, process: str) -> str:
        """A new lifeline of *process*, with a key never used before."""
        count = self._opened.get(process, 0) + 1
        self._opened[process] = count
        key = f"{process}~{count}"
        self._kept[key] = process
        self._say("lifeline %s opened", key)
        return key

    def confirm(self, key: str) -> None:
        """One round trip on the lifeline *key*: answered while it is kept."""
        if key in self._silent:
            raise NoReply
        if key not in self._kept:
            raise LifelineEndedError(f"lifeline {key} is gone")

    def read(self, keys: Collection[str], connection: str) -> LifelineReading:
        """Which of *keys* are kept, in the session of this incarnation and *connection*."""
        alive = frozenset(key for key in keys if key in self._kept)
        return LifelineReading(f"boot {self.boot}/{connection}", alive)

    def close(self, key: str) -> None:
        """The lifeline's connection was closed by its holder (the FIN arrived)."""
        self._silent.discard(key)
        if self._kept.pop(key, None) is not None:
            self._say("lifeline %s closed", key)

    def drop_process(self, process: str, why: str) -> None:
        """Every connection of *process* is gone (it died, or the keepalive gave up on it)."""
        dropped = [key for key, owner in self._kept.items() if owner == process]
        for key in dropped:
            del self._kept[key]
        if dropped:
            self._say("lifeline %s dropped (%s)", ", ".join(dropped), why)

    def kill(self, process: str, *, silent: bool) -> bool:
        """An admin kills the lifeline connections of *process*; False when it had none.

        With *silent*, the holder never hears of it: its confirmations go
        unanswered (the server dropped the connection; nothing reaches it).
        """
        killed = [key for key, owner in self._kept.items() if owner == process]
        for key in killed:
            del self._kept[key]
            if silent:
                self._silent.add(key)
        if killed:
            how = "its holder not told" if silent else "its holder told"
            self._say("lifeline %s killed by an admin (%s)", ", ".join(killed), how)
        return bool(killed)

    def restart(self) -> None:
        """The server stops (a restart, a failover): every connection is gone."""
        self.boot += 1
        self._kept.clear()
        self._silent.clear()


class StepThread(SuspendingThread):
    """One thread of a worker process as a chain of steps on virtual time, on a stack of its own.

    *body* does one step and returns the seconds until the next on the
    process's clock, or None to wait until :meth:`wake` (a monitor that
    follows nothing). Each step runs in a greenlet: a store call suspends
    it until its reply or timeout (:class:`~.network.SuspendingThread`), so
    its calls, one every 50 ms, never hold up another thread's call (which
    a call running the world nested would: every call of the process would
    return late by whatever calls began inside it). Like the node's thread,
    it is an owner of events (paused with its process, which holds back its
    steps and its replies) and a caller of the network. *after* runs after
    each step (the checker: what the step published is judged; the real
    lifeline and monitor change what is judged only after their last call
    of a step: a confirmation's listeners, a reading's callbacks).
    """

    def __init__(
        self,
        name: str,
        rate: float,
        sched: Scheduler,
        rng: random.Random,
        *,
        body: Callable[[], float | None],
        after: Callable[[], None],
    ) -> None:
        self.name = name
        self.rate = rate
        self.paused_until = 0.0
        #: False once stopped (a step in progress goes on) or dead (nothing goes on).
        self.running = True
        self._dead = False
        self._sched = sched
        self._rng = rng
        self._body = body
        self._after = after
        self._greenlets = _greenlets()
        self._glet: greenlet.greenlet | None = None
        self._gen = 0
        self._wake_pending = False

    def start(self, at: float) -> None:
        """The first step at real time *at*."""
        self._schedule(at)

    def _schedule(self, at: float) -> None:
        self._gen += 1
        gen = self._gen
        self._sched.at(at, lambda: self._step(gen), self)

    def wake(self) -> None:
        """Step now (or right after the current step), as a set wake event does."""
        if not self.running:
            return
        if self._glet is not None:
            self._wake_pending = True
        else:
            self._schedule(self._sched.now)

    def _step(self, gen: int) -> None:
        if gen != self._gen or not self.running or self._glet is not None:
            return
        self._glet = self._greenlets.greenlet(self._run)
        self._glet.switch()

    def _run(self) -> None:
        self._wake_pending = False
        try:
            delay = self._body()
        finally:
            self._glet = None
        self._after()
        if not self.running:
            return
        if self._wake_pending:
            delay = 0.0
        if delay is None:
            return
        latency = _MIN_LATENCY + self._rng.random() * SCHEDULING_LATENCY
        self._schedule(self._sched.now + max(delay, 0.0) / self.rate + latency)

    def suspend(self) -> None:
        """In a step: back to the world until the call's outcome resumes it."""
        glet = self._glet
        assert glet is not None, "only inside its step"
        assert glet is self._greenlets.getcurrent(), "only inside its step"
        parent = glet.parent
        assert parent is not None
        parent.switch()

    def resume(self) -> None:
        """The call's outcome came (an event of the thread's): the step goes on from it."""
        glet = self._glet
        if glet is not None and not self._dead:
            glet.switch()

    def pause(self, duration: float) -> None:
        """Stopped with its process: its steps and the replies to it wait."""
        self.paused_until = max(self.paused_until, self._sched.now + duration)

    def stop(self, *, dead: bool = False) -> None:
        """No further step; a step in progress goes on, unless the thread is *dead* (killed)."""
        self.running = False
        if dead:
            self._dead = True  # never resumed: it ends with whatever it was doing

    def close(self) -> None:
        """At the end of the run: end a step left suspended, so that its stack is freed.

        The garbage collector cannot free a suspended greenlet's stack, nor
        anything its frames hold (the whole world): it must be ended.
        """
        glet, self._glet = self._glet, None
        if glet is not None and not glet.dead:
            glet.throw()  # GreenletExit, inside it: it unwinds and ends


def _nothing() -> None:
    pass


class SimLifeline:
    """A :class:`~celery_leader.stores.base.Lifeline` on the model server, through the network."""

    def __init__(self, key: str, client: LifelineClient) -> None:
        self.key = key
        self._client = client
        self.closed = False

    def confirm(self, timeout: float) -> None:
        """A round trip on the lifeline: returns once the server answered that it keeps it."""
        client = self._client
        if self.closed:
            raise LifelineEndedError(f"lifeline {self.key} is closed")
        key, server = self.key, client.server
        client.call(lambda: server.confirm(key), timeout, "lifeline confirmation")
        if self.closed or not client.alive():
            # The process died (or closed it) while the call was out: nothing it does counts.
            raise LifelineEndedError(f"lifeline {self.key} is closed")

    def fileno(self) -> int:
        """No descriptor here (no fork in the simulation)."""
        return -1

    def close(self) -> None:
        """Close the connection: the server drops the key when the FIN arrives."""
        if self.closed:
            return
        self.closed = True
        client = self._client
        if client.alive():  # a dead process's connections were closed by its death
            key, server = self.key, client.server
            client.send(lambda: server.close(key), "lifeline close")


class LifelineClient:
    """The :class:`~celery_leader.stores.base.Lifelines` part of the store, for one thread.

    Its calls go through the network as *thread*'s (the holder's lifeline
    thread, or the monitor's), bounded by *timeout* (the store client's own
    timeout). ``take_over`` is the election's model's (the managers call it
    through their own store client; this one is never asked).
    """

    def __init__(
        self,
        network: Network,
        server: LifelineServer,
        thread: StepThread,
        *,
        process: str,
        timeout: float,
        alive: Callable[[], bool],
        models: Mapping[str, LeaseModel[Any]],
    ) -> None:
        self.server = server
        self._network = network
        self._thread = thread
        self._process = process
        self._timeout = timeout
        self.alive = alive
        self._models = models
        self._connections = 0

    def call(self, fn: Callable[[], Any], timeout: float, what: str) -> Any:
        """*fn* at the store, as a call of this client's thread."""
        return self._network.call(self._thread, fn, timeout, what)

    def send(self, fn: Callable[[], None], what: str) -> None:
        """A one-way message of this client's thread."""
        self._network.send(self._thread, fn, what)

    def open_lifeline(self) -> SimLifeline:
        """Open a lifeline (one round trip); a StoreError when no answer came in time."""
        server, process = self.server, self._process
        key: str = self.call(lambda: server.open(process), self._timeout, "lifeline open")
        return SimLifeline(key, self)

    def read_lifelines(self, keys: Collection[str]) -> LifelineReading:
        """One reading on this thread's connection (a new connection after one that failed)."""
        server, asked = self.server, tuple(keys)
        connection = f"{self._process}#{self._connections}"
        try:
            reading: LifelineReading = self.call(
                lambda: server.read(asked, connection), self._timeout, "lifeline reading"
            )
        except Exception:
            self._connections += 1  # the client drops a connection that failed a call
            raise
        return reading

    def take_over(
        self, name: str, holder: Holder, ttl: float, dead: LeaseRecord, min_token: int = 0
    ) -> AcquireResult:
        """See :meth:`.model_store.ModelStore.take_over`."""
        return self._models[name].take_over(name, holder, ttl, dead, min_token)


class SimHolderLifeline(HolderLifeline):
    """The real holder's lifeline; with *unbounded*, the broken variant that bounds nothing."""

    def __init__(
        self, store: LifelineClient, label: str, *, now: Callable[[], float], unbounded: bool
    ) -> None:
        super().__init__(store, label, now=now)
        self._unbounded = unbounded

    def valid_until(self, key: str) -> float:
        """As the real one; the broken variant: no bound while *key* is current."""
        bound = super().valid_until(key)
        if self._unbounded and bound > 0.0:
            return float("inf")
        return bound


class SimMonitor(LifelineMonitor):
    """The real monitor, without a thread (:class:`StepThread` steps it) and with a trace.

    With *no_wait*, the broken variant: a key's end is reported
    :data:`~celery_leader.lease.lifeline.TAKEOVER_WAIT` before the reading
    that showed it, so a follower takes over as soon as it saw it.
    """

    def __init__(
        self,
        store: LifelineClient,
        label: str,
        *,
        now: Callable[[], float],
        no_wait: bool,
        trace: Callable[[str, str], None],
    ) -> None:
        super().__init__(store, label, now=now, threaded=False)
        self._no_wait = no_wait
        self._tell = trace
        #: Set by the process: wakes the monitor's thread.
        self.on_follow: Callable[[], None] | None = None

    def follow(self, key: str, callback: Callable[[], None]) -> None:
        """As the real one, which wakes its thread: the thread steps now."""
        super().follow(key, callback)
        if key and self.on_follow is not None:
            self.on_follow()

    def following(self) -> bool:
        """True while some key is followed (the real thread ends when none is)."""
        with self._lock:
            return bool(self._followed)

    def ended_at(self, key: str) -> float | None:
        """As the real one; the broken variant reports the end a TAKEOVER_WAIT earlier."""
        ended = super().ended_at(key)
        if ended is not None and self._no_wait:
            return ended - TAKEOVER_WAIT
        return ended

    def _read(self, keys: list[str]) -> None:
        super()._read(keys)  # asks only about keys not yet seen ended
        for key in keys:
            if super().ended_at(key) is not None:
                self._tell("saw lifeline %s end", key)


class ProcessLifelines:
    """One worker process's lifeline and monitor, their threads, and what its faults do."""

    def __init__(
        self,
        *,
        process: str,
        rate: float,
        sched: Scheduler,
        network: Network,
        server: LifelineServer,
        rng: random.Random,
        trace: Trace,
        local_now: Callable[[], float],
        models: Mapping[str, LeaseModel[Any]],
        timeout: float,
        after_step: Callable[[], None],
        broken: Broken | None = None,
    ) -> None:
        self.process = process
        self.dead = False
        self._sched = sched
        self._network = network
        self._server = server
        self._trace = trace
        self._local_now = local_now
        self.holder_thread = StepThread(
            f"{process}/lifeline", rate, sched, rng, body=self._hold_step, after=self._judge
        )
        # A reading's callbacks only wake managers: nothing the checker judges changes.
        self.monitor_thread = StepThread(
            f"{process}/lifelines", rate, sched, rng, body=self._monitor_step, after=_nothing
        )
        self._after_step = after_step
        #: Set by the world: some election of the process leads (or holds off).
        self.holds: Callable[[], bool] = lambda: True

        def client(thread: StepThread) -> LifelineClient:
            return LifelineClient(
                network,
                server,
                thread,
                process=process,
                timeout=timeout,
                alive=lambda: not self.dead,
                models=models,
            )

        self.holder = SimHolderLifeline(
            client(self.holder_thread),
            process,
            now=local_now,
            unbounded=broken is Broken.LIFELINE_UNBOUNDED,
        )
        self.monitor = SimMonitor(
            client(self.monitor_thread),
            process,
            now=local_now,
            no_wait=broken is Broken.TAKEOVER_WITHOUT_WAIT,
            trace=lambda message, key: self._say(self.monitor_thread, message, key),
        )
        self.monitor.on_follow = self.monitor_thread.wake
        self.holder.add_listeners(ended=self._ended)

    def _ended(self, key: str) -> None:
        if not self.dead:
            self._say(self.holder_thread, "lifeline %s ended", key)

    def _say(self, thread: StepThread, message: str, *args: object) -> None:
        self._trace.add(self._sched.now, thread.name, message, *args)

    def _judge(self) -> None:
        # A confirmation republishes the validity of the process's terms (Election.refresh);
        # without a term there is nothing it can change.
        if self.holds():
            self._after_step()

    def _hold_step(self) -> float:
        sent = self._local_now()
        delay = self.holder.step()
        took = self._local_now() - sent
        if delay == CONFIRM_EVERY and took > GRACE and not self.dead:
            # Answered, but after the grace: the terms paused and resume with the next one.
            self._say(self.holder_thread, "lifeline confirmation answered late (%.3f s)", took)
        return delay

    def _monitor_step(self) -> float | None:
        # The real monitor's thread ends while nothing is followed; follow() starts it.
        return self.monitor.step() if self.monitor.following() else None

    @property
    def threads(self) -> tuple[StepThread, StepThread]:
        """The lifeline's thread and the monitor's."""
        return self.holder_thread, self.monitor_thread

    def start(self, at: float) -> None:
        """The lifeline's thread opens a lifeline at *at*; the monitor waits to follow a key."""
        self.holder_thread.start(at)

    def pause(self, duration: float) -> None:
        """SIGSTOP: both threads stop; the connections stay open (the key stays kept)."""
        for thread in self.threads:
            thread.pause(duration)

    def crash(self) -> None:
        """SIGKILL: the threads are gone; the server drops every key when the FIN arrives."""
        if self.dead:
            return
        self.dead = True
        for thread in self.threads:
            thread.stop(dead=True)
        server, process = self._server, self.process
        self._network.send(
            self.holder_thread,
            lambda: server.drop_process(process, "its process died"),
            "FIN of a dead process",
        )

    def stop(self) -> None:
        """The worker's exit after its terms ended (``lifeline.close_all``): closed, then gone."""
        self.holder.stop()
        for thread in self.threads:
            thread.stop()

    def close(self) -> None:
        """The run is over: end what its threads left suspended (see :meth:`StepThread.close`)."""
        for thread in self.threads:
            thread.stop(dead=True)
            thread.close()
