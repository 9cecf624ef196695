"""Who led each election, as a real Prometheus scraped it: docs/leader-timeline.png.

Three prefork workers take part in three elections (the default one,
``billing`` and ``reports``; named elections spread over the workers) and
a beat sends a 1 s entry. A real ``prometheus`` scrapes all four every
0.5 s. The run steps the default election's leader down (``celery leader
step-down``), then SIGKILLs the process leading ``billing``. The chart is
drawn from ``max by (election, process) (celery_leader_is_leader)`` over
the run, as Prometheus stored it: one row per election and process, filled
while that process reported itself leader, with the two faults marked.

Run: ``python -m benchmarks.leader_timeline`` (needs ``prometheus``,
``redis-server`` and matplotlib: ``./run.sh bench`` installs them). It
prints each term as Prometheus saw it and writes the chart.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from harness.cluster import ROOT, Cluster, Worker
from harness.prometheus import PrometheusServer
from harness.servers import free_port

APP = "tests.integration.electionsapp"
CHART = ROOT / "docs" / "leader-timeline.png"
SCRAPE = 0.5
TTL = 3.0


class Term(NamedTuple):
    """One stretch of time a process reported leading an election, as scraped."""

    election: str
    process: str
    start: float
    end: float


class Run(NamedTuple):
    """What the run recorded: the terms, its faults (seconds from its start, label)."""

    terms: list[Term]
    faults: list[tuple[float, str]]
    length: float
    elections: list[str]
    processes: list[str]


def _terms(series: list[dict], started: float, step: float, names: dict[str, str]) -> list[Term]:
    """The stretches of value 1 in each (election, process) series of a range query."""
    terms = []
    for row in series:
        election = names.get(row["metric"]["election"], row["metric"]["election"])
        process = row["metric"]["process"]
        start = None
        last = None
        for stamp, value in row["values"]:
            at = float(stamp) - started
            if float(value) == 1 and start is None:
                start = at
            if float(value) != 1 and start is not None:
                terms.append(Term(election, process, start, at))
                start = None
            # A gap (the process was gone) ends a term as well.
            if start is not None and last is not None and at - last > 2 * step:
                terms.append(Term(election, process, start, last))
                start = at
            last = at
        if start is not None and last is not None:
            terms.append(Term(election, process, start, last))
    return sorted(terms, key=lambda t: (t.election, t.start))


def record(workdir: Path) -> Run:
    """Run the workers, the beat and Prometheus through a step-down and a kill."""
    cluster = Cluster(workdir, "redis")
    cluster.env.update({"LEADER_TTL": f"{TTL:g}", "LEADER_BEAT_EVERY": "1"})
    ports: dict[str, int] = {}
    workers: dict[str, Worker] = {}
    prometheus = PrometheusServer(workdir, scrape_interval=SCRAPE)
    try:
        for index in range(1, 4):
            process = f"w{index}"
            ports[process] = free_port()
            (workers[process],) = cluster.start(
                1, app=APP, env={"LEADER_METRICS_PORT": str(ports[process])}
            )
        ports["beat1"] = free_port()
        cluster.start_beat(app=APP, env={"LEADER_BEAT_METRICS_PORT": str(ports["beat1"])})
        prometheus.start()
        prometheus.scrape(ports)
        prometheus.wait_scraping(set(ports))
        cluster.leader_worker(timeout=30)
        started = time.time()
        faults: list[tuple[float, str]] = []
        time.sleep(8)
        leader = cluster.leader_worker()
        proc = cluster.celery("leader", "step-down", app=APP)
        if proc.returncode != 0:
            raise RuntimeError(f"step-down failed: {proc.stdout}{proc.stderr}")
        faults.append((time.time() - started, f"step-down ({_process(workers, leader)})"))
        time.sleep(8)
        billing = _holder(cluster, f"{cluster.name}.billing", workers)
        workers[billing].signal(signal.SIGKILL)
        faults.append((time.time() - started, f"SIGKILL {billing}"))
        time.sleep(12)
        ended = time.time()
        series = prometheus.query_range(
            "max by (election, process) (celery_leader_is_leader)", started, ended, SCRAPE
        )
    finally:
        prometheus.stop()
        cluster.close()
    names = {
        cluster.name: "default",
        f"{cluster.name}.billing": "billing",
        f"{cluster.name}.reports": "reports",
        f"{cluster.name}.beat": "beat",
    }
    terms = _terms(series, started, SCRAPE, names)
    elections = [
        e for e in ("default", "billing", "reports", "beat") if any(t.election == e for t in terms)
    ]
    return Run(terms, faults, ended - started, elections, sorted(ports))


def _process(workers: dict[str, Worker], worker: Worker) -> str:
    return next(p for p, w in workers.items() if w is worker)


def _holder(cluster: Cluster, lease: str, workers: dict[str, Worker]) -> str:
    from celery_leader.stores import open_store

    store = open_store(cluster.env["LEADER_STORE"], timeout=2)
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            record = store.read(lease)
            if record is not None:
                for process, worker in workers.items():
                    if worker.nodename == record.nodename:
                        return process
            time.sleep(0.1)
    finally:
        store.close()
    raise RuntimeError(f"nobody holds {lease}")


def draw(run: Run, path: Path) -> bool:
    """Write the chart to *path*; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    colours = {p: plt.get_cmap("tab10")(i) for i, p in enumerate(run.processes)}
    workers = [p for p in run.processes if p.startswith("w")]
    rows = [(e, p) for e in run.elections for p in (["beat1"] if e == "beat" else workers)]
    fig, ax = plt.subplots(figsize=(11, 0.42 * len(rows) + 1.6))
    for index, (election, process) in enumerate(rows):
        for term in run.terms:
            if term.election == election and term.process == process:
                ax.broken_barh(
                    [(term.start, max(term.end - term.start, SCRAPE))],
                    (index - 0.35, 0.7),
                    color=colours[process],
                )
    for at, label in run.faults:
        ax.axvline(at, color="black", linestyle="--", linewidth=1)
        ax.annotate(label, (at, -0.75), xytext=(4, 0), textcoords="offset points", fontsize=9)
    ax.set_yticks(range(len(rows)), [f"{e}: {p}" for e, p in rows])
    ax.set_ylim(len(rows) - 0.4, -1.0)  # top to bottom, with room for the labels above
    ax.set_xlim(0, run.length)
    ax.set_xlabel("seconds (celery_leader_is_leader as Prometheus scraped it every 0.5 s)")
    ax.set_title(f"Who led each election: 3 workers, 1 beat, ttl {TTL:g} s")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chart", type=Path, default=CHART, help="where to write the chart")
    # benchmarks.report hands --rounds to every benchmark: this one is a single run.
    parser.add_argument("--rounds", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        run = record(Path(workdir))
    print("| election | process | from (s) | to (s) |")
    print("|---|---|---|---|")
    for term in run.terms:
        print(f"| {term.election} | {term.process} | {term.start:.1f} | {term.end:.1f} |")
    for at, label in run.faults:
        print(f"fault at {at:.1f} s: {label}")
    drew = draw(run, args.chart)
    print(f"wrote {args.chart}" if drew else "nothing drawn (no matplotlib?)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
