"""``celery -A proj leader status|step-down``: who leads, and handing over.

Registered as a Celery CLI plugin (entry point group ``celery.commands``) and
built the way Celery builds its own commands (``celery inspect``, ``celery
purge``): :class:`~celery.bin.base.CeleryCommand` with options grouped by
``help_group`` (:class:`~celery.bin.base.CeleryOption`), preload options handed to
``user_preload_options``, and errors reported through the
:class:`~celery.bin.base.CLIContext` as ``ERROR: ...`` (``-C/--no-color``
respected). Only names Celery 5.3.0 already had are used.

Exit codes (each command's ``--help`` lists its own): ``status`` 0 when a
leader holds the lease, 1 when none does; ``step-down`` 0 when the lease was
released, 1 when no leader held it (or it was not released in time), 3 when
the leader keeps the lease because leader tasks of its term still run in a
pool that cannot stop them (threads, solo, gevent, eventlet: it releases when
they end); both 2 when the store cannot be read (one line on stderr, no
traceback). Store URLs and error messages are printed with secrets masked.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, NoReturn, TypeVar, cast

import click
from celery.bin.base import CeleryCommand, CeleryOption, handle_preload_options

# Celery's own ``celery`` group is a DYMGroup, so ``celery leader stauts``
# suggests ``status`` as ``celery inspct`` suggests ``inspect``; Celery
# imports this package unconditionally, so it is there whenever we are.
from click_didyoumean import DYMGroup  # type: ignore[import-untyped]

from celery_leader._masking import mask_text
from celery_leader.exceptions import ConfigurationError, StoreError
from celery_leader.settings import AppSettings, LeaderSettings, app_settings
from celery_leader.stores import open_store
from celery_leader.stores.base import LeaseRecord, LeaseStore

EXIT_LEADER = 0
EXIT_NO_LEADER = 1
EXIT_STORE_ERROR = 2
EXIT_DRAINING = 3

_Callback = TypeVar("_Callback", bound=Callable[..., Any])

# Help texts, in one place so the wording is reviewed together. Each command
# sets short_help: click would otherwise cut the docstring's first sentence
# to fit ``celery leader --help``. A ``\b`` paragraph keeps click from
# rewrapping the exit-code table in ``--help``.
GROUP_SHORT_HELP = "Leader election: who leads, and handing over."
STATUS_SHORT_HELP = "Show who holds the lease (exit 0), or that none does (1)."
STEP_DOWN_SHORT_HELP = "Ask the leader to release so that another worker leads."
STATUS_EXIT_CODES = """\
\b
Exit codes:
  0  a leader holds the lease
  1  no leader holds it
  2  the store cannot be read (unreachable, wrong credentials, bad
     leader_* settings), or the command line is wrong
"""
STEP_DOWN_EXIT_CODES = """\
\b
Exit codes:
  0  the lease was released (who leads now is printed)
  1  no leader held the lease, or it was not released within --timeout
  2  the store or the broker cannot be reached, or the command line is wrong
  3  the leader stopped taking leader work but keeps the lease until
     leader tasks its pool cannot stop (threads, solo, gevent, eventlet)
     have ended; it releases then
"""


def _preload_options(callback: _Callback) -> _Callback:
    """Celery's ``handle_preload_options``, typed (Celery ships no annotations)."""
    return cast("_Callback", handle_preload_options(callback))


def _fail(ctx: click.Context, message: str) -> NoReturn:
    """Report *message* as Celery's commands report errors, then exit 2.

    One line on stderr: store and broker errors can carry newlines, and a
    second line would read like the start of a traceback. Secrets are masked,
    since drivers quote the URL they were given.
    """
    cli = ctx.obj
    cli.error(f"{cli.ERROR}: {' '.join(mask_text(message).split())}")
    ctx.exit(EXIT_STORE_ERROR)


def _open(ctx: click.Context, beat: bool) -> tuple[AppSettings, LeaderSettings, LeaseStore]:
    app = ctx.obj.app
    try:
        every = app_settings(app)
        settings = every.beat_election if beat else every.worker
        store = open_store(
            settings.backend_url,
            timeout=max(settings.timing.op_timeout, 2.0),
            options=settings.store_options,
        )
    except (ConfigurationError, StoreError) as exc:
        _fail(ctx, str(exc))
    return every, settings, store


def _read(ctx: click.Context, store: LeaseStore, name: str) -> LeaseRecord | None:
    try:
        return store.read(name)
    except StoreError as exc:
        _fail(ctx, str(exc))


def _holder(record: LeaseRecord | None) -> dict[str, Any] | None:
    if record is None:
        return None
    return {
        "nodename": record.nodename,
        "hostname": record.hostname,
        "pid": record.pid,
        "token": record.token,
        "acquired_at": record.acquired_at,
        "expires_in": round(record.expires_in, 3),
        "hold_off": round(record.hold_off, 3),
    }


def status_payload(
    settings: LeaderSettings,
    store: LeaseStore,
    record: LeaseRecord | None,
    beat: LeaseRecord | None = None,
    *,
    with_beat: bool = True,
) -> dict[str, Any]:
    """The JSON object ``leader status --json`` prints.

    ``leader`` is the holder of the election asked about; when that is the
    workers' election, ``beat`` is the holder of beat's (or null).
    """
    payload = {"name": settings.name, "store": store.url, "leader": _holder(record)}
    if with_beat:
        payload["beat"] = _holder(beat)
    return payload


