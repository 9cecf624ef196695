"""The pool child's side of a term's end: check before the body, register the run, stop it.

A leader run checks its term right before its body, records itself in the
run table (every policy, so the release guard sees it; ``terminate`` runs
are also ended by the watchdog) and checks again, since the term may end
while it registers. A run stopped here is handed back per the hand-back
rule (:func:`celery_leader.term_end.requeues_stopped_run`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery_leader.elections.procinfo import own_pid
from celery_leader.elections.run_table import RUN_SLOTS
from celery_leader.elections.shared_lease import SharedLease
from celery_leader.term_end import requeues_stopped_run

logger = logging.getLogger(__name__)


def stop_run_in_task(task: Any, why: str) -> None:
    """Inside the run: end it now, per the hand-back rule (always raises)."""
    from celery.exceptions import Ignore, Reject  # noqa: PLC0415 - keep this module light

    request = task.request
    logger.warning("celery-leader: %s[%s] handed back: %s", task.name, request.id, why)
    if requeues_stopped_run(task.acks_late):
        raise Reject(why, requeue=True)
    task.backend.mark_as_revoked(request.id, why, request=request)
    raise Ignore()


class RunRefusedError(RuntimeError):
    """A leader run must not start; the message says why."""


class UnwatchableRunError(RunRefusedError):
    """A pool child has no slot in the run table: it must not run leader work."""


class TermOverError(RunRefusedError):
    """The run's term was not valid once the run was recorded."""


def pool_child_index() -> int | None:
    """The billiard pool index of the calling process, or None outside a prefork child.

    Read at every run (a fraction of a microsecond): a cache would outlive a
    change of the process's index that a pool never makes, but tests do.
    """
    global _current_process  # noqa: PLW0603 - imported once, on the first run
    try:
        if _current_process is None:
            from billiard.process import current_process  # noqa: PLC0415 - prefork only

            _current_process = current_process
        index = getattr(_current_process(), "index", None)
    except Exception:  # noqa: BLE001 - no billiard, no index: the run is not watched
        return None
    return index if isinstance(index, int) and index >= 0 else None


#: billiard's ``current_process``, once a run asked (an import statement per run costs).
_current_process: Callable[[], Any] | None = None


def watch_run(shared: SharedLease, token: int, *, terminate: bool) -> int | None:
    """Record this leader run (in a prefork child), then check its term; its slot index, or None.

    Every policy is recorded, so that the release guard sees the run even
    before the parent does; only *terminate* runs are killed by the
    watchdog. The term is checked *after* the record: a term that ends while
    the run registers is seen here, or the watchdog and the release guard see
    the run. Returns None (nothing recorded) outside a prefork child.

    Raises :class:`TermOverError` (nothing left recorded) when term *token* is
    not valid, and :class:`UnwatchableRunError` in a child whose pool index is
    past the table (a pool grown at run time by ``pool_grow`` or autoscale): a
    run neither kill layer could see must not start.
    """
    index = pool_child_index()
    group = shared.group
    if index is not None and own_pid() != group.owner_pid:
        if index >= RUN_SLOTS:
            raise UnwatchableRunError(
                f"pool process index {index} is past the run table's {RUN_SLOTS} slots "
                "(the pool was grown at run time); this process runs no leader work"
            )
        group.runs.enter(index, token, terminate=terminate, election=shared.election)
    else:
        index = None
    deadline = shared.deadline_of(token)
    if deadline is None:
        unwatch_run(shared, index)
        raise TermOverError("the lease ended before the run started")
    if terminate and index is not None:
        # The watchdog sleeps until its next look; a term that ends sooner must wake it.
        group.nudge(deadline)
    return index


def unwatch_run(shared: SharedLease, index: int | None) -> None:
    """The run recorded by :func:`watch_run` ended."""
    if index is not None:
        shared.group.runs.leave(index, shared.election)
