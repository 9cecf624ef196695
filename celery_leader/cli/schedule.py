"""``celery -A proj leader schedule list|pause|resume|run``: steer the led beat's entries.

Everything goes through the lease store, as ``step-down --beat`` does: beat
listens to no broker queue. The commands write pauses and run-now requests
into the control slot beside beat's election; the beat leader reads them at
most half a second later, publishes its view of the schedule into beat's
own state, and records each run-now send there
(:mod:`celery_leader.beat.controls`, :mod:`celery_leader.beat.steering`).
So none of these commands needs a beat of its own, and all work the same for
every scheduler ``LeaderScheduler`` wraps.

Exit codes: 0 done; 1 no such entry, no beat leader (``pause``, ``resume``,
``run``), no view published yet (``list``), or a run-now not sent in time;
2 the store cannot be read or written (one line, secrets masked).
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar, cast

import click
from celery.bin.base import CeleryCommand, CeleryOption
from click_didyoumean import DYMGroup  # type: ignore[import-untyped]

from celery_leader.beat.controls import (
    PAUSE_PREFIX,
    RAN_PREFIX,
    RUN_PREFIX,
    Controls,
    control_slot,
    pause_value,
    resume_value,
    run_value,
    view_of,
)
from celery_leader.beat.schedule_text import one_line
from celery_leader.cli.support import (
    EXIT_LEADER,
    EXIT_NO_LEADER,
    _call,
    _open,
    _read,
    write_slot,
)
from celery_leader.settings import LeaderSettings
from celery_leader.stores.base import Holder, LeaseRecord, LeaseStore

SCHEDULE_SHORT_HELP = "Steer beat's entries: list, pause, resume, run now."
SCHEDULE_EXIT_CODES = """\
\b
Exit codes:
  0  done
  1  no such entry, no beat leader (pause, resume, run), no schedule
     view published yet (list), a pause or resume the beat leader did
     not confirm or a run-now it did not send within --timeout, or
     another command writing the same control meanwhile
  2  the store cannot be read or written, or the command line is wrong
