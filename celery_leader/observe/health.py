"""Is this process working? The verdict behind ``GET /healthz``, for a worker and a beat alike.

A liveness probe restarts what it fails, so the verdict fails only where a
restart helps. A process is judged on every election it takes part in
(a worker's default and named elections; beat's one):

* **healthy** (200): the process works, as leader or follower. Also while
  the lease store is unreachable, in one election or in all: restarting
  processes does not bring a store back, and a restart storm is the failure
  to avoid (the elections share one store, so one outage would fail every
  worker at once; meanwhile the worker keeps serving ordinary tasks and
  competing). Also while a solo worker runs a long task on its loop thread
  (by design), while it starts (the consumer is not connected yet, or beat
  has not begun to compete), while it waits on the broker (Celery
  reconnects the worker's consumer, beat connects or a publish is in
  flight: a restart does not bring a broker back either) and while it
  stops (a warm shutdown drains its tasks).
* **unhealthy** (503): the lease thread of any election died (``dead``
  names them), a prefork worker's run watchdog died and could not be
  replaced (it is replaced before the next renewal; until then the lease is
  not renewed), or the process's loop (the worker's consumer loop, beat's
  loop) has not turned for ``leader_health_stuck_after`` seconds (default
  60) with no task holding it.

Every answer has the same fields on a worker and on a beat: ``healthy``,
``status``, ``loop_age``, the default election as earlier releases reported
it (``election``, ``role``, ``store_failures``), ``elections`` (each
election of the process by lease name, :func:`election_state`), and
``dead`` when lease threads died.

The verdict reads the process's own state only (:class:`Observed`); it
makes no store or broker call, so a probe never waits on either.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from celery_leader.elections.liveness import LoopLiveness


class ElectionLease(Protocol):
    """What the verdict reads of one election: its :class:`~celery_leader.lease.LeaseManager`."""

    @property
    def name(self) -> str:
        """The election's lease name."""

    @property
    def running(self) -> bool:
        """True while its lease thread runs."""

    @property
    def store_failures(self) -> int:
        """Store calls failed in a row."""

    def is_leader(self) -> bool:
        """True while it leads with validity left."""

    def hold_off_left(self) -> float | None:
        """Seconds of hold-off left while holding off, else None."""

    def current_token(self) -> int | None:
        """The current term's token while leading, else None."""

    def time_left(self) -> float | None:
        """Seconds of validity left while leading, else None."""


class Alive(Protocol):
    """A helper process the verdict asks after (the worker's run watchdog)."""

    def alive(self) -> bool:
        """True while it runs. Asked only: never replaced or restarted from here."""


class Observed(Protocol):
    """A process as its health probe sees it: the worker's coordinator, beat's election."""

    @property
    def managers(self) -> Sequence[ElectionLease]:
        """Every election of the process, the default one first."""

    @property
    def loop(self) -> LoopLiveness:
        """The process's loop: its ticks, started, stopping, waits on the broker."""

    @property
    def watchdog(self) -> Alive | None:
        """The run watchdog, where the pool needs one (prefork), else None."""

    def loop_busy_with_task(self) -> bool:
        """True while a task holds the loop by design (a solo worker's task)."""


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


def election_state(manager: ElectionLease) -> dict[str, Any]:
    """One election as ``/healthz`` reports it, the same fields on a worker and a beat.

    * ``state``, the first that holds: ``not-running`` (its lease thread is
      not running: not started yet, stopped, or dead), ``store-unreachable``
      (its last store call failed; a leader keeps leading until its lease
      runs out), ``holding-off`` (it holds the lease but waits one ttl
      before leading, after the store lost its data or on a new store),
      ``leading``, ``following``;
    * ``role``: ``leader`` or ``follower``;
    * ``store_failures``: store calls failed in a row;
    * ``token``: the fencing token of the term it leads, else None;
    * ``expires_in``: seconds of validity left while it leads, else None.
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
    left = manager.time_left()
    return {
        "state": state,
        "role": "leader" if leading else "follower",
        "store_failures": manager.store_failures,
        "token": manager.current_token(),
        "expires_in": None if left is None else round(left, 3),
    }


def _detail(managers: Sequence[ElectionLease], loop_age: float) -> dict[str, Any]:
    """What every answer reports besides its verdict.

    The default election (the first of *managers*) as earlier releases
    did, and each of *managers* by its lease name.
    """
    default = managers[0]
    return {
        "election": default.name,
        "role": "leader" if default.is_leader() else "follower",
        "loop_age": round(loop_age, 3),
        "store_failures": default.store_failures,
        "elections": {m.name: election_state(m) for m in managers},
    }


def verdict(process: Observed, stuck_after: float) -> Verdict:  # noqa: PLR0911 - one check a line
    """The verdict for *process*, a worker or a beat; the rules are the module docstring's.

    *stuck_after* is ``leader_health_stuck_after``: seconds the loop may
    stand still before the process counts as stuck.
    """
    managers = list(process.managers)
    loop = process.loop
    loop_age = loop.age()
    detail = _detail(managers, loop_age)
    if loop.stopping:
        return Verdict(True, "stopping", detail)
    if not loop.started:
        return Verdict(True, "starting", detail)
    watchdog = process.watchdog
    if watchdog is not None and not watchdog.alive():
        return Verdict(False, "watchdog-dead", detail)
    dead = [m.name for m in managers if not m.running]
    if dead:
        return Verdict(False, "lease-thread-dead", {**detail, "dead": dead})
    if loop.waiting_on_broker:
        return Verdict(True, "reconnecting", detail)
    if loop_age > stuck_after and not process.loop_busy_with_task():
        return Verdict(False, "loop-stuck", detail)
    return Verdict(True, "ok", detail)
