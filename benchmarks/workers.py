"""End-to-end benchmark on real worker processes (Redis broker, Redis lease store).

Run from the repository root:
    .venv/bin/python -m benchmarks.workers [--rounds 10] [--ttl 3 10] [--json FILE]

Prints one table per ttl:
* crash failover: SIGKILL of the leading worker to the first leader task on the
  new leader, split in its parts: the lease running out in the store, the
  standby's election after that, and the first task after the election;
* graceful handover: SIGTERM of the idle leader to the first leader task on
  the new leader, and the part of it from the lease's release;
* revocation: the leader's local loss of the lease (store paused) to its
  running terminate-policy task being gone;
* gate overhead (once): throughput of leader-only no-op tasks over plain
  ones on one prefork worker.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import signal
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path

from benchmarks.stats import spread
from tests.integration.conftest import Cluster


def runs(rows, kind="start"):
    return [r for r in rows if r["kind"] == kind]


def lease_pttl(cluster: Cluster) -> float:
    client = cluster.store.client()
    pttl = client.pttl(f"celery-leader:{{{cluster.name}}}:lease")
    client.close()
    return max(0, pttl) / 1000


def crash_rounds(tmp: Path, ttl: float, rounds: int) -> list[dict[str, float]]:
    cluster = Cluster(tmp / "crash", "redis")
    cluster.env["LEADER_TTL"] = str(ttl)
    results = []
    rng = random.Random(1)
    try:
        cluster.start(3)
        for _ in range(rounds):
            leader = cluster.leader_worker(timeout=ttl * 3 + 10)
            cluster.history_client.delete("history")
            sending = True
            # Strike at a random point of the renew cycle, as a real crash would.
            time.sleep(0.3 + rng.uniform(0, ttl / 3))
            left = lease_pttl(cluster)
            killed_at = time.monotonic()
            leader.signal(signal.SIGKILL)
            expires_at = killed_at + left
            i = 0
            first = None
            while sending and time.monotonic() < killed_at + ttl * 3 + 10:
                cluster.send("leader_record", i)
                i += 1
                rows = cluster.history()
                new = [x for x in runs(rows) if x["worker"] != leader.nodename]
                if new:
                    first = min(x["at"] for x in new)
                    elected = min(x["at"] for x in runs(rows, "signal-elected"))
                    sending = False
                time.sleep(0.01)
            if first is None:
                raise RuntimeError("no failover")
            results.append(
                {
                    "failover": first - killed_at,
                    "expiry": first - expires_at,
                    "notice": elected - expires_at,
                    "pickup": first - elected,
                }
            )
            leader.proc.wait(10)
            cluster.start(1)
    finally:
        cluster.close()
    return results


def handover_rounds(tmp: Path, ttl: float, rounds: int) -> list[dict[str, float]]:
    """Per round: SIGTERM -> first leader task on another worker, and release -> that task."""
    cluster = Cluster(tmp / "handover", "redis")
    cluster.env["LEADER_TTL"] = str(ttl)
    results = []
    try:
        cluster.start(3)
        for _ in range(rounds):
            leader = cluster.leader_worker(timeout=ttl * 3 + 10)
            cluster.history_client.delete("history")
            termed_at = time.monotonic()
            leader.proc.send_signal(signal.SIGTERM)
            i, first = 0, None
            deadline = time.monotonic() + ttl * 3 + 10
            while first is None and time.monotonic() < deadline:
                cluster.send("leader_record", i)
                i += 1
                rows = cluster.history()
                new = [x for x in runs(rows) if x["worker"] != leader.nodename]
                released = runs(rows, "signal-released")
                if new and released:
                    first = min(x["at"] for x in new)
                    results.append(
                        {"sigterm": first - termed_at, "released": first - released[0]["at"]}
                    )
                time.sleep(0.005)
            if first is None:
                raise RuntimeError("no handover")
            leader.proc.wait(20)
            cluster.start(1)
    finally:
        cluster.close()
    return results


_LOG_TIME = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): WARNING/MainProcess\] "
    r"celery-leader: .* lost the lead"
)


def revocation_rounds(tmp: Path, ttl: float, rounds: int) -> list[float]:
    results = []
    for round_ in range(rounds):
        cluster = Cluster(tmp / "revoke" / str(round_), "redis")
        cluster.env["LEADER_TTL"] = str(ttl)
        try:
            (worker,) = cluster.start(1)
            cluster.leader_worker(timeout=ttl * 3 + 10)
            cluster.send("long_terminate", 60)
            rows = cluster.wait_history(runs, 10)
            pid = runs(rows)[0]["pid"]
            cluster.store.pause()
            try:
                while _pid_alive(pid):
                    time.sleep(0.002)
                gone_wall = time.time()
            finally:
                cluster.store.resume()
            lines = [m for m in map(_LOG_TIME.match, worker.text().splitlines()) if m]
            lost_wall = datetime.strptime(lines[0].group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            results.append(gone_wall - lost_wall)
        finally:
            cluster.close()
    return results


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except OSError:
        return False


def throughput(tmp: Path, count: int) -> tuple[float, float]:
    """Tasks/s for leader-only and plain no-ops, each queue filled before the worker starts.

    The rate is count / (last run - first run), from times the tasks record,
    so neither sending nor the worker's start-up (or election) counts.
    """
    rates: dict[str, list[float]] = {}
    for kind in ("plain", "leader") * 3:
        cluster = Cluster(tmp / "throughput", "redis")
        try:
            for _ in range(count):
                cluster.send(f"noop_{kind}")
            cluster.start(1, extra=["-c", "2"])
            key = f"noop-{kind}"
            deadline = time.monotonic() + 300
            while int(cluster.history_client.get(key) or 0) < count:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{kind} no-ops did not finish")
                time.sleep(0.02)
            first = float(cluster.history_client.get(f"{key}-first") or 0)
            last = float(cluster.history_client.get(f"{key}-last") or 0)
            rates.setdefault(kind, []).append(count / (last - first))
        finally:
            cluster.close()
    for kind, values in rates.items():
        print(f"throughput runs, {kind}: {[round(v) for v in values]} tasks/s", flush=True)
    return statistics.median(rates["leader"]), statistics.median(rates["plain"])


def print_ttl_table(
    ttl: float,
    rounds: int,
    crash: list[dict[str, float]],
    handover: list[dict[str, float]],
    revocation: list[float] | None,
) -> None:
    renew = ttl / 3

    def row(label: str, values: list[float], goal: str = "", ok: bool = True) -> None:
        verdict = ("met" if ok else "MISSED") if goal else ""
        columns = " | ".join(f"{v:7.3f}" for v in spread(values))
        print(f"| {label:<52} | {columns} | {goal:<26} | {verdict:<6} |")

    print(f"\nworkers end to end: Redis broker and store, ttl {ttl:g} s, {rounds} rounds\n")
    print(
        f"| {'measure (seconds)':<52} | {'median':>7} | {'p90':>7} | {'worst':>7} "
        f"| {'goal':<26} | {'':<6} |"
    )
    print(f"|{'-' * 54}|{'-' * 9}|{'-' * 9}|{'-' * 9}|{'-' * 28}|{'-' * 8}|")
    failover = [r["failover"] for r in crash]
    expiry = [r["expiry"] for r in crash]
    row(
        "crash failover: SIGKILL -> first leader task",
        failover,
        f"worst <= ttl + 1 = {ttl + 1:g}",
        max(failover) <= ttl + 1,
    )
    row(
        "  of which: lease expiry -> first leader task",
        expiry,
        "median <= 0.3",
        statistics.median(expiry) <= 0.3,
    )
    row("    standby elected after expiry", [r["notice"] for r in crash])
    row("    first task after election (queue pickup)", [r["pickup"] for r in crash])
    row("graceful handover: SIGTERM -> first leader task", [r["sigterm"] for r in handover])
    released = [r["released"] for r in handover]
    row(
        "  of which: released -> first leader task",
        released,
        "median <= 0.1",
        statistics.median(released) <= 0.1,
    )
    if revocation:
        row(
            "revocation: loss declared -> terminate run gone",
            revocation,
            f"<= renew + 1 = {renew + 1:.2f}",
            max(revocation) <= renew + 1,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--ttl", type=float, nargs="+", default=[3.0, 10.0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    args = parser.parse_args()
    figures: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for index, ttl in enumerate(args.ttl):
            run = tmp / f"ttl{index}"
            for sub in ("crash", "handover"):
                (run / sub).mkdir(parents=True)
            for round_ in range(max(3, args.rounds // 3)):
                (run / "revoke" / str(round_)).mkdir(parents=True)
            crash = crash_rounds(run, ttl, args.rounds)
            handover = handover_rounds(run, ttl, args.rounds)
            # Revocation does not wait on the ttl: measured at the first one only.
            revocation = (
                revocation_rounds(run, ttl, max(3, args.rounds // 3)) if index == 0 else None
            )
            print_ttl_table(ttl, args.rounds, crash, handover, revocation)
            figures[f"{ttl:g}"] = {
                "crash": [r["failover"] for r in crash],
                "graceful": [r["sigterm"] for r in handover],
            }
        (tmp / "throughput").mkdir()
        leader_rate, plain_rate = throughput(tmp, args.tasks)
    ratio = leader_rate / plain_rate
    print(
        f"\nthroughput on one prefork worker (-c 2, both acks_late), {args.tasks} no-op tasks, "
        "median of 3 alternating runs: "
        f"leader-only {leader_rate:.0f}/s, plain {plain_rate:.0f}/s, ratio {ratio:.3f} "
        f"(goal >= 0.95: {'met' if ratio >= 0.95 else 'MISSED'})"
    )
    if args.json:
        args.json.write_text(json.dumps({"workers": figures, "throughput_ratio": ratio}))


if __name__ == "__main__":
    main()
