"""Timing arithmetic, with plain numbers standing in for the clock."""

from __future__ import annotations

import pytest

from celery_leader.lease.timing import LeaseTiming


def test_defaults_derive_from_ttl():
    """renew = ttl/3, margin = max(0.05, 2 % of ttl), op timeout = renew/2."""
    timing = LeaseTiming.create(6.0)
    assert timing.renew_interval == 2.0
    assert timing.margin == pytest.approx(0.12)
    assert timing.op_timeout == 1.0


def test_validity_counts_from_send_time():
    """valid_until = t_sent + ttl - margin, whatever the reply time."""
    timing = LeaseTiming.create(10.0, margin=0.5)
    assert timing.valid_until(100.0) == 109.5


def test_renewal_started_only_if_it_can_land_in_time():
    """A renewal that could outlast validity is not started: loss is declared instead."""
    timing = LeaseTiming.create(3.0, renew_interval=1.0, margin=0.1, op_timeout=0.5)
    valid_until = timing.valid_until(0.0)  # 2.9
    assert timing.can_renew_in_time(2.4, valid_until)
    assert not timing.can_renew_in_time(2.41, valid_until)


def test_renew_schedule_under_a_dead_store():
    """With every renewal timing out, the holder gives up before validity ends."""
    timing = LeaseTiming.create(5.0)
    valid_until = timing.valid_until(0.0)
    now = timing.renew_interval
    attempts = []
    while timing.can_renew_in_time(now, valid_until):
        attempts.append(round(now, 3))
        now += timing.op_timeout + timing.renew_retry_delay(0.0)
    assert len(attempts) >= 2, "a failed renewal is retried before giving up"
    assert now < valid_until
    assert attempts[0] == pytest.approx(5 / 3, abs=1e-3)


def test_acquire_backoff_is_capped_and_jittered():
    """Backoff grows from 0.1 s, never beyond the renew interval, scaled by the random draw."""
    timing = LeaseTiming.create(3.0)
    assert timing.acquire_backoff(0, 1.0) == pytest.approx(0.1)
    assert timing.acquire_backoff(1, 1.0) == pytest.approx(0.2)
    assert timing.acquire_backoff(30, 1.0) == pytest.approx(1.0)
    assert timing.acquire_backoff(30, 0.5) == pytest.approx(0.5)
    assert timing.acquire_backoff(30, 0.0) == 0.01


def test_follower_jitter_is_small():
    """Follower jitter stays within 50 ms so handover is quick."""
    assert LeaseTiming.create(60.0).follower_jitter(0.999) < 0.05
    assert LeaseTiming.create(1.0).follower_jitter(1.0) == pytest.approx(0.01)
