"""Prometheus metrics: from lease events in-process, and scraped from a real worker."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry

from celery_leader.lease import LeaseManager
from celery_leader.lease.timing import LeaseTiming
from celery_leader.observe.metrics import metrics_for
from celery_leader.stores import open_store


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


def test_a_taken_port_stops_the_start_with_one_line_naming_the_setting():
    """/metrics and /healthz on a port another process holds: a start-up error, not a traceback,
    naming the port as it was given (here beat's environment variable)."""
    import socket

    import pytest

    from celery_leader.observe.endpoint import serve_at_start
    from celery_leader.observe.health import Verdict
    from celery_leader.settings import MetricsSettings
    from celery_leader.startup_error import StartupConfigurationError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        metrics = MetricsSettings(
            enabled=True,
            port=port,
            address="127.0.0.1",
            port_from="environment variable CELERY_LEADER_BEAT_METRICS_PORT",
        )
        with pytest.raises(StartupConfigurationError) as caught:
            serve_at_start(metrics, lambda: Verdict(True, "ok"))
    message = str(caught.value)
    assert message.startswith(
        f"celery-leader: environment variable CELERY_LEADER_BEAT_METRICS_PORT={port} cannot be "
        "served"
    )
    assert "\n" not in message


def test_the_endpoint_logs_where_it_listens(caplog):
    """One INFO line with the address and port; the every-interface default says so."""
    import logging
    import socket
    import urllib.request

    from celery_leader.observe.endpoint import serve
    from celery_leader.observe.health import Verdict

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    caplog.set_level(logging.INFO, logger="celery_leader")
    local = serve("127.0.0.1", port, lambda: Verdict(True, "ok"))
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{local.port}/healthz", timeout=5) as answer:
            assert answer.status == 200
    finally:
        local.close()
    wide = serve("0.0.0.0", 0, lambda: Verdict(True, "ok"))
    wide.close()
    lines = [r.getMessage() for r in caplog.records if "serving /metrics" in r.getMessage()]
    assert lines[0] == f"celery-leader: serving /metrics and /healthz on http://127.0.0.1:{port}"
    assert lines[1].startswith(
        f"celery-leader: serving /metrics and /healthz on http://0.0.0.0:{wide.port}"
    )
    assert "(every interface: set leader_metrics_address" in lines[1]
