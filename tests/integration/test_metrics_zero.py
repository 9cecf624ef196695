"""Real workers and beats: every counter they can know of exists at 0 before its first event.

Prometheus's ``increase()`` and ``rate()`` count from a series' first
sample: a counter that appears at 1 hides its first event. The watchdog's
families follow the real watchdog process of a prefork worker.
"""

from __future__ import annotations

import os
import signal

import pytest

from harness.servers import free_port
from tests.integration.test_metrics_worker import sample, scrape, start_with_port, wait_for
from tests.integration.test_overlap import runs, wait_state
from tests.integration.test_run_safety import watchdog_pids

TASK = "tests.integration.leaderapp"
#: Some of leaderapp's leader-only tasks of the default election, and its plain ones.
LEADER_TASKS = {
    f"{TASK}.{name}"
    for name in ("leader_record", "noop_leader", "slow_terminate", "overlap_skip", "overlap_buffer")
}
PLAIN_TASKS = {f"{TASK}.plain_record", f"{TASK}.noop_plain"}
REASONS = ("overlap", "occurrence")


def skip_counters(samples, election: str) -> dict[tuple[str, str], float]:  # type: ignore[no-untyped-def]
    """(task, reason) -> value of every ``celery_leader_tasks_skipped_total`` of *election*."""
    found = {}
    for (name, labels), value in samples.items():
        label = dict(labels)
        if name == "celery_leader_tasks_skipped_total" and label["election"] == election:
            found[(label["task"], label["reason"])] = value
    return found


@pytest.mark.slow
def test_a_workers_skip_counters_are_at_zero_before_its_first_skip_and_count_it(cluster_for):
    """Before any skip: each leader-only task, by each reason, at 0 (plain tasks have none);
    after an overlap skip: that series is 1, the others still 0."""
    cluster = cluster_for("redis")
    cluster.env["LEADER_RESULTS"] = cluster.env["LEADER_HISTORY"]
    _, port = start_with_port(cluster, extra=["-c", "3"])
    cluster.leader_worker()
    name = cluster.name
    before = skip_counters(scrape(port), name)
    tasks = {task for task, _ in before}
    assert tasks >= LEADER_TASKS, LEADER_TASKS - tasks
    assert not tasks & PLAIN_TASKS
    assert before == {(task, reason): 0 for task in tasks for reason in REASONS}

    cluster.send("overlap_skip", 2.0, "job")
    cluster.wait_history(runs, 10)
    skipped = cluster.send("overlap_skip", 0.1, "job")
    assert wait_state(cluster, skipped.id, {"SKIPPED"})[0] == "SKIPPED"
    task = f"{TASK}.overlap_skip"
    wait_for(
        lambda: skip_counters(scrape(port), name)[(task, "overlap")] == 1,
        5,
        "the overlap skip counted",
    )
    after = skip_counters(scrape(port), name)
    assert after == {**before, (task, "overlap"): 1}


@pytest.mark.slow
def test_the_watchdog_families_follow_a_prefork_workers_watchdog_and_solo_has_none(
    cluster_for,
):
    """Prefork: up 1, no replacement; after SIGKILL of its watchdog, one replacement and up
    1 again. A solo worker exports neither. Both export their election's ttl settings."""
    cluster = cluster_for("redis")
    prefork, prefork_port = start_with_port(cluster)
    _, solo_port = start_with_port(cluster, pool="solo")
    cluster.leader_worker()
    name = cluster.name
    ttl = float(cluster.env["LEADER_TTL"])
    for port in (prefork_port, solo_port):
        samples = scrape(port)
        assert sample(samples, "celery_leader_lease_ttl_seconds", election=name) == ttl
        renew = sample(samples, "celery_leader_renew_interval_seconds", election=name)
        assert renew is not None and 0 < renew < ttl / 2
    on_solo = scrape(solo_port)
    assert sample(on_solo, "celery_leader_watchdog_up", election=name) is None
    assert sample(on_solo, "celery_leader_watchdog_replacements_total", election=name) is None

    def watchdog(port: int) -> tuple[float | None, float | None]:
        samples = scrape(port)
        return (
            sample(samples, "celery_leader_watchdog_up", election=name),
            sample(samples, "celery_leader_watchdog_replacements_total", election=name),
        )

    assert watchdog(prefork_port) == (1, 0)
    (first,) = watchdog_pids(prefork)
    os.kill(first, signal.SIGKILL)
    # The leader asks before each renewal, a follower before each attempt (about once a ttl).
    wait_for(lambda: watchdog(prefork_port) == (1, 1), 4 * ttl, "the watchdog replaced")
    assert len(watchdog_pids(prefork)) == 2


@pytest.mark.slow
def test_a_beats_entry_series_are_at_zero_before_any_send_on_leader_and_standby(cluster_for):
    """Sends, late sends and slots skipped (paused, window) of beat's entry exist at 0 from
    start, on the beat that sends and on its standby, while no slot came due."""
    cluster = cluster_for("redis")
    cluster.env["LEADER_BEAT_EVERY"] = "3600"  # nothing comes due during the test
    ports = []
    for _ in range(2):
        ports.append(free_port())
        cluster.env["LEADER_BEAT_METRICS_PORT"] = str(ports[-1])
        cluster.start_beat()
    cluster.sending_beat(timeout=20)
    election = cluster.beat_election

    def series(port: int) -> list[float | None]:
        samples = scrape(port)
        labels = {"election": election, "entry": "tick"}
        return [
            sample(samples, "celery_leader_beat_sends_total", **labels),
            sample(samples, "celery_leader_beat_late_sends_total", **labels),
            sample(samples, "celery_leader_beat_slots_skipped_total", **labels, reason="paused"),
            sample(samples, "celery_leader_beat_slots_skipped_total", **labels, reason="window"),
        ]

    leaders = []
    for port in ports:
        wait_for(lambda p=port: series(p) == [0, 0, 0, 0], 10, f"the series at 0 on {port}")
        leaders.append(sample(scrape(port), "celery_leader_is_leader", election=election))
    assert sorted(leaders) == [0, 1], "one sends, one stands by"
    assert cluster.beat_sends() == []
