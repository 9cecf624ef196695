"""The ``celery leader`` group, to which each command family is added (see the package)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import click
from celery.bin.base import handle_preload_options

# Celery's own ``celery`` group is a DYMGroup, so ``celery leader stauts``
# suggests ``status`` as ``celery inspct`` suggests ``inspect``; Celery
# imports this package unconditionally, so it is there whenever we are.
from click_didyoumean import DYMGroup  # type: ignore[import-untyped]

_Callback = TypeVar("_Callback", bound=Callable[..., Any])

#: Set, as each command's: click would otherwise cut the docstring to fit ``celery --help``.
GROUP_SHORT_HELP = "Leader election: who leads, and handing over."


def _preload_options(callback: _Callback) -> _Callback:
    """Celery's ``handle_preload_options``, typed (Celery ships no annotations)."""
    return cast("_Callback", handle_preload_options(callback))


# Celery adds the app's preload options (app.user_options["preload"]) to each
# of its top-level commands, this group included: they arrive in **kwargs and
# go on to the user_preload_options signal, as for Celery's own commands.
@click.group(name="leader", cls=cast("type[click.Group]", DYMGroup), short_help=GROUP_SHORT_HELP)
@click.pass_context
@_preload_options
def leader(ctx: click.Context, /, **kwargs: Any) -> None:
    """Leader election: who leads, and handing leadership over.

    Each command's --help lists its exit codes.
    """
