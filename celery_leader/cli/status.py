"""``celery -A proj leader status``: who holds an election's lease, and whether it leads yet.

Exit codes: 0 when somebody holds the lease (also a holder still in the
hold-off of a new or emptied store, which does not lead yet: the output says
so), 1 when nobody does, 2 when the store cannot be read (one line on
stderr, no traceback). The store URL is printed with secrets masked.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timezone
from typing import Any

import click
from celery.bin.base import CeleryCommand, CeleryOption

from celery_leader.cli.support import EXIT_LEADER, EXIT_NO_LEADER, _open, _read
from celery_leader.exceptions import StoreError
from celery_leader.settings import AppSettings, LeaderSettings
from celery_leader.stores.base import LeaseRecord, LeaseStore, TokenHistory

logger = logging.getLogger(__name__)

#: A holder counts as overdue once this many renew intervals passed without a renewal.
#: A live holder renews about every interval; the half interval more allows for the
#: renewal's own round trip and for a store clock read in whole seconds (Azure).
OVERDUE_AFTER_INTERVALS = 1.5

# Help texts and hints, in one place so the wording is reviewed together. The command
# sets short_help: click would otherwise cut the docstring's first sentence to fit
# ``celery leader --help``. A ``\b`` paragraph keeps click from rewrapping the exit-code
# table in ``--help``.
STATUS_SHORT_HELP = "Show who holds the lease (exit 0), or that none does (1)."
STATUS_EXIT_CODES = """\
\b
Exit codes:
  0  somebody holds the lease (the output says when its holder is
     still holding off: the first holder of a new or emptied store
     waits one ttl before it leads)
  1  nobody holds the lease
  2  the store cannot be read (unreachable, wrong credentials, bad
     leader_* settings), or the command line is wrong
