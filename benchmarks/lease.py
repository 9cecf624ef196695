"""Lease-core benchmark: takeover, handover and store load on a real redis-server.

Run from the repository root:  .venv/bin/python -m benchmarks.lease [--rounds 10] [--ttl 3]

Prints a table:
* takeover after crash: SIGKILL of the leading process to ELECTED on another
  (median and worst over the rounds);
* handover after graceful stop: SIGTERM of the leader to ELECTED on another;
* store load at steady state: Redis commands per second with 1 leader and 50
  followers (each its own client), measured from the server's own counters.
"""

from __future__ import annotations

import argparse
import random
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from celery_leader.demo.group import NodeGroup
from celery_leader.lease import LeaseManager
from celery_leader.stores import open_store
from celery_leader.stores.base import Holder
from celery_leader.timing import LeaseTiming
from tests.servers import RedisServer


def warm(url: str, name: str) -> None:
    store = open_store(url, timeout=1.0)
    holder = Holder.for_this_process("warm-up")
    store.acquire(name, holder, 1.0)
    store.release(name, holder.lease_id)
    store.close()


def failover_rounds(url: str, ttl: float, rounds: int, sig: int) -> list[float]:
    """Seconds from *sig* to the leader until another node is elected, per round."""
    name = f"bench-{sig}-{ttl}"
    warm(url, name)
    group = NodeGroup(url, name, ttl)
    rng = random.Random(1)
    ignore = lambda event: None  # noqa: E731
    times = []
    try:
        for i in range(2):
            group.start(f"n{i}")
        leader = group.wait_elected(ttl * 3 + 5, ignore)["holder"]
        for round_ in range(rounds):
            # Strike at a random point of the renew cycle, as a real crash would.
            time.sleep(0.3 + rng.uniform(0, ttl / 3))
            struck_at = time.monotonic()
            group.signal(leader, sig)
            successor = group.wait_elected(ttl * 3 + 5, ignore, exclude=leader)
            times.append(successor["elected_at"] - struck_at)
            group.nodes[leader].proc.wait(10)
            replacement = f"{leader.split('.')[0]}.{round_}"
            group.start(replacement)
            group.wait_ready(replacement)
            leader = successor["holder"]
    finally:
        group.stop_all()
    return times


def store_load(url: str, ttl: float, followers: int, seconds: float) -> tuple[float, float]:
    """Redis commands/s and lease scripts/s at steady state with 1 leader + *followers*."""
    timing = LeaseTiming.create(ttl)
    name = "bench-load"
    warm(url, name)
    managers = []
    for i in range(followers + 1):
        store = open_store(url, timeout=timing.op_timeout)
        managers.append(LeaseManager(store, name, timing, holder=Holder.for_this_process(f"m{i}")))
    for manager in managers:
        manager.start()
    client = redis.Redis.from_url(url)
    try:
        deadline = time.monotonic() + ttl * 3 + 5
        while not any(m.is_leader() for m in managers) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(ttl)  # settle into steady state
        before = client.info("stats")["total_commands_processed"]
        scripts_before = client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
        time.sleep(seconds)
        after = client.info("stats")["total_commands_processed"]
        scripts_after = client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
        # Our own two INFO calls between the readings count too: leave them out.
        commands = (after - before - 2) / seconds
        scripts = (scripts_after - scripts_before) / seconds
    finally:
        for manager in managers:
            manager.stop(timeout=2)
            manager.store.close()
        client.close()
    return commands, scripts


def election_time(url: str, ttl: float, contenders: int) -> float:
    """Seconds from starting *contenders* managers at once (warm store) to the first leader."""
    timing = LeaseTiming.create(ttl)
    name = f"bench-elect-{contenders}"
    warm(url, name)
    managers = [
        LeaseManager(
            open_store(url, timeout=timing.op_timeout),
            name,
            timing,
            holder=Holder.for_this_process(f"c{i}"),
        )
        for i in range(contenders)
    ]
    started = time.monotonic()
    for manager in managers:
        manager.start()
    try:
        while not any(m.is_leader() for m in managers):
            if time.monotonic() - started > ttl * 3 + 10:
                raise RuntimeError("no leader elected")
            time.sleep(0.001)
        return time.monotonic() - started
    finally:
        for manager in managers:
            manager.stop(timeout=2)
            manager.store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--ttl", type=float, default=3.0)
    parser.add_argument("--followers", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not installed: run ./run.sh test once, or apt-get it")
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp)).start()
        try:
            crash = failover_rounds(server.url, args.ttl, args.rounds, signal.SIGKILL)
            graceful = failover_rounds(server.url, args.ttl, args.rounds, signal.SIGTERM)
            commands, scripts = store_load(server.url, args.ttl, args.followers, args.seconds)
            big_commands, big_scripts = store_load(server.url, args.ttl, 200, args.seconds)
            elect = election_time(server.url, args.ttl, 200)
        finally:
            server.stop()
    version = (
        subprocess.run(["redis-server", "--version"], capture_output=True, text=True, check=False)
        .stdout.split()[2]
        .removeprefix("v=")
    )
    print(f"\nlease core on redis-server {version}, ttl {args.ttl:g} s, {args.rounds} rounds\n")
    print(f"| {'measure':<52} | {'median':>8} | {'worst':>8} |")
    print(f"|{'-' * 54}|{'-' * 10}|{'-' * 10}|")
    for label, values in (
        ("takeover after crash (SIGKILL -> elected), s", crash),
        ("handover after stop (SIGTERM -> elected), s", graceful),
    ):
        print(f"| {label:<52} | {statistics.median(values):8.3f} | {max(values):8.3f} |")
    label = f"store load, 1 leader + {args.followers} followers"
    print(f"| {label + ', round trips/s':<52} | {scripts:8.1f} | {'':>8} |")
    print(f"| {label + ', commands/s':<52} | {commands:8.1f} | {'':>8} |")
    label = "store load, 1 leader + 200 followers"
    print(f"| {label + ', round trips/s':<52} | {big_scripts:8.1f} | {'':>8} |")
    print(f"| {label + ', commands/s':<52} | {big_commands:8.1f} | {'':>8} |")
    print(f"| {'time to elect among 200 (start -> leader), s':<52} | {elect:8.3f} | {'':>8} |")
    print("\n(commands/s counts the commands inside the Lua scripts as well; the 200")
    print(" managers run as threads of one process, each with its own connection)")
    print(
        f"\ngoal: takeover worst <= ttl + renew_interval + 1 s = "
        f"{args.ttl + args.ttl / 3 + 1:.2f} s"
    )


if __name__ == "__main__":
    main()
