"""What a ``leader_*`` setting is: one declarative :class:`Setting` entry, and where entries gather.

Every setting celery-leader reads is one :class:`Setting`: its name as in
``app.conf``, its Django spelling, its default and allowed values as a
reader wants them, a one-paragraph description, who owns it (the election
core, beat, metrics, or one store) and the parser that turns a given value
into what the code uses, or refuses it with one line naming the setting.

Entries are declared where they are read: the settings package declares
those of the election, beat and metrics, and each store module declares its
own (``celery_leader/stores/*.py``), so that adding a store adds its options
without touching the settings. Declaring an entry registers it here; the
catalogue (:mod:`celery_leader.settings.catalogue`) reads them back, and the
unknown-key warning and the settings reference are built from it.

This module sits below the stores (they import it), so it imports nothing
of celery-leader.
"""

from __future__ import annotations

import enum
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

_T = TypeVar("_T")

#: What a setting may be called: Celery's lower-case keys, all under ``leader_``.
NAME = re.compile(r"leader_[a-z][a-z0-9_]*")
#: What a worker option may be called: all under ``--leader-``.
OPTION = re.compile(r"--leader-[a-z][a-z0-9-]*")
#: The namespace Django projects give Celery (``config_from_object(..., namespace="CELERY")``).
DJANGO_PREFIX = "CELERY_"


class Owner(enum.Enum):
    """Who reads a setting; the reference groups the catalogue by it, in this order."""

    ELECTION = "Election"
    BEAT = "Beat"
    METRICS = "Metrics and health"
    STORE = "Lease stores"


def unset(value: object) -> bool:
    """True for a value that counts as not set: None, or an empty string.

    A settings file often reads ``os.environ.get(...)``, which gives None or
    ``""`` for a variable that is not there; either keeps the default.
    """
    return value is None or (isinstance(value, str) and value == "")


@dataclass(frozen=True)
class Setting(Generic[_T]):
    """One ``leader_*`` setting, declared once; :meth:`read` is the one way its value is taken.

    ``parse(name, value)`` turns a given value into what the code uses, or
    raises :class:`~celery_leader.exceptions.ConfigurationError` with one
    line that starts ``<name>=<value> is not allowed`` and says what is
    (secrets are never echoed). The text fields are for people: the
    settings reference (:mod:`celery_leader.settings.reference`) prints
    them as they are, so they are written in Markdown (`code` in single
    backticks).
    """

    name: str
    """The key in ``app.conf``: ``leader_lease_ttl``."""
    owner: Owner
    default: str
    """The default, as a reader wants it (``"5 seconds"``; ``""`` for none)."""
    allowed: str
    """The values allowed, as a reader wants them."""
    description: str
    """One paragraph: what the setting does."""
    parse: Callable[[str, Any], _T] = field(compare=False, repr=False)
    store: str | None = None
    """The URL beginning of the store that reads it (``"azureblob://"``); None unless a store's."""
    environment: str | None = None
    """An environment variable that overrides the setting for one process (read at its start).

    For a value each process of one app needs its own of (a port), where every
    process reads the same app configuration.
    """
    option: str | None = None
    """A ``celery worker`` option that overrides the setting and :attr:`environment` for one
    worker (``--leader-metrics-port``); :func:`celery_leader.install` adds it to the app."""

    def __post_init__(self) -> None:
        if not NAME.fullmatch(self.name):
            raise ValueError(f"{self.name!r} is not a setting name: use leader_<lower_case>")
        if (self.owner is Owner.STORE) != (self.store is not None):
            raise ValueError(f"{self.name}: a store's setting names its store, no other does")
        if self.option is not None and not OPTION.fullmatch(self.option):
            raise ValueError(f"{self.name}: option {self.option!r} is not --leader-<lower-case>")

    @property
    def option_parameter(self) -> str | None:
        """The keyword Celery passes :attr:`option`'s value under (``leader_metrics_port``)."""
        return None if self.option is None else self.option[2:].replace("-", "_")

    @property
    def django_name(self) -> str:
        """The name in a Django project's settings: ``CELERY_LEADER_LEASE_TTL``."""
        return DJANGO_PREFIX + self.name.upper()

    @property
    def owner_label(self) -> str:
        """``"beat"``, or ``"the azureblob:// store"`` for a store's setting."""
        return f"the {self.store} store" if self.store else self.owner.value.lower()

    def given(self, values: Mapping[str, Any]) -> Any:
        """The value *values* gives, as given; None when it is not set (see :func:`unset`)."""
        value = values.get(self.name)
        return None if unset(value) else value

    def read(self, values: Mapping[str, Any]) -> _T | None:
        """The parsed value *values* gives; None when not set. Raises on a bad value."""
        value = self.given(values)
        return None if value is None else self.parse(self.name, value)

    def read_or(self, values: Mapping[str, Any], fallback: _T) -> _T:
        """:meth:`read`, with *fallback* when the setting is not set."""
        value = self.read(values)
        return fallback if value is None else value

    def read_for_process(
        self,
        values: Mapping[str, Any],
        environ: Mapping[str, str],
        options: Mapping[str, Any],
    ) -> tuple[_T | None, str]:
        """The parsed value for this process, and the name it was given under.

        The first given of: the worker option (its value in *options*, by
        :attr:`option_parameter`), the environment variable (in *environ*),
        the setting (in *values*). A bad value raises naming where it came
        from (``--leader-metrics-port='x' is not allowed: ...``, ``environment
        variable CELERY_LEADER_METRICS_PORT='x' is not allowed: ...``). With
        none given, the value is None and the name the setting's.
        """
        parameter = self.option_parameter
        if self.option is not None and parameter is not None:
            given = options.get(parameter)
            if not unset(given):
                return self.parse(self.option, given), self.option
        if self.environment is not None:
            given = environ.get(self.environment)
            if not unset(given):
                # Said in full: under Django's namespace the setting has the variable's name.
                named = f"environment variable {self.environment}"
                return self.parse(named, given), named
        return self.read(values), self.name


_entries: dict[str, Setting[Any]] = {}
_lock = threading.Lock()


def register(*settings: Setting[Any]) -> tuple[Setting[Any], ...]:
    """Add *settings* to the catalogue; returns them, for the declaring module to keep.

    Registering the same name again from the same owner replaces the entry
    (a module imported a second time after a failed import); from another
    owner it is an error, so that two owners never read one key.
    """
    with _lock:
        for setting in settings:
            known = _entries.get(setting.name)
            if known is not None and (known.owner, known.store) != (setting.owner, setting.store):
                raise ValueError(
                    f"{setting.name} is declared by {known.owner_label} and by "
                    f"{setting.owner_label}: a setting has one owner"
                )
            _entries[setting.name] = setting
    return settings


def registered() -> tuple[Setting[Any], ...]:
    """Every entry registered so far, in the order they were first declared."""
    with _lock:
        return tuple(_entries.values())


def names_of(settings: Iterable[Setting[Any]]) -> frozenset[str]:
    """The names of *settings*."""
    return frozenset(setting.name for setting in settings)


def check(settings: Iterable[Setting[Any]], values: Mapping[str, Any]) -> None:
    """Parse each of *settings* that *values* gives; the first bad one raises."""
    for setting in settings:
        setting.read(values)
