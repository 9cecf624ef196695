"""Which elections a worker competes in, and which tasks sent by name are leader-only.

``leader_tasks``, ``leader_elections``, ``leader_elections_exclude`` and
``leader_balance``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from celery_leader._catalogue import Owner, Setting, register
from celery_leader.exceptions import ConfigurationError
from celery_leader.settings.names import check_election_name
from celery_leader.settings.parsing import true_or_false
from celery_leader.settings.spelling import spelled_as_given

TaskRoutes = tuple[tuple[str, str | None], ...]


def _task_routes(name: str, value: Any) -> TaskRoutes:
    """(pattern, election) pairs: a list (or one string) of patterns, or ``{pattern: election}``.

    A single string is one pattern, never a sequence of one-letter patterns.
    """
    if isinstance(value, Mapping):
        pairs: list[tuple[object, object]] = list(value.items())
    elif isinstance(value, str):
        pairs = [(value, None)]
    else:
        try:
            pairs = [(pattern, None) for pattern in value]
        except TypeError:
            pairs = [(None, None)]
    if not all(isinstance(p, str) and p for p, _ in pairs):
        raise ConfigurationError(
            f"{name}={value!r} is not allowed: it must be a list of task names or glob "
            "patterns, or a mapping {pattern: election}"
        )
    return tuple(
        (str(pattern), check_election_name(election, f"{name}[{pattern!r}]"))
        if election
        else (str(pattern), None)
        for pattern, election in pairs
    )


def _election_list(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = (value,)
    try:
        names = tuple(value)
    except TypeError:
        raise ConfigurationError(
            f"{name}={value!r} is not allowed: it must be a list of election names"
        ) from None
    return tuple(dict.fromkeys(check_election_name(each, name) for each in names))


TASKS: Setting[TaskRoutes] = Setting(
    "leader_tasks",
    Owner.ELECTION,
    default="`()`",
    allowed="a list of task names or glob patterns, or a mapping `{pattern: election}`",
    description=(
        "Leader-only tasks for processes that send them by name without importing them "
        "(`app.send_task`): their messages go to the leader queue. A mapping routes each "
        'pattern to a named election (`None` or `""` for the default one).'
    ),
    parse=_task_routes,
)
ELECTIONS: Setting[tuple[str, ...]] = Setting(
    "leader_elections",
    Owner.ELECTION,
    default="`()`",
    allowed="a list of election names (letters, digits, `-`, `_`; not `beat`)",
    description=(
        "Named elections this worker competes in besides those its imported tasks name "
        "(`@leader_only(election=...)`)."
    ),
    parse=_election_list,
)
ELECTIONS_EXCLUDE: Setting[tuple[str, ...]] = Setting(
    "leader_elections_exclude",
    Owner.ELECTION,
    default="`()`",
    allowed="a list of election names",
    description="Named elections this worker never leads, whatever its tasks name.",
    parse=_election_list,
)
BALANCE: Setting[bool] = Setting(
    "leader_balance",
    Owner.ELECTION,
    default="`True`",
    allowed="`True`, `False`",
    description=(
        "Spread the named elections over the workers: once steady, with N workers eligible "
        "for each of K elections, each leads floor(K/N) or ceil(K/N)."
    ),
    parse=true_or_false,
)
register(TASKS, ELECTIONS, ELECTIONS_EXCLUDE, BALANCE)


@spelled_as_given
def leader_task_routes(conf: Mapping[str, Any]) -> TaskRoutes:
    """``leader_tasks``: (pattern, election) pairs for leader-only tasks sent by name.

    A list (or one string) names patterns of the default election (None); a
    mapping ``{pattern: election}`` names each pattern's election (None or
    ``""`` for the default one).
    """
    return TASKS.read_or(conf, ())


def leader_task_patterns(conf: Mapping[str, Any]) -> tuple[str, ...]:
    """``leader_tasks``: the names or glob patterns, whatever their election."""
    return tuple(pattern for pattern, _ in leader_task_routes(conf))


@dataclass(frozen=True)
class ElectionChoice:
    """Which named elections a worker competes in, besides those its tasks name."""

    extra: tuple[str, ...] = ()
    """``leader_elections``: elections whose tasks this worker may not import."""
    excluded: frozenset[str] = frozenset()
    """``leader_elections_exclude``: elections this worker never leads."""
    balance: bool = True
    """``leader_balance``: spread the elections over the workers."""

    def elections(self, from_tasks: Iterable[str | None]) -> tuple[str | None, ...]:
        """The elections to compete in: None (the default one) first, then named ones sorted."""
        named = {name for name in (*from_tasks, *self.extra) if name is not None}
        return (None, *sorted(named - self.excluded))


@spelled_as_given
def election_choice(conf: Mapping[str, Any]) -> ElectionChoice:
    """``leader_elections``, ``leader_elections_exclude`` and ``leader_balance``, validated."""
    balance = BALANCE.read_or(conf, True)
    return ElectionChoice(
        extra=ELECTIONS.read_or(conf, ()),
        excluded=frozenset(ELECTIONS_EXCLUDE.read_or(conf, ())),
        balance=balance,
    )
