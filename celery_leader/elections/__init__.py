"""The elections a process takes part in, as the places where work runs see them. No Celery.

* :mod:`~celery_leader.elections.election`: :class:`Election`, one election
  of this process: its lease manager, its shared-memory slot and the
  listener that publishes each term there (the worker, beat and the
  simulation all use it);
* :mod:`~celery_leader.elections.group`: the elections of one process, keyed
  by name, sharing one block of shared memory and one run table;
* :mod:`~celery_leader.elections.shared_lease`: each election's term in
  shared memory, made before the pool forks;
* :mod:`~celery_leader.elections.run_table`: which pool child runs which
  election's work, for the watchdog and the release guard;
* :mod:`~celery_leader.elections.procinfo`: who a process is (``/proc``);
* :mod:`~celery_leader.elections.liveness`: how the process's loop is doing
  (its last tick, started, stopping, waiting on the broker), for the lease
  thread and the health probe alike.
"""
