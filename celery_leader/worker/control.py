"""Remote-control commands: ``celery inspect leader`` and the step-down request.

Importing this module registers the commands, in the worker and in the
client: ``celery inspect`` checks command names in the calling process, so
``celery_leader`` must be imported there too (it is, by any app module that
uses it).
"""

from __future__ import annotations

import sys
from typing import Any

import click
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


@control_command(  # type: ignore[untyped-decorator]
    args=[("election", str)], signature="[election]"
)
def leader_step_down(state: Any, election: str | None = None, **kwargs: Any) -> dict[str, Any]:
    """Stop leader work, release the lease and sit out one ttl (only the holder acts).

    *election*: a named election's own name; none (or ``""``): the default one.
    """
    coordinator = current_coordinator()
    if coordinator is None:
        return {"ok": False, "reason": "LeaderElection is not running on this worker"}
    return coordinator.step_down(election or None)


def _offer_to_celery_53_cli() -> None:
    """Let Celery 5.3's ``celery inspect``/``celery control`` accept our commands.

    Celery 5.3 checks the command name against a :class:`click.Choice` built
    when ``celery.bin.control`` is imported, which the ``celery`` program does
    before ``-A`` loads the app (and so this module): without this,
    ``celery inspect leader`` fails there with "'leader' is not one of ...".
    Celery 5.4 and later look the name up when the command runs; their
    command argument has no Choice, so this does nothing there.
    """
    module = sys.modules.get("celery.bin.control")
    if module is None:
        return  # imported before the CLI module: the Choice, if any, is built with ours
    for command_name, ours in (("inspect", "leader"), ("control", "leader_step_down")):
        command = getattr(module, command_name, None)
        for param in getattr(command, "params", ()):
            kind = param.type
            if isinstance(kind, click.Choice) and ours not in kind.choices:
                # A new Choice: click 8.2+ keeps the choices in a tuple.
                param.type = click.Choice([*kind.choices, ours], case_sensitive=kind.case_sensitive)


_offer_to_celery_53_cli()
