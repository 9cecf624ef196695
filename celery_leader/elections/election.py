"""One election a process takes part in: a lease manager, its shared slot, its listener.

:class:`Election` is the unit the worker, beat and the simulation share. It
builds the election's :class:`~celery_leader.lease.LeaseManager` and
publishes every change of term into the election's
:class:`~celery_leader.elections.shared_lease.SharedLease` slot, so the
places where work runs (pool children, the watchdog, the gate) see it:

* **ELECTED**: ``may_publish`` is asked first (the worker replaces a dead
  watchdog there, and says no while none runs), then the term is published,
  then ``on_elected``;
* **RENEWED**: ``may_publish`` is asked again, then the term's validity is
  extended (a revoked term stays revoked). A term not published, or not
  extended, ends in shared memory at the validity last published;
* **LOST / RELEASED**: the term is revoked in the slot at once and for good,
  then ``on_ended`` runs (the worker ends the term's work there);
* **each confirmation of the process's lifeline** (when the election has
  one, :mod:`celery_leader.lease.lifeline`): ``may_publish`` is asked, then
  the term's validity is extended to what the lifeline allows. The validity
  published is never later than the lifeline allows, nor than the lease.

Guarantee: the slot never shows a term as valid longer than the lease
manager published it, and never again once it was revoked (see
:mod:`~celery_leader.elections.shared_lease`). Callbacks run on the lease
manager's thread; an exception in one is logged and never reaches the
manager.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery_leader.elections.shared_lease import SharedLease
from celery_leader.lease import EventKind, LeaseEvent, LeaseManager, Role, Term
from celery_leader.lease.timing import LeaseTiming
from celery_leader.stores.base import Holder, LeaseStore

logger = logging.getLogger(__name__)

EventCallback = Callable[[LeaseEvent], None]


class Election:
    """One election of this process; see the module docstring."""

    def __init__(
        self,
        store: LeaseStore,
        shared: SharedLease,
        timing: LeaseTiming,
        *,
        holder: Holder,
        liveness: Callable[[], bool] | None = None,
        release_guard: Callable[[Term], bool] | None = None,
        may_publish: Callable[[], bool] | None = None,
        on_elected: EventCallback | None = None,
        on_ended: EventCallback | None = None,
        **manager_options: Any,
    ) -> None:
        self.name = shared.name
        self.shared = shared
        self._may_publish = may_publish
        self._on_elected = on_elected
        self._on_ended = on_ended
        self.manager = LeaseManager(
            store,
            shared.name,
            timing,
            holder=holder,
            listeners=(self._on_event,),
            liveness=liveness,
            release_guard=release_guard,
            **manager_options,
        )
        lifeline = manager_options.get("lifeline")
        if lifeline is not None:
            lifeline.add_listeners(confirmed=self.refresh)

    def refresh(self) -> None:
        """Publish the current term's validity again (after a lifeline confirmation)."""
        state = self.manager.state()
        token, valid_until = state.token, state.valid_until
        if state.role is Role.LEADER and token and valid_until is not None and self._allowed():
            self.shared.publish(token, valid_until)  # refused once revoked

    def _valid_until(self, event: LeaseEvent) -> float:
        """The validity to publish for *event*'s term: the lease's, bounded by the lifeline."""
        state = self.manager.state()
        if state.token == event.term.token and state.valid_until is not None:
            return min(event.term.valid_until, state.valid_until)
        return event.term.valid_until

    def _on_event(self, event: LeaseEvent) -> None:
        token = event.term.token
        if event.kind is EventKind.ELECTED:
            if self._allowed():
                self.shared.publish(token, self._valid_until(event))
            self._call(self._on_elected, event)
        elif event.kind is EventKind.RENEWED:
            if self._allowed():
                self.shared.publish(token, self._valid_until(event))  # refused once revoked
        else:
            self.shared.revoke(token)
            self._call(self._on_ended, event)

    def _allowed(self) -> bool:
        if self._may_publish is None:
            return True
        try:
            return bool(self._may_publish())
        except Exception:
            logger.exception("celery-leader: may_publish of election %r raised", self.name)
            return False

    def _call(self, callback: Callable[..., None] | None, *args: Any) -> None:
        if callback is None:
            return
        try:
            callback(*args)
        except Exception:
            logger.exception("celery-leader: error in a callback of election %r", self.name)
