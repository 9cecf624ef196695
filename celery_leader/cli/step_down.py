"""``celery -A proj leader step-down``: ask the leader to hand over.

Exit codes: 0 when the lease was released, 1 when no leader held it (or it
was not released in time), 3 when the leader keeps the lease because leader
tasks of its term still run in a pool that cannot stop them (threads, solo,
gevent, eventlet: it releases when they end), 2 when the store or the broker
cannot be reached (one line on stderr, no traceback).
"""

from __future__ import annotations

import time
from typing import Any

import click
from celery.bin.base import CeleryCommand, CeleryOption

from celery_leader.cli.support import (
    EXIT_DRAINING,
    EXIT_LEADER,
    EXIT_NO_LEADER,
    _fail,
    _open,
    _read,
    write_slot,
)
from celery_leader.settings import LeaderSettings
from celery_leader.stores.base import Holder, LeaseRecord, LeaseStore

STEP_DOWN_SHORT_HELP = "Ask the leader to release so that another worker leads."
STEP_DOWN_EXIT_CODES = """\
\b
Exit codes:
  0  the lease was released (who leads now is printed)
  1  no leader held the lease, or it was not released within --timeout
  2  the store or the broker cannot be reached, or the command line is wrong
  3  the leader stopped taking leader work but keeps the lease until
     leader tasks its pool cannot stop (threads, solo, gevent, eventlet)
     have ended; it releases then (workers only)
"""


def _draining(ctx: click.Context, nodename: str, election: str | None = None) -> int:
    """How many leader tasks *nodename* still waits for while stepping down (0 if unknown)."""
    try:
        inspect = ctx.obj.app.control.inspect(destination=[nodename], timeout=2.0)
        replies = inspect._request("leader") or {}  # a plugin command: no method of its own
    except Exception:  # noqa: BLE001 - only a hint for the message
        return 0
    view = replies.get(nodename) or {}
    if election:
        view = (view.get("elections") or {}).get(election) or {}
    return int(view.get("draining") or 0) if view.get("stepping_down") else 0


@click.command(
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
    help="Seconds to wait for the release and then for a standby to take the lease.",
)
@click.option(
    "--beat",
    cls=CeleryOption,
    is_flag=True,
    help_group="Step-down Options",
    help=(
        "Step beat's leader down instead of the workers': the beat that sends releases "
        "beat's lease and sits out one ttl, so that another beat sends."
    ),
)
@click.option(
    "--election",
    cls=CeleryOption,
    default=None,
    help_group="Step-down Options",
    help="Step down the holder of this named election instead of the default one's.",
)
@click.pass_context
def step_down(ctx: click.Context, timeout: float, beat: bool, election: str | None) -> None:
    """Ask the current leader to stop leader work and release; another worker takes over.

    Only the worker holding the lease acts: it stops taking leader work,
    stops its leader tasks per leader_on_loss, releases the lease and sits
    out one ttl so that a standby leads. Waits for the release, then for a
    standby to take the lease (both within --timeout), and prints who
    stepped down and who took over (or that nobody had yet).

    With --beat, the beat holding beat's lease does the same: it reads the
    request from the lease store (beat listens to no broker queue), at most
    a second after it was written while it sends, releases once no send of
    its term may still land unrecorded, and sits out one ttl.
    """
    _, settings, store = _open(ctx, beat=beat, election=election)
    try:
        record = _read(ctx, store, settings.name)
        if record is None:
            who = "beat leader" if beat else "leader"
            ctx.obj.echo(f"no {who} holds election {settings.name!r}")
            ctx.exit(EXIT_NO_LEADER)
        deadline = time.monotonic() + timeout
        if beat and record.hold_off > 0:
            # It does not send yet, so it does not look for requests: one left now would
            # be acted on only after this command gave up.
            ctx.obj.echo(
                f"{record.nodename} holds beat's lease but is holding off "
                f"{record.hold_off:.1f} s more and sends nothing yet: ask again after that"
            )
            ctx.exit(EXIT_NO_LEADER)
        if beat:
            _ask_beat(ctx, store, settings, record, deadline)
            replies: Any = None
        else:
            replies = _ask_worker(ctx, record, timeout, election)
            deadline = time.monotonic() + timeout
        successor = _await_release(ctx, store, settings.name, record, deadline)
        if successor is None:
            successor = _await_holder(ctx, store, settings.name, deadline)
    finally:
        store.close()
    if successor is not None and successor.token == record.token:
        if beat:
            ctx.obj.echo(
                f"{record.nodename} did not release within {timeout:g} s (a beat running "
                "celery_leader.beat:LeaderScheduler looks for the request every second while "
                "it sends)"
            )
            ctx.exit(EXIT_NO_LEADER)
        draining = _draining(ctx, record.nodename, election)
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
        standby = "another beat" if beat else "a standby"
        ctx.obj.echo(
            f"now leading: nobody yet ({standby} did not take the lease within --timeout "
            f"{timeout:g} s; `celery leader status` shows who leads)"
        )
    else:
        ctx.obj.echo(f"now leading: {successor.nodename} (token {successor.token})")
    ctx.exit(EXIT_LEADER)


