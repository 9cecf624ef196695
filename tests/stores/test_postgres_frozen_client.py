"""A PostgreSQL client frozen or cut off in the middle of a call never stalls the others.

A row lock lasts until its transaction ends. A client that goes silent
between two statements of a transaction (SIGSTOP, a paused container, a
partition) leaves its session "idle in transaction", holding what it locked
until the server notices the dead peer (TCP keepalive: about two hours by
default). The proxy here freezes a client right after its n-th request: the
server has run what it received, the client never hears back, and nothing
is closed (the proxy keeps the server's side of the connection open, as a
stopped process or a silent network does). Every call of the store must then
leave nothing held on the server: the leader renews on, another member
announces on, and the next leader is elected as soon as the lease is free.
A real follower process stopped at random moments checks the same without
the proxy.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from celery_leader.stores import Holder, open_store
from celery_leader.stores.postgres import _connect
from harness.proxy import FaultProxy
from harness.servers import PostgresServer

LEADER = Holder("leader", "n1", "h", 1)
FOLLOWER = Holder("follower", "n2", "h", 2)
NEXT = Holder("next", "n3", "h", 3)

#: The leader's bound on one call, which is also its lock_timeout on the server.
LEADER_TIMEOUT = 1.0
#: The frozen client's: longer, so that its own session guards cannot end the wait in time.
FROZEN_TIMEOUT = 8.0


@pytest.fixture
def server() -> Iterator[PostgresServer]:
    running = PostgresServer().start()
    yield running
    running.stop()


@pytest.fixture
def proxy(server: PostgresServer) -> Iterator[FaultProxy]:
    running = FaultProxy(server.port)
    yield running
    running.close()


def through(proxy: FaultProxy, server: PostgresServer) -> str:
    return server.url.replace(f":{server.port}/", f":{proxy.port}/")


def frozen_in(proxy: FaultProxy, requests: int, call: Callable[[], Any]) -> None:
    """Run *call* with the proxy freezing after its *requests*-th request.

    The call runs in a thread of its own (the frozen client waits for its own
    deadline); this returns once the proxy froze or the call ended (a call of
    fewer requests is not frozen inside, and the proxy freezes at a later one).
    """
    proxy.freeze_after_requests(requests)
    done = threading.Event()

    def run() -> None:
        try:
            call()
        except Exception:  # noqa: BLE001 - a frozen call ends in an error at its deadline
            pass
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    deadline = time.monotonic() + 10
    while proxy.mode != "freeze" and not done.is_set():
        assert time.monotonic() < deadline, "the call neither froze nor ended"
        time.sleep(0.01)


def renews_on(store: Any, seconds: float) -> None:
    """The leader renews every 0.4 s for *seconds*; each renewal must succeed."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert store.renew("job", LEADER.lease_id, 4.0), "the leader's lease was lost"
        time.sleep(0.4)


@pytest.mark.parametrize("requests", [1, 2, 3])
def test_a_follower_frozen_in_its_acquire_never_stalls_the_leader(server, proxy, requests):
    """A follower whose acquire froze after any of its requests: the leader renews on (its
    lock_timeout is 1 s, the renewals run for 3 s), and once it releases the lease the
    next leader is elected at once."""
    leader = open_store(server.url, timeout=LEADER_TIMEOUT)
    follower = open_store(through(proxy, server), timeout=FROZEN_TIMEOUT)
    other = open_store(server.url, timeout=LEADER_TIMEOUT)
    try:
        assert leader.acquire("job", LEADER, 4.0).acquired
        assert follower.read("job") is not None  # its connection is open: requests count from here
        frozen_in(proxy, requests, lambda: follower.acquire("job", FOLLOWER, 4.0))
        renews_on(leader, 3.0)
        assert leader.release("job", LEADER.lease_id)
        assert other.acquire("job", NEXT, 4.0).acquired, "no one can be elected"
    finally:
        for store in (leader, follower, other):
            store.close()


#: A follower process that acquires in a loop (it never gets the lease: the leader holds it).
FOLLOWER_LOOP = """
import sys
from celery_leader.stores import Holder, open_store
store = open_store(sys.argv[1], timeout=float(sys.argv[2]))
holder = Holder("follower", "n2", "h", 2)
assert not store.acquire("job", holder, 4.0).acquired
print("ready", flush=True)
while True:
    store.acquire("job", holder, 4.0)
"""