def _describe_holder(title: str, holder: dict[str, Any]) -> list[str]:
    acquired = datetime.fromtimestamp(holder["acquired_at"], tz=timezone.utc)
    lines = [
        f"{title:<11} {holder['nodename']} (host {holder['hostname']}, pid {holder['pid']})",
        f"token:      {holder['token']}",
        f"acquired:   {acquired:%Y-%m-%d %H:%M:%S} UTC "
        f"({max(0.0, time.time() - holder['acquired_at']):.1f} s ago)",
        f"expires in: {holder['expires_in']:.2f} s (renewed while the holder lives)",
    ]
    if holder["hold_off"] > 0:
        lines.append(f"holding off {holder['hold_off']:.2f} s: the store lost its data")
    return lines


def _human(payload: dict[str, Any]) -> str:
    lines = [f"election:   {payload['name']}", f"store:      {payload['store']}"]
    leader = payload["leader"]
    lines += ["leader:     none"] if leader is None else _describe_holder("leader:", leader)
    if "beat" in payload:
        beat = payload["beat"]
        lines += ["beat:       none"] if beat is None else _describe_holder("beat:", beat)[:2]
    return "\n".join(lines)


def _draining(ctx: click.Context, nodename: str) -> int:
    """How many leader tasks *nodename* still waits for while stepping down (0 if unknown)."""
    try:
        inspect = ctx.obj.app.control.inspect(destination=[nodename], timeout=2.0)
        replies = inspect._request("leader") or {}  # a plugin command: no method of its own
    except Exception:  # noqa: BLE001 - only a hint for the message
        return 0
    view = replies.get(nodename) or {}
    return int(view.get("draining") or 0) if view.get("stepping_down") else 0


# Celery adds the app's preload options (app.user_options["preload"]) to each
# of its top-level commands, this group included: they arrive in **kwargs and
# go on to the user_preload_options signal, as for Celery's own commands.
@click.group(name="leader", cls=cast("type[click.Group]", DYMGroup), short_help=GROUP_SHORT_HELP)
@click.pass_context
@_preload_options
def leader(ctx: click.Context, /, **kwargs: Any) -> None:
    """Leader election: who leads, and handing leadership over.

    Each command's --help lists its exit codes.
    """


@leader.command(cls=CeleryCommand, short_help=STATUS_SHORT_HELP, epilog=STATUS_EXIT_CODES)
@click.option(
    "-j",
    "--json",
    "as_json",
    cls=CeleryOption,
    is_flag=True,
    help_group="Status Options",
    help="Print one JSON object: name, store, leader (null or its holder), beat.",
)
@click.option(
    "--beat",
    cls=CeleryOption,
    is_flag=True,
    help_group="Status Options",
    help="Show beat's election instead of the workers'.",
)
@click.pass_context
def status(ctx: click.Context, as_json: bool, beat: bool) -> None:
    """Show the current holder of the lease, or that none holds it.

    The holder's nodename, host, pid, fencing token, when it acquired the
    lease and how long the lease has left; with the workers' election also
    beat's holder. The store URL is shown with its password masked.
    """
    every, settings, store = _open(ctx, beat)
    try:
        record = _read(ctx, store, settings.name)
        beat_record = None if beat else _read(ctx, store, every.names.beat)
    finally:
        store.close()
    payload = status_payload(settings, store, record, beat_record, with_beat=not beat)
    ctx.obj.echo(json.dumps(payload) if as_json else _human(payload))
    ctx.exit(EXIT_LEADER if record is not None else EXIT_NO_LEADER)


@leader.command(
    "step-down", cls=CeleryCommand, short_help=STEP_DOWN_SHORT_HELP, epilog=STEP_DOWN_EXIT_CODES
)
@click.option(
    "-t",
    "--timeout",
    cls=CeleryOption,
    default=10.0,
    show_default=True,
    type=click.FloatRange(0.5, 300),
    help_group="Step-down Options",
    help="Seconds to wait for the release.",
)
@click.pass_context
def step_down(ctx: click.Context, timeout: float) -> None:
    """Ask the current leader to stop leader work and release; another worker takes over.

    Only the worker holding the lease acts: it stops taking leader work,
    stops its leader tasks per leader_on_loss, releases the lease and sits
    out one ttl so that a standby leads. Waits for the release, then prints
    who stepped down and who leads now.
    """
    _, settings, store = _open(ctx, beat=False)
    try:
        record = _read(ctx, store, settings.name)
        if record is None:
            ctx.obj.echo(f"no leader holds election {settings.name!r}")
            ctx.exit(EXIT_NO_LEADER)
        replies: Any = None
        try:
            replies = ctx.obj.app.control.broadcast(
                "leader_step_down",
                destination=[record.nodename],
                reply=True,
                timeout=min(timeout, 3.0),
            )
        except Exception as exc:  # noqa: BLE001 - any broker failure is one clear line
            _fail(ctx, f"could not reach {record.nodename} through the broker: {exc}")
        deadline = time.monotonic() + timeout
        successor: LeaseRecord | None = record
        while time.monotonic() < deadline:
            successor = _read(ctx, store, settings.name)
            if successor is None or successor.token != record.token:
                break
            time.sleep(0.05)
    finally:
        store.close()
    if successor is not None and successor.token == record.token:
        draining = _draining(ctx, record.nodename)
        if draining:
            ctx.obj.echo(
                f"{record.nodename} stopped taking leader work but keeps the lease: "
                f"{draining} leader task(s) of term {record.token} still run and its pool "
                "cannot stop them; it releases when they end"
            )
            ctx.exit(EXIT_DRAINING)
        ctx.obj.echo(f"{record.nodename} did not release within {timeout:g} s (replies: {replies})")
        ctx.exit(EXIT_NO_LEADER)
    ctx.obj.echo(f"{record.nodename} stepped down (token {record.token})")
    if successor is None:
        ctx.obj.echo("now leading: nobody yet (a standby takes over within moments)")
    else:
        ctx.obj.echo(f"now leading: {successor.nodename} (token {successor.token})")
    ctx.exit(EXIT_LEADER)
