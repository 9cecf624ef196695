"""What a led beat does once at start: the checks that stop it with one line, and SIGTERM.

Each check runs where ``LeaderScheduler`` is built, not when competing
begins: beat's banner builds the scheduler (lazily) before beat runs it,
and an error there must be one line naming the setting, not a logged
traceback. Each raises
:class:`~celery_leader.startup_error.StartupConfigurationError`:

* the store's server would keep beat's lease longer than its ttl
  (:mod:`celery_leader.stores.server_limits`; once per store and ttl);
* metrics are on and the ``prometheus`` extra is missing;
* ``leader_beat_standby = "reserve"`` with a scheduler whose schedule is
  shared (its standbys would advance it without sending).

An embedded beat (``worker -B``) gets a SIGTERM handler that runs beat's
cleanup, so it releases its lease when the worker stops it.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from celery_leader.beat.state import ScheduleState
from celery_leader.exceptions import ConfigurationError
from celery_leader.observe.extra import check_metrics_extra
from celery_leader.settings import BeatSettings, LeaderSettings, spelled, spelled_in
from celery_leader.startup_error import StartupConfigurationError
from celery_leader.stores import open_store
from celery_leader.stores.server_limits import check_server_limits

#: (store URL, ttl) pairs whose server limits this process checked: beat builds its
#: scheduler more than once (lazily for its banner, then to run it).
_limits_checked: set[tuple[str, float]] = set()


def _check_server_limits(conf: Any, settings: LeaderSettings) -> None:
    """Stop beat at start when the store's server would keep beat's lease longer than its ttl.

    See :mod:`celery_leader.stores.server_limits`; once per store and ttl.
    """
    key = (settings.backend_url, settings.timing.ttl)
    if key in _limits_checked:
        return
    try:
        store = open_store(
            settings.backend_url, timeout=settings.timing.op_timeout, options=settings.store_options
        )
        try:
            check_server_limits(store, settings.timing.ttl)
        finally:
            store.close()
    except ConfigurationError as exc:
        raise StartupConfigurationError(f"celery-leader: {spelled_in(conf, str(exc))}") from None
    _limits_checked.add(key)


def _check_metrics_extra(conf: Any, settings: LeaderSettings) -> None:
    """Stop beat at start, with one line, when its metrics are on and the extra is missing."""
    try:
        check_metrics_extra(settings.metrics)
    except ConfigurationError as exc:
        raise StartupConfigurationError(f"celery-leader: {spelled_in(conf, str(exc))}") from None


def _standby_mode(conf: Any, beat: BeatSettings, wrapped: type, state: ScheduleState) -> str:
    """The standby mode to run: ``auto`` resolved; ``reserve`` refused for shared state."""
    mode = beat.standby
    if mode == "auto":
        return state.auto_mode
    if mode == "reserve" and state.shared:
        raise StartupConfigurationError(
            f"celery-leader: {spelled(conf, 'leader_beat_standby')}='reserve' is not allowed "
            f"with {wrapped.__module__}:{wrapped.__qualname__}: its schedule is shared, and a "
            "standby that ticks would advance it without sending; use auto or idle"
        )
    return str(mode)


def _exit_cleanly_on_sigterm() -> None:
    """In an embedded beat (``worker -B``), make SIGTERM run beat's cleanup.

    The worker stops its beat process with SIGTERM, whose default action ends
    it at once: no release, so a standby would wait a whole ttl. Standalone
    ``celery beat`` installs its own handler, which is left alone.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):

        def _exit(signum: int, frame: Any) -> None:
            raise SystemExit(0)

        signal.signal(signal.SIGTERM, _exit)
