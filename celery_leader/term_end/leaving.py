"""The ends of a term its holder chooses: a step-down, a hand-over, a warm shutdown.

A term ends in one of two ways. The lease ends it (a loss, or a release
the manager decided): :meth:`TermEnd.end
<celery_leader.term_end.in_worker.TermEnd.end>` runs on the lease thread.
Or the worker chooses to give it up, which is this module:

* **a step-down** on request (``celery leader step-down``, a leader message
  of a task this worker does not know): the term is revoked at once (its
  ``terminate`` runs killed, the waiting messages handed back), the other
  runs get ``leader_stop_grace`` seconds, then the lease is released and
  the worker sits out one ttl, so that a standby takes it;
* **a hand-over** (the balancer's move): never cuts a run short. It
  declines while a run of the term is in progress; otherwise the worker
  stops taking the election's work, lets a run admitted meanwhile end
  within ``leader_stop_grace``, then ends the term and steps down as above;
* **a warm shutdown**: the term is revoked, its runs stopped per policy,
  and the lease released as soon as none runs, before the rest of the pool
  drains; :meth:`Leaving.finish_shutdown` releases at the latest.

Guarantee, the same for all three: the lease is released only once no run
of the term is left here (the release guard of :class:`TermEnd`); where
the pool cannot stop a run, the lease is kept, with no new leader work,
until it ends. One step-down or hand-over at a time per election; a warm
shutdown may begin while one is under way (both only end the term).

Threads: :meth:`Leaving.step_down` runs on the consumer's loop thread (a
control command); :meth:`Leaving.hand_over` on any thread; the waits run on
a daemon thread of their own, never on the loop or the lease thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery_leader.lease import Role
from celery_leader.term_end.in_worker import SnapshotError, TermEnd

if TYPE_CHECKING:
    from celery_leader.lease import LeaseManager

logger = logging.getLogger(__name__)


def _in_background(work: Callable[[int], None], token: int, name: str) -> None:
    """Run ``work(token)`` on a daemon thread called *name*."""
    threading.Thread(target=work, args=(token,), name=name, daemon=True).start()


class Leaving:
    """One election's chosen term ends in a worker; see the module docstring.

    *election* is the lease name; *sit_out* the seconds a worker that
    stepped down waits before it competes again (the ttl); *stop_grace*
    what runs get to stop before a pool that can kill them kills them
    (``leader_stop_grace``); *poll* how often a pool that cannot kill asks
    again (the renew interval). *stop_taking_work* asks the consumer's
    loop to stop consuming the election's leader queue (it reads
    :attr:`under_way`).
    """

    def __init__(
        self,
        term_end: TermEnd,
        manager: LeaseManager,
        *,
        election: str,
        node: str,
        sit_out: float,
        stop_grace: float,
        poll: float,
        stop_taking_work: Callable[[], None],
    ) -> None:
        self.term_end = term_end
        self.manager = manager
        self.election = election
        self.node = node
        self.sit_out = sit_out
        self.stop_grace = stop_grace
        self.poll = poll
        self._stop_taking_work = stop_taking_work
        self._lock = threading.Lock()
        #: True from a step-down's or a hand-over's start until its release was done.
        #: A plain attribute: the gate reads it for every leader message.
        self.under_way = False

    def _claim(self) -> bool:
        """Mark a step-down as under way; False when one is under way already."""
        with self._lock:
            if self.under_way:
                return False
            self.under_way = True
            return True

    # -- step-down (loop thread) ---------------------------------------------

    def step_down(self) -> dict[str, Any]:
        """Stop leader work now, then release in the background and sit out one ttl."""
        name = self.election
        token = self.manager.current_token()
        if token is None:
            return {"ok": False, "reason": "not leader", "node": self.node, "election": name}
        if self._claim():
            logger.info(
                "celery-leader: %s steps down from election %r (token %d) on request: it "
                "releases once the term's runs stopped, to whichever standby takes it, and "
                "sits out %g s",
                self.node,
                name,
                token,
                self.sit_out,
            )
            self.term_end.end(token, on_loop=True)
            _in_background(self._release_and_sit_out, token, "celery-leader-step-down")
        return {"ok": True, "token": token, "node": self.node, "election": name}

    # -- hand-over (any thread) ----------------------------------------------

    def hand_over(self) -> bool:
        """Give the election to another worker gently; False if not leading or a run is going."""
        token = self.manager.current_token()
        if token is None:
            return False
        try:
            if self.term_end.leader_runs(token):
                return False  # never cut a run short to balance: asked again later
        except SnapshotError:
            return False
        if self._claim():
            self._stop_taking_work()
            _in_background(self._end_then_release, token, "celery-leader-hand-over")
        return True

    def _end_then_release(self, token: int) -> None:
        try:
            self.term_end.runs_ended(token, self.stop_grace)
            self.term_end.end(token)
        except Exception:
            logger.exception("celery-leader: hand-over of election %r failed", self.election)
        self._release_and_sit_out(token)

    def _release_and_sit_out(self, token: int) -> None:
        try:
            self.await_stopped(token)
            self.manager.step_down(sit_out=self.sit_out)
        except Exception:
            logger.exception("celery-leader: step-down of election %r failed", self.election)
        finally:
            self.under_way = False

    # -- warm shutdown -------------------------------------------------------

    def begin_shutdown(self) -> None:
        """Stop runs per policy and release once they stopped, in the background."""
        token = self.manager.current_token()
        if token is None:
            return
        self.term_end.end(token)  # the consumer is stopping: only the urgent part still runs
        _in_background(self._release_when_stopped, token, "celery-leader-shutdown")

    def _release_when_stopped(self, token: int) -> None:
        try:
            self.await_stopped(token)
            self.manager.stop(release=True)
        except Exception:
            logger.exception("celery-leader: early release failed; releasing at shutdown")

    def finish_shutdown(self) -> None:
        """After the pool drained: stop leading and release (the release guard still applies)."""
        self.manager.stop(release=True)

    # -- the wait both share -------------------------------------------------

    def await_stopped(self, token: int) -> None:
        """Stop the runs of *token*; where they cannot be killed, wait for them while leading."""
        self.term_end.await_stopped(
            token,
            self.stop_grace,
            holding=lambda: self.manager.state().role is not Role.FOLLOWER,
            poll=self.poll,
        )
