"""A process that asked to die with its parent is gone when the parent is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from celery_leader.elections.procinfo import Liveness, liveness

#: The parent forks a child that asks (or not) to die with it, prints the child's pid, waits.
PARENT = """
import os, sys, time
from celery_leader.term_end.orphans import die_with_parent
parent = os.getpid()
pid = os.fork()
if pid == 0:
    if sys.argv[1] == "ask":
        assert die_with_parent(parent)
    print(os.getpid(), flush=True)
    time.sleep(60)
    os._exit(0)
time.sleep(60)
"""


def _child_after_parent_killed(ask: bool) -> tuple[int, bool]:
    """(the child's pid, whether it is gone 2 s after its parent's SIGKILL)."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, "ask" if ask else "no"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait(10)
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        if liveness(child) is Liveness.GONE:
            return child, True
        time.sleep(0.01)
    return child, False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_that_asked_dies_with_its_parent_and_one_that_did_not_lives_on():
    child, gone = _child_after_parent_killed(ask=True)
    assert gone, f"pid {child} outlived its parent's SIGKILL"
    child, gone = _child_after_parent_killed(ask=False)
    try:
        assert not gone, "without asking, an orphan lives on (the test sees the difference)"
    finally:
        os.kill(child, signal.SIGKILL)
