"""End-to-end benchmark on real worker processes (Redis broker, Redis lease store).

Run from the repository root:
    .venv/bin/python -m benchmarks.workers [--rounds 10] [--ttl 3 10] [--json FILE]
        [--only revocation] [--revocation-rounds N]

Prints one table per ttl:
* crash failover: SIGKILL of the leading worker to the first leader task on the
  new leader, split in its parts: the lease running out in the store, the
  standby's election after that, and the first task after the election;
* graceful handover: SIGTERM of the idle leader to the first leader task on
  the new leader, and the part of it from the lease's release;
* revocation, each measured on a fresh one-worker cluster while a
  terminate-policy task (``long_terminate``) runs in a pool child, "gone"
  meaning the child exited (a zombie its stopped parent cannot reap counts):
  - store paused: the leader's local loss of the lease ("lost the lead" in
    its log) to the child being gone;
  - store slowed: the leader's store connection behind a FaultProxy in
    trickle mode, as in tests/integration/test_term_end.py (right after a
    renewal every reply just inside the read timeout, the fourth on a
    connection held, the server's scripts flushed): the local loss to the
    child being gone, and the slowdown itself (the lease's end in the store
    is about one ttl after it) to the child being gone;
  - main process stopped: SIGSTOP of the worker's main pid alone, at a
    random point of the renew cycle, to the child being gone, also as a
    fraction of the ttl;
  measured at the first ttl only, or at every ttl with ``--only revocation``
  (which runs nothing else); ``--revocation-rounds`` rounds each (default:
  ``--rounds``, at most 5);
* gate overhead (once): throughput of leader-only no-op tasks over plain
  ones on one prefork worker.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import redis

from benchmarks.stats import spread
from celery_leader.elections.procinfo import has_ended
from celery_leader.stores import open_store
from celery_leader.stores.base import Holder
from harness.cluster import Cluster, Worker
from harness.cpu import cpu_seconds
from harness.proxy import FaultProxy


def _dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def runs(rows, kind="start"):
    return [r for r in rows if r["kind"] == kind]


def lease_pttl(cluster: Cluster) -> float:
    client = cluster.store.client()
    pttl = client.pttl(f"celery-leader:{{{cluster.name}}}:lease")
    client.close()
    return max(0, pttl) / 1000


def crash_rounds(tmp: Path, ttl: float, rounds: int) -> list[dict[str, float]]:
    cluster = Cluster(_dir(tmp / "crash"), "redis")
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
    cluster = Cluster(_dir(tmp / "handover"), "redis")
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


def _lost_wall(text: str) -> float:
    """Wall time of the worker's first "lost the lead" log line."""
    lines = [m for m in map(_LOG_TIME.match, text.splitlines()) if m]
    if not lines:
        raise RuntimeError("the leader never logged the loss of its lease")
    return datetime.strptime(lines[0].group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _one_run(cluster: Cluster, ttl: float) -> int:
    """Elect the cluster's worker, start a long terminate run; the pid of its pool child."""
    cluster.leader_worker(timeout=ttl * 3 + 10)
    cluster.send("long_terminate", 60)
    rows = cluster.wait_history(runs, 10)
    if not runs(rows):
        raise RuntimeError("the long terminate task did not start")
    return int(runs(rows)[0]["pid"])


def revocation_rounds(tmp: Path, ttl: float, rounds: int) -> list[float]:
    """Per round: store paused; the leader's "lost the lead" -> its terminate run gone."""
    results = []
    for round_ in range(rounds):
        cluster = Cluster(_dir(tmp / "revoke" / str(round_)), "redis")
        cluster.env["LEADER_TTL"] = str(ttl)
        try:
            (worker,) = cluster.start(1)
            pid = _one_run(cluster, ttl)
            cluster.store.pause()
            try:
                gone = wait_gone(pid, ttl * 3 + 10)
            finally:
                cluster.store.resume()
            if gone is None:
                raise RuntimeError("the terminate run outlived a paused store")
            results.append(gone[1] - _lost_wall(worker.text()))
        finally:
            cluster.close()
    return results


def slow_store_rounds(tmp: Path, ttl: float, rounds: int) -> list[dict[str, float]]:
    """Per round: the leader's store slowed; loss -> run gone, and slowdown -> run gone.

    Timing as in tests/integration/test_term_end.py, scaled to the ttl: renew
    every 0.3 ttl, store calls bounded at 0.6 ttl (so one read may take 0.3
    ttl), each reply 0.275 ttl late, the fourth on a connection held.
    """
    results = []
    for round_ in range(rounds):
        cluster = Cluster(_dir(tmp / "slow" / str(round_)), "redis")
        cluster.env.update(
            LEADER_TTL=str(ttl),
            LEADER_RENEW=f"{0.3 * ttl:g}",
            LEADER_STORE_TIMEOUT=f"{0.6 * ttl:g}",
        )
        proxy = FaultProxy(cluster.store.port)
        direct = cluster.env["LEADER_STORE"]
        admin = redis.Redis.from_url(direct)
        try:
            cluster.env["LEADER_STORE"] = f"redis://127.0.0.1:{proxy.port}/0"
            try:
                (worker,) = cluster.start(1)
            finally:
                cluster.env["LEADER_STORE"] = direct
            pid = _one_run(cluster, ttl)
            time.sleep(0.3)
            proxy.after_next_reply("trickle", delay=0.275 * ttl, hang_after=3)
            deadline = time.monotonic() + ttl * 2
            while proxy.mode != "trickle" and time.monotonic() < deadline:
                time.sleep(0.001)
            if proxy.mode != "trickle":
                raise RuntimeError("no store reply to slow down")
            slowed_at = time.monotonic()
            admin.script_flush()
            gone = wait_gone(pid, ttl * 3 + 10)
            if gone is None:
                raise RuntimeError("the terminate run outlived a slow store")
            results.append(
                {"lost": gone[1] - _lost_wall(worker.text()), "slowed": gone[0] - slowed_at}
            )
        finally:
            proxy.set_mode("pass")
            proxy.close()
            admin.close()
            cluster.close()
    return results


def stall_rounds(tmp: Path, ttl: float, rounds: int) -> list[float]:
    """Per round: SIGSTOP of the main process alone -> its pool child's terminate run gone."""
    results = []
    rng = random.Random(2)
    for round_ in range(rounds):
        cluster = Cluster(_dir(tmp / "stall" / str(round_)), "redis")
        cluster.env["LEADER_TTL"] = str(ttl)
        try:
            (worker,) = cluster.start(1)
            pid = _one_run(cluster, ttl)
            time.sleep(0.3 + rng.uniform(0, ttl / 3))  # anywhere in the renew cycle
            os.kill(worker.proc.pid, signal.SIGSTOP)  # the main process alone
            stopped_at = time.monotonic()
            try:
                gone = wait_gone(pid, ttl * 3 + 10)
            finally:
                os.kill(worker.proc.pid, signal.SIGCONT)
            if gone is None:
                raise RuntimeError("the terminate run outlived its stopped main process")
            results.append(gone[0] - stopped_at)
        finally:
            cluster.close()
    return results


def wait_gone(pid: int, timeout: float) -> tuple[float, float] | None:
    """(monotonic, wall) time at which *pid* was first seen gone, or None within *timeout*."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if has_ended(pid):
            return time.monotonic(), time.time()
        time.sleep(0.002)
    return None


def revocation_figures(tmp: Path, ttl: float, rounds: int) -> dict[str, list[float]]:
    """Every revocation measurement at *ttl*, *rounds* rounds each."""
    slowed = slow_store_rounds(tmp, ttl, rounds)
    return {
        "paused": revocation_rounds(tmp, ttl, rounds),
        "slowed_lost": [r["lost"] for r in slowed],
        "slowed": [r["slowed"] for r in slowed],
        "stalled": stall_rounds(tmp, ttl, rounds),
    }


def _tree_cpu(root: int) -> float:
    """CPU seconds (user + system) used so far by process *root* and its live children."""
    return cpu_seconds(lambda pid, ppid, _group: root in (pid, ppid))


def prime_store(cluster: Cluster) -> None:
    """Give the cluster's lease store a record of an earlier, released term.

    A store with no record makes the first holder wait one ttl before it
    leads (the hold-off after a store lost its data); a worker started on a
    primed store leads at once.
    """
    store = open_store(cluster.env["LEADER_STORE"], timeout=2)
    try:
        holder = Holder.for_this_process("benchmark-primer")
        if store.acquire(cluster.name, holder, ttl=2.0).acquired:
            store.release(cluster.name, holder.lease_id)
    finally:
        store.close()


def leads(worker: Worker) -> bool:
    """True once *worker* consumes its election's leader queue."""
    return "Started consuming from" in worker.text()


def throughput(tmp: Path, count: int, pairs: int = 5) -> dict[str, list[float]]:
    """Tasks/s and worker CPU per task for leader-only and plain no-ops, *pairs* alternating runs.

    Each queue is filled before the worker starts, on a store primed so the
    worker leads at once (:func:`prime_store`). Both kinds are measured
    from the moment the worker leads and has run a task to its last run:
    a worker that leads consumes two queues and keeps its term, so plain
    runs before the election would cost less than the same runs after it,
    and the figure must compare the gate alone. The rate is the runs in
    that window over its length (the last run's time, as the task records
    it); neither sending nor the worker's start-up counts. CPU per task is
    the worker's process tree's CPU time over the same window: a steadier
    figure than the rate on a shared machine, where the rate of one kind
    moves by 10 % or more run to run.
    """
    found: dict[str, list[float]] = {}
    # plain, leader, leader, plain, ...: neither kind always runs first on a warm machine.
    orders = (("plain", "leader"), ("leader", "plain"))
    for kind in [kind for i in range(pairs) for kind in orders[i % 2]]:
        cluster = Cluster(_dir(tmp / "throughput"), "redis")
        try:
            prime_store(cluster)
            for _ in range(count):
                cluster.send(f"noop_{kind}")
            (worker,) = cluster.start(1, extra=["-c", "2"])
            key = f"noop-{kind}"
            deadline = time.monotonic() + 300
            start: tuple[int, float, float] | None = None  # runs, time, CPU at the window's start
            while True:
                done = int(cluster.history_client.get(key) or 0)
                if start is None and done and leads(worker):
                    # The time is read with the count, before /proc is walked.
                    start = (done, time.monotonic(), _tree_cpu(worker.proc.pid))
                if done >= count:
                    cpu_after = _tree_cpu(worker.proc.pid)
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{kind} no-ops did not finish")
                time.sleep(0.005)
            if start is None or count - start[0] < count // 2:
                raise RuntimeError(f"{kind}: the worker led too late to measure (after {start})")
            ran_before, began, cpu_before = start
            last = float(cluster.history_client.get(f"{key}-last") or 0)
            found.setdefault(f"{kind}_rate", []).append((count - ran_before) / (last - began))
            found.setdefault(f"{kind}_cpu_ms", []).append(
                1000 * (cpu_after - cpu_before) / (count - ran_before)
            )
        finally:
            cluster.close()
    for kind in ("plain", "leader"):
        rates = [round(v) for v in found[f"{kind}_rate"]]
        cpu = [round(v, 3) for v in found[f"{kind}_cpu_ms"]]
        print(f"throughput runs, {kind}: {rates} tasks/s; worker CPU per task {cpu} ms", flush=True)
    return found


def throughput_summary(found: dict[str, list[float]], count: int) -> dict[str, float]:
    """Print the throughput line; return its figures."""
    pairs = len(found["plain_rate"])
    rate = {kind: statistics.median(found[f"{kind}_rate"]) for kind in ("plain", "leader")}
    cpu = {kind: statistics.median(found[f"{kind}_cpu_ms"]) for kind in ("plain", "leader")}
    ratio = rate["leader"] / rate["plain"]
    cpu_ratio = cpu["plain"] / cpu["leader"]
    spread = (max(found["plain_rate"]) - min(found["plain_rate"])) / rate["plain"]
    low, high = _ratio_interval(found["leader_rate"], found["plain_rate"])
    print(
        f"\nthroughput on one prefork worker (-c 2, both acks_late), {count} no-op tasks, "
        f"median of {pairs} alternating runs: leader-only {rate['leader']:.0f}/s, plain "
        f"{rate['plain']:.0f}/s, ratio {ratio:.3f} (goal >= 0.98: "
        f"{'met' if ratio >= 0.98 else 'MISSED'}; plain runs alone spread {spread:.0%}; "
        f"95% bootstrap interval of the ratio {low:.3f}..{high:.3f})\n"
        f"worker CPU per task: leader-only {cpu['leader']:.3f} ms, plain {cpu['plain']:.3f} ms, "
        f"plain / leader {cpu_ratio:.3f} (goal >= 0.98: {'met' if cpu_ratio >= 0.98 else 'MISSED'})"
    )
    return {"throughput_ratio": ratio, "cpu_ratio": cpu_ratio, "plain_spread": spread}


def _ratio_interval(
    numerator: list[float], denominator: list[float], draws: int = 2000
) -> tuple[float, float]:
    """A 95 % bootstrap interval for median(numerator) / median(denominator).

    On a shared 2-core machine one kind's runs spread by tens of percent;
    the interval says how far the median ratio can be trusted.
    """
    rng = random.Random(0)
    ratios = sorted(
        statistics.median(rng.choices(numerator, k=len(numerator)))
        / statistics.median(rng.choices(denominator, k=len(denominator)))
        for _ in range(draws)
    )
    return ratios[int(0.025 * draws)], ratios[int(0.975 * draws) - 1]


Row = Callable[..., None]


def table(title: str) -> Row:
    """Print a table's title and head; return the function that prints one row."""

    def row(label: str, values: list[float], goal: str = "", ok: bool = True) -> None:
        verdict = ("met" if ok else "MISSED") if goal else ""
        columns = " | ".join(f"{v:7.3f}" for v in spread(values))
        print(f"| {label:<52} | {columns} | {goal:<26} | {verdict:<6} |")

    print(f"\n{title}\n")
    print(
        f"| {'measure (seconds)':<52} | {'median':>7} | {'p90':>7} | {'worst':>7} "
        f"| {'goal':<26} | {'':<6} |"
    )
    print(f"|{'-' * 54}|{'-' * 9}|{'-' * 9}|{'-' * 9}|{'-' * 28}|{'-' * 8}|")
    return row


def revocation_rows(row: Row, ttl: float, figures: dict[str, list[float]]) -> None:
    renew = ttl / 3
    paused, lost = figures["paused"], figures["slowed_lost"]
    slowed, stalled = figures["slowed"], figures["stalled"]
    row(
        "revocation: loss declared -> terminate run gone",
        paused,
        f"<= renew + 1 = {renew + 1:.2f}",
        max(paused) <= renew + 1,
    )
    row(
        "revocation, store slowed: loss -> run gone",
        lost,
        f"<= renew + 1 = {renew + 1:.2f}",
        max(lost) <= renew + 1,
    )
    row(
        "  store slowed (after a renewal) -> run gone",
        slowed,
        f"worst < ttl = {ttl:g}",
        max(slowed) < ttl,
    )
    row(
        "main process stopped -> child's leader work gone",
        stalled,
        f"worst < ttl = {ttl:g}",
        max(stalled) < ttl,
    )
    relative = [v / ttl for v in stalled]
    row("  same, in ttls", relative, "worst < 1", max(relative) < 1)


def print_ttl_table(
    ttl: float,
    rounds: int,
    crash: list[dict[str, float]],
    handover: list[dict[str, float]],
    revocation: dict[str, list[float]] | None,
) -> None:
    row = table(f"workers end to end: Redis broker and store, ttl {ttl:g} s, {rounds} rounds")
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
        revocation_rows(row, ttl, revocation)
        count = len(revocation["paused"])
        print(f"\n(revocation rows: {count} round{'' if count == 1 else 's'} each)")


def print_revocation_table(ttl: float, figures: dict[str, list[float]]) -> None:
    rounds = len(figures["paused"])
    row = table(
        f"revocation on real workers: Redis broker and store, ttl {ttl:g} s, {rounds} rounds each"
    )
    revocation_rows(row, ttl, figures)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--ttl", type=float, nargs="+", default=[3.0, 10.0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument(
        "--pairs", type=int, default=5, help="alternating plain/leader throughput runs"
    )
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    parser.add_argument(
        "--only",
        choices=["revocation", "throughput"],
        help="run only these measurements (revocation: at every --ttl)",
    )
    parser.add_argument(
        "--revocation-rounds",
        type=int,
        default=None,
        help="rounds of each revocation measurement (default: --rounds, at most 5)",
    )
    args = parser.parse_args()
    revocation_rounds_ = args.revocation_rounds or min(args.rounds, 5)
    figures: dict[str, dict[str, list[float]]] = {}
    revocation: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if args.only == "throughput":
            (tmp / "throughput").mkdir()
            summary = throughput_summary(throughput(tmp, args.tasks, args.pairs), args.tasks)
            if args.json:
                args.json.write_text(json.dumps(summary))
            return
        if args.only == "revocation":
            for index, ttl in enumerate(args.ttl):
                revocation[f"{ttl:g}"] = found = revocation_figures(
                    tmp / f"ttl{index}", ttl, revocation_rounds_
                )
                print_revocation_table(ttl, found)
            if args.json:
                args.json.write_text(json.dumps({"revocation": revocation}))
            return
        for index, ttl in enumerate(args.ttl):
            run = tmp / f"ttl{index}"
            crash = crash_rounds(run, ttl, args.rounds)
            handover = handover_rounds(run, ttl, args.rounds)
            # Revocation does not wait on the ttl: measured at the first one only.
            found = revocation_figures(run, ttl, revocation_rounds_) if index == 0 else None
            if found is not None:
                revocation[f"{ttl:g}"] = found
            print_ttl_table(ttl, args.rounds, crash, handover, found)
            figures[f"{ttl:g}"] = {
                "crash": [r["failover"] for r in crash],
                "graceful": [r["sigterm"] for r in handover],
            }
        (tmp / "throughput").mkdir()
        summary = throughput_summary(throughput(tmp, args.tasks, args.pairs), args.tasks)
    if args.json:
        args.json.write_text(json.dumps({"workers": figures, **summary, "revocation": revocation}))


if __name__ == "__main__":
    main()
