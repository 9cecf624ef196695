"""A beat meant to be led that runs another scheduler is refused at start.

``celery beat -S django`` (as django-celery-beat's docs say to run it), or any
``-S``/``beat_scheduler`` other than ``LeaderScheduler``, names its scheduler
directly: that beat sends whether or not it holds beat's lease, beside the
beat that does, and every entry goes out twice. Nothing would fail, so such a
beat stops at ``beat_init``, before its first tick, with one line
(``Error: celery-leader: ...``, exit status 1) naming the settings as the
project writes them and the fix.

**A beat is meant to be led** when the configuration Celery reads names
``LeaderScheduler`` in ``beat_scheduler`` (a ``-S`` on the command line then
chose the other scheduler) or sets one of celery-leader's beat settings
(``leader_beat_*``, found as celery-leader finds them: ``CELERY_LEADER_BEAT_SCHEDULER``
under Django's ``namespace="CELERY"``) to anything but None or ``""``.
``leader_beat_unled`` itself does not count.

A project that sets only the workers' settings (``leader_backend_url``, say,
which a non-Redis broker needs) may run one plain beat on purpose: its beat
starts, with one warning that it is not led. A setting that merely contains
"LEADER" (a Django project's ``TEAM_LEADER_EMAIL``) counts for neither.

``leader_beat_unled = True`` lets a beat run another scheduler anyway (one
beat, deliberately unled): it starts and says so in one info line, instead
of being refused or warned about. It changes nothing for a beat that runs
``LeaderScheduler``.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from celery import signals
from celery.utils.imports import load_extension_class_names

from celery_leader.exceptions import ConfigurationError
from celery_leader.settings import beat_unled, given_settings, spelled
from celery_leader.settings.beat import BEAT_UNLED

logger = logging.getLogger(__name__)

LEADER_SCHEDULER = "celery_leader.beat:LeaderScheduler"
#: The names ``beat_scheduler`` may give LeaderScheduler by (``-S leader`` is an alias).
_LEADER_SCHEDULER_NAMES = frozenset(
    {"celery_leader.beat.LeaderScheduler", "celery_leader.beat.scheduler.LeaderScheduler"}
)
#: The setting that lets a beat run unled; it does not make leader settings present.
UNLED_KEY = BEAT_UNLED.name


class BeatRefused(SystemExit):
    """A beat refused at start: exit status 1, its one line already reported (:func:`refuse`).

    A ``SystemExit``, not an ``Exception``: Celery's signal dispatch logs an
    ``Exception`` raised by a ``beat_init`` receiver and carries on, and the
    beat would go on sending. ``str()`` gives the line.
    """

    def __init__(self, message: str) -> None:
        super().__init__(1)
        self.message = message

    def __str__(self) -> str:
        return self.message


def written(conf: Any, key: str) -> str:
    """*key* as the project writes it, set or not: ``CELERY_BEAT_SCHEDULER`` under a namespace.

    A key the configuration sets is named as it is set (see
    :func:`celery_leader.settings.spelled`); one it does not set, as Celery
    would look it up: with the namespace's prefix, in the prefix's case.
    """
    conf.get(key)  # Celery loads a configuration still pending, and its prefix, on a first read
    name = spelled(conf, key)
    prefix = str(getattr(conf, "prefix", None) or "")
    if name != key or not prefix:
        return name
    given = f"{prefix}{key}"
    return given.upper() if prefix.isupper() else given


def beat_meant_to_be_led(conf: Any) -> bool:
    """True when *conf* names LeaderScheduler or sets a ``leader_beat_*`` setting (module doc)."""
    given = set(given_settings(conf)) - {UNLED_KEY}
    if any(name.startswith("leader_beat_") for name in given):
        return True
    return _names_leader_scheduler(conf.get("beat_scheduler"))


def leader_settings_present(conf: Any) -> bool:
    """True when *conf* sets a celery-leader setting or names LeaderScheduler (module doc)."""
    if set(given_settings(conf)) - {UNLED_KEY}:
        return True
    return _names_leader_scheduler(conf.get("beat_scheduler"))


def _names_leader_scheduler(value: Any) -> bool:
    """True when a ``beat_scheduler`` value names LeaderScheduler (imports nothing)."""
    if isinstance(value, str):
        aliases = dict(load_extension_class_names("celery.beat_schedulers"))
        return aliases.get(value, value).replace(":", ".") in _LEADER_SCHEDULER_NAMES
    if isinstance(value, type):
        from celery_leader.beat.scheduler import (  # noqa: PLC0415 - beat is optional
            LeaderScheduler,
            LeaderSchedulerMixin,
        )

        return value is LeaderScheduler or issubclass(value, LeaderSchedulerMixin)
    return False


def in_embedded_beat_process() -> bool:
    """True in the process ``celery worker -B`` runs its beat in.

    An error raised there ends as a traceback in the worker's log (billiard
    prints it). Celery's class for that process is private: without it, False.
    """
    from billiard.process import current_process  # noqa: PLC0415 - with beat only
    from celery import beat  # noqa: PLC0415 - not loaded by import celery_leader

    embedded = getattr(beat, "_Process", None)
    return isinstance(embedded, type) and isinstance(current_process(), embedded)


def refuse(message: str) -> BeatRefused:
    """Report *message* in one line, and give the exit to raise.

    ``celery beat`` prints it as the ``celery`` command prints a start-up
    error (``Error: <message>``), on the process's own stderr: beat has
    redirected ``sys.stderr`` to its log by now, which would add a log prefix
    and a level. The beat process of ``worker -B`` logs it as an error, in
    the worker's log, where the worker's own lines go.
    """
    if in_embedded_beat_process():
        logger.error("%s", message)
    else:
        stream = sys.__stderr__ or sys.stderr
        stream.write(f"Error: {message}\n")
        stream.flush()
    return BeatRefused(message)


def refuse_unled_beat(sender: Any = None, **_: Any) -> None:
    """``beat_init`` handler: stop a beat meant to be led that runs another scheduler.

    Raises :class:`BeatRefused` (after printing its one line) when the beat
    does not run ``LeaderScheduler``, is meant to be led (module doc) and
    ``leader_beat_unled`` is not True; warns once when only the workers'
    settings are present. Under ``worker -B`` only the embedded
    beat stops; the worker runs on.
    """
    from celery_leader.beat.scheduler import LeaderSchedulerMixin  # noqa: PLC0415 - beat is optional

    scheduler = getattr(sender, "scheduler", None)
    app = getattr(sender, "app", None)
    if scheduler is None or app is None or isinstance(scheduler, LeaderSchedulerMixin):
        return
    conf = app.conf
    try:
        unled = beat_unled(conf)
    except ConfigurationError as exc:
        raise refuse(f"celery-leader: {exc}") from None
    if not unled and not leader_settings_present(conf):
        return
    cls = type(scheduler)
    name = f"{cls.__module__}:{cls.__qualname__}"
    if unled:
        logger.info(
            "celery-leader: this beat runs %s directly: it runs unled on purpose (%s = True) "
            "and sends whether or not another beat holds beat's lease",
            name,
            written(conf, UNLED_KEY),
        )
        return
    # celery worker's -S is --statedb: its beat takes the scheduler from --scheduler alone.
    option = "--scheduler" if in_embedded_beat_process() else "-S"
    fix = (
        f"Lead it: {option} leader (or no {option}, and "
        f"{written(conf, 'beat_scheduler')} = '{LEADER_SCHEDULER}'), with "
        f"{written(conf, 'leader_beat_scheduler')} = '{name}'; for a beat meant to run "
        f"unled, set {written(conf, UNLED_KEY)} = True"
    )
    if not beat_meant_to_be_led(conf):
        # Only the workers' settings: one plain beat may be the project's choice.
        logger.warning(
            "celery-leader: this beat runs %s directly, not under LeaderScheduler: it is not "
            "led, and a second beat like it would send every entry again. %s",
            name,
            fix,
        )
        return
    raise refuse(
        f"celery-leader: this beat runs {name} directly: it would send whether or not it holds "
        f"beat's lease, beside the beat that does. {fix}"
    )


signals.beat_init.connect(refuse_unled_beat, weak=False)
