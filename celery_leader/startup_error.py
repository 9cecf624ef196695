"""The error that stops ``celery worker`` or ``celery beat`` at start over a bad setting."""

from __future__ import annotations

import click
from celery.exceptions import ImproperlyConfigured


class StartupConfigurationError(ImproperlyConfigured, click.ClickException):  # type: ignore[misc]
    """A bad ``leader_*`` setting found at worker or beat start.

    It is Celery's ``ImproperlyConfigured`` for code that embeds a worker or a
    scheduler, and a click exception for the ``celery`` command, which then
    prints the one line ``Error: celery-leader: <key>=<value> is not allowed:
    ...`` and exits 1, instead of a traceback.
    """

    def __init__(self, message: str) -> None:
        ImproperlyConfigured.__init__(self, message)
        click.ClickException.__init__(self, message)
