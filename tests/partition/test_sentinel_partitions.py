"""The partition Redis Sentinel cannot survive alone: the leader cut off with the old primary.

A primary, a replica and three sentinels (quorum 2), each on a host of the
bed; the partition puts {the leader, the primary} on one side and {the other
workers, the replica, the sentinels} on the other (the broker and the run
history reach both). The sentinels promote the replica.

* Without ``min-replicas-to-write`` the old primary keeps taking the leader's
  renewals while a follower leads on the promoted replica: two terms act at
  once until the heal (docs/stores/index.md, "What each store cannot keep"). The test shows
  it happening, and that the fence refuses the stale term's writes: only
  fencing protects there.
* With ``min-replicas-to-write 1`` and ``min-replicas-max-lag 1`` (below the
  ttl of 2 s) on both servers, the old primary refuses the renewals it cannot
  replicate and the leader steps down; the promoted replica has no replica
  while the partition lasts and refuses writes too: no one leads until the
  heal, never two at once, and a leader runs work again within ttl +
  ``SENTINEL_HEAL_BOUND`` of the heal.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.partition.scenarios import FAULTS, PartitionBed, partition_bed, run_scenario

pytestmark = [pytest.mark.partition, pytest.mark.slow]


@pytest.fixture
def sentinel_bed(tmp_path: Path) -> Iterator[PartitionBed]:
    """Sentinel store without min-replicas-to-write, Redis broker, three workers."""
    with partition_bed(tmp_path, store="sentinel", broker="redis") as bed:
        yield bed


@pytest.fixture
def fenced_sentinel_bed(tmp_path: Path) -> Iterator[PartitionBed]:
    """Sentinel store with min-replicas-to-write 1 on both servers, Redis broker."""
    with partition_bed(tmp_path, store="sentinel-minrep", broker="redis") as bed:
        yield bed


def test_leader_cut_off_with_the_primary_splits_and_only_the_fence_holds(
    sentinel_bed: PartitionBed,
) -> None:
    """Without min-replicas-to-write: two terms run at once, no stale write is accepted."""
    outcome = run_scenario(sentinel_bed, FAULTS["sentinel-primary-split"])
    summary = outcome.summary
    assert outcome.mode == "split"
    # The split, visible in the history: runs of the old term once the new one ran.
    assert outcome.split_runs > 0, outcome.report()
    assert summary.terms >= 2, outcome.report()
    # What protects: the fence refused the old term's writes, and accepted none late.
    assert summary.stale_writes_accepted == [], outcome.report()
    assert summary.writes_refused > 0, outcome.report()
    assert not outcome.failures(), outcome.report()


@pytest.mark.matrix  # about a minute: the sentinels take 8 s to take the old primary back
def test_min_replicas_to_write_keeps_one_term_at_a_time(
    fenced_sentinel_bed: PartitionBed,
) -> None:
    """With min-replicas-to-write 1: never two terms at once, nothing lost, a leader after."""
    outcome = run_scenario(fenced_sentinel_bed, FAULTS["sentinel-primary-split"])
    summary = outcome.summary
    assert outcome.mode == "leaderless"
    assert summary.in_flight_overlaps == [], outcome.report()
    assert summary.stale_starts == [], outcome.report()
    assert summary.stale_writes_accepted == [], outcome.report()
    assert summary.lost == [], outcome.report()
    assert not outcome.failures(), outcome.report()
