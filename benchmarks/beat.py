"""Beat failover side by side: celery-leader, RedBeat and single-beat on real processes.

Run from the repository root:
    .venv/bin/python -m benchmarks.beat [--rounds 10] [--ttl 3 10] [--json FILE]
(needs ``pip install celery-redbeat single-beat`` in the venv).

For each scheduler, two instances run (each a ``celery beat``, under a
``single-beat`` wrapper for single-beat's rows) with one entry every second,
next to one real ``celery worker`` that runs the sent ticks and records which
instance sent each (celery-leader: the beat term's token in the message,
matched to the instance that logged it; the others: an instance id that
benchmarks/beatapps.py puts in the headers). Each row gets its own
redis-server (broker, lock or lease, history) per column, and the table shows:

* crash failover: SIGKILL of the sending instance's whole process group to
  the first tick sent by the other instance (run by the worker), median, p90
  and worst over the rounds;
* graceful handover: SIGTERM of the sending instance's main process to the
  first tick sent by the other instance, median, p90 and worst;
* tick gap: the struck instance's last tick to the other's first, median of
  each column (1 s: no slot lost; a handover that loses nothing still waits
  0 to 1 s for the next slot, which the two columns above include).

The tuned rows run once per ttl (``--ttl``, 3 s and 10 s by default), each
peer set to that ttl as far as its settings allow; the rows at the peers'
defaults ignore the ttl and run once.

Each strike lands at a random point of the tick (and renewal) cycle. After
each, the struck instance is replaced by a fresh one, which becomes the
standby. A wait is capped (``--cap``, 60 s): a row that reaches it is
reported as "> 60 s" and that column stops there (its next rounds would only
wait out the cap again). RedBeat at its defaults (a 25 min lock, polled every
5 min) can only reach the cap, so its row runs in the background while the
others run, to keep the whole run shorter.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import math
import os
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import NamedTuple

import celery
import redis

from benchmarks.stats import spread, to_json
from harness.servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
STOP = threading.Event()  # set on Ctrl-C or an error: every wait gives up
SPAWNED: list[Proc] = []  # every process started, for the last-resort cleanup
_SPAWN_LOCK = threading.Lock()
_TOKEN_LINE = re.compile(r"this beat sends now \(token (\d+)\)")


class StoppedError(Exception):
    """The run is being stopped (Ctrl-C, SIGTERM or an error elsewhere)."""


class Proc:
    """One process (and its children) in its own session, output to a log file."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], logdir: Path) -> None:
        self.name = name
        self.log = logdir / f"{name}.log"
        with open(self.log, "ab") as log, _SPAWN_LOCK:
            self.proc = subprocess.Popen(
                args, cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True
            )
            SPAWNED.append(self)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill_group(self) -> None:
        """SIGKILL the whole process group (the wrapper and its child, if any)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def terminate(self) -> None:
        """SIGTERM the main process only, as a supervisor stopping it would."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 15) -> None:
        self.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)
        self.kill_group()  # also whatever the main process left behind
        self.proc.wait(10)

    def wait_text(self, marker: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while marker not in self.text():
            checkpoint()
            if not self.alive():
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: no {marker!r} in its log:\n{self.tail()}")
            time.sleep(0.05)

    def tail(self) -> str:
        return self.text()[-3000:]


def checkpoint() -> None:
    if STOP.is_set():
        raise StoppedError


@dataclass(frozen=True)
class Peer:
    """One row: a scheduler, its settings, and how to run an instance of it."""

    label: str
    settings: str
    app: str  # the module given to celery -A
    env: Callable[[int, str], dict[str, str]]  # (redis port, unique name) -> environment
    ready: str  # log line of an instance that runs and competes
    single_beat: bool = False
    background: bool = False  # only waits out the cap: run next to the other rows
    ttl: float | None = None  # the ttl it is tuned to (None: defaults, the same at any ttl)

    @property
    def key(self) -> str:
        return self.label if self.ttl is None else f"{self.label}, ttl {self.ttl:g} s"


def peers(ttls: list[float]) -> list[Peer]:
    """The tuned rows once per ttl, then the rows at their defaults (which ignore the ttl)."""
    rows = [peer for ttl in ttls for peer in tuned_peers(ttl)]
    return [*rows, *default_peers()]


def leader_env(ttl: float) -> Callable[[int, str], dict[str, str]]:
    def env(port: int, name: str) -> dict[str, str]:
        return {
            "LEADER_BROKER": f"redis://127.0.0.1:{port}/0",
            "LEADER_STORE": f"redis://127.0.0.1:{port}/1",
            "LEADER_HISTORY": f"redis://127.0.0.1:{port}/2",
            "LEADER_NAME": name,
            "LEADER_TTL": f"{ttl:g}",
            "LEADER_BEAT_EVERY": "1",
        }

    return env


def app_env(port: int, name: str) -> dict[str, str]:
    return {
        "BENCH_BROKER": f"redis://127.0.0.1:{port}/0",
        "BENCH_HISTORY": f"redis://127.0.0.1:{port}/2",
        "BENCH_NAME": name,
    }


def redbeat_env(lock: int | None) -> Callable[[int, str], dict[str, str]]:
    """RedBeat's environment: tuned to a *lock* timeout in seconds, or its defaults (None)."""

    def env(port: int, name: str) -> dict[str, str]:
        extra = {
            "BENCH_SCHEDULER": "redbeat",
            "BENCH_REDBEAT_REDIS": f"redis://127.0.0.1:{port}/3",
        }
        if lock is not None:
            extra["BENCH_REDBEAT_LOCK_TIMEOUT"] = str(lock)
            extra["BENCH_MAX_INTERVAL"] = f"{lock / 3:g}"
        return {**app_env(port, name), **extra}

    return env


def single_beat_env(lock: int | None) -> Callable[[int, str], dict[str, str]]:
    """single-beat's environment: tuned to a *lock* time in seconds, or its defaults (None)."""

    def env(port: int, name: str) -> dict[str, str]:
        extra = {
            "BENCH_SCHEDULER": "persistent",
            "SINGLE_BEAT_REDIS_SERVER": f"redis://127.0.0.1:{port}/4",
            "SINGLE_BEAT_IDENTIFIER": f"bench-{name}",
            "SINGLE_BEAT_LOG_LEVEL": "debug",  # "timer called": the wrapper competes
        }
        if lock is not None:
            extra["SINGLE_BEAT_LOCK_TIME"] = str(lock)
            extra["SINGLE_BEAT_HEARTBEAT_INTERVAL"] = "1"
        return {**app_env(port, name), **extra}

    return env


def tuned_peers(ttl: float) -> list[Peer]:
    lock = max(3, round(ttl))  # RedBeat and single-beat take whole seconds
    return [
        Peer(
            "celery-leader",
            f"LeaderScheduler over PersistentScheduler (renew every {ttl / 3:.3g} s)",
            "tests.integration.leaderapp",
            leader_env(ttl),
            "celery-leader beat: election",
            ttl=ttl,
        ),
        Peer(
            "RedBeat, tuned",
            f"redbeat_lock_timeout={lock}, beat_max_loop_interval={lock / 3:.3g}",
            "benchmarks.beatapps",
            redbeat_env(lock),
            "beat: Starting...",
            ttl=ttl,
        ),
        Peer(
            "single-beat, tuned",
            f"SINGLE_BEAT_LOCK_TIME={lock}, HEARTBEAT_INTERVAL=1",
            "benchmarks.beatapps",
            single_beat_env(lock),
            "timer called",
            single_beat=True,
            ttl=ttl,
        ),
    ]


def default_peers() -> list[Peer]:
    return [
        Peer(
            "RedBeat, defaults",
            "lock_timeout = 5 x max interval (300 s) = 1500 s; standby retries every 300 s",
            "benchmarks.beatapps",
            redbeat_env(None),
            "beat: Starting...",
            background=True,
        ),
        Peer(
            "single-beat, defaults",
            "LOCK_TIME=5, HEARTBEAT_INTERVAL=1 (INITIAL_LOCK_TIME=10)",
            "benchmarks.beatapps",
            single_beat_env(None),
            "timer called",
            single_beat=True,
        ),
    ]


class Bench:
    """One redis-server, one worker and the beat instances of one peer."""

    def __init__(self, tmp: Path, peer: Peer) -> None:
        tmp.mkdir(parents=True)
        self.tmp = tmp
        self.peer = peer
        self.name = f"b{uuid.uuid4().hex[:8]}"
        self.redis = RedisServer(tmp).start()
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",  # single-beat forwards its child's output: no lag
            **peer.env(self.redis.port, self.name),
        }
        self.history = redis.Redis(
            host="127.0.0.1", port=self.redis.port, db=2, decode_responses=True
        )
        self.rows: list[dict] = []  # the beat ticks run, in order
        self.read = 0  # how many entries of the history list were read (not all are ticks)
        self.tokens: dict[int, str] = {}
        self.beats: list[Proc] = []  # running
        self.started: list[Proc] = []  # ever, for the tokens in their logs
        try:
            self.worker = Proc(
                "worker",
                [
                    *self.celery(),
                    "worker",
                    "-n",
                    f"w@{self.name}",
                    "-P",
                    "solo",
                    "-l",
                    "info",
                    "--without-gossip",
                    "--without-mingle",
                    "--without-heartbeat",
                ],
                self.env,
                tmp,
            )
        except BaseException:
            self.redis.stop()
            raise

    def celery(self) -> list[str]:
        return [sys.executable, "-m", "celery", "-A", self.peer.app]

    def add_beat(self) -> Proc:
        name = f"beat{len(self.started) + 1}"
        args = [*self.celery(), "beat", "-s", str(self.tmp / f"{name}-schedule"), "-l", "info"]
        if self.peer.single_beat:
            args = [str(BIN / "single-beat"), *args]
        beat = Proc(name, args, {**self.env, "BENCH_BEAT_ID": name}, self.tmp)
        self.beats.append(beat)
        self.started.append(beat)
        return beat

    def refresh(self) -> None:
        """Read the rows the worker recorded since the last call."""
        new = self.history.lrange("history", self.read, -1)
        self.read += len(new)
        self.rows += [row for row in map(json.loads, new) if row["kind"] == "beat"]

    def sender(self, row: dict) -> str | None:
        """The name of the instance that sent *row*'s tick (None: not known yet)."""
        if "beat" in row:
            return row["beat"]
        token = row.get("token")
        if token not in self.tokens:
            for beat in self.started:
                for match in _TOKEN_LINE.finditer(beat.text()):
                    self.tokens[int(match.group(1))] = beat.name
        return self.tokens.get(token)

    def check_beats(self) -> None:
        for beat in self.beats:
            if not beat.alive():
                raise RuntimeError(f"{beat.name} exited {beat.proc.returncode}:\n{beat.tail()}")

    def wait_steady(self, after: float, timeout: float = 90) -> Proc:
        """The sending instance, once both run and it sent two ticks in a row after *after*."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            checkpoint()
            self.check_beats()
            self.refresh()
            recent = [r for r in self.rows if r["at"] > after][-2:]
            ready = all(self.peer.ready in beat.text() for beat in self.beats)
            if ready and len(recent) == 2:
                names = {self.sender(r) for r in recent}
                for beat in self.beats:
                    if names == {beat.name}:
                        return beat
            time.sleep(0.05)
        logs = "\n".join(f"--- {b.name}\n{b.tail()}" for b in self.beats)
        raise RuntimeError(f"{self.peer.label}: no steady sender within {timeout:g} s\n{logs}")

    def wait_first(self, struck: str, t0: float, cap: float) -> float | None:
        """Seconds from *t0* to the first tick sent by an instance other than *struck*."""
        while time.monotonic() < t0 + cap:
            checkpoint()
            self.refresh()
            for row in self.rows:
                if row["at"] > t0 and self.sender(row) not in (None, struck):
                    return float(row["at"] - t0)
            time.sleep(0.02)
        return None

    def retire(self, beat: Proc) -> None:
        """Let a struck instance finish (a SIGTERM'd one may still be shutting down)."""
        beat.stop(timeout=30)
        self.beats.remove(beat)

    def close(self) -> None:
        procs = [*self.beats, self.worker]
        for proc in procs:  # all at once: each takes a moment to stop
            proc.terminate()
        for proc in procs:
            proc.stop()
        self.history.close()
        self.redis.stop()


class Round(NamedTuple):
    """One strike: seconds to the other instance's first tick, and the gap in ticks around it."""

    took: float  # strike -> first tick sent by the other instance (inf: not within the cap)
    gap: float  # last tick sent by the struck instance -> that first tick (1 s: none missed)


def measure(
    tmp: Path,
    peer: Peer,
    *,
    crash: bool,
    rounds: int,
    cap: float,
    armed: threading.Event | None = None,
) -> list[Round]:
    """One column of one row: a strike per round, and what followed it."""
    rng = random.Random(1)
    bench = Bench(tmp, peer)
    results: list[Round] = []
    try:
        bench.worker.wait_text("ready.")
        bench.add_beat()
        bench.add_beat()
        last = 0.0
        for _ in range(rounds):
            sender = bench.wait_steady(after=last)
            time.sleep(rng.uniform(0, 1))  # a random point of the tick and renewal cycles
            checkpoint()
            t0 = time.monotonic()
            if crash:
                sender.kill_group()
            else:
                sender.terminate()
            if armed is not None:
                armed.set()
            took = bench.wait_first(sender.name, t0, cap)
            bench.retire(sender)
            if took is None:
                results.append(Round(math.inf, math.inf))
                break  # the next rounds would only wait out the cap again
            bench.refresh()
            last_struck = max(r["at"] for r in bench.rows if bench.sender(r) == sender.name)
            results.append(Round(took, t0 + took - last_struck))
            last = t0 + took
            bench.add_beat()
    finally:
        if armed is not None:
            armed.set()
        bench.close()
    return results


def cell(value: float, cap: float) -> str:
    return f"> {cap:g} s" if math.isinf(value) else f"{value:.2f} s"


def redis_server_version() -> str:
    out = subprocess.run(
        ["redis-server", "--version"], capture_output=True, text=True, check=True
    ).stdout
    match = re.search(r"v=(\S+)", out)
    return match.group(1) if match else out.strip()


Results = dict[tuple[str, bool], list[Round]]


def run_all(tmp: Path, rows: list[Peer], rounds: int, cap: float) -> Results:
    """Every row, both columns: background rows in threads, the others one after another."""
    results: Results = {}
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=4)
    try:
        futures = {}
        armed = []
        for i, peer in enumerate(rows):
            for crash in (True, False) if peer.background else ():
                event = threading.Event()
                armed.append(event)
                futures[peer.key, crash] = pool.submit(
                    measure,
                    tmp / f"{i}-{crash}",
                    peer,
                    crash=crash,
                    rounds=rounds,
                    cap=cap,
                    armed=event,
                )
        for event in armed:  # their start-up is over before the timed rows begin
            while not event.wait(0.1):
                checkpoint()
        for i, peer in enumerate(rows):
            for crash in () if peer.background else (True, False):
                values = measure(tmp / f"{i}-{crash}", peer, crash=crash, rounds=rounds, cap=cap)
                results[peer.key, crash] = values
                column = "crash" if crash else "graceful"
                took = [round(r.took, 2) for r in values]
                print(f"{peer.key}, {column}: {took}", flush=True)
        for key, future in futures.items():
            results[key] = future.result()
    finally:
        STOP.set()
        pool.shutdown(wait=True, cancel_futures=True)
        for proc in SPAWNED:  # last resort: normally each Bench stopped its own
            if proc.alive():
                proc.kill_group()
                proc.proc.wait(10)
    return results


