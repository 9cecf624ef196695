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


# -- series that exist at 0 before their first event -----------------------------------------


def idle_manager(name: str, ttl: float = 3.0, renew_interval: float = 0.8) -> LeaseManager:
    """A real lease manager, never started: attach() reads its name and timing only."""
    store = open_store(f"memory://{name}", timeout=1)
    return LeaseManager(store, name, LeaseTiming.create(ttl, renew_interval=renew_interval))


def test_attach_makes_each_tasks_skip_counters_at_zero_for_every_reason_and_the_timing_gauges():
    """Every skip reason of every task given starts at 0 (so increase() sees the first skip);
    the ttl and renew interval are exported as set; a skip then counts from 0 to 1."""
    from celery_leader.signals import leader_task_skipped
    from celery_leader.skip_reasons import TASK_SKIP_REASONS

    registry = CollectorRegistry()
    metrics = metrics_for(registry)
    metrics.attach(idle_manager("zero-skips"), tasks=["proj.a", "proj.b"])
    assert set(TASK_SKIP_REASONS) == {"overlap", "occurrence"}
    for task in ("proj.a", "proj.b"):
        for reason in TASK_SKIP_REASONS:
            skips = value(
                registry,
                "celery_leader_tasks_skipped_total",
                election="zero-skips",
                task=task,
                reason=reason,
            )
            assert skips == 0, (task, reason)
    assert value(registry, "celery_leader_lease_ttl_seconds", election="zero-skips") == 3.0
    assert value(registry, "celery_leader_renew_interval_seconds", election="zero-skips") == 0.8
    # The default bound on one store call: half the renew interval.
    assert value(registry, "celery_leader_store_timeout_seconds", election="zero-skips") == 0.4

    leader_task_skipped.send(
        sender="w@h", name="zero-skips", token=1, task="proj.a", task_id="i", reason="overlap"
    )
    labels = {"election": "zero-skips", "task": "proj.a"}
    assert value(registry, "celery_leader_tasks_skipped_total", **labels, reason="overlap") == 1
    assert value(registry, "celery_leader_tasks_skipped_total", **labels, reason="occurrence") == 0


def test_beat_entries_makes_each_entrys_series_at_zero_and_keeps_those_of_a_dropped_entry():
    """Sends, late sends and each slot-skip reason exist at 0 per entry, also for an entry
    that appears later; an entry that left keeps its series and its count."""
    from celery_leader.skip_reasons import SLOT_SKIP_REASONS

    registry = CollectorRegistry()
    metrics = metrics_for(registry)

    def series(entry: str) -> list[float | None]:
        labels = {"election": "b.beat", "entry": entry}
        return [
            value(registry, "celery_leader_beat_sends_total", **labels),
            value(registry, "celery_leader_beat_late_sends_total", **labels),
            *(
                value(registry, "celery_leader_beat_slots_skipped_total", **labels, reason=r)
                for r in SLOT_SKIP_REASONS
            ),
        ]

    assert set(SLOT_SKIP_REASONS) == {"paused", "window"}
    metrics.beat_entries("b.beat", {"first": 1, "second": 2}.keys())
    assert series("first") == series("second") == [0, 0, 0, 0]
    metrics.beat_sent("b.beat", "first", late_by=5.0)
    metrics.beat_entries("b.beat", {"second", "third"})  # "first" dropped, "third" new
    assert series("third") == [0, 0, 0, 0]
    assert series("first") == [1, 1, 0, 0]
    metrics.beat_entries("b.beat", {"second", "third"})  # unchanged: nothing to do
    assert series("second") == [0, 0, 0, 0]


def test_a_forked_process_forgets_the_entries_and_watchdogs_it_inherited():
    """In a forked child (an embedded beat) the parent's series are gone, its watchdog's
    too, and an entry the parent had seen is made again at 0 when the child sees it."""
    import os

    registry = CollectorRegistry()
    metrics = metrics_for(registry)
    metrics.attach(idle_manager("inherited"), watchdog=StandingWatchdog())
    metrics.beat_entries("inherited.beat", {"tick"})
    metrics.beat_sent("inherited.beat", "tick", late_by=0.0)
    assert value(registry, "celery_leader_watchdog_up", election="inherited") == 1
    labels = {"election": "inherited.beat", "entry": "tick"}
    pid = os.fork()
    if pid == 0:  # the child: report through the exit code, never return into pytest
        code = 1
        try:
            child = metrics_for(registry)
            gone = value(registry, "celery_leader_watchdog_up", election="inherited") is None
            gone = gone and value(registry, "celery_leader_beat_sends_total", **labels) is None
            child.beat_entries("inherited.beat", {"tick"})
            again = value(registry, "celery_leader_beat_sends_total", **labels) == 0
            code = 0 if child is metrics and gone and again else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert value(registry, "celery_leader_beat_sends_total", **labels) == 1, "the parent's kept"


class StandingWatchdog:
    """A watchdog that is always alive and was never replaced (for the fork test only)."""

    replacements = 0
    stopped = False

    def alive(self) -> bool:
        return True


