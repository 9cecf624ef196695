"""The demo shows which beat sends, and explains the burst of runs after a failover."""

from __future__ import annotations

import re

import pytest

from tests.test_demo import demo_processes, run_demo

#: The line the demo prints once beat's election has a leader.
BEAT_LEADER = re.compile(r"beat leader: beat \(pid (\d+), token (\d+)\): it sends the tick")
#: The one line that explains the backlog the new leader runs at once.
BACKLOG = re.compile(
    r"(\S+) ran (\d+) leader tasks within ([\d.]+) s: the backlog of ticks beat sent while "
    r"no worker led"
)


@pytest.mark.slow
def test_quick_demo_names_the_beat_leader_and_explains_the_backlog():
    """`demo --quick`: beat's leader is shown; the failover's burst of runs is explained once."""
    before = demo_processes()
    proc = run_demo("--quick")
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    beat = BEAT_LEADER.search(out)
    assert beat, out
    assert int(beat.group(2)) > 0
    assert re.search(rf"  beat leader\s+beat\s+token {beat.group(2)}\n", out), out
    failover = re.search(r"failover: (\S+) ran the leader task", out)
    assert failover, out
    after_failover = out[failover.end() :]
    bursts = BACKLOG.findall(after_failover)
    assert bursts, "the burst after the failover is explained"
    node, count, seconds = bursts[0]
    assert node == failover.group(1), "the new leader runs the backlog"
    assert int(count) >= 3 and float(seconds) < 2
    lines = [line.split("] ", 1)[1] for line in out.splitlines() if BACKLOG.search(line)]
    assert len(lines) == len(set(lines)), "one line per burst, not one per status line"
    assert demo_processes() == before, "the demo leaves no process behind"
