"""The demo command, as a newcomer runs it: a real failover, shown and measured."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def demo_processes() -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True)
    return [
        line
        for line in out.stdout.splitlines()
        if "celery_leader.demo" in line and "ps -eo" not in line
    ]


@pytest.mark.slow
def test_quick_demo_shows_failover_and_handover():
    """`celery-leader demo --quick`: another leader after the kill, rising tokens, nothing left."""
    before = demo_processes()
    proc = subprocess.run(
        [sys.executable, "-m", "celery_leader", "demo", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    first = re.search(r"first leader\s+(\S+)\s+token (\d+)", out)
    failover = re.search(r"failover \(SIGKILL\)\s+(\S+)\s+token (\d+)\s+([\d.]+) s", out)
    handover = re.search(r"handover \(step-down\)\s+(\S+)\s+token (\d+)", out)
    assert first and failover and handover, out
    assert failover.group(1) != first.group(1), "a different worker leads after the kill"
    assert int(first.group(2)) < int(failover.group(2)) < int(handover.group(2))
    assert 0 < float(failover.group(3)) < 2 + 5
    assert "tokens increased: True" in out
    assert re.search(r"failover: \S+ ran the leader task [\d.]+ s after the kill", out)
    assert demo_processes() == before, "the demo leaves no process behind"


def test_lease_only_demo_runs_without_celery():
    """`celery-leader demo --lease-only --quick`: lease managers alone fail over too."""
    proc = subprocess.run(
        [sys.executable, "-m", "celery_leader", "demo", "--lease-only", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "failover took" in proc.stdout
    assert "tokens increased: True" in proc.stdout


@pytest.mark.slow
def test_demo_without_a_leader_shows_the_worker_logs_and_keeps_them():
    """A broker nobody answers: the demo shows each log's tail, keeps the logs, exits 1."""
    from tests.servers import free_port

    before = demo_processes()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "celery_leader",
            "demo",
            "--quick",
            "--ttl",
            "1",
            "--broker",
            f"redis://127.0.0.1:{free_port()}/0",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "Traceback" not in out and "KeyError" not in out, out[-3000:]
    assert "no leader appeared" in out
    assert "--- node1.log (last " in out
    kept = re.search(r"the full logs are kept in (\S+)", out)
    assert kept, out[-3000:]
    logs = Path(kept.group(1))
    try:
        assert (logs / "node1.log").read_text(), "the kept log has the worker's output"
    finally:
        for log in logs.glob("*.log"):
            log.unlink()
        logs.rmdir()
    assert demo_processes() == before