def _ask_worker(
    ctx: click.Context, record: LeaseRecord, timeout: float, election: str | None = None
) -> Any:
    """Send the step-down control command to the worker holding the lease; its replies."""
    try:
        return ctx.obj.app.control.broadcast(
            "leader_step_down",
            arguments={"election": election} if election else None,
            destination=[record.nodename],
            reply=True,
            timeout=min(timeout, 3.0),
        )
    except Exception as exc:  # noqa: BLE001 - any broker failure is one clear line
        _fail(ctx, f"could not reach {record.nodename} through the broker: {exc}")


def _ask_beat(
    ctx: click.Context,
    store: LeaseStore,
    settings: LeaderSettings,
    record: LeaseRecord,
    deadline: float,
) -> None:
    """Write a step-down request for the term of *record* where the beat leader reads it.

    Beat consumes no broker queue, so the request goes through the lease
    store: into the state of a request slot beside beat's election
    (:func:`celery_leader.beat.step_down.step_down_channel`), which only a
    lease holder may write. The command takes that slot's lease for the
    moment of the write and releases it (a concurrent request waits for it).
    The request names the term's token, so it can only end that term: a
    beat elected since is left alone (a request read after this command
    gave up may still end the term it names). Nothing here
    touches beat's own lease; only its holder releases it.
    """
    # Imported here: every ``celery`` command loads this module, and only this one needs beat.
    from celery_leader.beat.step_down import (  # noqa: PLC0415
        STEP_DOWN_KEY,
        step_down_channel,
        step_down_request,
    )

    channel = step_down_channel(settings.name)
    asking = Holder.for_this_process(f"step-down-{Holder.for_this_process().nodename}")
    value = step_down_request(record.token, asking.nodename)
    write_slot(
        ctx,
        store,
        settings,
        slot=channel,
        key=STEP_DOWN_KEY,
        value=value,
        deadline=deadline,
        asking=asking,
        what="step-down request",
    )


def _await_release(
    ctx: click.Context, store: LeaseStore, name: str, record: LeaseRecord, deadline: float
) -> LeaseRecord | None:
    """The holder of *name* once the term of *record* ended, or that term's record at *deadline*."""
    successor: LeaseRecord | None = record
    while time.monotonic() < deadline:
        successor = _read(ctx, store, name)
        if successor is None or successor.token != record.token:
            break
        time.sleep(0.05)
    return successor


def _await_holder(
    ctx: click.Context, store: LeaseStore, name: str, deadline: float
) -> LeaseRecord | None:
    """The holder of the free lease *name* once somebody took it, or None at *deadline*."""
    while time.monotonic() < deadline:
        found = _read(ctx, store, name)
        if found is not None:
            return found
        time.sleep(0.05)
    return None
