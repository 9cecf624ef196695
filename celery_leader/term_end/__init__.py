"""The end of a term: what happens to leader work when an election's term ends, however it ends.

This package is the one place that decides it, and does it. A term ends
because its lease ended (lost, or its lifeline ended: see
:mod:`celery_leader.lease.lifeline`; the lease thread reports either as
LOST), because the manager released it, or because the worker chose to give
it up (a step-down, a hand-over, a warm shutdown). Whichever it is, the
work ends here:

* here, the ``on_loss`` policy and its per-pool defaults, and the hand-back
  rule for a run that was stopped;
* :mod:`~celery_leader.term_end.in_worker`: the sequence in the worker's main
  process, per election (revoke, kill, hand back what never reached the pool,
  wait with grace, guard the release), as :class:`TermEnd`; the parent's
  kill and the release guard's reading of the run table are written once
  there, for the worker and for the simulation
  (:mod:`celery_leader.simulation.pool` runs them on its model);
* :mod:`~celery_leader.term_end.leaving`: the ends a worker chooses
  (step-down, hand-over, warm shutdown), each built on that sequence;
* :mod:`~celery_leader.term_end.in_run`: the pool child's side (check before
  the body, register the run, stop the run);
* :mod:`~celery_leader.term_end.watchdog`: the dead-man's switch that ends
  prefork runs at their term's deadline from outside the run, and its
  replacement when it died; :mod:`~celery_leader.term_end.alarm`: the alarm
  it sleeps on.

When a worker's main process dies, no code of it runs any more: its
prefork children die with it, each having asked the kernel for a SIGKILL
when its parent exits (:mod:`~celery_leader.term_end.orphans`), its
watchdog exits with it, and its lifeline, held by the main process alone,
ends with it; the successor waits out a bound that covers the delivery of
those signals (:mod:`celery_leader.lease.lifeline`).

How a term's work ends, fastest first. Correctness rests on the last
layer alone; the others only make it sooner.

1. **The parent's kill.** The lease thread hears LOST (or a step-down or a
   shutdown revokes the term) and SIGKILLs the pool children that run
   ``terminate`` runs of the term.
2. **The watchdog (the dead-man's switch).** Each prefork worker forks one
   small :class:`~celery_leader.term_end.watchdog.Watchdog` process before its
   pool. A child that starts any leader run records it in the shared run
   table (:mod:`celery_leader.elections.run_table`: pid, start time, election,
   token, policy). The watchdog sleeps until the earliest published
   validity of the ``terminate`` entries, and is woken at once by a
   revocation or by a run whose term ends sooner
   (:mod:`celery_leader.term_end.alarm`); each pass compares every
   ``terminate`` entry with its election's shared lease. It SIGKILLs the
   child within :data:`~celery_leader.term_end.watchdog.WATCH_INTERVAL` of
   the term's revocation or the end of its published validity, and only a
   renewal that the parent publishes extends that validity. It records each
   kill, so the parent hands the message back even if a late renewal made
   the term look valid again. The
   watchdog waits on nothing the run or the main process does: it acts when
   the main process is stopped or stuck, when the lease thread hangs in a
   store call, and when the run holds the GIL in a C call. It also covers a
   run the parent has not yet seen start. A watchdog that died is replaced
   before the next renewal, and the lease is not renewed while none runs.

The release guard (:meth:`TermEnd.work_stopped
<celery_leader.term_end.in_worker.TermEnd.work_stopped>`) reads the same run
table, so a run the parent has not seen start still holds the lease.

Everything is keyed by election: a run is judged against its own election's
term only, since the tokens of two elections are unrelated numbers.

Assumptions: the watchdog process is scheduled (a host so starved that it
cannot run for a whole margin breaks the clock assumption of guarantee 1 as
well). A process group frozen as a whole (SIGSTOP of the group, a paused VM)
is a paused leader; only fencing tokens protect against that. Linux is
needed, since the watchdog checks ``/proc/<pid>/stat`` before it kills.
A ``/proc`` that cannot answer (out of descriptors or memory) is never
taken for "the run is gone" (:class:`~celery_leader.elections.procinfo.Liveness`):
the watchdog looks again at its next pass, within
:data:`~celery_leader.term_end.watchdog.WATCH_INTERVAL`; the parent's kill
asks again for up to :data:`~celery_leader.term_end.in_worker.KILL_SETTLE`;
the release guard counts the run as running.

Policies (:class:`OnLoss`):

* ``terminate``: the run is killed at the end of the term. It is the
  default where the pool can kill, which means prefork.
* ``cancel``: :func:`celery_leader.lease_lost` turns true at the end of the
  term, and the task is expected to stop. It is the default, and the only
  choice, in threads, solo, gevent and eventlet. A task that never polls
  runs on, beside the next leader's run of its overlap key or occurrence
  (:mod:`celery_leader.worker.unkillable_runs` warns at start); on a
  step-down or a warm shutdown, prefork then kills it after the grace
  period.
* ``finish``: the run completes. This is unsafe without fencing. On a
  step-down or a warm shutdown, prefork kills it after the grace period.

The hand-back rule for a run that was stopped: with ``acks_late`` the
message goes back to the broker and runs again on the next leader;
otherwise the task is recorded ``REVOKED``.
"""

from __future__ import annotations

import enum

from celery_leader.exceptions import ConfigurationError

#: Pools whose runs can be killed one by one (each run is a process).
KILLABLE_POOLS = frozenset({"prefork", "processes"})


class OnLoss(str, enum.Enum):
    """What happens to a running leader task when its term ends."""

    TERMINATE = "terminate"
    CANCEL = "cancel"
    FINISH = "finish"

    @classmethod
    def parse(cls, value: str | OnLoss | None) -> OnLoss | None:
        """The policy named *value* (None stays None); a clear error for anything else."""
        if value is None or isinstance(value, OnLoss):
            return value
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(policy.value for policy in cls)
            raise ConfigurationError(
                f"on_loss={value!r} is not allowed: use one of {allowed}"
            ) from None


def effective_policy(declared: str | OnLoss | None, pool_kind: str) -> OnLoss:
    """The policy that applies to a task declaring *declared* in a *pool_kind* pool.

    ``terminate`` needs a pool that can kill one run. Elsewhere it becomes
    ``cancel``, because the run must cooperate.
    """
    policy = OnLoss.parse(declared)
    killable = pool_kind in KILLABLE_POOLS
    if policy is None:
        return OnLoss.TERMINATE if killable else OnLoss.CANCEL
    if policy is OnLoss.TERMINATE and not killable:
        return OnLoss.CANCEL
    return policy


# -- the hand-back rule ------------------------------------------------------


def requeues_stopped_run(acks_late: bool) -> bool:
    """True when a stopped run's message goes back to the broker, False when it is REVOKED."""
    return bool(acks_late)