"""
#: Said when no worker ever held the workers' lease in this store.
HINT_NO_WORKER = (
    "no worker has ever held it in this store (new or emptied): a worker leads only when it "
    "runs with the LeaderElection step, "
    'app.steps["worker"].add(LeaderElection) or celery_leader.install(app)'
)
#: Said when no beat ever held beat's lease in this store.
HINT_NO_BEAT = (
    "no beat has ever held it in this store (new or emptied): a beat leads only when it "
    'runs with beat_scheduler = "celery_leader.beat:LeaderScheduler"'
)
HOLD_OFF_REASON = (
    "a new or emptied store makes its first holder wait one ttl before it leads "
    "(an earlier leader may still act)"
)


def _ever_held(ctx: click.Context, store: LeaseStore, name: str) -> bool | None:
    """Whether a term of *name* ever began in *store*; None when the store cannot say."""
    if not isinstance(store, TokenHistory):
        return None
    try:  # only a hint: a failed look leaves it out, the status itself was read
        return store.last_token(name) is not None
    except StoreError:
        return None


def _holder(record: LeaseRecord | None, renew_interval: float) -> dict[str, Any] | None:
    """The JSON view of a lease's holder.

    ``leading`` is false while the holder holds off (``hold_off`` seconds
    more, until ``hold_off_until``, unix time); ``renewed_ago`` is how long
    ago its last acquire or renewal landed (null when the store cannot tell),
    and ``overdue`` says that is more than :data:`OVERDUE_AFTER_INTERVALS`
    renew intervals: a holder that stopped renewing (killed, paused, cut off
    from the store) still holds the lease until it expires. ``lifeline`` is
    true when the term is tied to its process's lifeline
    (``leader_fast_failover``): its death is seen at once.
    """
    if record is None:
        return None
    holding_off = record.hold_off > 0
    renewed_ago = None if record.renewed_ago is None else round(record.renewed_ago, 3)
    return {
        "nodename": record.nodename,
        "hostname": record.hostname,
        "pid": record.pid,
        "token": record.token,
        "acquired_at": record.acquired_at,
        "expires_in": round(record.expires_in, 3),
        "hold_off": round(record.hold_off, 3),
        "hold_off_until": round(time.time() + record.hold_off, 3) if holding_off else None,
        "leading": not holding_off,
        "renewed_ago": renewed_ago,
        "overdue": (
            None if renewed_ago is None else renewed_ago > OVERDUE_AFTER_INTERVALS * renew_interval
        ),
        "lifeline": bool(record.lifeline),
    }


def status_payload(
    settings: LeaderSettings,
    store: LeaseStore,
    record: LeaseRecord | None,
    beat: LeaseRecord | None = None,
    *,
    beat_settings: LeaderSettings | None = None,
    ever_held: bool | None = None,
) -> dict[str, Any]:
    """The JSON object ``leader status --json`` prints.

    ``leader`` and ``holder`` are whoever holds the lease of the election
    asked about (null when nobody does); ``leading`` in it is false while the
    holder waits out a first-start hold-off, when it does no leader work yet.
    ``ever_held`` says whether a term ever began in this store (null: the
    store cannot tell). With *beat_settings*
    (the workers' election asked about), ``beat`` is the holder of beat's.
    """
    holder = _holder(record, settings.timing.renew_interval)
    payload = {
        "name": settings.name,
        "store": store.url,
        "leader": holder,
        "holder": holder,
        "renew_interval": round(settings.timing.renew_interval, 3),
        "ever_held": True if record is not None else ever_held,
    }
    if beat_settings is not None:
        payload["beat"] = _holder(beat, beat_settings.timing.renew_interval)
    return payload


def known_elections(app: Any, every: AppSettings) -> list[str]:
    """The named elections this app knows: its imported leader tasks' and ``leader_elections``."""
    from celery_leader.tasks import resolve_leader_tasks  # noqa: PLC0415 - only for status
    from celery_leader.tasks.registry import leader_task_elections  # noqa: PLC0415

    try:
        resolve_leader_tasks(app)
    except Exception:  # a task that cannot be made leader-only is logged there
        logger.debug("celery-leader: could not resolve the app's leader tasks", exc_info=True)
    named = {e for e in leader_task_elections(app).values() if e is not None}
    named |= set(every.choice.extra)
    named |= {e for _, e in every.task_routes if e is not None}
    return sorted(named)


def _elections_payload(
    ctx: click.Context, store: LeaseStore, every: AppSettings, named: list[str]
) -> dict[str, Any]:
    """``"elections"`` of ``status --json``: the default one (by lease name) and each named one."""
    found: dict[str, Any] = {}
    for election in [None, *named]:
        settings = every.for_named(election)
        found[election or settings.name] = _holder(
            _read(ctx, store, settings.name), settings.timing.renew_interval
        )
    return found


def _elections_table(elections: dict[str, Any]) -> list[str]:
    """One row per election: holder, token, held for, expires in."""
    rows = [("ELECTION", "HOLDER", "TOKEN", "HELD FOR", "EXPIRES IN")]
    now = time.time()
    for name, holder in elections.items():
        if holder is None:
            rows.append((name, "-", "-", "-", "-"))
            continue
        who = holder["nodename"] + ("" if holder["leading"] else " (holding off)")
        held = f"{max(0.0, now - holder['acquired_at']):.1f} s"
        rows.append((name, who, str(holder["token"]), held, f"{holder['expires_in']:.2f} s"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def _field(label: str, text: str) -> str:
    return f"{label:<11} {text}"


def _who(holder: dict[str, Any]) -> str:
    return f"{holder['nodename']} (host {holder['hostname']}, pid {holder['pid']})"


def _utc(moment: float) -> str:
    return f"{datetime.fromtimestamp(moment, tz=timezone.utc):%Y-%m-%d %H:%M:%S} UTC"


def _renewal(holder: dict[str, Any], renew_interval: float) -> str:
    every = f"renews every {renew_interval:.2g} s"
    if holder["renewed_ago"] is None:
        return f"unknown: its record does not say ({every})"
    overdue = "overdue: " if holder["overdue"] else ""
    return f"{holder['renewed_ago']:.1f} s ago ({overdue}{every})"


def _describe_holder(holder: dict[str, Any], renew_interval: float) -> list[str]:
    """Token, acquisition, last renewal and expiry of a holder, one line each."""
    if holder["overdue"]:
        expiry = "its holder has stopped renewing: if it is gone, another takes over then"
    else:
        expiry = "renewed while the holder lives"
    return [
        _field("token:", str(holder["token"])),
        _field(
            "acquired:",
            f"{_utc(holder['acquired_at'])} "
            f"({max(0.0, time.time() - holder['acquired_at']):.1f} s ago)",
        ),
        _field("renewed:", _renewal(holder, renew_interval)),
        _field("expires in:", f"{holder['expires_in']:.2f} s ({expiry})"),
        *(
            [_field("if it dies:", "replaced within about 0.3 s (its term is tied to a lifeline)")]
            if holder.get("lifeline")
            else []
        ),
    ]


def _nobody(payload: dict[str, Any], hint: str) -> list[str]:
    if payload["ever_held"] is False:
        return [_field("leader:", "none: nobody holds the lease"), _field("hint:", hint)]
    if payload["ever_held"]:
        return [
            _field(
                "leader:",
                "none: nobody holds the lease (held before: a standby takes it within "
                "about one ttl, if one runs)",
            )
        ]
    return [_field("leader:", "none: nobody holds the lease")]


def _beat_summary(beat: dict[str, Any] | None) -> list[str]:
    """Beat's holder in two lines, for the workers' status."""
    if beat is None:
        return [_field("beat:", "none")]
    state = ""
    if not beat["leading"]:
        state = f", holding off {beat['hold_off']:.2f} s more: not sending yet"
    elif beat["overdue"]:
        state = f", last renewed {beat['renewed_ago']:.1f} s ago (overdue)"
    return [_field("beat:", _who(beat) + state), _field("token:", str(beat["token"]))]


def _human(payload: dict[str, Any], *, hint: str) -> str:
    lines = [_field("election:", payload["name"]), _field("store:", payload["store"])]
    holder = payload["holder"]
    renew_interval = payload["renew_interval"]
    if holder is None:
        lines += _nobody(payload, hint)
    elif holder["leading"]:
        lines += [_field("leader:", _who(holder)), *_describe_holder(holder, renew_interval)]
    else:
        lines += [
            _field("leader:", "none yet (its holder is holding off, not leading)"),
            _field("holder:", _who(holder)),
            _field(
                "holds off:",
                f"until {_utc(holder['hold_off_until'])} ({holder['hold_off']:.2f} s from "
                f"now): {HOLD_OFF_REASON}",
            ),
            *_describe_holder(holder, renew_interval),
        ]
    if "beat" in payload:
        lines += _beat_summary(payload["beat"])
    if len(payload.get("elections") or {}) > 1:
        lines += ["", *_elections_table(payload["elections"])]
    return "\n".join(lines)


@click.command(cls=CeleryCommand, short_help=STATUS_SHORT_HELP, epilog=STATUS_EXIT_CODES)
@click.option(
    "-j",
    "--json",
    "as_json",
    cls=CeleryOption,
    is_flag=True,
    help_group="Status Options",
    help=(
        "Print one JSON object: name, store, leader (null unless its holder leads), "
        "holder, renew_interval, ever_held, beat."
    ),
)
@click.option(
    "--beat",
    cls=CeleryOption,
    is_flag=True,
    help_group="Status Options",
    help="Show beat's election instead of the workers'.",
)
@click.option(
    "--election",
    cls=CeleryOption,
    default=None,
    help_group="Status Options",
    help="Show this named election (@leader_only(election=...)) instead of the default one.",
)
@click.pass_context
def status(ctx: click.Context, as_json: bool, beat: bool, election: str | None) -> None:
    """Show the current holder of the lease, whether it leads yet, or that none holds it.

    The holder's nodename, host, pid, fencing token, when it acquired the
    lease, how long ago it last renewed it (marked overdue past one and a
    half renew intervals: it may have stopped) and how long the lease has
    left. A holder in the hold-off of a new or emptied store does not lead
    yet: status says so and until when (exit 0: it holds the lease). With nobody holding the lease,
    it says whether anyone ever did. With the workers' election also beat's
    holder. The store URL is shown with its password masked.
    """
    every, settings, store = _open(ctx, beat, election)
    try:
        record = _read(ctx, store, settings.name)
        beat_record = None if beat else _read(ctx, store, every.names.beat)
        ever_held = _ever_held(ctx, store, settings.name) if record is None else True
        elections = (
            None
            if beat
            else _elections_payload(ctx, store, every, known_elections(ctx.obj.app, every))
        )
    finally:
        store.close()
    payload = status_payload(
        settings,
        store,
        record,
        beat_record,
        beat_settings=None if beat else every.beat_election,
        ever_held=ever_held,
    )
    if elections is not None:
        payload["elections"] = elections
    hint = HINT_NO_BEAT if beat else HINT_NO_WORKER
    ctx.obj.echo(json.dumps(payload) if as_json else _human(payload, hint=hint))
    # The contract's codes: 0 while somebody holds the lease (also in its hold-off).
    ctx.exit(EXIT_LEADER if payload["leader"] is not None else EXIT_NO_LEADER)
