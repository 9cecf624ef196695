"""Is this process working? The verdict behind ``GET /healthz``.

A liveness probe restarts what it fails, so the verdict fails only where a
restart helps. A worker in several elections (named elections) is judged on
all of them:

* **healthy** (200): the process works, as leader or follower. Also while
  the lease store is unreachable, in one election or in all: restarting
  workers does not bring a store back, and a restart storm is the failure
  to avoid (the elections share one store, so one outage would fail every
  worker at once; meanwhile the worker keeps serving ordinary tasks and
  competing). Also while a solo worker runs a long task on its loop thread
  (by design), while it starts (the consumer is not connected yet), while
  Celery reconnects to the broker (a restart does not bring a broker back
  either) and while it stops (a warm shutdown drains its tasks).
* **unhealthy** (503): the lease thread of any election died (``dead``
  names them), a prefork worker's run watchdog died and could not be
  replaced (it is replaced before the next renewal; until then the lease is
  not renewed), or the consumer's loop (beat's loop, for beat) has not
  turned for ``leader_health_stuck_after`` seconds (default 60) with no
  task holding it. Beat's loop waiting on the broker (connecting, or a
  publish in flight) counts as reconnecting, not stuck.

Besides its verdict, every answer reports the default election as earlier
releases did (``election``, ``role``, ``store_failures``) and each election
of the process under ``elections``, by lease name: its ``state``, its
``role`` and its ``store_failures`` (:func:`election_state`).

The verdict reads the process's own state only; it makes no store or
broker call, so a probe never waits on either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Verdict:
    """One answer of the health probe."""

    healthy: bool
    status: str
    """``ok``, ``starting``, ``reconnecting``, ``stopping``, ``loop-stuck``,
    ``lease-thread-dead`` or ``watchdog-dead``."""
    detail: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The JSON body of the answer."""
        return {"healthy": self.healthy, "status": self.status, **self.detail}


#: An election's state in the answer, from the first that holds (see :func:`election_state`).
NOT_RUNNING, STORE_UNREACHABLE, HOLDING_OFF, LEADING, FOLLOWING = (
    "not-running",
    "store-unreachable",
    "holding-off",
    "leading",
    "following",
)


def election_state(manager: Any) -> dict[str, Any]:
    """One election as ``/healthz`` reports it: ``state``, ``role``, ``store_failures``.

    ``state`` is the first that holds: ``not-running`` (its lease thread is
    not running: not started yet, stopped, or dead), ``store-unreachable``
    (its last store call failed; a leader keeps leading until its lease
    runs out), ``holding-off`` (it holds the lease but waits one ttl before
    leading, after the store lost its data or on a new store), ``leading``,
    ``following``.
    """
    leading = manager.is_leader()
    if not manager.running:
        state = NOT_RUNNING
    elif manager.store_failures:
        state = STORE_UNREACHABLE
    elif manager.hold_off_left() is not None:
        state = HOLDING_OFF
    else:
        state = LEADING if leading else FOLLOWING
    return {
        "state": state,
        "role": "leader" if leading else "follower",
        "store_failures": manager.store_failures,
    }


def _detail(manager: Any, loop_age: float, managers: list[Any]) -> dict[str, Any]:
    """What every answer reports besides its verdict.

    *manager* (the default election) as earlier releases did, and each of
    *managers* by its lease name.
    """
    return {
        "election": manager.name,
        "role": "leader" if manager.is_leader() else "follower",
        "loop_age": round(loop_age, 3),
        "store_failures": manager.store_failures,
        "elections": {m.name: election_state(m) for m in managers},
    }


def worker_verdict(coordinator: Any, stuck_after: float) -> Verdict:  # noqa: PLR0911 - one check a line
    """The verdict for a worker, from its coordinator (:mod:`celery_leader.worker.coordinator`)."""
    manager = coordinator.manager
    loop_age = coordinator.loop_age()
    managers = [e.manager for e in getattr(coordinator, "elections", {}).values()] or [manager]
    detail = _detail(manager, loop_age, managers)
    if coordinator.shutting_down:
        return Verdict(True, "stopping", detail)
    if not coordinator.started:
        return Verdict(True, "starting", detail)
    watchdog = coordinator.watchdog
    if watchdog is not None and not watchdog.alive():
        return Verdict(False, "watchdog-dead", detail)
    dead = [m.name for m in managers if not m.running]
    if dead:
        return Verdict(False, "lease-thread-dead", {**detail, "dead": dead})
    if not coordinator.connected:
        return Verdict(True, "reconnecting", detail)
    if loop_age > stuck_after and not coordinator.loop_busy_with_task():
        return Verdict(False, "loop-stuck", detail)
    return Verdict(True, "ok", detail)


def beat_verdict(election: Any, stuck_after: float) -> Verdict:
    """The verdict for a beat, from its election (:class:`celery_leader.beat.BeatElection`)."""
    manager = election.manager
    loop_age = election.loop_age()
    detail = _detail(manager, loop_age, [manager])
    if not election.started:
        return Verdict(True, "starting", detail)
    if not manager.running:
        return Verdict(False, "lease-thread-dead", {**detail, "dead": [manager.name]})
    if election.waiting_on_broker():  # Celery retries the broker inside beat's loop
        return Verdict(True, "reconnecting", detail)
    if loop_age > stuck_after:
        return Verdict(False, "loop-stuck", detail)
    return Verdict(True, "ok", detail)
