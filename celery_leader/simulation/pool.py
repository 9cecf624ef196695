"""One node's pool: leader runs in pool children, the run table, the watchdog, the kills.

A node's leader work, as a prefork worker does it, on virtual time:

* **the gate** (the worker's main process, so held back by its pauses)
  admits a run while the node's :class:`~celery_leader.elections.shared_lease.SharedLease`
  shows a valid term, under that term's token, and hands it to a free pool
  child;
* **a run** (in its child, held back by the child's own stops) checks its
  term before the body, writes its slot in the run table (named by the
  writer first, then the body: torn in between), checks again, runs its body
  and empties its slot, as :mod:`celery_leader.term_end.in_run` and
  ``LeaderTaskMixin.__call__`` do. Every run is ``terminate`` (prefork's
  default). The checker judges a run from its body's start (after the
  second check) to its end: nothing a run does before then can act;
* **a child killed mid-write** (the OOM killer, a hard time limit) leaves
  its slot torn; the next child of that pool index heals it at its first
  write, as the run table's writer does;
* **the watchdog** runs :func:`celery_leader.term_end.watchdog.past_deadline`
  (the real decision) over the table on the node's clock, every
  :data:`~celery_leader.term_end.watchdog.WATCH_INTERVAL` (on a grid of its
  own phase), and kills what it decides;
* **the parent's kill** on LOST and RELEASED is the worker's own code,
  :func:`~celery_leader.term_end.in_worker.kill_table_runs`, run on the
  model table and processes: it kills the ``terminate`` runs the table
  shows running the term or an older one; the **release guard** reads the
  table with the worker's :func:`~celery_leader.term_end.in_worker.recorded_runs_of`
  and says the term's work stopped once it shows none
  (``TermEnd.work_stopped``);
* **a kill** ends the child at once; billiard puts a new child (a new pid)
  in its pool index.

The table is a model of :class:`~celery_leader.elections.run_table.RunTable`
with the same reads: a slot torn by a writer that is gone reads empty, and a
slot torn by a writer that still runs reads as a run of
:data:`~celery_leader.elections.run_table.EVERY_TERM` of the writer's
election, without the ``terminate`` flag (the writer is before or after its
body, never in it): the release guard waits for it, nothing kills it. The
deliberately broken variant (:attr:`~.model_store.Broken.TORN_SLOT_HIDES_RUNS`)
is the table before the fix: a slot left torn by a dead writer reads torn
after every later write too (the writer kept the inverted parity), and the
kill layers and the guard skip what they cannot read. Its
slots are Python objects, not shared memory, and processes are pids of this
model, not of the host: real pids and ``/proc`` are per host, and here every
node lives in one process.

Equivalence to a watchdog that wakes every interval: a pass decides from the
table, the shared lease and the node's clock, so a pass changes nothing
unless one of them changed since the previous pass or the published
validity ran out meanwhile. Only those passes are run, at the same grid
instants: after every table write and every publish or revoke, and at the
first instant past the validity of a term the table shows a run of.

Modelled simplifications: the parent's half that kills the requests it saw
start (``kill_runs``) is left out, so the parent kills fewer here (the table
half covers those children, and the ones the parent has not heard from
yet); a torn slot is read torn at once, where the real read retries a
thousand times first.

The children of a main process that crashed stop with it, at once: Celery's
prefork children ask the kernel to SIGKILL them when their parent dies
(``PR_SET_PDEATHSIG``), and the watchdog exits with the main process. A
stopped worker's children end when it exits, after its term's end was
handled.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from celery_leader.elections.procinfo import Liveness
from celery_leader.elections.run_table import EVERY_TERM, Run
from celery_leader.elections.shared_lease import SharedLease
from celery_leader.simulation.scheduler import Owner, Scheduler
from celery_leader.simulation.trace import Trace
from celery_leader.term_end.in_worker import kill_table_runs, recorded_runs_of
from celery_leader.term_end.watchdog import WATCH_INTERVAL, past_deadline

#: Pool children per node.
POOL_SIZE = 2
#: From the gate to the child: uniform in [0, this] seconds.
DISPATCH_DELAY = 0.002


@dataclass(frozen=True)
class WorkProfile:
    """How much leader work a seed's leaders run, and how often a child stops mid-write."""

    #: Mean time between two runs the gate admits while its term is valid (s).
    arrival: float = 0.7
    #: Share of runs that are long (up to ``long_max``); the rest last up to ``short_max``.
    long_share: float = 0.4
    short_max: float = 0.5
    long_max: float = 6.0
    #: Share of slot writes during which the child stops (a SIGSTOP, a frozen
    #: cgroup, the scheduler), leaving its slot torn until it resumes.
    stall: float = 0.0
    stall_max: float = 0.0
    #: Share of runs whose child is killed while it empties its slot (the OOM
    #: killer, a hard time limit), leaving the slot torn by a dead writer.
    die_mid_write: float = 0.0


