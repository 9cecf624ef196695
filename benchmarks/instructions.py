"""Instructions per leader-only no-op task against a plain one, counted by callgrind.

Run from the repository root (needs ``valgrind``; Debian's package has it):
    .venv/bin/python -m benchmarks.instructions [--tasks 220 520] [--rounds 1]

Why a second figure beside the throughput ratio of ``benchmarks.workers``:
on a shared 2-core machine one kind's rate moves by 10 to 70 % from run to
run, far more than the 2 % the gate may cost, so a rate ratio needs many
quiet runs to say anything. Instructions executed hardly depend on what
else the machine does (only work paid per second, below, does). Callgrind
counts them exactly, about 50 times slower than the real worker.

Method: one prefork worker (``-c 2``, Redis broker and store) runs under
``valgrind --tool=callgrind`` on a queue filled before it starts, on a store
primed so that it leads at once, for each kind and each count in
``--tasks``. The main process is counted between two dumps: once the worker
leads and a few runs are done, and once the last run is done. The pool
children cannot be dumped while they run; their totals are read at exit,
and the count per task is the difference between the two counts of
``--tasks``, over the runs between them (what a child does before its first
run and at exit, and the counts it inherits from the main process at the
fork, are the same in both). The watchdog process is left out: it does not
work per task.

What it does not show: the cost of cold caches, which makes each
instruction of the gate dearer in a real worker than in a loop, and
background work paid per second rather than per task (the lease's
renewals), which callgrind's slowness charges to each task about 50 times
over, in proportion to each run's time under callgrind (a few percent
more for leader-only runs, which take longer).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.workers import leads
from harness.cluster import Cluster, Worker

KINDS = ("plain", "leader")
#: Runs done before the main process's first dump (start-up effects left out).
WARM_RUNS = 20
#: The goal of the issue that made this benchmark: leader-only at 0.98 of plain or better.
GOAL = 0.98


def _total(path: Path) -> int:
    """The instruction total a callgrind output file records."""
    for line in path.read_text().splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise ValueError(f"{path}: no totals line")


def _dump(pid: int) -> None:
    subprocess.run(["callgrind_control", "--dump", str(pid)], capture_output=True, check=True)


def _watchdog_pid(worker: Worker) -> int | None:
    for line in worker.text().splitlines():
        if "run watchdog started (pid " in line:
            return int(line.rsplit("(pid ", 1)[1].split(")")[0])
    return None


def count_run(tmp: Path, kind: str, tasks: int) -> dict[str, float]:
    """One worker under callgrind running *tasks* no-ops of *kind*.

    Returns the main process's instructions between its two dumps
    (``main``), the runs between them (``runs``), and the pool children's
    lifetime total (``children``).
    """
    out = Path(tempfile.mkdtemp(prefix=f"{kind}-{tasks}-", dir=tmp))
    cluster = Cluster(out, "redis")
    try:
        cluster.prime_store()
        for _ in range(tasks):
            cluster.send(f"noop_{kind}")
        wrapper = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}/callgrind.%p",
            "--dump-line=no",
        ]
        # A long ttl: under callgrind a renewal takes about 50 times as long; a
        # visibility timeout no run or prefetched message comes near (no copy runs).
        env = {"LEADER_TTL": "20", "LEADER_VISIBILITY": "3600", "PYTHONHASHSEED": "0"}
        (worker,) = cluster.start(1, extra=["-c", "2"], env=env, wrapper=wrapper, wait=False)
        worker.wait_ready(timeout=600)
        key = f"noop-{kind}"
        marks: list[float] = []
        deadline = time.monotonic() + 1800
        for target in (WARM_RUNS, tasks):
            while int(cluster.history_client.get(key) or 0) < target or not leads(worker):
                if worker.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{kind}: worker ended or stalled:\n{worker.text()[-2000:]}")
                time.sleep(0.05)
            # Runs go on in the children while the main process dumps: the
            # mark is the middle of the counts read before and after.
            before = int(cluster.history_client.get(key) or 0)
            _dump(worker.proc.pid)
            marks.append((before + int(cluster.history_client.get(key) or 0)) / 2)
        watchdog = _watchdog_pid(worker)
        children = [
            int(pid)
            for pid in subprocess.run(
                ["pgrep", "-P", str(worker.proc.pid)], capture_output=True, text=True, check=False
            ).stdout.split()
            if int(pid) != watchdog
        ]
        worker.proc.send_signal(signal.SIGTERM)
        worker.proc.wait(300)
        time.sleep(1)  # the children write their totals as they exit
        ran = int(cluster.history_client.get(key) or 0)
        if ran != tasks:  # a message run twice would count twice in the children's totals
            raise RuntimeError(f"{kind}: {ran} runs of {tasks} messages")
    finally:
        cluster.close()
    main_dumps = sorted(out.glob(f"callgrind.{worker.proc.pid}.*"), key=lambda p: int(p.suffix[1:]))
    runs = marks[1] - marks[0]
    if runs <= 0:
        raise RuntimeError(f"{kind}: no run between the dumps (marks {marks})")
    return {
        "main": _total(main_dumps[1]),
        "runs": runs,
        "children": sum(_total(out / f"callgrind.{pid}") for pid in children),
    }


def measure(tmp: Path, counts: tuple[int, int], rounds: int) -> dict[str, dict[str, list[float]]]:
    """Per kind: main-process and pool-children instructions per run, one entry per round."""
    found: dict[str, dict[str, list[float]]] = {
        kind: {"main": [], "children": []} for kind in KINDS
    }
    small, large = counts
    for round_ in range(rounds):
        for kind in KINDS if round_ % 2 == 0 else KINDS[::-1]:
            few = count_run(tmp, kind, small)
            many = count_run(tmp, kind, large)
            found[kind]["main"].append((few["main"] + many["main"]) / (few["runs"] + many["runs"]))
            found[kind]["children"].append((many["children"] - few["children"]) / (large - small))
            print(
                f"{kind}: main {found[kind]['main'][-1] / 1e6:.3f} M, children "
                f"{found[kind]['children'][-1] / 1e6:.3f} M instructions per run",
                flush=True,
            )
    return found


def report(found: dict[str, dict[str, list[float]]], counts: tuple[int, int]) -> float:
    """Print the table; return plain / leader-only instructions per run."""
    per = {
        kind: {part: statistics.median(values) for part, values in parts.items()}
        for kind, parts in found.items()
    }
    total = {kind: per[kind]["main"] + per[kind]["children"] for kind in KINDS}
    ratio = total["plain"] / total["leader"]
    print(
        f"\ninstructions per no-op run on one prefork worker (-c 2, both acks_late, the worker "
        f"leading), callgrind, {counts[0]} and {counts[1]} tasks, "
        f"median of {len(found['plain']['main'])} round(s):\n"
        "| process | plain | leader-only | extra |\n|---|---|---|---|"
    )
    for part in ("main", "children"):
        plain, leader = per["plain"][part], per["leader"][part]
        print(
            f"| {part} | {plain / 1e6:.3f} M | {leader / 1e6:.3f} M | "
            f"{(leader - plain) / 1e3:+.0f} k ({leader / plain - 1:+.1%}) |"
        )
    print(
        f"| all | {total['plain'] / 1e6:.3f} M | {total['leader'] / 1e6:.3f} M | "
        f"{(total['leader'] - total['plain']) / 1e3:+.0f} k |\n"
        f"plain / leader-only: {ratio:.3f} (goal >= {GOAL}: {'met' if ratio >= GOAL else 'MISSED'})"
    )
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tasks", type=int, nargs=2, default=(220, 520), metavar=("FEW", "MANY"))
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit(
            "benchmarks.instructions needs valgrind (Debian: apt-get install valgrind)"
        )
    counts = (min(args.tasks), max(args.tasks))
    if counts[0] <= WARM_RUNS or counts[0] == counts[1]:
        raise SystemExit(f"--tasks: two different counts above {WARM_RUNS}")
    with tempfile.TemporaryDirectory(prefix="leader-instructions-") as tmp:
        report(measure(Path(tmp), counts, args.rounds), counts)


if __name__ == "__main__":
    main()
