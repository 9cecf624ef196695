"""``celery -A proj leader status|step-down``: who leads, and handing over.

Registered as a Celery CLI plugin (entry point group ``celery.commands``).
Exit codes: ``status`` 0 when a leader holds the lease, 1 when none does;
``step-down`` 0 when the lease was released, 1 when no leader held it (or it
was not released in time), 3 when the leader keeps the lease because leader
tasks of its term still run in a pool that cannot stop them (threads, solo,
gevent, eventlet: it releases when they end); both 2 when the store cannot be
read (one line on stderr, no traceback). Store URLs are printed with secrets
masked.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Any

import click

from celery_leader._masking import mask_text
from celery_leader.exceptions import ConfigurationError, StoreError
from celery_leader.settings import LeaderSettings, settings_for_app
from celery_leader.stores import open_store
from celery_leader.stores.base import LeaseRecord, LeaseStore

BEAT_SUFFIX = ".beat"
EXIT_LEADER = 0
EXIT_NO_LEADER = 1
EXIT_STORE_ERROR = 2
EXIT_DRAINING = 3


def _fail(ctx: click.Context, message: str) -> None:
    click.echo(f"celery leader: {mask_text(message)}", err=True)
    ctx.exit(EXIT_STORE_ERROR)


def _open(ctx: click.Context, beat: bool) -> tuple[LeaderSettings, LeaseStore]:
    app = ctx.obj.app
    try:
        settings = settings_for_app(app, name_suffix=BEAT_SUFFIX if beat else "")
        store = open_store(
            settings.backend_url,
            timeout=max(settings.timing.op_timeout, 2.0),
            options=settings.store_options,
        )
    except (ConfigurationError, StoreError) as exc:
        _fail(ctx, str(exc))
        raise  # unreachable: ctx.exit raises
    return settings, store


def _read(ctx: click.Context, store: LeaseStore, name: str) -> LeaseRecord | None:
    try:
        return store.read(name)
    except StoreError as exc:
        _fail(ctx, str(exc))
        raise


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
) -> dict[str, Any]:
    """The JSON object ``leader status --json`` prints.

    ``leader`` is the holder of the election asked about; when that is the
    workers' election, ``beat`` is the holder of beat's (or null).
    """
    payload = {"name": settings.name, "store": store.url, "leader": _holder(record)}
    if not settings.name.endswith(BEAT_SUFFIX):
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


@click.group(name="leader")
def leader() -> None:
    """Leader election: who leads, and handing leadership over."""


@leader.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--beat", is_flag=True, help="Show beat's election instead of the workers'.")
@click.pass_context
def status(ctx: click.Context, as_json: bool, beat: bool) -> None:
    """Show the current holder of the lease (exit 0), or that none holds it (exit 1)."""
    settings, store = _open(ctx, beat)
    try:
        record = _read(ctx, store, settings.name)
        beat_record = None if beat else _read(ctx, store, settings.name + BEAT_SUFFIX)
    finally:
        store.close()
    payload = status_payload(settings, store, record, beat_record)
    click.echo(json.dumps(payload) if as_json else _human(payload))
    ctx.exit(EXIT_LEADER if record is not None else EXIT_NO_LEADER)


@leader.command("step-down")
@click.option(
    "--timeout",
    default=10.0,
    show_default=True,
    type=click.FloatRange(0.5, 300),
    help="Seconds to wait for the release.",
)
@click.pass_context
def step_down(ctx: click.Context, timeout: float) -> None:
    """Ask the current leader to stop leader work and release; another worker takes over.

    Exit 0 when the lease was released, 1 when no leader held it or it was not
    released in time, 2 when the store cannot be read, 3 when the leader keeps
    the lease until leader tasks its pool cannot stop have ended.
    """
    settings, store = _open(ctx, beat=False)
    try:
        record = _read(ctx, store, settings.name)
        if record is None:
            click.echo(f"no leader holds election {settings.name!r}")
            ctx.exit(EXIT_NO_LEADER)
        assert record is not None
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
            click.echo(
                f"{record.nodename} stopped taking leader work but keeps the lease: "
                f"{draining} leader task(s) of term {record.token} still run and its pool "
                "cannot stop them; it releases when they end"
            )
            ctx.exit(EXIT_DRAINING)
        click.echo(f"{record.nodename} did not release within {timeout:g} s (replies: {replies})")
        ctx.exit(EXIT_NO_LEADER)
    click.echo(f"{record.nodename} stepped down (token {record.token})")
    if successor is None:
        click.echo("now leading: nobody yet (a standby takes over within moments)")
    else:
        click.echo(f"now leading: {successor.nodename} (token {successor.token})")
    ctx.exit(EXIT_LEADER)
