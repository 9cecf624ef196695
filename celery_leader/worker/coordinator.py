"""The worker side of one election: lease events in, Celery actions out.

One :class:`Coordinator` per worker process. It owns the lease manager and
turns its events into Celery actions:

* ELECTED: publish the term to pool children, start consuming the leader
  queue (on the consumer's loop thread).
* RENEWED: extend the term in shared memory.
* LOST / RELEASED: revoke at once (shared memory, so cooperative runs see it
  and buffered jobs never start), kill ``terminate``-policy runs in prefork
  children straight from the lease thread (the deadline is the store's
  expiry, not the loop's next turn), then on the loop thread stop consuming
  the leader queue and hand reserved and ETA leader messages back.

Threads: lease events arrive on the manager thread; queue changes and
request bookkeeping run on the consumer's loop thread via ``call_soon`` (one
callable per ordered sequence, since Celery does not order a batch).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from celery.worker import state as worker_state

from celery_leader import signals
from celery_leader.lease import EventKind, LeaseEvent, LeaseManager, Role
from celery_leader.runtime import install_shared_lease
from celery_leader.settings import LeaderSettings
from celery_leader.worker.dispatch import SerialDispatcher
from celery_leader.worker.redis_wakeup import wake_redis_consumer
from celery_leader.worker.shared_state import SharedLease

logger = logging.getLogger(__name__)

#: Pools whose runs can be killed from the parent.
KILLABLE_POOLS = frozenset({"prefork", "processes"})

_current: Coordinator | None = None


def current_coordinator() -> Coordinator | None:
    """The coordinator of this worker process, if the LeaderElection step runs here."""
    return _current


def _snapshot(requests: Any) -> list[Any]:
    """A list copy of one of Celery's request WeakSets, safe against concurrent change."""
    for _ in range(10):
        try:
            return list(requests)
        except RuntimeError:  # the loop thread changed the set while we copied it
            continue
    return []


def is_leader_request(request: Any) -> bool:
    """True for requests of leader-only tasks."""
    return bool(getattr(request.task, "leader_only", False))


