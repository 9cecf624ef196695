"""``celery-leader``, the console script: ``celery-leader demo`` runs the demo.

Also ``python -m celery_leader`` (:mod:`celery_leader.__main__`).
"""

from __future__ import annotations

import click

from celery_leader.demo.celery_demo import run_celery_demo
from celery_leader.demo.lease_demo import run_lease_demo


@click.group()
@click.version_option(package_name="celery-leader")
def main() -> None:
    """celery-leader: leader election for Celery."""


#: The demo's lease ttl when --ttl is not given, without and with --quick.
DEMO_TTL, DEMO_QUICK_TTL = 3.0, 2.0


@main.command()
@click.option("--broker", default=None, help="Broker URL (default: kombu's filesystem transport).")
@click.option("--store", default=None, help="Lease store URL (default: SQLite in a temp dir).")
@click.option(
    "--nodes",
    default=3,
    show_default=True,
    type=click.IntRange(2, 20),
    help="How many workers to start (lease managers with --lease-only).",
)
@click.option(
    "--ttl",
    default=None,
    type=click.FloatRange(1, 60),
    help=(
        f"Lease ttl in seconds, {DEMO_TTL:g} by default and {DEMO_QUICK_TTL:g} with --quick: "
        "a killed leader blocks the next one for up to this long."
    ),
)
@click.option(
    "--quick",
    is_flag=True,
    help=f"A shorter run: shorter pauses, and a {DEMO_QUICK_TTL:g} s ttl unless --ttl is given.",
)
@click.option("--lease-only", is_flag=True, help="Lease managers alone, no Celery.")
def demo(  # noqa: PLR0917 - click passes every option as an argument
    broker: str | None,
    store: str | None,
    nodes: int,
    ttl: float | None,
    quick: bool,
    lease_only: bool,
) -> None:
    """Real workers and a beat elect a leader; kill it; step the next one down."""
    if lease_only and broker:
        raise click.UsageError("--broker has no use with --lease-only (no Celery runs)")
    if ttl is None:
        ttl = DEMO_QUICK_TTL if quick else DEMO_TTL
    if lease_only:
        run_lease_demo(store=store, nodes=nodes, ttl=ttl, lead_for=1.0 if quick else 3.0)
        return
    result = run_celery_demo(
        broker=broker, store=store, nodes=nodes, ttl=ttl, lead_for=1.0 if quick else 4.0
    )
    if not (result.failover_leader and result.handover_leader):
        raise SystemExit(1)
