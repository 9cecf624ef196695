"""Warnings at start about settings written so that celery-leader never reads them.

Two ways a setting is lost in silence, each warned of once per process:

* a ``leader_*`` key that is no setting (a typo keeps the default), named
  with the setting probably meant;
* a setting spelled as Celery does not read it: in a Django project whose
  Celery reads ``namespace="CELERY"``, ``LEADER_LEASE_TTL`` instead of
  ``CELERY_LEADER_LEASE_TTL`` (without a namespace, upper case instead of
  ``leader_lease_ttl``).
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping
from typing import Any

from celery_leader._catalogue import names_of, registered
from celery_leader.settings.catalogue import known_names, listed_keys
from celery_leader.settings.spelling import own_keys, prefix_of

logger = logging.getLogger(__name__)

#: Warnings given in this process: each is given once (beat builds its scheduler twice,
#: and every start reads the settings).
_warned: set[str] = set()


def warn_about_spelling(conf: Mapping[str, Any]) -> None:
    """Log one warning per key of *conf* that celery-leader will not read as the user meant."""
    _warn_unknown_keys(conf)
    _warn_unread_spellings(conf)


def _warn(message: str, *args: object) -> None:
    text = message % args
    if text not in _warned:
        _warned.add(text)
        logger.warning(message, *args)


def _warn_unknown_keys(conf: Mapping[str, Any]) -> None:
    """A ``leader_*`` key that is no setting: a typo keeps a default, so name the likely one."""
    listed = listed_keys(conf)
    if not set(listed) - names_of(registered()):
        return
    names = known_names()  # every store's too: one of them may declare the key
    prefix = prefix_of(conf)
    for key, written in sorted(listed.items()):
        if key in names:
            continue
        close = difflib.get_close_matches(key, names, n=1)
        meant = f"{prefix}{close[0]}".upper() if close and prefix else (close or [""])[0]
        hint = f"; did you mean {meant}?" if meant else ""
        _warn("celery-leader: %s is not a celery-leader setting%s", written, hint)


def _warn_unread_spellings(conf: Mapping[str, Any]) -> None:
    """A setting written as Celery never reads it: name the spelling it does read."""
    prefix = prefix_of(conf)
    names: frozenset[str] | None = None
    for written in sorted(map(str, own_keys(conf))):
        key = written.lower()
        if not key.startswith("leader_") or written == key:
            continue  # not ours, or lower case as Celery reads it with or without a namespace
        if names is None:
            names = known_names()
        if key not in names:
            continue  # LEADER_BOARD_PAGE_SIZE: a project's own setting
        if prefix:
            use = f"{prefix}{key.upper()}" if prefix.isupper() else f"{prefix}{key}"
            why = f"Celery reads this app's settings under the namespace {prefix.rstrip('_')!r}"
        else:
            use, why = key, "Celery reads its settings in lower case"
        _warn("celery-leader: %s is ignored: %s; write it as %s", written, why, use)