class Coordinator:
    """Connects a :class:`LeaseManager` to one Celery worker."""

    def __init__(
        self,
        settings: LeaderSettings,
        manager: LeaseManager | None,
        *,
        nodename: str,
        pool_kind: str,
    ) -> None:
        self.settings = settings
        self.manager: LeaseManager = manager  # type: ignore[assignment]
        self.nodename = nodename
        self.pool_kind = pool_kind
        self.shared = SharedLease()
        self.consumer: Any = None
        self.stepping_down = False
        self.shutting_down = False
        self._last_tick = time.monotonic()
        self._liveness_window = max(2 * settings.timing.renew_interval, 1.0)
        self._started = False
        self._signals = SerialDispatcher("celery-leader-signals")
        self._lock = threading.Lock()

    # -- wiring ---------------------------------------------------------------

    def install(self) -> None:
        """Make this the process's coordinator and publish the shared lease (before forking)."""
        global _current  # noqa: PLW0603 - one coordinator per worker process
        _current = self
        install_shared_lease(self.shared)

    def attach(self, consumer: Any) -> None:
        """The consumer (re)started: start competing, and match consumption to the lease."""
        self.consumer = consumer
        self.tick()
        if not self._started:
            self._started = True
            self.manager.start()
        self.sync_consumption()

    def detach(self) -> None:
        """The consumer is stopping (shutdown or broker reconnect)."""
        self.consumer = None

    def post(self, fn: Callable[[], None]) -> None:
        """Run *fn* on the consumer's loop thread; errors are logged, never raised there."""
        consumer = self.consumer
        if consumer is None:
            return

        def guarded() -> None:
            try:
                fn()
            except Exception:
                logger.exception("celery-leader: error in a worker callback")

        consumer.call_soon(guarded)

    # -- liveness -------------------------------------------------------------

    def tick(self) -> None:
        """Called from the consumer's loop: the loop is alive."""
        self._last_tick = time.monotonic()

    def is_live(self) -> bool:
        """True while the worker can act on leadership: its loop runs (or a solo task does)."""
        if self.shutting_down:
            return True
        if time.monotonic() - self._last_tick < self._liveness_window:
            return True
        # A solo pool runs tasks on the loop thread: a busy loop is not a stuck one.
        return self.pool_kind == "solo" and bool(_snapshot(worker_state.active_requests))

    # -- the gate (loop thread) -----------------------------------------------

    def admit(self) -> int | None:
        """The token to run a leader task under now, or None to hand it back."""
        token = self.manager.current_token()
        if not self._taking_work() or token is None or not self.shared.valid_for(token):
            return None
        return token

    def on_gate_refused(self) -> None:
        """A leader message reached us without a lease: make sure we stop consuming."""
        self.post(self.sync_consumption)

    # -- leader queue (loop thread) -------------------------------------------

    def _taking_work(self) -> bool:
        """False while stepping down or shutting down: no new leader work then."""
        return not (self.stepping_down or self.shutting_down)

    def should_consume(self) -> bool:
        """True when this worker should consume the leader queue now."""
        return self._taking_work() and self.manager.is_leader()

    def sync_consumption(self) -> None:
        """Consume the leader queue exactly when leading. Loop thread only."""
        consumer = self.consumer
        if consumer is None or getattr(consumer, "task_consumer", None) is None:
            return
        queue = self.settings.queue
        consuming = consumer.task_consumer.consuming_from(queue)
        wanted = self.should_consume()
        if wanted and not consuming:
            consumer.add_task_queue(queue)
            wake_redis_consumer(consumer)
        elif not wanted:
            if consuming:
                consumer.cancel_task_queue(queue)
            else:
                consumer.app.amqp.queues.deselect(queue)

    # -- lease events (manager thread) ----------------------------------------

    def on_lease_event(self, event: LeaseEvent) -> None:
        """Handle one event from the lease manager. Runs on the manager thread."""
        token = event.term.token
        if event.kind is EventKind.ELECTED:
            self.shared.publish(token, event.term.valid_until)
            self.post(self.sync_consumption)
            self._send(signals.leader_elected, token=token)
        elif event.kind is EventKind.RENEWED:
            self.shared.publish(token, event.term.valid_until)
        else:
            self.revoke(token)
            if event.kind is EventKind.LOST:
                reason = event.reason.value if event.reason else "unknown"
                self._send(signals.leader_lost, token=token, reason=reason)
            else:
                self._send(signals.leader_released, token=token)

    def _send(self, signal_: Any, **kwargs: Any) -> None:
        self._signals.submit(
            lambda: signal_.send(sender=self.nodename, name=self.settings.name, **kwargs)
        )

    # -- revocation -----------------------------------------------------------

    def revoke(self, token: int, *, on_loop: bool = False) -> None:
        """Stop all leader work of term *token*: now where it is urgent, the rest on the loop.

        Pass *on_loop* when already on the consumer's loop thread (the waiting
        messages are then handed back at once instead of being posted).
        """
        self.shared.revoke()
        self.kill_terminate_runs(token)
        if on_loop:
            self.hand_back_waiting(token)
        else:
            self.post(lambda: self.hand_back_waiting(token))

    def policy_for(self, request: Any) -> str:
        """The on_loss policy that applies to *request* in this pool."""
        policy = getattr(request.task, "leader_on_loss", None)
        if policy is None:
            policy = "terminate" if self.pool_kind in KILLABLE_POOLS else "cancel"
        if policy == "terminate" and self.pool_kind not in KILLABLE_POOLS:
            policy = "cancel"  # threads and solo cannot kill a run: it must cooperate
        return policy

    def kill_terminate_runs(self, token: int) -> None:
        """SIGKILL the pool children running ``terminate``-policy runs of *token*.

        Runs on the lease thread so that the kill does not wait for the loop.
        The request is marked first, so whichever thread sees the child's
        death hands the message back instead of recording a failure.
        """
        for request in _snapshot(worker_state.active_requests):
            if not is_leader_request(request) or self.policy_for(request) != "terminate":
                continue
            if getattr(request, "leader_token", None) not in (token, None):
                continue
            pid = request.worker_pid
            request.leader_revoked = True
            if pid and pid != os.getpid():
                logger.warning(
                    "celery-leader: lease lost; killing %s (pid %s)", request.humaninfo(), pid
                )
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def hand_back_waiting(self, token: int) -> None:
        """Stop consuming, and hand back reserved and ETA leader messages. Loop thread."""
        self.sync_consumption()
        consumer = self.consumer
        active = set(map(id, _snapshot(worker_state.active_requests)))
        for request in _snapshot(worker_state.scheduled_requests):
            if is_leader_request(request) and id(request) not in active:
                entry = getattr(request, "_eta_timer_entry", None)
                if entry is not None and consumer is not None and consumer.timer is not None:
                    consumer.timer.cancel(entry)
                    consumer.qos.decrement_eventually()
                request.hand_back("lease lost before its ETA")
        for request in _snapshot(worker_state.reserved_requests):
            if is_leader_request(request) and id(request) not in active:
                request.hand_back("lease lost while it waited for the pool")
        logger.debug("celery-leader: term %d revoked on the loop", token)

    # -- step-down (loop thread, from a control command) ---------------------

    def step_down(self, timeout: float | None = None) -> dict[str, Any]:
        """Stop leader work, then release in the background and sit out one ttl."""
        token = self.manager.current_token()
        if token is None:
            return {"ok": False, "reason": "not leader", "node": self.nodename}
        with self._lock:
            if self.stepping_down:
                return {"ok": True, "token": token, "node": self.nodename}
            self.stepping_down = True
        self.revoke(token, on_loop=True)
        wait = self.settings.timing.ttl * 2 if timeout is None else timeout
        threading.Thread(
            target=self._finish_step_down,
            args=(wait,),
            name="celery-leader-step-down",
            daemon=True,
        ).start()
        return {"ok": True, "token": token, "node": self.nodename}

    def _finish_step_down(self, wait: float) -> None:
        try:
            self.wait_for_leader_runs(wait)
            self.manager.step_down(sit_out=self.settings.timing.ttl)
        except Exception:
            logger.exception("celery-leader: step-down failed")
        finally:
            self.stepping_down = False

    def wait_for_leader_runs(self, timeout: float) -> bool:
        """Block until no leader task runs here (at most *timeout* s); True when none does."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not any(map(is_leader_request, _snapshot(worker_state.active_requests))):
                return True
            time.sleep(0.02)
        return False

    # -- shutdown (main thread) ----------------------------------------------

    def begin_shutdown(self) -> None:
        """Warm shutdown: stop taking leader work, stop runs per policy, release when they end.

        The lease is released as soon as no leader task runs here any more
        (a standby then takes over at once), without waiting for the rest of
        the pool to drain; :meth:`finish_shutdown` releases at the latest.
        """
        self.shutting_down = True
        token = self.manager.current_token()
        if token is None:
            return
        self.revoke(token)  # the consumer is stopping: only the urgent part still runs
        threading.Thread(
            target=self._release_when_idle, name="celery-leader-shutdown", daemon=True
        ).start()

    def _release_when_idle(self) -> None:
        try:
            if self.wait_for_leader_runs(self.settings.timing.ttl * 60):
                self.manager.stop(release=True)
        except Exception:
            logger.exception("celery-leader: early release failed; releasing at shutdown")

    def finish_shutdown(self) -> None:
        """After the pool drained: stop leading, release, stop the threads."""
        self.shutting_down = True
        try:
            self.manager.stop(release=True)
        finally:
            self._signals.close()
            self.manager.store.close()

    # -- inspection -----------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """The worker's view, as ``celery inspect leader`` shows it."""
        state = self.manager.state()
        left = self.manager.time_left()
        leading = state.role is Role.LEADER and left is not None
        return {
            "role": "leader" if leading else "follower",
            "name": self.settings.name,
            "token": state.token if leading else None,
            "expires_in": round(left, 3) if left is not None else None,
        }
