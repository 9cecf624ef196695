"""``celery-leader demo``: real workers and a beat on one host, a leader, a crash, a handover.

Starts NODES ``celery worker`` processes and one ``celery beat`` (LeaderScheduler)
of :mod:`celery_leader.demo.app`, on kombu's filesystem broker and a SQLite
lease store in a temporary directory unless ``--broker`` / ``--store`` say
otherwise. It shows who leads, with which token, which beat sends (beat's own
election), and the leader task runs, and says in one line what a burst of runs
is when one happens (the ticks beat sent while no worker led, run at once);
SIGKILLs the leader and measures the failover (from the kill to the first
leader task elsewhere); restarts the killed worker under a new name; then asks
the new leader to step down (``celery leader step-down``) and measures the
handover from the old leader's release (its ``leader_released`` signal) to the
new leader's first leader task, and from the step-down request, which also
counts starting the ``celery`` command. Every process it starts is stopped
when it returns, also on Ctrl-C.

The times compared are all on the lease clock (:func:`celery_leader.clock.now`),
read by the demo and stamped by the workers in the files described in
:mod:`celery_leader.demo.app`. Each line of the narrative carries the time of
the event it tells, and the lines come in that order
(:mod:`celery_leader.demo.timeline`). The summary counts the leader task runs
of every worker started, 0 for one that ran none.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from celery_leader import clock
from celery_leader._masking import mask_url
from celery_leader.demo.lease_demo import DemoResult
from celery_leader.demo.timeline import Timeline
from celery_leader.settings import election_names
from celery_leader.stores import open_store

APP = "celery_leader.demo.app"
#: Seconds between the beat's leader tasks; a new leader's first task may wait up to this long.
TICK_SECONDS = 0.2
#: The demo app's elections: the workers' (``demo``) and beat's.
NAMES = election_names({}, "demo")
#: Runs closer together than this are not ticks as beat sends them but a backlog run at once.
BURST_GAP = TICK_SECONDS / 2
#: How many runs that close together make a burst worth a line.
BURST_RUNS = 3

#: Shown under the summary on kombu's filesystem broker only: its figures are polled ones.
FILESYSTEM_FOOTNOTE = (
    "  (kombu's filesystem broker is polled, here every 50 ms, and the handover includes\n"
    "   a poll; Redis and RabbitMQ deliver without polling)"
)


@dataclass
class CeleryDemoResult(DemoResult):
    """What the demo measured, with the Celery part.

    ``handover_seconds`` runs from the old leader's release to the new
    leader's first leader task; ``handover_request_seconds`` from the
    step-down request (which starts a ``celery`` process) to that task.
    """

    handover_request_seconds: float = 0.0
    filesystem_broker: bool = False
    runs: Counter[str] = field(default_factory=Counter)
    #: Every worker the demo started (its name in the demo), whether it ran anything or not.
    workers: list[str] = field(default_factory=list)
    #: The beat process that held beat's lease (its name in the demo), and its term.
    beat_leader: str = ""
    beat_token: int = 0


class _Processes:
    """Worker and beat processes of the demo app, each in its own session."""

    def __init__(self, env: dict[str, str], workdir: Path) -> None:
        self.env, self.workdir = env, workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        #: The workers started, in order (``procs`` has the beat too).
        self.workers: list[str] = []

    def start(self, name: str, *args: str) -> None:
        log = (self.workdir / f"{name}.log").open("ab")
        self.procs[name] = subprocess.Popen(  # noqa: S603 - our interpreter, our module
            [sys.executable, "-m", "celery", "-A", APP, *args],
            env=self.env,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        log.close()

    def worker(self, name: str) -> None:
        self.workers.append(name)
        self.start(
            name,
            "worker",
            "-n",
            f"{name}@demo",
            "-c",
            "1",
            "-l",
            "info",
            "--without-mingle",
            "--without-gossip",
            "--without-heartbeat",
        )

    def kill(self, name: str, signum: int = signal.SIGKILL) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            os.killpg(proc.pid, signum)

    def stop_all(self) -> None:
        for name in self.procs:
            self.kill(name, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for name, proc in self.procs.items():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill(name, signal.SIGKILL)
                proc.wait()


@contextmanager
def _workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="celery-leader-demo-") as tmp:
        yield Path(tmp)


#: How many lines of each process's log the demo shows when no leader appears.
LOG_TAIL_LINES = 20


def _explain_no_leader(
    workdir: Path, procs: _Processes, timeline: Timeline, out: Callable[[str], None]
) -> None:
    """No leader appeared: show why (each log's tail) and keep the logs for a closer look."""
    kept = Path(tempfile.mkdtemp(prefix="celery-leader-demo-logs-"))
    timeline.say("no leader appeared; the end of each process's log follows")
    timeline.flush(everything=True)
    for name in procs.procs:
        log = workdir / f"{name}.log"
        if not log.exists():
            continue
        shutil.copy(log, kept / log.name)
        lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        out(f"--- {name}.log (last {len(lines)} lines)")
        out("\n".join(lines) if lines else "(empty)")
    out(f"--- the full logs are kept in {kept}")


@dataclass(frozen=True)
class Burst:
    """Leader-task runs of one worker, each less than :data:`BURST_GAP` after the one before."""

    worker: str
    count: int
    first_at: float
    seconds: float


def bursts(rows: list[dict[str, Any]]) -> list[Burst]:
    """The finished bursts of at least :data:`BURST_RUNS` runs in *rows* (lease-clock times).

    Beat sends a tick every :data:`TICK_SECONDS`, so runs come that far
    apart, unless ticks piled up in the leader queue while no worker led:
    the next leader then runs them back to back. A burst counts once a later
    run came at the normal pace, so it is reported whole.
    """
    found: list[Burst] = []
    run: list[dict[str, Any]] = []
    for row in sorted(rows, key=lambda r: float(r["at"])):
        if run and (row["worker"] != run[-1]["worker"] or row["at"] - run[-1]["at"] >= BURST_GAP):
            if len(run) >= BURST_RUNS:
                found.append(
                    Burst(run[0]["worker"], len(run), run[0]["at"], run[-1]["at"] - run[0]["at"])
                )
            run = []
        run.append(row)
    return found


def _rows(path: Path) -> list[dict[str, Any]]:
    """The JSON lines the workers appended to *path* so far, in the order of their times."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # a line being written
    # Workers append in the order they write, which is not always the order of their stamps.
    return sorted(rows, key=lambda row: float(row["at"]))


def run_celery_demo(
    *,
    broker: str | None = None,
    store: str | None = None,
    nodes: int = 3,
    ttl: float = 3.0,
    lead_for: float = 4.0,
    out: Callable[[str], None] = print,
) -> CeleryDemoResult:
    """Run the demo; print a narrative and a summary through *out*; return the figures."""
    result = CeleryDemoResult(filesystem_broker=not broker or broker.startswith("filesystem"))
    timeline = Timeline(out, clock.now())
    say = timeline.say

    with _workdir() as workdir:
        env = {
            **os.environ,
            "CELERY_LEADER_DEMO_DIR": str(workdir),
            "CELERY_LEADER_DEMO_BROKER": broker or "",
            "CELERY_LEADER_DEMO_STORE": store or "",
            "CELERY_LEADER_DEMO_TTL": str(ttl),
            "CELERY_LEADER_DEMO_TICK": str(TICK_SECONDS),
        }
        store_url = store or f"sqlite:///{workdir}/leader.db"
        lease_store = open_store(store_url, timeout=1.0)
        runs_file = workdir / "runs.jsonl"
        terms_file = workdir / "terms.jsonl"
        procs = _Processes(env, workdir)
        names = [f"node{i}" for i in range(1, nodes + 1)]

        def leader_now() -> tuple[str, int] | None:
            try:
                record = lease_store.read(NAMES.leader)
            except Exception:  # noqa: BLE001 - a demo keeps going through store hiccups
                return None
            if record is None or record.hold_off > 0:
                return None
            return record.nodename.split("@")[0], record.token

        beat_seen: list[tuple[str, int, bool] | None] = [None]

        def show_beat() -> None:
            """Say which beat holds beat's lease whenever that changes."""
            try:
                record = lease_store.read(NAMES.beat)
            except Exception:  # noqa: BLE001 - a demo keeps going through store hiccups
                return
            if record is None:
                return
            # The demo's own name for the process, when it started it.
            name = next((n for n, p in procs.procs.items() if p.pid == record.pid), record.nodename)
            now = (name, record.token, record.hold_off <= 0)
            if now == beat_seen[0]:
                return
            beat_seen[0] = now
            if record.hold_off > 0:
                say(
                    f"beat: {name} (pid {record.pid}) holds beat's lease and holds off "
                    f"{record.hold_off:.1f} s more, as the workers' first leader does: it "
                    "sends nothing yet"
                )
                return
            result.beat_leader, result.beat_token = name, record.token
            say(
                f"beat leader: {name} (pid {record.pid}, token {record.token}): it sends the "
                f"tick to the leader queue every {TICK_SECONDS:g} s, whichever worker leads "
                "(beat's election is its own)"
            )

        explained: set[tuple[str, float]] = set()

        def explain_bursts(rows: list[dict[str, Any]]) -> None:
            """One line per burst of runs, at its last run: what the jump in a worker's count is."""
            for burst in bursts(rows):
                if (burst.worker, burst.first_at) in explained:
                    continue
                explained.add((burst.worker, burst.first_at))
                timeline.add(
                    burst.first_at + burst.seconds,
                    f"{burst.worker.split('@')[0]} ran {burst.count} leader tasks within "
                    f"{burst.seconds:.2f} s: the backlog of ticks beat sent while no worker led "
                    "(they waited in the leader queue); each ran once, on the leader",
                )

        shown = [0.0]

        def look(rows: list[dict[str, Any]]) -> None:
            """Beat's lease and bursts at every look; who leads and the tally once a second."""
            show_beat()
            explain_bursts(rows)
            if time.monotonic() - shown[0] >= 1.0:
                shown[0] = time.monotonic()
                holder = leader_now()
                counts = Counter(r["worker"].split("@")[0] for r in rows)
                tally = "  ".join(f"{n}:{counts.get(n, 0)}" for n in sorted(procs.workers))
                who = f"{holder[0]} (token {holder[1]})" if holder else "nobody"
                say(f"leader: {who:<34} leader task runs  {tally}")
            timeline.flush()

        def watch_until(done: Callable[[list[dict[str, Any]]], Any], timeout: float) -> Any:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                rows = _rows(runs_file)
                value = done(rows)
                if value:
                    return value
                look(rows)
                time.sleep(0.05)
            raise TimeoutError("the demo did not see what it waited for in time")

        def watch_for(seconds: float) -> None:
            """Show what happens for *seconds*."""
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                look(_rows(runs_file))
                time.sleep(0.05)

        def first_run_after(
            moment: float, accept: Callable[[dict[str, Any]], bool]
        ) -> dict[str, Any]:
            """The first leader-task run after *moment* (lease clock) that *accept* takes."""
            run: dict[str, Any] = watch_until(
                lambda rows: next((r for r in rows if r["at"] > moment and accept(r)), None),
                ttl * 3 + 20,
            )
            return run

        try:
            say(
                f"broker: {mask_url(broker) if broker else 'filesystem (no server)'}; "
                f"lease store: {mask_url(store_url)}; ttl {ttl:g} s"
            )
            say(
                f"starting {nodes} workers and a beat "
                f"(LeaderScheduler, a tick every {TICK_SECONDS:g} s)"
            )
            for name in names:
                procs.worker(name)
            procs.start("beat", "beat", "-s", str(workdir / "beat-schedule"), "-l", "info")
            say(
                "a new store holds off one ttl before its first leader (it cannot know "
                "whether an earlier leader still acts)"
            )
            first = watch_until(lambda rows: rows[0] if rows else None, ttl * 4 + 30)
            result.first_leader = first["worker"].split("@")[0]
            result.first_token = first["token"]
            timeline.add(
                first["at"],
                f"{result.first_leader} leads with token {result.first_token}; only it runs "
                "the leader task",
            )
            watch_for(lead_for)
        except TimeoutError:
            pass
        result.workers = list(procs.workers)
        if not result.first_leader:
            _explain_no_leader(workdir, procs, timeline, out)
            result.runs = Counter()
            procs.stop_all()
            lease_store.close()
            out(summary(result, ttl))
            return result
        try:
            killed_at = clock.now()
            timeline.add(
                killed_at,
                f"SIGKILL {result.first_leader}: its lease must run out before anyone else leads",
            )
            procs.kill(result.first_leader)
            second = first_run_after(
                killed_at, lambda r: not r["worker"].startswith(result.first_leader + "@")
            )
            result.failover_leader = second["worker"].split("@")[0]
            result.failover_token = second["token"]
            result.failover_seconds = second["at"] - killed_at
            timeline.add(
                second["at"],
                f"failover: {result.failover_leader} ran the leader task "
                f"{result.failover_seconds:.2f} s after the kill (token {result.failover_token})",
            )
            restarted = f"{result.first_leader}b"
            say(
                f"restarting {result.first_leader} as {restarted}: a new worker, it joins "
                f"as a follower of {result.failover_leader}"
            )
            procs.worker(restarted)
            watch_for(lead_for)
        except TimeoutError:
            pass
        try:
            asked_at = clock.now()
            timeline.add(
                asked_at,
                f"celery leader step-down: {result.failover_leader} stops leader work and releases",
            )
            stepping_down = subprocess.Popen(  # noqa: S603 - our interpreter, our module
                [sys.executable, "-m", "celery", "-A", APP, "leader", "step-down"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

            def term_event(event: str, accept: Callable[[dict[str, Any]], bool]) -> Any:
                """The first ``terms.jsonl`` row of *event* that *accept* takes, or None."""
                return next(
                    (t for t in _rows(terms_file) if t["event"] == event and accept(t)), None
                )

            released = watch_until(
                lambda rows: term_event("released", lambda t: t["token"] == result.failover_token),
                ttl * 3 + 20,
            )
            timeline.add(
                released["at"],
                f"{result.failover_leader} released the lease {released['at'] - asked_at:.2f} s "
                "after the request (which starts a `celery leader step-down` process)",
            )
            third = first_run_after(asked_at, lambda r: r["token"] > result.failover_token)
            stepping_down.wait(60)
            result.handover_leader = third["worker"].split("@")[0]
            result.handover_token = third["token"]
            result.handover_seconds = third["at"] - released["at"]
            result.handover_request_seconds = third["at"] - asked_at
            elected = term_event("elected", lambda t: t["token"] == result.handover_token)
            if elected is not None:
                timeline.add(
                    elected["at"],
                    f"{result.handover_leader} holds the lease "
                    f"{elected['at'] - released['at']:.2f} s after the release",
                )
            timeline.add(
                third["at"],
                f"handover: {result.handover_leader} ran the leader task "
                f"{result.handover_seconds:.2f} s after the release "
                f"({result.handover_request_seconds:.2f} s after the step-down request)",
            )
        except TimeoutError:
            pass
        finally:
            timeline.flush(everything=True)
            result.workers = list(procs.workers)
            result.runs = Counter(r["worker"].split("@")[0] for r in _rows(runs_file))
            procs.stop_all()
            lease_store.close()
    out(summary(result, ttl))
    return result


def summary(result: CeleryDemoResult, ttl: float) -> str:
    """The closing table."""
    rising = 0 < result.first_token < result.failover_token < result.handover_token
    # Every worker started, 0 for one that ran nothing (the restarted one, often).
    workers = sorted(set(result.workers) | set(result.runs))
    beat = f"{result.beat_leader or 'none'}"
    return "\n".join(
        [
            "",
            "summary",
            f"  beat leader          {beat:<10} token {result.beat_token}",
            f"  first leader         {result.first_leader:<10} token {result.first_token}",
            f"  failover (SIGKILL)   {result.failover_leader:<10} token {result.failover_token}"
            f"   {result.failover_seconds:.2f} s (ttl {ttl:g} s)",
            f"  handover (step-down) {result.handover_leader:<10} token {result.handover_token}"
            f"   {result.handover_seconds:.2f} s from the release",
            f"{'':<34}({result.handover_request_seconds:.2f} s from the step-down request, "
            "which starts a process)",
            f"  tokens increased: {rising}",
            *([FILESYSTEM_FOOTNOTE] if result.filesystem_broker else []),
            "  leader task runs per worker: "
            + ", ".join(f"{name} {result.runs.get(name, 0)}" for name in workers),
        ]
    )
