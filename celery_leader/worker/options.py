"""celery-leader's ``celery worker`` options (``--leader-metrics-port``), from the catalogue.

A setting that declares a worker option (:attr:`~celery_leader._catalogue.Setting.option`)
gets one here, in ``app.user_options["worker"]``, where Celery's command line
looks for an app's own options once it loaded the app. Celery then passes
the value to every worker step as a keyword argument, and the
``LeaderElection`` step reads it before the setting and its environment
variable (:meth:`~celery_leader._catalogue.Setting.read_for_process`).

The value is taken as text and checked by the setting's own parser, so a bad
one stops the worker with the project's one line naming the option, as a
bad setting does. Click's own reading of ``CELERY_WORKER_LEADER_...``
variables is off: the setting's variable is the one environment spelling.
"""

from __future__ import annotations

from typing import Any

from celery.bin.base import CeleryOption

from celery_leader._catalogue import Setting
from celery_leader.settings.catalogue import entries

#: The heading ``celery worker --help`` lists the options under.
HELP_GROUP = "Leader Election Options"


def add_worker_options(app: Any) -> None:
    """Add every worker option of the catalogue to *app*'s ``celery worker`` (once each)."""
    known = {name for option in app.user_options["worker"] for name in getattr(option, "opts", ())}
    for setting in entries():
        if setting.option is None or setting.option in known:
            continue
        app.user_options["worker"].add(
            CeleryOption(
                [setting.option],
                default=None,
                metavar=setting.option.rsplit("-", 1)[-1].upper(),  # --leader-metrics-port: PORT
                help=_help(setting),
                help_group=HELP_GROUP,
                allow_from_autoenv=False,
            )
        )


def _help(setting: Setting[Any]) -> str:
    """The option's help: the setting's first sentence, and what the option overrides."""
    first = setting.description.split(". ")[0].rstrip(".").replace("`", "")
    overridden = " and ".join(filter(None, (setting.name, setting.environment)))
    return f"{first} (overrides {overridden})."
