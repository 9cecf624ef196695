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
