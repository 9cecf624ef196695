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

    def __post_init__(self) -> None:
        if not NAME.fullmatch(self.name):
            raise ValueError(f"{self.name!r} is not a setting name: use leader_<lower_case>")
        if (self.owner is Owner.STORE) != (self.store is not None):
            raise ValueError(f"{self.name}: a store's setting names its store, no other does")

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
