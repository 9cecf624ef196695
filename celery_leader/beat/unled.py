"""A warning when a beat runs with celery-leader's settings but not under its scheduler.

``celery beat -S django`` (as django-celery-beat's docs say to run it) or any
``-S``/``beat_scheduler`` other than ``LeaderScheduler`` names its scheduler
directly: that beat sends whether or not it holds beat's lease, and several
such beats send every entry several times. Nothing fails, so without this
line nobody would notice.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import signals

logger = logging.getLogger(__name__)

LEADER_SCHEDULER = "celery_leader.beat:LeaderScheduler"


def _has_leader_settings(conf: Any) -> bool:
    """True when the app's configuration sets any ``leader_*`` key (any namespace)."""
    try:
        keys = [str(key).lower() for key in conf]
    except Exception:  # noqa: BLE001 - a conf that cannot list keys: say nothing
        return False
    return any(key.startswith("leader_") or "_leader_" in key for key in keys)


def warn_if_beat_is_not_led(sender: Any = None, **_: Any) -> None:
    """``beat_init`` handler: one warning when leader settings are set but beat is not led."""
    from celery_leader.beat.scheduler import LeaderSchedulerMixin  # noqa: PLC0415 - beat is optional

    scheduler = getattr(sender, "scheduler", None)
    app = getattr(sender, "app", None)
    if scheduler is None or app is None or isinstance(scheduler, LeaderSchedulerMixin):
        return
    if not _has_leader_settings(app.conf):
        return
    name = f"{type(scheduler).__module__}.{type(scheduler).__qualname__}"
    logger.warning(
        "celery-leader: this beat runs %s directly, not %s: it sends whether or not it holds "
        "beat's lease. Run it with -S leader and set leader_beat_scheduler to the scheduler "
        "to wrap.",
        name,
        LEADER_SCHEDULER,
    )


signals.beat_init.connect(warn_if_beat_is_not_led, weak=False)
