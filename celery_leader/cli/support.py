"""What the ``celery leader`` commands share: exit codes, the one-line error, store access.

Kept apart from the commands so that each command module imports it, and
none imports another.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import NoReturn, TypeVar

import click

from celery_leader._masking import mask_text
from celery_leader.exceptions import ConfigurationError, StoreError
from celery_leader.settings import AppSettings, LeaderSettings, app_settings, check_election_name
from celery_leader.stores import open_store
from celery_leader.stores.base import Holder, LeaseRecord, LeaseStore

EXIT_LEADER = 0
EXIT_NO_LEADER = 1
EXIT_STORE_ERROR = 2
EXIT_DRAINING = 3

#: What every error line starts with after ``Error: ``: the worker's own prefix.
ERROR_SOURCE = "celery-leader: "

_T = TypeVar("_T")


def _fail(ctx: click.Context, message: str) -> NoReturn:
    """Report *message* as the worker reports a bad setting, then exit 2.

    ``Error: celery-leader: <message>``, the line ``celery worker`` stops
    with for the same problem, so that both read alike (``Error`` is red on
    a terminal, plain with ``-C``). One line on stderr: store and broker
    errors can carry newlines, and a second line would read like the start
    of a traceback. Secrets are masked, since drivers quote the URL they
    were given.
    """
    cli = ctx.obj
    label = cli.style("Error", fg="red", bold=True)
    cli.error(f"{label}: {ERROR_SOURCE}{' '.join(mask_text(message).split())}")
    ctx.exit(EXIT_STORE_ERROR)


def _open(
    ctx: click.Context, beat: bool, election: str | None = None
) -> tuple[AppSettings, LeaderSettings, LeaseStore]:
    app = ctx.obj.app
    if beat and election:
        _fail(ctx, "--beat and --election name different elections: give one of them")
    try:
        every = app_settings(app, fresh=True)
        if election:
            check_election_name(election, "--election")
        settings = every.beat_election if beat else every.for_named(election or None)
        store = open_store(
            settings.backend_url,
            timeout=max(settings.timing.op_timeout, 2.0),
            options=settings.store_options,
        )
    except (ConfigurationError, StoreError) as exc:
        _fail(ctx, str(exc))
    return every, settings, store


def _call(ctx: click.Context, call: Callable[[], _T]) -> _T:
    """One store call; a store error ends the command with exit 2."""
    try:
        return call()
    except StoreError as exc:
        _fail(ctx, str(exc))


def _read(ctx: click.Context, store: LeaseStore, name: str) -> LeaseRecord | None:
    return _call(ctx, lambda: store.read(name))


def write_slot(
    ctx: click.Context,
    store: LeaseStore,
    settings: LeaderSettings,
    *,
    slot: str,
    key: str,
    value: str,
    deadline: float,
    asking: Holder,
    what: str,
) -> None:
    """Write *key* into the state of the request slot *slot*, holding its lease for the moment.

    Only a lease holder may write a slot's state, so the command takes the
    slot's lease, writes and releases it (a concurrent request waits for
    it, until *deadline*: then exit 1). A write the store refuses exits 2.
    """
    while not _call(ctx, lambda: store.acquire(slot, asking, settings.timing.ttl)).acquired:
        if time.monotonic() >= deadline:
            ctx.obj.echo(f"another {what} for {settings.name!r} is being written")
            ctx.exit(EXIT_NO_LEADER)
        time.sleep(0.05)
    try:
        written = _call(ctx, lambda: store.set_state(slot, asking.lease_id, key, value))
    finally:
        # Written or not, the slot is free again; if the release fails, its lease ends by
        # itself within one ttl (nothing else waits for it but another request).
        with contextlib.suppress(StoreError):
            store.release(slot, asking.lease_id)
    if not written:
        _fail(ctx, f"lease store {store.url}: the {what} could not be written")