def test_a_follower_process_stopped_at_any_moment_never_stalls_the_leader(server):
    """A real follower process, acquiring in a loop, stopped (SIGSTOP) 30 times at random
    moments: whenever it stops, the leader's renewal must go through."""
    leader = open_store(server.url, timeout=LEADER_TIMEOUT)
    assert leader.acquire("job", LEADER, 4.0).acquired
    follower = subprocess.Popen(
        [sys.executable, "-c", FOLLOWER_LOOP, server.url, str(FROZEN_TIMEOUT)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stdout is not None and follower.stdout.readline().strip() == "ready"
        chance = random.Random(7)
        for _ in range(30):
            time.sleep(chance.uniform(0.0, 0.02))
            os.kill(follower.pid, signal.SIGSTOP)
            try:
                assert leader.renew("job", LEADER.lease_id, 4.0), "the leader's lease was lost"
            finally:
                os.kill(follower.pid, signal.SIGCONT)
    finally:
        follower.kill()
        follower.wait(timeout=10)
        leader.close()


@pytest.mark.parametrize("requests", [1, 2, 3])
def test_a_member_frozen_in_its_announce_never_stalls_the_others(server, proxy, requests):
    """The balancer's member table: a member whose announce froze after any of its requests,
    while an expired member waits to be swept, must not stop another member's announces."""
    member = open_store(server.url, timeout=LEADER_TIMEOUT)
    frozen = open_store(through(proxy, server), timeout=FROZEN_TIMEOUT)
    try:
        member.announce("workers", "gone", "{}", 0.05)
        frozen.announce("workers", "frozen", "{}", 0.05)  # connection open; its row expires
        time.sleep(0.2)
        frozen_in(proxy, requests, lambda: frozen.announce("workers", "frozen", "{}", 30.0))
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            members = member.announce("workers", "member", "{}", 30.0)
            assert "member" in members and "gone" not in members
            time.sleep(0.4)
    finally:
        member.close()
        frozen.close()


def test_a_session_gone_silent_in_a_transaction_is_ended_by_the_server(server, proxy):
    """The session guards on every connection the store opens: a transaction left idle
    (its client frozen between two statements) is ended within about the store's timeout,
    and the server probes a silent peer with TCP keepalives of its own."""
    leader = open_store(server.url, timeout=LEADER_TIMEOUT)
    try:
        assert leader.acquire("job", LEADER, 4.0).acquired
        guarded = _connect(through(proxy, server), LEADER_TIMEOUT, "celery-leader")
        guarded.execute("BEGIN")
        guarded.execute("SELECT 1 FROM celery_leader_lease WHERE name = 'job' FOR UPDATE")
        proxy.set_mode("freeze")
        started = time.monotonic()
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("SET lock_timeout = '20s'")
            conn.execute("SELECT 1 FROM celery_leader_lease WHERE name = 'job' FOR UPDATE")
        waited = time.monotonic() - started
        assert waited < 10.0, f"the row stayed locked {waited:.1f} s"
        probe = _connect(server.url, LEADER_TIMEOUT, "celery-leader")
        settings = dict(
            probe.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN"
                " ('idle_in_transaction_session_timeout', 'tcp_keepalives_idle',"
                " 'tcp_keepalives_interval', 'tcp_keepalives_count', 'tcp_user_timeout')"
            ).fetchall()
        )
        value = {name: int(setting) for name, setting in settings.items()}
        # A transaction idle longer than one call (ms): its client is gone or frozen.
        assert 0 < value["idle_in_transaction_session_timeout"] <= LEADER_TIMEOUT * 1000, value
        # A silent peer: probed after seconds, not two hours (seconds), and unacknowledged
        # data given up on as quickly (ms).
        probed = value["tcp_keepalives_idle"]
        probed += value["tcp_keepalives_interval"] * value["tcp_keepalives_count"]
        assert 0 < probed <= 10, value
        assert 0 < value["tcp_user_timeout"] <= 10_000, value
        probe.close()
    finally:
        leader.close()
