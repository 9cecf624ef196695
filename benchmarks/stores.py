"""The lease stores side by side: call latency, failover, handover, load, a failure of the store.

Run from the repository root:
    .venv/bin/python -m benchmarks.stores [--rounds 5] [--ttl 3] [--followers 200]

For each of Redis, Redis Sentinel (a primary, a replica, three sentinels),
PostgreSQL and etcd (one member, and three), all on loopback:

* call latency: acquire, renew and release of one client, median and p90 over
  200 calls each;
* takeover after crash and handover after stop: SIGKILL / SIGTERM of the
  leading lease-manager process to ELECTED on another (benchmarks.lease's
  rounds, on this store);
* store load with 1 leader and *followers* followers (each its own client,
  over 4 processes) at steady state, in the store's own counters: Redis
  commands/s (INFO), PostgreSQL transactions/s (pg_stat_database), etcd gRPC
  calls/s (its /metrics, summed over the members); and the time to elect
  among them when all start at one instant;
* leaderless time across a failure of the store itself, with two nodes: the
  Redis server restarted empty, the Sentinel primary SIGKILLed (the sentinels
  promote the replica), PostgreSQL killed with -9 and started again 1 s
  later, the one etcd member killed and started again 1 s later, etcd's
  leader member of three SIGKILLed. Leaderless: from the first LOST after
  the fault to the next ELECTED (0 when the leader kept its lease throughout).
"""

from __future__ import annotations

import argparse
import queue
import signal
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import NamedTuple

import psycopg
import redis

from benchmarks.lease import failover_rounds, warm
from benchmarks.stats import spread
from benchmarks.swarm import swarm
from celery_leader.demo.group import NodeGroup
from celery_leader.stores import open_store
from celery_leader.stores.base import Holder
from harness.servers import EtcdCluster, PostgresServer, RedisServer, SentinelRedis

CALLS = 200


class Running(NamedTuple):
    """A store up for the benchmark."""

    url: str
    #: Fail the store (it comes back by itself or is brought back).
    fail: Callable[[], None]
    #: The store's own count of the requests it served so far.
    served: Callable[[], float]
    #: What :attr:`served` counts.
    unit: str


def _redis_commands(url: str) -> Callable[[], float]:
    def served() -> float:
        with redis.Redis.from_url(url) as client:
            return float(client.info("stats")["total_commands_processed"]) - 1  # our INFO

    return served


@contextmanager
def redis_store(tmp: Path) -> Iterator[Running]:
    server = RedisServer(tmp).start()
    try:
        yield Running(server.url, server.restart_empty, _redis_commands(server.url), "commands")
    finally:
        server.stop()


@contextmanager
def sentinel_store(tmp: Path) -> Iterator[Running]:
    servers = SentinelRedis(tmp).start()

    def fail() -> None:
        port = servers.primary_port()
        assert port is not None
        servers.server_on(port).stop()
        servers.wait_failover(port)

    def served() -> float:
        port = servers.primary_port()
        assert port is not None
        return _redis_commands(servers.server_on(port).url)()

    try:
        yield Running(servers.url, fail, served, "commands")
    finally:
        servers.stop()


@contextmanager
def postgres_store(tmp: Path) -> Iterator[Running]:
    server = PostgresServer().start()

    def fail() -> None:
        server.kill()
        time.sleep(1.0)
        server.start()

    def served() -> float:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute(
                "SELECT xact_commit + xact_rollback FROM pg_stat_database"
                " WHERE datname = current_database()"
            ).fetchone()
        assert row is not None
        return float(row[0]) - 2  # our own two

    try:
        yield Running(server.url, fail, served, "transactions")
    finally:
        server.stop()


def _etcd_calls(cluster: EtcdCluster) -> Callable[[], float]:
    """gRPC calls started on every member (the JSON gateway turns each request into one)."""

    def served() -> float:
        total = 0.0
        for member in cluster.members:
            with urllib.request.urlopen(f"{member.client_url}/metrics", timeout=5) as answer:
                for line in answer.read().decode().splitlines():
                    if line.startswith("grpc_server_started_total{"):
                        total += float(line.rsplit(" ", 1)[1])
        return total

    return served