class Child:
    """One pool child: a process of its own, with its own pauses (the scheduler's owner)."""

    __slots__ = ("alive", "index", "paused_until", "pid", "run", "started")

    def __init__(self, index: int, pid: int, started: int) -> None:
        self.index = index
        self.pid = pid
        #: Its start time as ``/proc`` would give it (unique per process).
        self.started = started
        self.alive = True
        self.paused_until = 0.0
        self.run: SimRun | None = None


class SimRun:
    """One leader run in a child, from the gate's admission to its end."""

    __slots__ = ("child", "executing", "in_body", "node", "number", "started_at", "token")

    def __init__(self, number: int, node: str, token: int, child: Child) -> None:
        self.number = number
        self.node = node
        self.token = token
        self.child = child
        #: True from its check before the body (its slot write begins) to its end.
        self.executing = False
        #: True once it passed its check after registering (its body runs).
        self.in_body = False
        self.started_at = 0.0


class _Slot:
    __slots__ = ("election", "inverted", "run", "torn", "writer")

    def __init__(self) -> None:
        self.writer = 0
        self.election = 0
        self.torn = False
        #: Broken variant only: a dead writer left the parity inverted for good.
        self.inverted = False
        self.run: Run | None = None


#: Is the process (pid, start time; 0: unknown) running? Is pid gone?
Running = Callable[[int, int], bool]


class RunTableModel:
    """The run table's slots and reads (see the module docstring); one writer per slot.

    With *broken*, the table before the fix: a writer that finds the slot
    torn by a dead writer keeps the inverted parity (its own writes read
    torn), and a torn slot reads as nothing at all.
    """

    def __init__(self, size: int, *, broken: bool = False) -> None:
        self._slots = [_Slot() for _ in range(size)]
        self._broken = broken

    def begin_write(self, index: int, writer: int, election: int = 0) -> None:
        """The writer names itself and starts its write: the slot is torn until it ends."""
        slot = self._slots[index]
        if self._broken and slot.torn:
            slot.inverted = True  # the parity a dead writer left, kept by every later write
        slot.writer, slot.election, slot.torn = writer, election, True

    def end_write(self, index: int, run: Run | None) -> None:
        """The write ends: the slot holds *run* (None: empty), whole (broken: torn for good)."""
        slot = self._slots[index]
        slot.run, slot.torn = run, slot.inverted

    def slot(self, index: int, running: Running) -> Run | None:
        """As :meth:`RunTable.slot`: torn by a live writer, a run of every term of its election."""
        slot = self._slots[index]
        if not slot.torn:
            return slot.run
        if self._broken:
            return None  # before the fix: a sentinel every reader skipped
        if slot.writer <= 0 or not running(slot.writer, 0):
            return None  # killed mid-write: nothing runs under this slot
        return Run(index, slot.writer, EVERY_TERM, False, 0, slot.election)

    def busy(self, running: Running) -> list[Run]:
        """Every slot in use, stale ones included."""
        found = []
        for index in range(len(self._slots)):
            run = self.slot(index, running)
            if run is not None:
                found.append(run)
        return found

    def running(
        self, token: int, running: Running, *, exclude_pid: int, election: int | None
    ) -> list[Run]:
        """As :meth:`RunTable.running`: runs of the term or older (torn ones too) still running."""
        return [
            run
            for run in self.busy(running)
            if run.of_term(token, election)
            and run.pid != exclude_pid
            and running(run.pid, run.started)
        ]


class _TableView:
    """The model table read as the worker reads its run table (``RecordedRuns``)."""

    def __init__(self, table: RunTableModel, running: Running) -> None:
        self._table = table
        self._running = running

    def running(self, token: int, exclude_pid: int = 0, election: int | None = None) -> list[Run]:
        return self._table.running(token, self._running, exclude_pid=exclude_pid, election=election)


