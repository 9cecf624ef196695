"""The names of an app's elections and queues: the one place a lease name or a queue is derived.

``leader_name`` and ``leader_queue`` are declared here; a process that only
sends (a web app) reads these and nothing else, so it needs no store setting.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from celery_leader._catalogue import Owner, Setting, register
from celery_leader.exceptions import ConfigurationError
from celery_leader.settings.parsing import non_empty_string
from celery_leader.settings.spelling import spelled_as_given

#: Beat's election is the workers' election name with this suffix.
BEAT_SUFFIX = ".beat"
#: What an election may be called (``@leader_only(election=...)``, ``leader_elections``).
ELECTION_NAME = re.compile(r"[A-Za-z0-9_-]+")
#: Election names taken by celery-leader itself: ``beat`` is beat's own election.
RESERVED_ELECTIONS = frozenset({"beat"})

NAME: Setting[str] = Setting(
    "leader_name",
    Owner.ELECTION,
    default="the app's main module name (`Celery('proj')`), else `celery`",
    allowed="a non-empty string",
    description=(
        "The election's name. Workers with the same name and the same lease store elect one "
        "leader among them; the lease, the leader queue and beat's election are named after it."
    ),
    parse=non_empty_string("a non-empty string"),
)
QUEUE: Setting[str] = Setting(
    "leader_queue",
    Owner.ELECTION,
    default="`<leader_name>.leader`",
    allowed="a non-empty queue name",
    description=(
        "The queue only the leader consumes: leader-only tasks are routed there. A named "
        "election's queue is `<leader_name>.<election>.leader`."
    ),
    parse=non_empty_string("a non-empty queue name"),
)
register(NAME, QUEUE)


def check_election_name(name: object, where: str) -> str:
    """*name* when it may name an election; else a :class:`ConfigurationError` naming *where*."""
    if not isinstance(name, str) or not ELECTION_NAME.fullmatch(name):
        raise ConfigurationError(
            f"{where}={name!r} is not allowed: an election name is a non-empty string of "
            "letters, digits, '-' and '_'"
        )
    if name in RESERVED_ELECTIONS:
        raise ConfigurationError(
            f"{where}={name!r} is not allowed: {name!r} is reserved (beat's own election)"
        )
    return name


@spelled_as_given
def default_name(conf: Mapping[str, Any], main: str | None) -> str:
    """``leader_name``, else the app's main module name, else ``"celery"``."""
    return NAME.read(conf) or main or "celery"


@spelled_as_given
def default_queue(conf: Mapping[str, Any], main: str | None) -> str:
    """``leader_queue``, else ``"<leader_name>.leader"``."""
    return QUEUE.read(conf) or f"{default_name(conf, main)}.leader"


@dataclass(frozen=True)
class ElectionNames:
    """The names of an app's elections: the one place a lease name or a queue is derived.

    ``leader`` is the workers' election (``leader_name``, else the app's main
    module, else ``"celery"``), ``queue`` its leader queue (``leader_queue``,
    else ``"<leader>.leader"``) and ``beat`` beat's own election
    (``"<leader>.beat"``).
    """

    leader: str
    queue: str

    @property
    def beat(self) -> str:
        """Beat's election: the workers' name with :data:`BEAT_SUFFIX`."""
        return self.leader + BEAT_SUFFIX

    @property
    def members(self) -> str:
        """The group the workers announce themselves in, for balancing named elections."""
        return f"{self.leader}.members"

    def lease_of(self, election: str | None) -> str:
        """The lease name of *election* (None: the default election): ``"<leader>.<election>"``."""
        return self.leader if election is None else f"{self.leader}.{election}"

    def queue_of(self, election: str | None) -> str:
        """The leader queue of *election* (None: the default): ``"<leader>.<name>.leader"``."""
        return self.queue if election is None else f"{self.leader}.{election}.leader"

    def election_of_queue(self, queue: str) -> tuple[bool, str | None]:
        """``(True, election)`` for the leader queue of *election*, else ``(False, None)``."""
        if queue == self.queue:
            return True, None
        prefix, suffix = f"{self.leader}.", ".leader"
        if queue.startswith(prefix) and queue.endswith(suffix):
            election = queue[len(prefix) : -len(suffix)]
            if ELECTION_NAME.fullmatch(election) and election not in RESERVED_ELECTIONS:
                return True, election
        return False, None


def step_down_slot(election: str) -> str:
    """The lease name beside *election* through which a step-down is asked of its holder.

    Used for beat's election, which listens to no broker queue.
    """
    return f"{election}.step-down"


def schedule_slot(election: str) -> str:
    """The lease name beside beat's *election* that holds its schedule controls.

    ``celery leader schedule pause|resume|run`` write there; the beat leader
    reads it (see :mod:`celery_leader.beat.controls`).
    """
    return f"{election}.schedule"


@spelled_as_given
def election_names(conf: Mapping[str, Any], main: str | None) -> ElectionNames:
    """The validated :class:`ElectionNames` of *conf*; needs no store setting.

    A process that only sends (a web app) reads these, and nothing else,
    so a client whose broker is not Redis sends without ``leader_backend_url``.
    """
    return ElectionNames(leader=default_name(conf, main), queue=default_queue(conf, main))
