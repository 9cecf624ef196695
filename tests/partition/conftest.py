"""Fixtures of the partition tests: a harness.netbed bed with a cluster on it.

The bed needs root: without it (or without nftables) the fixture fails with
a message saying so; CI runs as root. Each bed takes an index of its own
(see harness.netbed), so pytest-xdist workers run these side by side.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.partition.scenarios import PartitionBed, partition_bed


@pytest.fixture
def redis_bed(tmp_path: Path) -> Iterator[PartitionBed]:
    """Redis store and Redis broker on hosts of their own, three workers on theirs."""
    with partition_bed(tmp_path, store="redis", broker="redis") as bed:
        yield bed


@pytest.fixture
def redis_fast_bed(tmp_path: Path) -> Iterator[PartitionBed]:
    """The Redis bed, its workers with leader_fast_failover (lifelines)."""
    with partition_bed(tmp_path, store="redis", broker="redis", fast_failover=True) as bed:
        yield bed


@pytest.fixture
def postgres_bed(tmp_path: Path) -> Iterator[PartitionBed]:
    """PostgreSQL store and Redis broker on hosts of their own, three workers on theirs."""
    with partition_bed(tmp_path, store="postgres", broker="redis") as bed:
        yield bed
