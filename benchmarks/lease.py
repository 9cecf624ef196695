"""Lease-core benchmark: takeover, handover and store load on a real redis-server.

Run from the repository root:  .venv/bin/python -m benchmarks.lease [--rounds 10] [--ttl 3]

Prints a table:
* takeover after crash: SIGKILL of the leading process to ELECTED on another
  (median and worst over the rounds);
* handover after graceful stop: SIGTERM of the leader to ELECTED on another;
* store load at steady state: Redis commands per second with 1 leader and 50,
  then 200, followers (each its own client, spread over a few processes),
  measured from the server's own counters, and the time to elect a leader
  when all of them start at one instant on a warm store.
"""

from __future__ import annotations

import argparse
import random
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from benchmarks.stats import spread
from benchmarks.swarm import swarm
from celery_leader.demo.group import NodeGroup
from celery_leader.stores import open_store
from celery_leader.stores.base import Holder
from harness.servers import RedisServer


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


def _evalsha_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def store_load(
    url: str, ttl: float, followers: int, seconds: float, processes: int
) -> tuple[float, float, float]:
    """(time to elect, commands/s, lease scripts/s) with 1 leader + *followers* managers.

    The managers run in *processes* child processes and start at one instant;
    the load is read from the server's own counters at steady state.
    """
    name = f"bench-load-{followers}"
    warm(url, name)
    client = redis.Redis.from_url(url)
    try:
        with swarm(url, name, ttl, followers + 1, processes) as running:
            elect = running.first_election(timeout=ttl * 3 + 10)
            time.sleep(ttl)  # settle into steady state
            before = client.info("stats")["total_commands_processed"]
            scripts_before = _evalsha_calls(client)
            time.sleep(seconds)
            after = client.info("stats")["total_commands_processed"]
            scripts_after = _evalsha_calls(client)
    finally:
        client.close()
    # Our own INFO calls between the readings count too: leave them out.
    commands = (after - before - 2) / seconds
    scripts = (scripts_after - scripts_before) / seconds
    return elect, commands, scripts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--ttl", type=float, default=3.0)
    parser.add_argument("--followers", type=int, nargs="+", default=[50, 200])
    parser.add_argument("--processes", type=int, default=4, help="the managers' processes")
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not installed: run ./run.sh test once, or apt-get it")
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp)).start()
        try:
            crash = failover_rounds(server.url, args.ttl, args.rounds, signal.SIGKILL)
            graceful = failover_rounds(server.url, args.ttl, args.rounds, signal.SIGTERM)
            loads = {
                followers: store_load(server.url, args.ttl, followers, args.seconds, args.processes)
                for followers in args.followers
            }
        finally:
            server.stop()
    version = (
        subprocess.run(["redis-server", "--version"], capture_output=True, text=True, check=False)
        .stdout.split()[2]
        .removeprefix("v=")
    )
    print(f"\nlease core on redis-server {version}, ttl {args.ttl:g} s, {args.rounds} rounds\n")
    print(f"| {'measure':<52} | {'median':>8} | {'p90':>8} | {'worst':>8} |")
    print(f"|{'-' * 54}|{'-' * 10}|{'-' * 10}|{'-' * 10}|")
    for label, values in (
        ("takeover after crash (SIGKILL -> elected), s", crash),
        ("handover after stop (SIGTERM -> elected), s", graceful),
    ):
        print(f"| {label:<52} | " + " | ".join(f"{v:8.3f}" for v in spread(values)) + " |")
    for followers, (elect, commands, scripts) in loads.items():
        label = f"1 leader + {followers} followers"
        for what, value in (
            (f"store load, {label}, round trips/s", f"{scripts:8.1f}"),
            (f"store load, {label}, commands/s", f"{commands:8.1f}"),
            (f"time to elect among {followers + 1} (start -> leader), s", f"{elect:8.3f}"),
        ):
            print(f"| {what:<52} | {value} | {'':>8} | {'':>8} |")
    print(
        "\n(commands/s counts the commands inside the Lua scripts as well; the managers run"
        f" in {args.processes} processes that start them at one instant, each manager with"
        " its own connection)"
    )
    print(
        f"\ngoal: takeover worst <= ttl + renew_interval + 1 s = "
        f"{args.ttl + args.ttl / 3 + 1:.2f} s"
    )


if __name__ == "__main__":
    main()
