"""A deterministic simulation of the lease protocol, in the manner of FoundationDB's.

The real :class:`~celery_leader.lease.LeaseManager` (not a model of it) of
several nodes runs against a model of a lease store (Redis by default;
``--store`` picks Sentinel, PostgreSQL or etcd), on one virtual clock,
with every source of randomness drawn from the seed; faults of the network,
the store and the nodes are injected; a checker judges the history as it
happens. Each node builds its lease through the
:class:`~celery_leader.elections.election.Election` unit the worker uses,
and runs leader work the way a prefork worker does: runs in pool children,
the run table, the watchdog's decision, the parent's kill on loss, the
release guard. The checker judges whether work actually stopped, not only
what was published. A failing seed prints the last events before the
violation and replays exactly.

Modules, one job each:

* :mod:`.scheduler`: virtual time, the event queue, pauses of an event's owner;
* :mod:`.model_store`: the Redis store's decisions as a pure state machine
  (and deliberately broken variants), and what every model shares;
  :mod:`.model_sentinel`, :mod:`.model_postgres`, :mod:`.model_etcd`: the
  other stores, each with what its real store does and what can happen to
  it; :mod:`.models`: the models by ``--store`` name;
* :mod:`.network`: store calls (delay, loss, duplication, timeouts) and
  release notifications;
* :mod:`.node`: one worker: its Election (a LeaseManager and its
  SharedLease), its clock, its thread as a chain of steps;
* :mod:`.pool`: its leader work: runs, the run table, the watchdog, the
  kills;
* :mod:`.process`: a worker process with several elections (a node each)
  and the real balancer that spreads them, on the member list of
  :mod:`.presence`;
* :mod:`.lifelines`: with ``--lifelines``, the server's lifelines and each
  process's real lifeline and monitor, on threads of their own; followers
  take over a holder whose lifeline ended; :mod:`.failover`: failover
  times after the leader's process is killed, with and without;
* :mod:`.faults`: what a seed suffers, drawn before its run (the store's
  faults from the store's menu; with lifelines, also admin kills of a
  lifeline's connection and partitions of the leader's process);
* :mod:`.checker`: the invariants;
* :mod:`.world`: one seed, wired; :mod:`.runner`: many seeds on every core;
  :mod:`.cli`: the command line.

Assumptions (the lease manager's, see :mod:`celery_leader.lease`): the store
honours its ttl on its clock, which may step back but never forward; each
node's clock drifts from real time by less than the margin over one ttl;
the store notices whenever other data comes to lie under the lease (Redis,
Sentinel, PostgreSQL: its epoch changes; etcd: another cluster id, or a
revision lower than one a process saw). Each model states the assumptions
of its store (etcd's restores under the same cluster id are covered only in
part: see :mod:`.model_etcd`). The worker's: its
watchdog is scheduled, and the pool children of a main process that
crashed die with it (the kernel's parent-death signal, see :mod:`.pool`).
Within them, the checker expects no violation at all.

With several elections (``--elections K``) every node takes part in K
elections and balances them as a worker does; one checker per election
judges that election's history alone (two holders at once, a token not
above every earlier one of that election, work outliving its term).

How time is shared: a node's store call runs the rest of the world nested
inside it until its reply or timeout, so a call may return late when another
node's call is nested in it (by at most that call's timeout per level): a
thread scheduled late, which the manager must tolerate. A node is paused
only when that cannot hold up the calls of others (else its pause starts
after its step), so that a pause means a pause of that node alone.

With lifelines (``--lifelines``, another run of each seed; not for etcd,
whose leases end only by revoke or ttl), every process also runs the real
:class:`~celery_leader.lease.lifeline.HolderLifeline` and
:class:`~celery_leader.lease.lifeline.LifelineMonitor`, and the checker
also fails a take-over of a lifeline the server still keeps (a paused
holder's). The assumption added is the lifeline rule's: the watchdog
ends a run within its allowance past the validity the lifeline bounds.

What is not modelled: the BoundedCaller's limit on abandoned calls, the
consumer and the broker (the gate admits runs directly), the parent's kill
of the requests it saw start (its run-table half is modelled, see
:mod:`.pool`), a watchdog that dies (the worker replaces it and does not
renew without one), policies other than ``terminate``, batched renewals
and a pool shared by several elections (see :mod:`.process`), and the
SQLite, Azure Blob and in-memory stores. The store's clock steps back only
in runs that lose no data (the token rule's assumption).
"""

from __future__ import annotations

from celery_leader.simulation.model_store import Broken
from celery_leader.simulation.runner import Summary, run_seeds
from celery_leader.simulation.world import SeedResult, simulate

__all__ = ["Broken", "SeedResult", "Summary", "run_seeds", "simulate"]