class _ModelProcesses:
    """A pool's children as the parent's kill reaches them (``Processes``)."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    def liveness(self, pid: int, started: int) -> Liveness:
        # The model's /proc always answers.
        return Liveness.RUNNING if self._pool._running(pid, started) else Liveness.GONE

    def kill(self, pid: int, reason: str) -> bool:
        child = self._pool._children.get(pid)
        if child is None or not child.alive:
            return False
        self._pool.kill(child, reason)
        return True


class Judge:
    """What the pool tells the checker (see :class:`~.checker.Checker`)."""

    def on_run_start(self, run: SimRun, at: float) -> None:
        """*run* passed its check after registering at *at*: its body starts."""

    def on_run_end(self, run: SimRun, at: float) -> None:
        """*run* ended at *at* (by itself, or its child died)."""


class Pool:
    """One node's children, run table, gate and watchdog."""

    def __init__(
        self,
        *,
        node: Owner,
        name: str,
        shared: SharedLease,
        sched: Scheduler,
        trace: Trace,
        rng: random.Random,
        profile: WorkProfile,
        local_now: Callable[[], float],
        real_time_of: Callable[[float], float],
        rate: float,
        new_pid: Callable[[], int],
        judge: Judge,
        owner_pid: int,
        torn_slot_hides_runs: bool = False,
    ) -> None:
        self._node = node
        self.name = name
        self.shared = shared
        self._sched = sched
        self._trace = trace
        self._rng = rng
        self._profile = profile
        self._local_now = local_now
        self._real_time_of = real_time_of
        self._new_pid = new_pid
        self._judge = judge
        self.owner_pid = owner_pid
        #: The table before the fix (:attr:`~.model_store.Broken.TORN_SLOT_HIDES_RUNS`).
        self.table = RunTableModel(POOL_SIZE, broken=torn_slot_hides_runs)
        self._children: dict[int, Child] = {}
        self._by_index: list[Child] = [self._spawn(index) for index in range(POOL_SIZE)]
        self._runs = 0
        self._gate_open = False
        self.open = True  # False once the worker process is gone
        self._step = WATCH_INTERVAL / rate
        self._phase = rng.random() * self._step
        self._passes: set[float] = set()
        self._done: set[tuple[int, int]] = set()

    # -- processes ------------------------------------------------------------------

    def _spawn(self, index: int) -> Child:
        pid = self._new_pid()
        child = Child(index, pid, started=pid)
        self._children[pid] = child
        return child

    def _running(self, pid: int, started: int) -> bool:
        """``Run.running`` / ``procinfo``: the process runs (and is the same one)."""
        child = self._children.get(pid)
        return child is not None and child.alive and (not started or child.started == started)

    def kill(self, child: Child, by: str) -> None:
        """SIGKILL *child*: its run ends now; billiard starts a new child in its index."""
        if not child.alive:
            return
        child.alive = False
        del self._children[child.pid]
        run, child.run = child.run, None
        if run is not None and run.executing:
            self._trace.add(
                self._sched.now,
                self.name,
                "%s kills pid %d (run of token %d)",
                by,
                child.pid,
                run.token,
            )
            self._end(run)
        if self.open:
            self._by_index[child.index] = self._spawn(child.index)

    def busy(self) -> bool:
        """True while a child has a run (from its dispatch to its end)."""
        return any(child.run is not None for child in self._by_index)

    def exit(self, why: str) -> None:
        """The worker process is gone (crash, or its exit after a stop): its children end."""
        if not self.open:
            return
        self.open = False
        self._gate_open = False
        for child in self._by_index:
            self.kill(child, why)

    # -- the gate (the main process) --------------------------------------------------

    def on_elected(self) -> None:
        """A term was published: the gate admits runs while it is valid."""
        if not self._gate_open and self.open:
            self._gate_open = True
            self._next_arrival()

    def _next_arrival(self) -> None:
        delay = self._rng.expovariate(1.0 / self._profile.arrival)
        self._sched.at(self._sched.now + delay, self._arrive, self._node)

    def _arrive(self) -> None:
        token, _ = self.shared.read()
        if not self.open or not self.shared.valid_for(token, now=self._local_now()):
            self._gate_open = False  # reopened by the next election
            return
        free = [child for child in self._by_index if child.run is None]
        if free:
            child = self._rng.choice(free)
            self._runs += 1
            run = child.run = SimRun(self._runs, self.name, token, child)
            at = self._sched.now + self._rng.random() * DISPATCH_DELAY
            self._sched.at(at, partial(self._begin, run), child)
        self._next_arrival()

    # -- a run (in its child) ---------------------------------------------------------

    def _current(self, run: SimRun) -> bool:
        child = run.child
        return child.alive and child.run is run

    def _begin(self, run: SimRun) -> None:
        if not self._current(run):
            return
        child = run.child
        if not self.shared.valid_for(run.token, now=self._local_now()):
            child.run = None  # the check before the body: handed back, never ran
            return
        self.table.begin_write(child.index, child.pid, self.shared.election)
        profile = self._profile
        if profile.stall and self._rng.random() < profile.stall:
            stop = self._rng.uniform(0.05, profile.stall_max)
            child.paused_until = self._sched.now + stop
            self._trace.add(
                self._sched.now,
                self.name,
                "pid %d stops mid-write of its slot for %.3f s",
                child.pid,
                stop,
            )
            self._poke()
            self._sched.at(self._sched.now, partial(self._registered, run), child)
        else:
            self._registered(run)

    def _registered(self, run: SimRun) -> None:
        if not self._current(run):
            return
        child = run.child
        whole = Run(child.index, child.pid, run.token, True, child.started, self.shared.election)
        self.table.end_write(child.index, whole)
        self._poke()
        if not self.shared.valid_for(run.token, now=self._local_now()):
            self._leave(run)  # revoked while it registered: stopped before its body
            return
        run.in_body = run.executing = True
        run.started_at = self._sched.now
        self._judge.on_run_start(run, self._sched.now)
        profile, rng = self._profile, self._rng
        longest = profile.long_max if rng.random() < profile.long_share else profile.short_max
        self._sched.at(
            self._sched.now + rng.uniform(0.0, longest), partial(self._finish, run), child
        )

    def _finish(self, run: SimRun) -> None:
        if self._current(run):
            self._leave(run)

    def _leave(self, run: SimRun) -> None:
        child = run.child
        self.table.begin_write(child.index, child.pid, self.shared.election)
        if run.executing and self._rng.random() < self._profile.die_mid_write:
            self._end(run)  # its body ended; the kill lands while it empties its slot
            self.kill(child, "the OOM killer, mid-write")
            return
        self.table.end_write(child.index, None)
        child.run = None
        if run.executing:
            self._end(run)

    def _end(self, run: SimRun) -> None:
        run.executing = False
        self._judge.on_run_end(run, self._sched.now)

    # -- the kill layers ----------------------------------------------------------------

    def parent_kill(self, token: int, why: str) -> None:
        """On LOST and RELEASED: the worker's kill of the ``terminate`` runs of *token* or older.

        The real :func:`~celery_leader.term_end.in_worker.kill_table_runs`, on
        this pool's table and processes.
        """
        kill_table_runs(
            _TableView(self.table, self._running),
            self.shared.election,
            token,
            f"parent ({why})",
            owner_pid=self.owner_pid,
            processes=_ModelProcesses(self),
            terminate_only=True,
        )

    def work_stopped(self, token: int) -> bool:
        """The release guard's reading of the table (``TermEnd.work_stopped``'s table half)."""
        return not recorded_runs_of(
            _TableView(self.table, self._running),
            token,
            owner_pid=self.owner_pid,
            election=self.shared.election,
        )

    def _grid_after(self, time: float) -> float:
        """The watchdog's first wake-up strictly after *time*."""
        k = math.floor((time - self._phase) / self._step) + 1
        at = self._phase + k * self._step
        while at <= time:  # rounding: strictly after, or a pass could repeat at one instant
            k += 1
            at = self._phase + k * self._step
        return at

    def _schedule_pass(self, at: float) -> None:
        if at in self._passes:
            return
        self._passes.add(at)
        self._sched.at(at, partial(self._pass, at))

    def _poke(self) -> None:
        """Something the watchdog reads changed: its next wake-up will look."""
        if not self.open or not any(child.run is not None for child in self._by_index):
            return  # a pass over a table without runs kills nothing
        now = self._sched.now
        target = self._grid_after(now)
        if any(now <= due <= target for due in self._passes):
            return
        self._schedule_pass(target)

    def on_shared_change(self) -> None:
        """The shared lease was published or revoked."""
        self._poke()

    def _pass(self, at: float) -> None:
        """One watchdog pass (``enforce_deadlines``), with the real decision."""
        self._passes.discard(at)
        if not self.open:
            return
        now = self._local_now()
        group = self.shared.group
        for run in self.table.busy(self._running):
            if (run.pid, run.started) in self._done or not past_deadline(group, run, now=now):
                continue
            child = self._children.get(run.pid)
            if child is not None and self._running(run.pid, run.started):
                self.kill(child, "watchdog")
            self._done.add((run.pid, run.started))
        self._plan_deadline()

    def _plan_deadline(self) -> None:
        """Wake up at the first grid instant past the validity of a term the table shows."""
        token, valid_until = self.shared.read()
        if not token:
            return
        if not any(
            run.terminate and run.token == token and self._running(run.pid, run.started)
            for run in self.table.busy(self._running)
        ):
            return  # nothing the validity's end would kill
        now = self._sched.now
        deadline = self._real_time_of(valid_until)
        self._schedule_pass(self._grid_after(max(deadline, now)))
