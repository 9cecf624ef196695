"""The demo command, as a newcomer runs it: a real failover, shown and measured."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parent.parent


def demo_processes() -> list[str]:
    """The demo processes of this checkout's interpreter (another checkout's demo on the same
    machine is not this test's)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True)
    return [
        line
        for line in out.stdout.splitlines()
        if "celery_leader.demo" in line and sys.executable in line and "ps -eo" not in line
    ]


def run_demo(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``celery-leader demo ARGS`` as a newcomer runs it, in its own process."""
    return subprocess.run(
        [sys.executable, "-m", "celery_leader", "demo", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


#: The summary's handover line: seconds from the release, then from the step-down request.
HANDOVER = re.compile(
    r"handover \(step-down\)\s+(\S+)\s+token (\d+)\s+([\d.]+) s from the release\s+"
    r"\(([\d.]+) s from the step-down request"
)
#: The footnote that explains figures measured on kombu's polled filesystem broker.
FOOTNOTE = "kombu's filesystem broker is polled"
#: A line of the narrative: its stamp (seconds from the start) and its text.
LINE = re.compile(r"^\[ *([\d.]+)s\] (.*)$", flags=re.MULTILINE)
#: Stamps and the intervals between them are printed to 0.01 s: rounding both may differ by that.
ROUNDING = 0.011


def timeline(out: str) -> list[tuple[float, str]]:
    """The narrative's lines as (stamp, text), in the order printed."""
    return [(float(stamp), text) for stamp, text in LINE.findall(out)]


def stamp_of(lines: list[tuple[float, str]], pattern: str) -> tuple[float, re.Match[str]]:
    """The stamp of the one line matching *pattern*, and the match."""
    found = [(at, m) for at, text in lines if (m := re.search(pattern, text))]
    assert len(found) == 1, (pattern, lines)
    return found[0]


def check_timeline(out: str) -> None:
    """Lines come in the order of their stamps, and each stamp is its event's own time: the
    interval a line states is the one between its stamp and the stamp of its starting point."""
    lines = timeline(out)
    assert lines, out
    stamps = [at for at, _ in lines]
    assert stamps == sorted(stamps), "\n".join(f"[{at:6.2f}s] {text}" for at, text in lines)
    killed, _ = stamp_of(lines, r"^SIGKILL ")
    failover, m = stamp_of(lines, r"^failover: \S+ ran the leader task ([\d.]+) s after the kill")
    assert abs(failover - killed - float(m.group(1))) <= ROUNDING, (killed, failover, m.group(0))
    asked, _ = stamp_of(lines, r"^celery leader step-down: ")
    released, m = stamp_of(lines, r"released the lease ([\d.]+) s after the request")
    assert abs(released - asked - float(m.group(1))) <= ROUNDING, (asked, released, m.group(0))
    holds, m = stamp_of(lines, r"holds the lease ([\d.]+) s after the release")
    assert abs(holds - released - float(m.group(1))) <= ROUNDING, (released, holds, m.group(0))
    handover, m = stamp_of(
        lines, r"^handover: \S+ ran the leader task ([\d.]+) s after the release"
    )
    assert abs(handover - released - float(m.group(1))) <= ROUNDING, (
        released,
        handover,
        m.group(0),
    )


def check_runs_per_worker(out: str, workers: set[str]) -> None:
    """The summary counts the runs of every worker started, 0 for one that ran nothing; the
    leaders' counts are not 0."""
    found = re.search(r"^  leader task runs per worker: (.*)$", out, flags=re.MULTILINE)
    assert found, out
    counts = {name: int(count) for name, count in re.findall(r"(\S+) (\d+)", found.group(1))}
    assert set(counts) == workers, found.group(0)
    assert 0 in counts.values(), "one worker of four never leads: " + found.group(0)


@pytest.mark.slow
def test_quick_demo_shows_failover_and_handover():
    """`demo --quick`: failover, restart announced, sub-second handover from the release; the
    lines in the order of their events' own times; every worker counted in the summary."""
    before = demo_processes()
    proc = run_demo("--quick")
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    first = re.search(r"first leader\s+(\S+)\s+token (\d+)", out)
    failover = re.search(r"failover \(SIGKILL\)\s+(\S+)\s+token (\d+)\s+([\d.]+) s", out)
    handover = HANDOVER.search(out)
    assert first and failover and handover, out
    assert failover.group(1) != first.group(1), "a different worker leads after the kill"
    assert int(first.group(2)) < int(failover.group(2)) < int(handover.group(2))
    assert 0 < float(failover.group(3)) < 2 + 5
    assert "tokens increased: True" in out
    assert re.search(r"failover: \S+ ran the leader task [\d.]+ s after the kill", out)
    assert f"restarting {first.group(1)} as {first.group(1)}b: a new worker" in out, out
    assert re.search(r"\S+ released the lease [\d.]+ s after the request", out), out
    from_release, from_request = float(handover.group(3)), float(handover.group(4))
    # Measured at 0.01-0.16 s on a 2-core machine: the bound leaves room for a loaded one.
    assert 0 <= from_release < 1.0, out
    assert from_request >= from_release, out
    assert FOOTNOTE in out, "the filesystem broker's figures carry their footnote"
    check_timeline(out)
    check_runs_per_worker(out, {"node1", "node2", "node3", f"{first.group(1)}b"})
    assert demo_processes() == before, "the demo leaves no process behind"


@pytest.mark.slow
def test_demo_on_redis_honours_ttl_with_quick_and_drops_the_footnote(tmp_path):
    """`--broker redis://... --quick --ttl 2.5`: the given ttl is used, no filesystem footnote."""
    from harness.servers import RedisServer

    before = demo_processes()
    server = RedisServer(tmp_path).start()
    try:
        proc = run_demo("--quick", "--ttl", "2.5", "--broker", server.url)
    finally:
        server.stop()
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "; ttl 2.5 s" in out and "(ttl 2.5 s)" in out, "--quick keeps the --ttl given"
    handover = HANDOVER.search(out)
    assert handover and 0 <= float(handover.group(3)) < 1.0, out
    assert FOOTNOTE not in out, "the footnote is about the filesystem broker only"
    check_timeline(out)
    assert demo_processes() == before


def test_demo_options_all_have_help():
    """`celery-leader demo --help` explains every option; --broker with --lease-only is refused."""
    from celery_leader.cli.demo import demo

    options = [param for param in demo.params if isinstance(param, click.Option)]
    assert options and all(option.help for option in options), "an option without a help text"
    proc = run_demo("--help", timeout=60)
    assert proc.returncode == 0, proc.stderr
    help_text = " ".join(proc.stdout.split())  # click wraps lines; compare words
    assert "How many workers to start" in help_text
    assert "Lease ttl in seconds, 3 by default and 2 with --quick" in help_text
    assert "a 2 s ttl unless --ttl is given" in help_text
    refused = run_demo("--lease-only", "--broker", "redis://127.0.0.1:1/0", timeout=60)
    assert refused.returncode == 2 and "--broker has no use with --lease-only" in refused.stderr


def test_lease_only_demo_runs_without_celery():
    """`celery-leader demo --lease-only --quick`: lease managers alone fail over too."""
    proc = run_demo("--lease-only", "--quick", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "failover took" in proc.stdout
    assert "tokens increased: True" in proc.stdout


@pytest.mark.slow
def test_demo_without_a_leader_shows_the_worker_logs_and_keeps_them():
    """A broker nobody answers: the demo shows each log's tail, keeps the logs, exits 1."""
    from harness.servers import free_port

    before = demo_processes()
    proc = run_demo("--quick", "--ttl", "1", "--broker", f"redis://127.0.0.1:{free_port()}/0")
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