@contextmanager
def etcd_store(tmp: Path, size: int) -> Iterator[Running]:
    cluster = EtcdCluster(tmp, size=size).start()

    def fail() -> None:
        leader = cluster.wait_leader()
        leader.kill()
        time.sleep(1.0)
        if size == 1:
            leader.restart()
        else:  # the other two elect a new leader member; this one rejoins later
            cluster.wait_leader(timeout=20, other_than=leader)
            leader.restart()

    try:
        yield Running(cluster.url, fail, _etcd_calls(cluster), "gRPC calls")
    finally:
        cluster.close()


STORES: dict[str, Callable[[Path], AbstractContextManager[Running]]] = {
    "Redis": redis_store,
    "Redis Sentinel": sentinel_store,
    "PostgreSQL": postgres_store,
    "etcd, 1 member": lambda tmp: etcd_store(tmp, 1),
    "etcd, 3 members": lambda tmp: etcd_store(tmp, 3),
}


def store_load(store: Running, ttl: float, followers: int) -> tuple[float, float]:
    """(time to elect among 1 + *followers*, the store's requests per second at steady state)."""
    name = f"bench-load-{followers}"
    warm(store.url, name)
    with swarm(store.url, name, ttl, followers + 1, 4) as running:
        elect = running.first_election(timeout=ttl * 3 + 20)
        time.sleep(ttl)  # settle into steady state
        before, started = store.served(), time.monotonic()
        time.sleep(max(10.0, ttl * 3))
        after, ended = store.served(), time.monotonic()
    return elect, (after - before) / (ended - started)


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
    parser.add_argument("--followers", type=int, default=200)
    parser.add_argument("--only", nargs="+", choices=list(STORES), help="these stores only")
    args = parser.parse_args()
    rows: list[tuple[str, str, tuple[float, float, float]]] = []
    with tempfile.TemporaryDirectory() as scratch:
        for label, running in STORES.items():
            if args.only and label not in args.only:
                continue
            workdir = Path(scratch) / label.replace(" ", "-").replace(",", "")
            workdir.mkdir()
            with running(workdir) as store:
                url, fail = store.url, store.fail
                elect, load = store_load(store, args.ttl, args.followers)
                crowd = f"1 + {args.followers} followers"
                rows.append((label, f"time to elect among {crowd}, s", (elect, elect, elect)))
                rows.append((label, f"{store.unit}/s with {crowd}", (load, load, load)))
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
    print(METHOD)


#: How the figures above are taken (printed under the table, so docs/benchmarks.md keeps it).
METHOD = """
Everything on loopback; Sentinel: a primary, a replica and three sentinels;
etcd with a 50 ms heartbeat and a 500 ms election timeout, one member and three.
Latency: 200 calls of one client each. Takeover and handover: SIGKILL or
SIGTERM of the leading lease-manager process to ELECTED on the other.
Store load: 1 leader and 200 followers (each its own client, in 4
processes) at steady state, read from the store's own counters: Redis
commands (`INFO`), PostgreSQL transactions (`pg_stat_database`: every call is
one), etcd gRPC calls (its `/metrics`, summed over the members; each
request of the JSON gateway is one). A follower looks once per ttl (etcd: a
range and, while the lease is held, a time-to-live) and otherwise waits on
the release notification.

The store failure: Redis restarted empty (the leader's lease is gone: it
declares loss, and the next holder waits out the hold-off); the Sentinel
primary SIGKILLed and the replica promoted (the lease had been replicated:
the leader renews on the new primary and never loses it); PostgreSQL killed
with -9 and started again 1 s later (the leader's row survives in the WAL and
its next renewal lands within its validity; only a new acquire there would be
held off one ttl, the start time having changed); etcd's one member killed
and restarted after 1 s, and etcd's leader member of three SIGKILLed (etcd
keeps leases across both and gives each its full TTL again, so the leader's
next renewal lands). A failover to a replica that missed the acquire is
tested, not timed here (tests/stores/test_sentinel.py: the next holder waits
one ttl); so is a quorum lost (tests/integration/test_etcd_workers.py: the
holder stops before its ttl, nobody leads until two members are back).

Every etcd acquire and release is a Raft write (an fsync on each member), so
its calls take milliseconds where Redis takes a fraction of one, and three
members take longer still. Crash takeover follows the ttl (etcd counts whole
seconds: up to one more). The PostgreSQL acquire's worst case is the first
one, which creates the schema."""


if __name__ == "__main__":
    main()
