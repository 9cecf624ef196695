"""A deterministic simulation of the lease protocol, in the manner of FoundationDB's.

The real :class:`~celery_leader.lease.LeaseManager` (not a model of it) of
several nodes runs against a model of the Redis lease store, on one virtual
clock, with every source of randomness drawn from the seed; faults of the
network, the store and the nodes are injected; a checker judges the history
as it happens. A failing seed prints the last events before the violation
and replays exactly.

Modules, one job each:

* :mod:`.scheduler`: virtual time, the event queue, pauses of an event's owner;
* :mod:`.model_store`: the Redis store's decisions as a pure state machine
  (and deliberately broken variants);
* :mod:`.network`: store calls (delay, loss, duplication, timeouts) and
  release notifications;
* :mod:`.node`: one worker: a LeaseManager, its clock, its thread as a chain
  of steps, its SharedLease fed as the worker's coordinator feeds it;
* :mod:`.faults`: what a seed suffers, drawn before its run;
* :mod:`.checker`: the invariants;
* :mod:`.world`: one seed, wired; :mod:`.runner`: many seeds on every core;
  :mod:`.cli`: the command line.

Assumptions (the lease manager's, see :mod:`celery_leader.lease`): the store
honours its ttl on its clock; each node's clock drifts from the store's by
less than the margin over one ttl; the store's epoch changes whenever
other data comes to lie under the lease (any restart, and older data loaded
without one). Within them, the checker expects no violation at all.

How time is shared: a node's store call runs the rest of the world nested
inside it until its reply or timeout, so a call may return late when another
node's call is nested in it (by at most that call's timeout per level): a
thread scheduled late, which the manager must tolerate. A node is paused
only when that cannot hold up the calls of others (else its pause starts
after its step), so that a pause means a pause of that node alone.

What is not modelled: the store's own clock going back (tokens assume it
does not), the BoundedCaller's limit on abandoned calls, the worker beyond
its SharedLease (pool children, the watchdog, the consumer), several
elections at once, and stores other than Redis.
"""

from __future__ import annotations

from celery_leader.simulation.model_store import Broken
from celery_leader.simulation.runner import Summary, run_seeds
from celery_leader.simulation.world import SeedResult, simulate

__all__ = ["Broken", "SeedResult", "Summary", "run_seeds", "simulate"]
