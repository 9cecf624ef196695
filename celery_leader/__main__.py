"""The ``celery-leader`` console script."""

from __future__ import annotations

import click

from celery_leader.demo.lease_demo import run_lease_demo


@click.group()
@click.version_option(package_name="celery-leader")
def main() -> None:
    """celery-leader: leader election for Celery."""


@main.command()
@click.option("--store", default=None, help="Lease store URL (default: SQLite in a temp dir).")
@click.option("--nodes", default=3, show_default=True, type=click.IntRange(2, 20))
@click.option("--ttl", default=3.0, show_default=True, type=click.FloatRange(0.5, 60))
@click.option("--quick", is_flag=True, help="A shorter run (about 15 s), as CI uses.")
def demo(store: str | None, nodes: int, ttl: float, quick: bool) -> None:
    """Elect a leader among processes, kill it, and show failover and handover."""
    if quick:
        ttl = min(ttl, 2.0)
    run_lease_demo(store=store, nodes=nodes, ttl=ttl, lead_for=1.0 if quick else 3.0)


if __name__ == "__main__":
    main()
