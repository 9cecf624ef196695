"""Inside a running leader-only task: checks whether the lease has been lost.

:func:`lease_lost` and :func:`check_leadership` work in every pool: in a
prefork child they read the lease the parent publishes in shared memory, in
threads and solo pools the same memory in-process. Call them often in long
loops; they cost a memory read, no store round trip.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from celery_leader.elections.shared_lease import SharedLease
from celery_leader.exceptions import LeaseError, LeaseLost

_shared: SharedLease | None = None
#: The token eager runs hold, set by :func:`celery_leader.testing.leadership`.
_eager_token: int | None = None


@dataclass(frozen=True)
class _Run:
    name: str
    token: int | None
    shared: SharedLease | None


_current_run: contextvars.ContextVar[_Run | None] = contextvars.ContextVar(
    "celery_leader_run", default=None
)
#: The run :func:`enter_run` marked last: the next run of the same term reuses it
#: (immutable; a run of another term, election or slot gets a new one).
_last_run: _Run | None = None
#: What :func:`enter_run` returns and :func:`exit_run` takes.
RunMark = contextvars.Token[_Run | None]


def install_shared_lease(shared: SharedLease | None) -> None:
    """Make *shared* (and its group's other elections) what runs here and in forks check."""
    global _shared  # noqa: PLW0603 - one lease per worker process, set before the pool forks
    _shared = shared


def set_eager_token(token: int | None) -> None:
    """Make eager leader-only runs hold *token* (None: no lease, as by default)."""
    global _eager_token  # noqa: PLW0603 - set and restored by celery_leader.testing only
    _eager_token = token


def eager_token() -> int | None:
    """The token eager runs hold, if a test forced one."""
    return _eager_token


def shared_lease(election: str | None = None) -> SharedLease | None:
    """The shared lease of *election* in this process (default: the one installed), if any.

    An unnamed lease (made by :func:`celery_leader.testing.leadership`)
    stands for every election; a named one only for its own.
    """
    if _shared is None or election is None:
        return _shared
    found = _shared.group.get(election)
    if found is None and not _shared.name:
        return _shared
    return found


def enter_run(name: str, token: int | None, shared: SharedLease | None = None) -> RunMark:
    """Mark what runs next as a leader run under *token*, until :func:`exit_run`.

    *shared* is the election's slot when the caller has it at hand (default:
    looked up by *name*). The task base calls this pair around every run;
    :func:`leader_run` is the same as a context manager.
    """
    shared = shared or shared_lease(name)
    global _last_run  # noqa: PLW0603 - one object per term, not per run
    run = _last_run
    if run is None or run.token != token or run.shared is not shared or run.name != name:
        run = _last_run = _Run(name, token, shared)
    return _current_run.set(run)


def exit_run(mark: RunMark) -> None:
    """End the leader run marked by :func:`enter_run`."""
    _current_run.reset(mark)


@contextmanager
def leader_run(name: str, token: int | None, shared: SharedLease | None = None) -> Iterator[None]:
    """Mark the code inside as a leader run under *token* (see :func:`enter_run`)."""
    mark = enter_run(name, token, shared)
    try:
        yield
    finally:
        exit_run(mark)


def _run() -> _Run:
    run = _current_run.get()
    if run is None:
        raise LeaseError("lease_lost()/check_leadership() called outside a leader-only task")
    return run


def lease_lost() -> bool:
    """True once the lease this run started under has ended (or was never valid).

    Eager runs (``task.apply()``, ``task_always_eager``) hold no lease and
    never see it lost, unless a test forced one with
    :func:`celery_leader.testing.leadership`. Raises :class:`LeaseError`
    outside a leader-only task.
    """
    run = _run()
    if run.token is None:
        return False
    return run.shared is None or not run.shared.valid_for(run.token)


def check_leadership() -> None:
    """Raise :class:`LeaseLost` when :func:`lease_lost` is true.

    Under ``on_loss="cancel"`` with ``acks_late`` the message goes back to the
    broker and runs again on the new leader.
    """
    if lease_lost():
        run = _run()
        raise LeaseLost(run.name, run.token)


def current_token() -> int | None:
    """The fencing token of the running leader task (None in eager runs)."""
    return _run().token
