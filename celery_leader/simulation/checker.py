"""The invariants, judged over the run as it happens.

Under the stated assumptions (the store honours its ttl on its clock, clock
drift stays within the margin, the epoch changes whenever other data comes
to lie under the lease: any restart, and older data loaded without one):

1. **One leader.** Never two nodes whose ``is_leader()`` is true at the same
   real instant, each judged on its own clock.
2. **Tokens.** Every grant's token is greater than every token granted
   before it (so none is granted twice). Terms are elected in token order,
   as fencing needs ("every term has a token strictly greater than all
   earlier ones"), and a term is elected only while it is valid
   (``add_listener``: ``is_leader()`` is already true when ELECTED is
   delivered).
3. **The work view ends before the next term acts.** The work of a term
   as published (the instants when its node's SharedLease says the term is
   valid, judged on that node's clock, as pool children judge it) never
   overlaps another term's published work or another term's leadership.
4. **Work stops before the next term starts.** No run of term ``T`` is
   still executing when a term ``T' > T`` is elected, and none starts after
   that. Judged on the runs themselves (see :mod:`.pool`), not on what was
   published: a run executes from its check before the body (when its
   child starts writing its slot in the run table) until it ends by itself
   or its child dies (the parent's kill, the watchdog's, the worker's exit).
   So a kill layer that misses a run, or kills it late, is a violation even
   while every published view is right.

(4) is judged at the events that change it: a run's start, and an election.

When (1) and (3) are judged: a leadership or a term's work starts only
inside a node's code (a step, a stop: that is where the manager's state and
the SharedLease are written); store and network events cannot start either.
So an overlap always begins at the end of some node's event, and judging
after every node event finds every overlap. ``every_event`` judges after
every event as well, which finds the same violations, more slowly.

The first violation ends the run (:class:`~.scheduler.Halt`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from celery_leader.elections.shared_lease import SharedLease
from celery_leader.lease import LeaseManager
from celery_leader.simulation.pool import Judge, SimRun
from celery_leader.simulation.scheduler import Halt, Scheduler
from celery_leader.simulation.trace import Trace


class Judged(Protocol):
    """A node as the checker sees it."""

    name: str
    crashed: bool
    manager: LeaseManager
    shared: SharedLease

    def local_now(self) -> float:
        """The node's clock."""


class Checker(Judge):
    """Records the first violation of the run, with the time it was found."""

    def __init__(
        self, sched: Scheduler, trace: Trace, nodes: Sequence[Judged], *, label: str = ""
    ) -> None:
        #: The election judged, named in every violation when there are several.
        self.label = label
        self._sched = sched
        self._trace = trace
        #: Every node of the run, stopped and crashed ones too (their work may still run).
        self._nodes = nodes
        self.violation: str | None = None
        self._max_granted = 0
        self._max_elected = 0
        #: The runs executing now, by (node, run number).
        self._executing: dict[tuple[str, int], SimRun] = {}
        #: The newest term elected so far: token, node, real time.
        self._newest: tuple[int, str, float] = (0, "", 0.0)

    def fail(self, message: str) -> None:
        """Record *message* as the run's violation and end the run."""
        if self.violation is None:
            if self.label:
                message = f"election {self.label}: {message}"
            self.violation = message
            self._trace.add(self._sched.now, "CHECKER", "VIOLATION: %s", message)
        self._sched.halted = True
        raise Halt

    # -- (2) tokens ---------------------------------------------------------------

    def on_grant(self, token: int, who: str, at: float) -> None:
        """The store granted *token* to *who*."""
        if token <= self._max_granted:
            self.fail(
                f"token {token} granted to {who} at {at:.6f}, after token "
                f"{self._max_granted} was granted"
            )
        self._max_granted = token

    def on_elected(self, name: str, token: int, valid_until: float, now: float) -> None:
        """Node *name* was elected with *token*, valid until *valid_until* (at *now*, its clock)."""
        if now >= valid_until:
            self.fail(
                f"{name} elected (token {token}) with its validity over: valid until "
                f"{valid_until:.6f}, now {now:.6f} on its clock"
            )
        if token <= self._max_elected:
            self.fail(
                f"{name} elected with token {token} after a term with token "
                f"{self._max_elected} was elected"
            )
        self._max_elected = token
        self._term_started(name, token)

    # -- (4) runs ----------------------------------------------------------------

    def _term_started(self, name: str, token: int) -> None:
        now = self._sched.now
        if token > self._newest[0]:
            self._newest = (token, name, now)
        for run in self._executing.values():
            if run.token < token:
                self.fail(
                    f"a run of term {run.token} (pid {run.child.pid} on {run.node}, since "
                    f"{run.started_at:.6f}, in its body) still executing when term {token} "
                    f"started on {name} at {now:.6f}"
                )

    def on_run_start(self, run: SimRun, at: float) -> None:
        """*run* passed its check after registering at *at*: its body starts."""
        token, name, since = self._newest
        if run.token < token:
            self.fail(
                f"a run of term {run.token} (pid {run.child.pid} on {run.node}) started at "
                f"{at:.6f}, after term {token} started on {name} at {since:.6f}"
            )
        self._executing[run.node, run.number] = run

    def on_run_end(self, run: SimRun, at: float) -> None:
        """*run* ended at *at* (by itself, or its child died)."""
        self._executing.pop((run.node, run.number), None)

    # -- (1) and (3) at one instant ---------------------------------------------

    def check_instant(self) -> None:
        """Judge leadership and work of every node now."""
        leaders: list[tuple[str, int]] = []
        work: list[tuple[str, int]] = []
        for node in self._nodes:
            # A crashed process answers nothing (its pool children may still
            # work: the SharedLease is judged below); a stopped one says "no".
            if not node.crashed and node.manager.is_leader():
                leaders.append((node.name, _token(node.manager.state().token)))
            token, _ = node.shared.read()
            if token and node.shared.valid_for(token, now=node.local_now()):
                work.append((node.name, token))
        if len(leaders) > 1:
            self.fail("two leaders at once: " + _listing(leaders))
        tokens = {token for _, token in leaders} | {token for _, token in work}
        if len(tokens) > 1:
            self.fail(
                "work of one term overlaps another term: leaders "
                + (_listing(leaders) or "none")
                + "; work valid for "
                + (_listing(work) or "none")
            )


def _token(token: int | None) -> int:
    assert token is not None, "a leader always has a token"
    return token


def _listing(entries: Iterable[tuple[str, int]]) -> str:
    return ", ".join(f"{name} (token {token})" for name, token in entries)
