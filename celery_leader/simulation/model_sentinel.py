"""A model of the lease store on a Sentinel-managed Redis: the Redis model, plus failovers.

What the real store is (:mod:`celery_leader.stores.sentinel`): the Redis
store's scripts and keys, on whichever server the sentinels name primary.
So every decision is the Redis model's (:class:`~.model_store.ModelStore`),
and every fault of a Redis server can hit the primary. What Sentinel adds is
the failover:

* **Failover** (:meth:`SentinelModel.failover`): the primary is gone (while
  it is, calls are refused), and a replica is promoted. Replication is
  asynchronous, so the replica holds the data of a moment shortly before the
  failure (it lags by a part of a second): a restore to that recent
  snapshot, with what came after it lost (acquires, renewals, releases).
  The promoted replica always has another run id and replication id, so the
  data comes with a new epoch: the next acquire holds its holder off one ttl
  and takes its token from ``max(last + 1, server time, min + 1)``.

Assumptions (the real store's, stated in its docstring): the clocks of the
primary and of its replicas agree (one store clock here, which may step back
for all of them, only in runs that lose no data); the old holder does not
keep renewing on a demoted primary it is partitioned with (a demoted primary
refuses writes, ``READONLY``): one primary at a time.
"""

from __future__ import annotations

from typing import ClassVar

from celery_leader.simulation.model_store import Broken, ModelStore


class SentinelModel(ModelStore):
    """The Redis model on the current primary; :meth:`failover` promotes a lagging replica."""

    name: ClassVar[str] = "sentinel"
    breaks: ClassVar[frozenset[Broken]] = ModelStore.breaks | {Broken.SENTINEL_FAILOVER_KEEPS_EPOCH}

    def failover(self, as_of: float) -> float:
        """A replica whose data is that of real time *as_of* becomes primary; a new epoch.

        Returns the time of the replica's data. As with :meth:`restore`, the
        lease comes back with its absolute expiry (on the shared clock).
        """
        taken, data = self._snapshot(as_of)
        if self.broken is not Broken.SENTINEL_FAILOVER_KEEPS_EPOCH:
            self.epoch += 1  # another run id and replication id
        self._set(data)
        return taken
