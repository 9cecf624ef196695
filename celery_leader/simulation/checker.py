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
3. **Work stops before the next term acts.** The work of a term (the
   instants when its node's SharedLease says the term is valid, judged on
   that node's clock, as pool children judge it) never overlaps another
   term's work or another term's leadership.

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


class Checker:
    """Records the first violation of the run, with the time it was found."""

    def __init__(self, sched: Scheduler, trace: Trace, nodes: Sequence[Judged]) -> None:
        self._sched = sched
        self._trace = trace
        #: Every node of the run, stopped and crashed ones too (their work may still run).
        self._nodes = nodes
        self.violation: str | None = None
        self._max_granted = 0
        self._max_elected = 0

    def fail(self, message: str) -> None:
        """Record *message* as the run's violation and end the run."""
        if self.violation is None:
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
