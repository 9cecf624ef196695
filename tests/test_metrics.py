"""Prometheus metrics: from lease events in-process, and scraped from a real worker."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry

from celery_leader.lease import LeaseManager
from celery_leader.metrics import metrics_for
from celery_leader.stores import open_store
from celery_leader.timing import LeaseTiming


def value(registry, name, **labels):
    return registry.get_sample_value(name, labels)


def test_metrics_follow_a_term_from_election_to_loss():
    """is_leader, token, elections, renew latency and losses by reason track real events."""
    registry = CollectorRegistry()
    metrics = metrics_for(registry)
    store = open_store("memory://metrics-test", timeout=1)
    timing = LeaseTiming.create(1.0)
    manager = LeaseManager(store, "m", timing, listeners=(metrics.listener,))
    manager.start()
    try:
        assert manager.wait_for_leadership(3)
        time.sleep(timing.renew_interval * 2.5)
        token = manager.current_token()
        assert value(registry, "celery_leader_is_leader", election="m") == 1
        assert value(registry, "celery_leader_token", election="m") == token
        assert value(registry, "celery_leader_elections_total", election="m") == 1
        assert value(registry, "celery_leader_renew_seconds_count", election="m") >= 2
        store.release("m", manager.holder.lease_id)  # someone took it away
        deadline = time.monotonic() + 3
        while (
            value(registry, "celery_leader_losses_total", election="m", reason="renew-rejected")
            is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.02)
        assert (
            value(registry, "celery_leader_losses_total", election="m", reason="renew-rejected")
            == 1
        )
    finally:
        manager.stop()
    assert value(registry, "celery_leader_releases_total", election="m") >= 1
    assert value(registry, "celery_leader_is_leader", election="m") == 0
