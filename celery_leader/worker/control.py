"""Remote-control commands: ``celery inspect leader`` and the step-down request.

Importing this module registers the commands, in the worker and in the
client: ``celery inspect`` checks command names in the calling process, so
``celery_leader`` must be imported there too (it is, by any app module that
uses it).
"""

from __future__ import annotations

from typing import Any

from celery.worker.control import control_command, inspect_command

from celery_leader.worker.coordinator import current_coordinator


@inspect_command()  # type: ignore[untyped-decorator]
def leader(state: Any, **kwargs: Any) -> dict[str, Any]:
    """Each worker's view of its election: role, name, token and seconds left.

    ``"disabled"`` where the worker has not added the LeaderElection step.
    """
    coordinator = current_coordinator()
    if coordinator is None:
        return {"role": "disabled", "name": None, "token": None, "expires_in": None}
    return coordinator.describe()


@control_command()  # type: ignore[untyped-decorator]
def leader_step_down(state: Any, **kwargs: Any) -> dict[str, Any]:
    """Stop leader work, release the lease and sit out one ttl (only the holder acts)."""
    coordinator = current_coordinator()
    if coordinator is None:
        return {"ok": False, "reason": "LeaderElection is not running on this worker"}
    return coordinator.step_down()
