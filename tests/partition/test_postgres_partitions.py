"""Real network partitions (harness.netbed) against a PostgreSQL store (Redis broker)."""

from __future__ import annotations

import pytest

from tests.partition.scenarios import FAULTS, PartitionBed, run_scenario

pytestmark = [pytest.mark.partition, pytest.mark.slow]


def test_follower_cut_off_mid_acquire_does_not_stall_the_election(
    postgres_bed: PartitionBed,
) -> None:
    """A follower's session cut off holding the lease row's lock: the leader keeps leading."""
    fault = FAULTS["follower-mid-acquire"]
    outcome = run_scenario(postgres_bed, fault)
    assert not outcome.failures(), (
        f"{fault.description}:\n{outcome.summary.table()}\n"
        f"longest gap {outcome.longest_gap_s}, resumed {outcome.resumed_s}\n"
        + "\n".join(outcome.failures())
    )
