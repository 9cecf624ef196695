"""The ``celery-leader`` console script."""

from __future__ import annotations

import click

from celery_leader.demo.celery_demo import run_celery_demo
from celery_leader.demo.lease_demo import run_lease_demo


@click.group()
@click.version_option(package_name="celery-leader")
def main() -> None:
    """celery-leader: leader election for Celery."""


@main.command()
@click.option("--broker", default=None, help="Broker URL (default: kombu's filesystem transport).")
@click.option("--store", default=None, help="Lease store URL (default: SQLite in a temp dir).")
@click.option("--nodes", default=3, show_default=True, type=click.IntRange(2, 20))
@click.option("--ttl", default=3.0, show_default=True, type=click.FloatRange(1, 60))
@click.option("--quick", is_flag=True, help="A shorter run (under a minute), as CI uses.")
@click.option("--lease-only", is_flag=True, help="Lease managers alone, no Celery.")
def demo(  # noqa: PLR0917 - click passes every option as an argument
    broker: str | None, store: str | None, nodes: int, ttl: float, quick: bool, lease_only: bool
) -> None:
    """Real workers and a beat elect a leader; kill it; step the next one down."""
    if quick:
        ttl = min(ttl, 2.0)
    if lease_only:
        run_lease_demo(store=store, nodes=nodes, ttl=ttl, lead_for=1.0 if quick else 3.0)
        return
    result = run_celery_demo(
        broker=broker, store=store, nodes=nodes, ttl=ttl, lead_for=1.0 if quick else 4.0
    )
    if not (result.failover_leader and result.handover_leader):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
