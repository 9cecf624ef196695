"""Real network partitions (harness.netbed) against a PostgreSQL store (Redis broker)."""

from __future__ import annotations

import pytest

from tests.partition.scenarios import FAULTS, PartitionBed, run_scenario

pytestmark = [pytest.mark.partition, pytest.mark.slow]


def test_follower_cut_off_mid_acquire_does_not_stall_the_election(
    postgres_bed: PartitionBed,
) -> None:
    """A follower's session cut off holding the lease row's lock: the leader keeps leading."""
    outcome = run_scenario(postgres_bed, FAULTS["follower-mid-acquire"])
    assert not outcome.failures(), outcome.report()


@pytest.mark.matrix
def test_server_down_past_the_ttl_then_restarted_holds_the_next_leader_off_one_ttl(
    postgres_bed: PartitionBed,
) -> None:
    """PostgreSQL killed, down past the ttl, started again: the leader lost its lease, and
    the next term's first run comes at least one ttl after the server was started again
    (the hold-off ends one ttl after the server's start, not one after the acquire)."""
    outcome = run_scenario(postgres_bed, FAULTS["store-down-restart"])
    assert outcome.after_restart_s is not None, outcome.report()
    assert outcome.after_restart_s >= outcome.ttl, outcome.report()
    assert not outcome.failures(), outcome.report()