def worker_coordinator(name: str, pool_kind: str):  # type: ignore[no-untyped-def]
    """A real coordinator of a worker in the default election *name* and its "reports"."""
    from celery_leader.settings import load_app_settings
    from celery_leader.worker.coordinator import Coordinator

    settings = load_app_settings(
        {"leader_backend_url": f"memory://{name}", "leader_name": name, "leader_lease_ttl": 4}
    )
    coordinator = Coordinator(
        settings.worker,
        open_store(f"memory://{name}", timeout=1),
        nodename="w@h",
        pool_kind=pool_kind,
        lease_of=settings.names.lease_of,
    )
    coordinator.add_election(
        "reports", settings.for_named("reports"), open_store(f"memory://{name}", timeout=1)
    )
    return coordinator


class LeaderTask:
    """What the worker knows of a registered leader-only task: its name and election."""

    def __init__(self, name: str, election: str | None = None) -> None:
        self.name, self.leader_election = name, election


def test_a_worker_counts_the_skips_of_each_leader_task_under_its_own_election_from_zero():
    """Each task's series under the election it runs under here; a task of an election the
    worker takes no part in has none. No watchdog series where the pool runs none (solo)."""
    import uuid

    from prometheus_client import REGISTRY

    from celery_leader.observe.metrics import enable_worker_metrics
    from celery_leader.settings import MetricsSettings

    name = f"w{uuid.uuid4().hex[:8]}"
    coordinator = worker_coordinator(name, "solo")
    tasks = [LeaderTask("t.default"), LeaderTask("t.reports", "reports"), LeaderTask("t.x", "x")]
    enable_worker_metrics(MetricsSettings(enabled=True, port=None, address=""), coordinator, tasks)

    def skips(election: str, task: str) -> float | None:
        labels = {"election": election, "task": task, "reason": "overlap"}
        return REGISTRY.get_sample_value("celery_leader_tasks_skipped_total", labels)

    default, reports = name, f"{name}.reports"
    assert (skips(default, "t.default"), skips(reports, "t.reports")) == (0, 0)
    assert skips(default, "t.reports") is None and skips(reports, "t.default") is None
    assert skips(default, "t.x") is None and skips(reports, "t.x") is None
    for election in (default, reports):
        assert REGISTRY.get_sample_value("celery_leader_lease_ttl_seconds", {"election": election})
        assert (
            REGISTRY.get_sample_value("celery_leader_watchdog_up", {"election": election}) is None
        )


def test_the_watchdog_gauge_follows_a_real_watchdog_through_its_death_and_replacement():
    """Prefork: up 1 and no replacement at start, for every election; 0 once the watchdog
    process is killed; after the liveness check replaced it, 1 again and one replacement."""
    import os
    import signal

    coordinator = worker_coordinator("watched", "prefork")
    registry = CollectorRegistry()
    metrics = metrics_for(registry)
    for election in coordinator.elections.values():
        metrics.attach(election.manager, watchdog=coordinator.watchdog)
    watchdog = coordinator.watchdog
    watchdog.start()

    def both(name: str) -> list[float | None]:
        return [value(registry, name, election=e) for e in ("watched", "watched.reports")]

    try:
        assert both("celery_leader_watchdog_up") == [1, 1]
        assert both("celery_leader_watchdog_replacements_total") == [0, 0]
        os.kill(watchdog.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while watchdog.alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert both("celery_leader_watchdog_up") == [0, 0]
        assert coordinator.is_live(), "the liveness check replaces the dead watchdog"
        assert both("celery_leader_watchdog_up") == [1, 1]
        assert both("celery_leader_watchdog_replacements_total") == [1, 1]
        watchdog.stop()  # as at shutdown: ended on purpose, not dead
        assert both("celery_leader_watchdog_up") == [None, None]
        assert both("celery_leader_watchdog_replacements_total") == [None, None]
    finally:
        watchdog.stop()


def test_a_renewal_past_half_the_store_timeout_counts_as_slow(tmp_path):
    """A real Redis paused for 0.37 s while a renewal waits: that renewal, past a quarter
    of the 0.4 s store timeout, counts as slow; the quick ones before it do not."""
    from harness.servers import RedisServer

    server = RedisServer(tmp_path).start()
    registry = CollectorRegistry()
    metrics = metrics_for(registry)
    store = open_store(server.url, timeout=2)
    timing = LeaseTiming.create(3.0, renew_interval=0.8, op_timeout=0.4)
    manager = LeaseManager(store, "slow", timing)
    metrics.attach(manager)
    manager.start()
    try:
        assert manager.wait_for_leadership(5)
        time.sleep(2 * timing.renew_interval)
        assert value(registry, "celery_leader_renew_seconds_count", election="slow") >= 1
        assert value(registry, "celery_leader_slow_renewals_total", election="slow") == 0
        for _ in range(20):  # until a pause falls on a renewal
            server.pause()
            time.sleep(0.37)  # within the store timeout: the renewal succeeds, late
            server.resume()
            time.sleep(0.2)
            if value(registry, "celery_leader_slow_renewals_total", election="slow"):
                break
        assert value(registry, "celery_leader_slow_renewals_total", election="slow") >= 1
        assert value(registry, "celery_leader_store_timeout_seconds", election="slow") == 0.4
    finally:
        manager.stop(release=True)
        store.close()
        server.stop()
