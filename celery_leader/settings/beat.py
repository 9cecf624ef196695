"""Beat's settings (``leader_beat_*``): the wrapped scheduler, standbys, missed slots, unled beats.

Read at worker start too: a worker may run beat (``-B``), and a bad value is
better reported before it is used.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from celery_leader._catalogue import Owner, Setting, register
from celery_leader.exceptions import ConfigurationError
from celery_leader.settings.parsing import one_of, true_or_false
from celery_leader.settings.spelling import spelled_as_given

#: What a new beat leader does with a slot missed in the leaderless gap.
MISSED_POLICIES = ("once", "skip")
#: How beat standbys keep in step (see celery_leader.beat).
STANDBY_MODES = ("auto", "reserve", "idle")
#: The scheduler LeaderScheduler wraps unless ``leader_beat_scheduler`` names another.
DEFAULT_BEAT_SCHEDULER = "celery.beat:PersistentScheduler"

_MISSED_ALLOWED = f"one of {', '.join(MISSED_POLICIES)} or a catch-up window in seconds (>= 0)"


def _scheduler(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigurationError(
            f"{name}={value!r} is not allowed: name a scheduler class as 'module:Class'"
        )
    return value


def _missed_policy(name: str, value: Any) -> str | float:
    """A missed-slot policy as given: ``"once"``, ``"skip"`` or a window in seconds."""
    if value in MISSED_POLICIES:
        return str(value)
    window: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        window = float(value)
    elif isinstance(value, str):  # from an environment variable: "3600"
        with contextlib.suppress(ValueError):
            window = float(value)
    if window is not None and math.isfinite(window) and window >= 0:
        return window
    raise ConfigurationError(f"{name}={value!r} is not allowed: use {_MISSED_ALLOWED}")


def _missed_policies(name: str, value: Any) -> dict[str, str | float]:
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"{name}={value!r} is not allowed: it must be a dict of entry name to {_MISSED_ALLOWED}"
        )
    return {
        str(entry): _missed_policy(f"{name}[{entry!r}]", policy) for entry, policy in value.items()
    }


BEAT_SCHEDULER: Setting[str] = Setting(
    "leader_beat_scheduler",
    Owner.BEAT,
    default=f"`{DEFAULT_BEAT_SCHEDULER}`",
    allowed="a beat scheduler class as `module:Class`, or an alias (`django`, `redbeat`, ...)",
    description=(
        "The scheduler `LeaderScheduler` leads: it keeps the schedule, and only the beat that "
        "holds beat's lease lets it send."
    ),
    parse=_scheduler,
)
BEAT_STANDBY: Setting[str] = Setting(
    "leader_beat_standby",
    Owner.BEAT,
    default="`auto`: `idle` for RedBeat and django-celery-beat, `reserve` otherwise",
    allowed=(
        "`auto`, `reserve` (tick without sending; refused with RedBeat and django-celery-beat), "
        "`idle` (do not tick)"
    ),
    description="What the beats that do not hold beat's lease do while they stand by.",
    parse=one_of(*STANDBY_MODES),
)
BEAT_MISSED_DEFAULT: Setting[str | float] = Setting(
    "leader_beat_missed_default",
    Owner.BEAT,
    default="`once`",
    allowed="`once`, `skip`, or a catch-up window in seconds (>= 0)",
    description=(
        "What a new beat leader does with the slots missed in the gap between two leaders: "
        "send the latest one once, skip them, or send one no older than the window."
    ),
    parse=_missed_policy,
)
BEAT_MISSED: Setting[dict[str, str | float]] = Setting(
    "leader_beat_missed",
    Owner.BEAT,
    default="`{}`",
    allowed='`{entry name: "once" | "skip" | seconds}`',
    description="Per-entry overrides of `leader_beat_missed_default`.",
    parse=_missed_policies,
)
BEAT_UNLED: Setting[bool] = Setting(
    "leader_beat_unled",
    Owner.BEAT,
    default="`False`: such a beat is refused at start",
    allowed="`True`, `False`",
    description=(
        "Let a beat run a scheduler other than `LeaderScheduler` (unled) although the app's "
        "settings say its beat is meant to be led."
    ),
    parse=true_or_false,
)
register(BEAT_SCHEDULER, BEAT_STANDBY, BEAT_MISSED_DEFAULT, BEAT_MISSED, BEAT_UNLED)


@dataclass(frozen=True)
class BeatSettings:
    """``leader_beat_*``: the wrapped scheduler, standby mode and missed-slot policies."""

    scheduler: str
    standby: Literal["auto", "reserve", "idle"]
    missed: Mapping[str, str | float]
    missed_default: str | float

    def missed_policy(self, entry_name: str) -> str | float:
        """``"once"``, ``"skip"`` or a catch-up window in seconds for *entry_name*."""
        return self.missed.get(entry_name, self.missed_default)

    def catch_up_window(self, entry_name: str) -> float:
        """How old a missed slot of *entry_name* may be and still be sent at a takeover, seconds.

        ``"once"`` is no limit (infinity), ``"skip"`` is 0 (never sent).
        """
        policy = self.missed_policy(entry_name)
        if policy == "once":
            return math.inf
        if policy == "skip":
            return 0.0
        return float(policy)


@spelled_as_given
def beat_settings(conf: Mapping[str, Any]) -> BeatSettings:
    """The validated ``leader_beat_*`` settings of *conf*."""
    return BeatSettings(
        scheduler=BEAT_SCHEDULER.read_or(conf, DEFAULT_BEAT_SCHEDULER),
        standby=cast("Literal['auto', 'reserve', 'idle']", BEAT_STANDBY.read_or(conf, "auto")),
        missed=BEAT_MISSED.read_or(conf, {}),
        missed_default=BEAT_MISSED_DEFAULT.read_or(conf, "once"),
    )


@spelled_as_given
def beat_unled(conf: Mapping[str, Any]) -> bool:
    """``leader_beat_unled``: True lets a beat run a scheduler other than LeaderScheduler.

    Only a real bool: "no" or "0" from an environment would be truthy.
    """
    return BEAT_UNLED.read_or(conf, False)
