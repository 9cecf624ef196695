"""``celery -A proj leader ...``: who leads, handing over, and steering beat's entries.

Registered as a Celery CLI plugin (entry point group ``celery.commands``,
``leader = "celery_leader.cli:leader"``) and built the way Celery builds its
own commands (``celery inspect``, ``celery purge``):
:class:`~celery.bin.base.CeleryCommand` with options grouped by
``help_group`` (:class:`~celery.bin.base.CeleryOption`), preload options
handed to ``user_preload_options``, and ``-C/--no-color`` respected. Only
names Celery 5.3.0 already had are used.

One command family a module, each added to the :data:`leader` group here:
``status`` (:mod:`.status`), ``step-down`` (:mod:`.step_down`) and
``schedule list|pause|resume|run`` (:mod:`.schedule`); what they share (exit
codes, the one-line error, store access) is :mod:`.support`, and
``celery-leader``, the console script of the demo, is :mod:`.demo`.

Errors are one line on stderr in the form a worker stops with over the same
problem, ``Error: celery-leader: <message>`` (``Error`` in red on a terminal),
exit status 2. Each command's ``--help`` lists its exit codes. Store URLs
and error messages are printed with secrets masked.
"""

from __future__ import annotations

from celery_leader.cli.group import GROUP_SHORT_HELP, leader
from celery_leader.cli.schedule import SCHEDULE_SHORT_HELP, schedule
from celery_leader.cli.status import STATUS_SHORT_HELP, status
from celery_leader.cli.step_down import STEP_DOWN_SHORT_HELP, step_down

leader.add_command(status)
leader.add_command(step_down)
leader.add_command(schedule)

__all__ = [
    "GROUP_SHORT_HELP",
    "SCHEDULE_SHORT_HELP",
    "STATUS_SHORT_HELP",
    "STEP_DOWN_SHORT_HELP",
    "leader",
    "schedule",
    "status",
    "step_down",
]
