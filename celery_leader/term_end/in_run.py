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

from celery_leader.elections.procinfo import own_pid, own_start_time
from celery_leader.elections.run_table import RUN_SLOTS, RunTable, SlotWriter
from celery_leader.elections.shared_lease import SharedLease, SharedLeases
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
    """The billiard pool index of the calling process, or None outside a prefork child."""
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

#: This pool child's writer of its run-table slot, with the pid and the table it is for:
#: made at its first leader run, made again in a fork (a new pid) or for another table.
_own_slot: tuple[int, RunTable, SlotWriter] | None = None


def _slot_writer(group: SharedLeases) -> SlotWriter | None:
    """The calling pool child's writer of its slot in *group*'s run table; None outside one.

    Kept for the process once its start time is known (an unknown one is
    read again at the next run, never cached as 0). A pool child's index
    does not change while it lives. Raises :class:`UnwatchableRunError` past
    the table.
    """
    global _own_slot  # noqa: PLW0603 - one writer per process, reset by a fork's new pid
    pid = own_pid()
    found = _own_slot
    if found is not None and found[0] == pid and found[1] is group.runs:
        return found[2]
    index = pool_child_index()
    if index is None or pid == group.owner_pid:
        return None
    if index >= RUN_SLOTS:
        raise UnwatchableRunError(
            f"pool process index {index} is past the run table's {RUN_SLOTS} slots "
            "(the pool was grown at run time); this process runs no leader work"
        )
    started = own_start_time()
    writer = group.runs.writer(index, pid, started)
    if started:
        _own_slot = (pid, group.runs, writer)
    return writer


def watch_run(shared: SharedLease, token: int, *, terminate: bool) -> SlotWriter | None:
    """Record this leader run (in a prefork child), then check its term; its slot's writer, or None.

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
    group = shared.group
    writer = _slot_writer(group)
    if writer is not None:
        writer.enter(token, terminate=terminate, election=shared.election)
    deadline = shared.deadline_of(token)
    if deadline is None:
        unwatch_run(shared, writer)
        raise TermOverError("the lease ended before the run started")
    if terminate and writer is not None:
        # The watchdog sleeps until its next look; a term that ends sooner must wake it.
        group.nudge(deadline)
    return writer


def unwatch_run(shared: SharedLease, writer: SlotWriter | None) -> None:
    """The run recorded by :func:`watch_run` ended."""
    if writer is not None:
        writer.leave(shared.election)
