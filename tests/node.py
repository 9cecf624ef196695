"""A lease manager in its own process, for multi-process tests and benchmarks.

Usage: python -m tests.node URL NAME TTL LOGFILE [NODENAME]

Appends one JSON line per lease event to LOGFILE; SIGTERM stops it
gracefully (releasing the lease).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

from celery_leader.lease import LeaseEvent, LeaseManager
from celery_leader.stores import open_store
from celery_leader.stores.base import Holder
from celery_leader.timing import LeaseTiming


def main() -> None:
    url, name, ttl, logfile = sys.argv[1:5]
    nodename = sys.argv[5] if len(sys.argv) > 5 else f"node-{os.getpid()}"
    timing = LeaseTiming.create(float(ttl))
    store = open_store(url, timeout=timing.op_timeout)
    fd = os.open(logfile, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    write_lock = threading.Lock()

    def record(event: LeaseEvent) -> None:
        line = json.dumps({"holder": nodename, "pid": os.getpid(), "kind": event.kind.value,
                           "token": event.term.token, "elected_at": event.term.elected_at,
                           "valid_until": event.term.valid_until, "at": event.at})
        with write_lock:
            os.write(fd, (line + "\n").encode())

    holder = Holder.for_this_process(nodename)
    manager = LeaseManager(store, name, timing, holder=holder, listeners=(record,))
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    manager.start()
    print("ready", flush=True)
    done.wait()
    manager.stop()
    store.close()


if __name__ == "__main__":
    main()
