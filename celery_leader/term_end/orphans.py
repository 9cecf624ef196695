"""A prefork child dies with the worker's main process, never runs on as an orphan.

When the main process dies (SIGKILL, the OOM killer), nothing of it is left
to end a run in a pool child: the watchdog exits with it, no renewal comes,
and the child's run would go on with nobody counting it, beside the next
leader's. With ``leader_fast_failover`` the next leader may act 0.3 s
after the death. So each child asks the kernel to SIGKILL it when its
parent exits (``PR_SET_PDEATHSIG``), and kills itself at once if its parent
died before it could ask.

Celery's own prefork initializer asks too, through billiard, which loads
``libc.so.6`` by name and gives up silently where that fails (musl). This
asks again through the symbols already in the process, so the guarantee
does not rest on which C library the host has.

Assumptions: Linux (elsewhere :func:`die_with_parent` returns False and
nothing changes). The kernel sends the signal when the *thread* that forked
the child exits; billiard forks from the main thread and from its
supervisor thread, both of which live as long as the main process. The
lifeline ends when the main process's descriptors are closed, a moment
before the kernel signals the children; the successor's wait
(:data:`celery_leader.lease.lifeline.TAKEOVER_WAIT`) covers that moment.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from typing import Any

logger = logging.getLogger(__name__)

#: prctl(2)'s option that sets the signal sent to the caller when its parent exits.
PR_SET_PDEATHSIG = 1

#: The worker's main process, recorded before its pool forks.
_parent: int | None = None


def die_with_parent(parent: int) -> bool:
    """Have the kernel SIGKILL this process when its parent exits; True when it was asked.

    *parent* is the pid the caller was forked from: when the parent is gone
    already (it died between the fork and this call), this process kills
    itself now. False on a system without ``prctl``.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        asked = libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
    if not asked:
        return False
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
    return True


def _in_pool_child(**_: Any) -> None:
    if _parent is not None and not die_with_parent(_parent):
        logger.warning(
            "celery-leader: this pool child cannot ask to die with its worker "
            "(no prctl): if the worker is killed, its leader runs go on until they end"
        )


def guard_pool_children() -> None:
    """In the worker's main process, before the pool forks: each child will die with it."""
    from celery.signals import worker_process_init  # noqa: PLC0415 - keep this module light

    global _parent  # noqa: PLW0603 - one worker main process per process
    _parent = os.getpid()
    worker_process_init.connect(
        _in_pool_child, weak=False, dispatch_uid="celery-leader-die-with-parent"
    )