def print_table(rows: list[Peer], results: Results, rounds: int, cap: float) -> None:
    print(
        "| scheduler | ttl | settings | crash: median | p90 | worst | graceful: median | p90 "
        f"| worst | tick gap, median: crash / graceful | rounds (of {rounds}) |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for peer in rows:
        crash = [r.took for r in results[peer.key, True]]
        graceful = [r.took for r in results[peer.key, False]]
        gaps = [
            cell(statistics.median([r.gap for r in results[peer.key, kind]]), cap)
            for kind in (True, False)
        ]
        ttl = "any" if peer.ttl is None else f"{peer.ttl:g} s"
        timings = " | ".join(cell(v, cap) for v in (*spread(crash), *spread(graceful)))
        print(
            f"| {peer.label} | {ttl} | {peer.settings} | {timings} "
            f"| {gaps[0]} / {gaps[1]} | {len(crash)} / {len(graceful)} |"
        )


def figures(rows: list[Peer], results: Results) -> dict[str, dict[str, object]]:
    """The raw seconds per row and column, for benchmarks.report (null: reached the cap)."""
    return {
        peer.key: {
            "label": peer.label,
            "ttl": peer.ttl,
            "crash": to_json([r.took for r in results[peer.key, True]]),
            "graceful": to_json([r.took for r in results[peer.key, False]]),
        }
        for peer in rows
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--ttl", type=float, nargs="+", default=[3.0, 10.0])
    parser.add_argument("--cap", type=float, default=60.0, help="longest wait for one failover")
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    args = parser.parse_args()
    if not (BIN / "single-beat").exists():
        sys.exit("single-beat is not installed: .venv/bin/pip install celery-redbeat single-beat")
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    started = time.monotonic()
    rows = peers(args.ttl)
    with tempfile.TemporaryDirectory() as tmp_name:
        results = run_all(Path(tmp_name), rows, args.rounds, args.cap)
    # Where the raw figures went (a temporary file of the report) is no setting: not shown.
    shown, skip = [], False
    for arg in sys.argv[1:]:
        if not skip and not arg.startswith("--json"):
            shown.append(arg)
        skip = arg == "--json"
    command = shlex.join(
        [os.path.relpath(sys.executable, Path.cwd()), "-m", "benchmarks.beat", *shown]
    )
    print(f"\ncommand: {command}  (took {time.monotonic() - started:.0f} s)")
    print(
        f"versions: celery {celery.__version__}, celery-redbeat {version('celery-redbeat')}, "
        f"single-beat {version('single-beat')}, redis-server {redis_server_version()}, "
        f"celery-leader {version('celery-leader')}"
    )
    print(
        f"\nbeat failover: 2 instances, one entry every 1 s, {args.rounds} rounds; seconds from "
        "the signal to the first tick sent by the other instance (as run by the worker)\n"
    )
    print_table(rows, results, args.rounds, args.cap)
    if args.json:
        args.json.write_text(json.dumps({"beat": figures(rows, results), "cap": args.cap}))
    print(
        "\ncrash: SIGKILL of the sending instance's process group; graceful: SIGTERM of its "
        "main process. With one tick a second, even a handover that loses nothing waits for "
        "the next slot (0 to 1 s); tick gap: last tick of the struck instance to the first of "
        "the other (1 s: no slot missed; n s: n - 1 missed; under 0.5 s: a slot sent twice). "
        f"A column that reached the {args.cap:g} s cap stopped there (rounds: how many ran)."
    )


if __name__ == "__main__":
    main()
