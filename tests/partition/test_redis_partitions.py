"""Real network partitions (harness.netbed) against a Redis store and a Redis broker.

Each test cuts or slows links around the leader (or a follower) while
leader-only runs stream through, heals, and requires what the chaos checker
requires (no two terms acting at once, no stale start, no stale write
accepted, nothing lost) plus the bounds of tests/partition/scenarios.py.
"""

from __future__ import annotations

import time

import pytest

from celery_leader.stores import open_store
from tests.partition.scenarios import FAULTS, PartitionBed, run_scenario

pytestmark = [pytest.mark.partition, pytest.mark.slow]


def _judge(bed: PartitionBed, fault: str) -> None:
    outcome = run_scenario(bed, FAULTS[fault])
    assert not outcome.failures(), outcome.report()


def test_leader_cut_from_the_store_stops_before_another_leads(redis_bed: PartitionBed) -> None:
    """The leader cut from the store stops its runs; another worker leads; no two terms at once."""
    _judge(redis_bed, "leader-store")


def test_leader_cut_from_the_store_with_lifelines_stops_before_another_leads(
    redis_fast_bed: PartitionBed,
) -> None:
    """With leader_fast_failover: the leader cut off keeps its lifeline on the server (a
    partition is not a death: the server's keepalive is minutes) but cannot confirm it, so it
    stops within the lifeline's grace; the next leader still waits for the lease."""
    _judge(redis_fast_bed, "leader-store")


def test_leader_cut_from_the_store_while_it_restarts_with_lifelines(
    redis_fast_bed: PartitionBed,
) -> None:
    """With leader_fast_failover: the leader cut from the store, and the store restarted (empty)
    meanwhile. Every lifeline ends with the restart; the cut-off leader never hears of it but
    stops within its grace, and nobody takes over early across the restart (a new session
    proves nothing): the next term runs one ttl after the store's start, never beside the
    old one; and that term is tied to its holder's new lifeline."""
    _judge(redis_fast_bed, "leader-store-restart")
    cluster = redis_fast_bed.cluster
    store = open_store(cluster.env["LEADER_STORE"], timeout=2)
    try:
        record = store.read(cluster.name)
    finally:
        store.close()
    assert record is not None and record.lifeline, f"no lifeline after the restart: {record}"


def test_leader_cut_from_the_broker_hands_over_to_a_worker_that_reaches_it(
    redis_bed: PartitionBed,
) -> None:
    """The leader cut from the broker alone: its loop stalls, it steps down, another leads."""
    _judge(redis_bed, "leader-broker")


def test_leader_cut_from_store_and_broker_hands_over_without_loss(
    redis_bed: PartitionBed,
) -> None:
    """The leader cut from store and broker: another leads, no message is lost."""
    _judge(redis_bed, "leader-both")


def test_follower_cut_off_changes_nothing_for_the_leader(redis_bed: PartitionBed) -> None:
    """A follower cut off from every host: one term throughout, nothing lost."""
    _judge(redis_bed, "follower-off")


def test_one_way_loss_from_leader_to_store_ends_its_term(redis_bed: PartitionBed) -> None:
    """Every packet from the leader to the store lost: its term ends before another begins."""
    _judge(redis_bed, "leader-store-oneway")


def test_store_slower_than_the_renew_interval_ends_the_term(redis_bed: PartitionBed) -> None:
    """Round trips to the store later than the renew interval: the leader steps down in time."""
    _judge(redis_bed, "leader-store-slow")


def test_follower_frozen_past_the_ttl_does_not_act_when_continued(redis_bed: PartitionBed) -> None:
    """A follower's process group stopped past the ttl, then continued: one term throughout."""
    _judge(redis_bed, "follower-frozen")


def test_beat_cut_from_the_store_with_lifelines_stops_before_another_sends(
    redis_fast_bed: PartitionBed,
) -> None:
    """Two beats on hosts of their own with leader_fast_failover; the sending one is cut from
    the store. It cannot confirm its lifeline, so it stops sending within the grace; the other
    beat (the partition is not a death) waits for the lease, then sends under a higher token,
    never while the cut one still sent."""
    bed = redis_fast_bed
    cluster = bed.cluster
    cluster.env["LEADER_BEAT_EVERY"] = "0.2"
    beats = [(cluster.start_beat(wrapper=bed.net.wrapper(host)), host) for host in ("w1", "w2")]
    old, token = cluster.sending_beat(timeout=bed.ttl * 3 + 30)
    (host,) = [host for beat, host in beats if beat is old]
    store = open_store(cluster.env["LEADER_STORE"], timeout=2)
    try:
        record = store.read(cluster.beat_election)
    finally:
        store.close()
    assert record is not None and record.token == token
    assert record.lifeline, "the sending beat's term is not tied to a lifeline"
    time.sleep(1)
    cut_at = time.monotonic()
    bed.net.cut(host, "store")
    try:
        new, new_token = cluster.sending_beat(timeout=bed.ttl * 3 + 20, after=token)
        time.sleep(1)
    finally:
        bed.net.heal()
    time.sleep(0.5)  # a send of the cut beat once it reaches the store again counts too
    sends = cluster.beat_sends()
    assert new is not old, "the other beat takes over (the cut one cannot reach the store)"
    mine = [s for s in sends if s["token"] == token]
    theirs = [s for s in sends if s["token"] != token and s["at"] > cut_at]
    assert new_token > token
    assert mine and theirs
    assert min(s["token"] for s in theirs) > token
    assert max(s["at"] for s in mine) < min(s["at"] for s in theirs), (
        "the beat cut from the store sent after the next term began"
    )
    stopped = max(s["at"] for s in mine) - cut_at
    assert stopped < 1.0, f"the cut beat sent {stopped:.2f} s after the cut"
