"""Azure Blob lease store on Azurite: call latency, takeover and handover.

Run from the repository root:  .venv/bin/python -m benchmarks.azure [--rounds 3]

Azurite runs on this machine, so latencies are the store's own work plus
loopback HTTP, not Azure's network. Takeover after a crash waits for the
blob lease (15 s, Azure's minimum) to expire; on real Azure a new acquire
after an expiry can take up to a minute more (Azure's documented rule).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from celery_leader.lease import LeaseManager
from celery_leader.lease.timing import LeaseTiming
from celery_leader.stores import open_store
from celery_leader.stores.base import Holder
from harness.servers import AzuriteServer

TTL = 15.0


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def call_latencies(url: str, options: dict[str, str], count: int) -> dict[str, list[float]]:
    store = open_store(url, timeout=2, options=options)
    holder = Holder.for_this_process("bench")
    acquire, renew, release = [], [], []
    try:
        store.acquire("latency", holder, TTL)  # create container and blob first
        store.release("latency", holder.lease_id)
        for _ in range(count):
            acquire.append(timed(lambda: store.acquire("latency", holder, TTL)))
            renew.append(timed(lambda: store.renew("latency", holder.lease_id, TTL)))
            release.append(timed(lambda: store.release("latency", holder.lease_id)))
    finally:
        store.close()
    return {"acquire": acquire, "renew": renew, "release": release}


def failover_rounds(url: str, options: dict[str, str], rounds: int, crash: bool) -> list[float]:
    timing = LeaseTiming.create(TTL, renew_fraction=0.25)
    results = []
    warm = open_store(url, timeout=2, options=options)
    holder = Holder.for_this_process("warm")
    warm.acquire("job", holder, TTL)
    warm.release("job", holder.lease_id)
    warm.close()
    for _ in range(rounds):
        managers = [
            LeaseManager(
                open_store(url, timeout=timing.op_timeout, options=options),
                "job",
                timing,
                holder=Holder.for_this_process(f"m{i}"),
            )
            for i in range(2)
        ]
        for manager in managers:
            manager.start()
        try:
            deadline = time.monotonic() + 30
            while not any(m.is_leader() for m in managers) and time.monotonic() < deadline:
                time.sleep(0.01)
            leader = next(m for m in managers if m.is_leader())
            other = next(m for m in managers if m is not leader)
            struck = time.monotonic()
            leader.stop(release=not crash)
            while not other.is_leader() and time.monotonic() < struck + TTL * 3:
                time.sleep(0.005)
            results.append(time.monotonic() - struck)
        finally:
            for manager in managers:
                manager.stop()
                manager.store.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = AzuriteServer(Path(tmp)).start()
        try:
            options = {"leader_azure_connection_string": server.connection_string}
            url = f"azureblob://bench{uuid.uuid4().hex[:8]}/leases"
            latency = call_latencies(url, options, args.calls)
            handover = failover_rounds(url, options, args.rounds * 3, crash=False)
            takeover = failover_rounds(url, options, args.rounds, crash=True)
        finally:
            server.stop()
    print(
        f"\nAzure Blob store on Azurite, ttl {TTL:g} s (Azure's minimum), "
        f"{args.calls} calls, {args.rounds} crash rounds\n"
    )
    print(f"| {'measure (seconds)':<44} | {'median':>7} | {'worst':>7} |")
    print(f"|{'-' * 46}|{'-' * 9}|{'-' * 9}|")
    for name, values in latency.items():
        label = f"{name} call"
        print(f"| {label:<44} | {statistics.median(values):7.4f} | {max(values):7.4f} |")
    print(
        f"| {'handover after release (watch 0.5 s)':<44} | "
        f"{statistics.median(handover):7.3f} | {max(handover):7.3f} |"
    )
    print(
        f"| {'takeover after crash (lease expiry)':<44} | "
        f"{statistics.median(takeover):7.3f} | {max(takeover):7.3f} |"
    )
    print("\non real Azure, add up to 60 s to takeover after an expiry (Azure's documented rule)")


if __name__ == "__main__":
    main()
