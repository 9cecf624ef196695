"""The lease stores side by side: call latency, failover, handover, and a failure of the store.

Run from the repository root:  .venv/bin/python -m benchmarks.stores [--rounds 5] [--ttl 3]

For each of Redis, Redis Sentinel (a primary, a replica, three sentinels) and
PostgreSQL, all on loopback:

* call latency: acquire, renew and release of one client, median and p90 over
  200 calls each;
* takeover after crash and handover after stop: SIGKILL / SIGTERM of the
  leading lease-manager process to ELECTED on another (benchmarks.lease's
  rounds, on this store);
* leaderless time across a failure of the store itself, with two nodes: the
  Redis server restarted empty, the Sentinel primary SIGKILLed (the sentinels
  promote the replica), PostgreSQL killed with -9 and started again 1 s
  later. Leaderless: from the first LOST after the fault to the next
  ELECTED (0 when the leader kept its lease throughout).
"""

from __future__ import annotations

import argparse
import queue
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks.lease import failover_rounds, warm
from benchmarks.stats import spread
from celery_leader.demo.group import NodeGroup
from celery_leader.stores import open_store
from celery_leader.stores.base import Holder
from harness.servers import PostgresServer, RedisServer, SentinelRedis

CALLS = 200


@contextmanager
def redis_store(tmp: Path) -> Iterator[tuple[str, Callable[[], None]]]:
    server = RedisServer(tmp).start()
    try:
        yield server.url, server.restart_empty
    finally:
        server.stop()


@contextmanager
def sentinel_store(tmp: Path) -> Iterator[tuple[str, Callable[[], None]]]:
    servers = SentinelRedis(tmp).start()

    def fail() -> None:
        port = servers.primary_port()
        assert port is not None
        servers.server_on(port).stop()
        servers.wait_failover(port)

    try:
        yield servers.url, fail
    finally:
        servers.stop()


@contextmanager
def postgres_store(tmp: Path) -> Iterator[tuple[str, Callable[[], None]]]:
    server = PostgresServer().start()

    def fail() -> None:
        server.kill()
        time.sleep(1.0)
        server.start()

    try:
        yield server.url, fail
    finally:
        server.stop()


STORES = {"Redis": redis_store, "Redis Sentinel": sentinel_store, "PostgreSQL": postgres_store}


def latencies(url: str) -> dict[str, list[float]]:
    """Seconds per acquire, renew and release of one client, *CALLS* of each."""
    store = open_store(url, timeout=2.0)
    found: dict[str, list[float]] = {"acquire": [], "renew": [], "release": []}
    try:
        for i in range(CALLS):
            holder = Holder(f"bench-{i}", "bench", "h", 1)
            name = f"latency-{i % 10}"
            for what, call in (
                ("acquire", lambda: store.acquire(name, holder, 5.0)),  # noqa: B023
                ("renew", lambda: store.renew(name, holder.lease_id, 5.0)),  # noqa: B023
                ("release", lambda: store.release(name, holder.lease_id)),  # noqa: B023
            ):
                started = time.perf_counter()
                call()
                found[what].append(time.perf_counter() - started)
    finally:
        store.close()
    return found


def leaderless(url: str, ttl: float, fail: Callable[[], None]) -> float:
    """Seconds without a leader after the store's failure (two nodes)."""
    name = f"bench-store-failure-{time.monotonic_ns()}"
    warm(url, name)
    group = NodeGroup(url, name, ttl)
    try:
        group.start("n0")
        group.start("n1")
        group.wait_elected(ttl * 3 + 10, lambda event: None)
        time.sleep(ttl)
        fail()
        lost_at: float | None = None
        deadline = time.monotonic() + ttl * 4 + 20
        while time.monotonic() < deadline:
            try:
                event = group.events.get(timeout=0.5)
            except queue.Empty:
                if lost_at is None and time.monotonic() > deadline - ttl * 3:
                    return 0.0  # no loss after the failure: the leader kept its lease
                continue
            if event["kind"] == "lost" and lost_at is None:
                lost_at = float(event["at"])
            elif event["kind"] == "elected" and lost_at is not None:
                return float(event["elected_at"]) - lost_at
        raise TimeoutError("no leader again after the store's failure")
    finally:
        group.stop_all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ttl", type=float, default=3.0)
    args = parser.parse_args()
    rows: list[tuple[str, str, tuple[float, float, float]]] = []
    with tempfile.TemporaryDirectory() as scratch:
        for label, running in STORES.items():
            workdir = Path(scratch) / label.replace(" ", "-")
            workdir.mkdir()
            with running(workdir) as (url, fail):
                for what, values in latencies(url).items():
                    rows.append((label, f"{what}, ms", spread([v * 1000 for v in values])))
                for what, sig in (("takeover after crash, s", signal.SIGKILL),
                                  ("handover after stop, s", signal.SIGTERM)):  # fmt: skip
                    rows.append(
                        (label, what, spread(failover_rounds(url, args.ttl, args.rounds, sig)))
                    )
                gap = leaderless(url, args.ttl, fail)
                rows.append((label, "leaderless across a store failure, s", (gap, gap, gap)))
    print(f"\nlease stores on loopback, ttl {args.ttl:g} s, {args.rounds} failover rounds\n")
    print("| store | measure | median | p90 | worst |")
    print("|---|---|---:|---:|---:|")
    for label, what, (median, p90, worst) in rows:
        print(f"| {label} | {what} | {median:.3f} | {p90:.3f} | {worst:.3f} |")


if __name__ == "__main__":
    main()