"""
#: Said when no beat ever published its view.
HINT_NO_VIEW = (
    "a beat leader running celery_leader.beat:LeaderScheduler publishes it within seconds "
    "of taking over"
)
#: How many entry names an error lists at most.
NAMES_SHOWN = 10


_F = TypeVar("_F", bound=Callable[..., Any])


def _finite(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """Refuse ``nan`` (click's FloatRange lets it through): it would never end a wait."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a number of seconds", ctx=ctx, param=param)
    return value


def _timeout_option(default: float, low: float, meaning: str) -> Callable[[_F], _F]:
    """``-t/--timeout``, as every schedule command takes it."""
    return click.option(
        "-t",
        "--timeout",
        cls=CeleryOption,
        default=default,
        show_default=True,
        type=click.FloatRange(low, 300),
        callback=_finite,
        help_group="Schedule Options",
        help=meaning,
    )


#: pause and resume wait this long for the beat leader to show the change.
_confirm_timeout = _timeout_option(5.0, 0.5, "Seconds to wait for the beat leader to confirm.")


@click.group(
    name="schedule", cls=cast("type[click.Group]", DYMGroup), short_help=SCHEDULE_SHORT_HELP
)
def schedule() -> None:
    """Beat's schedule as the beat leader sees it, and steering its entries.

    Pauses are kept in the lease store: they hold across beat failovers and
    restarts. Each command's --help lists its exit codes.
    """


@schedule.command("list", cls=CeleryCommand, epilog=SCHEDULE_EXIT_CODES)
@click.option(
    "-j",
    "--json",
    "as_json",
    cls=CeleryOption,
    is_flag=True,
    help_group="Schedule Options",
    help=(
        'Print one JSON object: {"election", "leader", "published_at", "entries": [{"name", '
        '"task", "schedule", "last_sent", "next_due", "paused", "paused_until", ...}]}.'
    ),
)
@click.pass_context
def list_entries(ctx: click.Context, as_json: bool) -> None:
    """Every entry of the led beat: task, schedule, last sent, next due, paused, policies.

    As the beat leader last published it (every few seconds while it leads,
    and after each change); pauses are shown as they stand in the store now.
    """
    _, settings, store = _open(ctx, beat=True)
    try:
        view = _view(ctx, store, settings)
        controls = _controls(ctx, store, settings)
        record = _read(ctx, store, settings.name)
    finally:
        store.close()
    entries = []
    for row in view.get("entries") or []:
        until = controls.paused_until(str(row.get("name")))
        entries.append(
            {
                **row,
                "paused": until is not None,
                "paused_until": None if until is None or math.isinf(until) else until,
            }
        )
    payload = {
        "election": settings.name,
        "leader": record.nodename if record is not None else None,
        "published_at": view.get("published_at"),
        "published_by": view.get("holder"),
        "entries": entries,
    }
    ctx.obj.echo(json.dumps(payload) if as_json else _table(payload))
    ctx.exit(EXIT_LEADER)


@schedule.command("pause", cls=CeleryCommand, epilog=SCHEDULE_EXIT_CODES)
@click.argument("entry")
@click.option(
    "--for",
    "for_seconds",
    cls=CeleryOption,
    type=click.FloatRange(min=0, min_open=True),
    callback=_finite,
    default=None,
    help_group="Schedule Options",
    help="End the pause after this many seconds, as resume would (default: until resumed).",
)
@_confirm_timeout
@click.pass_context
def pause(ctx: click.Context, entry: str, for_seconds: float | None, timeout: float) -> None:
    """Stop sending ENTRY until resumed (or for --for seconds); its slots meanwhile are skipped.

    Kept in the lease store: a beat that takes over, or restarts, reads it
    before it sends anything. Waits until the beat leader shows the pause.
    """
    at = time.time()
    until = at + for_seconds if for_seconds is not None else None
    _steer(
        ctx, entry, timeout, PAUSE_PREFIX, lambda by: pause_value(until, by, at), paused=True, at=at
    )


@schedule.command("resume", cls=CeleryCommand, epilog=SCHEDULE_EXIT_CODES)
@click.argument("entry")
@_confirm_timeout
@click.pass_context
def resume(ctx: click.Context, entry: str, timeout: float) -> None:
    """Send ENTRY again from its next due slot; the slots it missed while paused are not sent."""
    at = time.time()
    _steer(ctx, entry, timeout, PAUSE_PREFIX, lambda by: resume_value(by, at), paused=False, at=at)


@schedule.command("run", cls=CeleryCommand, epilog=SCHEDULE_EXIT_CODES)
@click.argument("entry")
@_timeout_option(10.0, 1, "Seconds the beat leader has to send it; the request expires after that.")
@click.pass_context
def run(ctx: click.Context, entry: str, timeout: float) -> None:
    """Send ENTRY once now, through the beat leader, as a manual occurrence.

    Also for a paused entry; its next due time does not move. The task reads
    ``self.request.leader_occurrence`` as ``"ENTRY@manual:<request time>"``.
    """
    request_id = uuid.uuid4().hex
    at = time.time()
    outcome = _steer(
        ctx,
        entry,
        timeout,
        RUN_PREFIX,
        lambda by: run_value(request_id, at, at + timeout, by),
        ran=request_id,
    )
    if outcome is None:
        ctx.obj.echo(
            f"the beat leader did not send {entry!r} within {timeout:g} s; the request expired "
            "unsent"
        )
        ctx.exit(EXIT_NO_LEADER)
    ctx.obj.echo(f"{entry} sent as {outcome.get('occurrence')}")
    ctx.exit(EXIT_LEADER)


def _steer(
    ctx: click.Context,
    entry: str,
    timeout: float,
    prefix: str,
    value: Callable[[str], str],
    *,
    paused: bool | None = None,
    at: float | None = None,
    ran: str | None = None,
) -> dict[str, Any] | None:
    """Check the entry and the beat leader, write the control, wait for the leader to act.

    Returns what the beat leader recorded for a run-now (*ran*, the
    request id), or None when it did not within *timeout*. For a pause or a
    resume (*paused*), prints the outcome and exits.
    """
    deadline = time.monotonic() + timeout
    _, settings, store = _open(ctx, beat=True)
    try:
        view = _view(ctx, store, settings)
        names = [str(row.get("name")) for row in view.get("entries") or []]
        # An entry gone from the schedule may still be paused: it can be resumed.
        stale_pause = paused is False and entry in _controls(ctx, store, settings).pauses
        if entry not in names and not stale_pause:
            _no_such_entry(ctx, settings, entry, names)
        record = _read(ctx, store, settings.name)
        if record is None:
            ctx.obj.echo(
                f"no beat leader holds election {settings.name!r}: nothing changed (a beat "
                "running celery_leader.beat:LeaderScheduler must lead)"
            )
            ctx.exit(EXIT_NO_LEADER)
        asking = Holder.for_this_process(f"schedule-{Holder.for_this_process().nodename}")
        write_slot(
            ctx,
            store,
            settings,
            slot=control_slot(settings.name),
            key=f"{prefix}{entry}",
            value=value(asking.nodename),
            deadline=deadline,
            asking=asking,
            what="schedule control",
        )
        if ran is not None:
            return _await_run(
                ctx, store, settings, entry=entry, request_id=ran, deadline=deadline + 1.0
            )
        assert paused is not None
        assert at is not None
        confirmed = stale_pause or _await_view(
            ctx, store, settings, entry=entry, control_at=at, deadline=deadline
        )
    finally:
        store.close()
    _say_steered(ctx, record, entry, paused=paused, confirmed=confirmed)
    return None


def _say_steered(
    ctx: click.Context, record: LeaseRecord, entry: str, *, paused: bool, confirmed: bool
) -> None:
    done = "paused" if paused else "resumed"
    if confirmed:
        ctx.obj.echo(f"{entry} {done} (beat leader {record.nodename} confirmed)")
        ctx.exit(EXIT_LEADER)
    # Written, but the beat leader has not shown it: it may not be in effect yet.
    ctx.obj.echo(
        f"{entry} {done} in the lease store, but beat leader {record.nodename} did not confirm "
        "within --timeout: it may not lead any more, or not reach the store (a beat that "
        "takes over reads it before it sends)"
    )
    ctx.exit(EXIT_NO_LEADER)


def _view(ctx: click.Context, store: LeaseStore, settings: LeaderSettings) -> dict[str, Any]:
    """The view the beat leader published last; exit 1 when none was."""
    view = view_of(_call(ctx, lambda: store.get_state(settings.name)))
    if view is None:
        ctx.obj.echo(f"no beat has published a schedule view for election {settings.name!r}:")
        ctx.obj.echo(HINT_NO_VIEW)
        ctx.exit(EXIT_NO_LEADER)
    return view


def _controls(ctx: click.Context, store: LeaseStore, settings: LeaderSettings) -> Controls:
    return Controls.from_state(_call(ctx, lambda: store.get_state(control_slot(settings.name))))


def _no_such_entry(
    ctx: click.Context, settings: LeaderSettings, entry: str, names: list[str]
) -> None:
    shown = ", ".join(sorted(names)[:NAMES_SHOWN]) or "none"
    more = f" and {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else ""
    ctx.obj.echo(
        f"no entry {entry!r} in the schedule of {settings.name!r} (entries: {shown}{more})"
    )
    ctx.exit(EXIT_NO_LEADER)


def _await_view(
    ctx: click.Context,
    store: LeaseStore,
    settings: LeaderSettings,
    *,
    entry: str,
    control_at: float,
    deadline: float,
) -> bool:
    """True once the beat leader's view shows *entry* under the control written at *control_at*.

    The view echoes the stamp of the control it reflects: no clock of two
    hosts is compared.
    """
    while time.monotonic() < deadline:
        view = view_of(_call(ctx, lambda: store.get_state(settings.name))) or {}
        for row in view.get("entries") or []:
            if row.get("name") == entry and row.get("control_at") == control_at:
                return True
        time.sleep(0.1)
    return False


def _await_run(
    ctx: click.Context,
    store: LeaseStore,
    settings: LeaderSettings,
    *,
    entry: str,
    request_id: str,
    deadline: float,
) -> dict[str, Any] | None:
    """The beat leader's record of the run-now *request_id*, or None at *deadline*."""
    key = f"{RAN_PREFIX}{entry}"
    while time.monotonic() < deadline:
        raw = _call(ctx, lambda: store.get_state(settings.name)).get(key)
        if raw is not None:
            try:
                record = json.loads(raw)
            except ValueError:
                record = None
            if isinstance(record, dict) and record.get("id") == request_id:
                return record
        time.sleep(0.1)
    return None


def _table(payload: dict[str, Any]) -> str:
    """The human view: a title line, the column headings, then one line per entry."""
    published = payload.get("published_at")
    age = f"{max(0.0, time.time() - published):.0f} s ago" if published else "at an unknown time"
    leader = payload.get("leader") or "nobody"
    by = payload.get("published_by")
    source = f"published {age}" if by in (None, leader) else f"published {age} by {by}"
    lines = [f"beat election {payload['election']}: led by {leader} (view {source}; times UTC)"]
    header = ("ENTRY", "TASK", "SCHEDULE", "LAST SENT", "NEXT DUE", "PAUSED")
    rows = [header]
    for row in payload["entries"]:
        paused = "no"
        if row.get("paused"):
            until = row.get("paused_until")
            paused = f"until {_utc(until)}" if until else "yes"
        # Each cell on one line, whatever a beat (of an earlier version too) published.
        rows.append(
            (
                one_line(row.get("name")),
                one_line(row.get("task")),
                one_line(row.get("schedule")),
                _utc(row.get("last_sent")),
                _utc(row.get("next_due")),
                paused,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines += [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    return "\n".join(lines)


def _utc(moment: Any) -> str:
    if not isinstance(moment, (int, float)):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(moment))
