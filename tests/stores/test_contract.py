"""The lease store contract, run against every store on a real server or file."""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import threading
import time
from pathlib import Path

import pytest

from celery_leader import clock
from celery_leader.stores.base import AcquireResult, Capability, Holder, LeaseStore, NullWatch
from tests.store_matrix import kind_of


def holder(tag: str) -> Holder:
    return Holder(lease_id=f"id-{tag}", nodename=f"node-{tag}", hostname="host", pid=100)


def claims(store: LeaseStore, capability: Capability) -> bool:
    """Whether the store's class claims *capability* (what the checks below hold it to)."""
    return capability in type(store).capabilities  # type: ignore[attr-defined]


def test_acquire_free_lease_gives_positive_token(make_store, lease_ttl):
    """An acquire on a free lease succeeds with a positive token."""
    store = make_store()
    result = store.acquire("job", holder("a"), ttl=lease_ttl)
    assert result.acquired
    assert result.token is not None and result.token > 0


def test_second_holder_is_refused_and_told_when_to_retry(make_store, lease_ttl):
    """A held lease refuses another holder and says how long it lasts."""
    store = make_store()
    store.acquire("job", holder("a"), ttl=lease_ttl)
    result = make_store().acquire("job", holder("b"), ttl=lease_ttl)
    assert not result.acquired
    assert result.retry_in is not None and 0 < result.retry_in <= lease_ttl
    assert result.holder is not None and result.holder.nodename == "node-a"


def test_tokens_strictly_increase_across_acquisitions(make_store, lease_ttl):
    """Each new acquisition gets a token greater than every earlier one."""
    store = make_store()
    tokens = []
    for i in range(5):
        result = store.acquire("job", holder(str(i)), ttl=lease_ttl)
        assert result.acquired
        tokens.append(result.token)
        assert store.release("job", f"id-{i}")
    assert tokens == sorted(tokens) and len(set(tokens)) == 5


def test_min_token_is_respected(make_store, lease_ttl):
    """A caller's highest seen token is a floor for the next one."""
    store = make_store()
    first = store.acquire("job", holder("a"), ttl=lease_ttl).token
    store.release("job", "id-a")
    result = store.acquire("job", holder("b"), ttl=lease_ttl, min_token=first + 1000)
    assert result.token is not None and result.token > first + 1000


def test_own_lease_is_adopted_with_new_token(make_store, lease_ttl):
    """Acquiring a lease we already hold (lost reply) succeeds with a newer token."""
    store = make_store()
    first = store.acquire("job", holder("a"), ttl=lease_ttl)
    again = store.acquire("job", holder("a"), ttl=lease_ttl)
    assert again.acquired and again.token > first.token


def test_renew_and_release_are_compare_and_set(make_store, lease_ttl):
    """Renew and release never touch another holder's lease."""
    store = make_store()
    store.acquire("job", holder("a"), ttl=lease_ttl)
    assert not store.renew("job", "id-b", ttl=lease_ttl)
    assert not store.release("job", "id-b")
    assert store.read("job").nodename == "node-a"
    assert store.renew("job", "id-a", ttl=lease_ttl)
    assert store.release("job", "id-a")
    assert store.read("job") is None
    assert not store.renew("job", "id-a", ttl=lease_ttl)


@pytest.mark.slow
def test_renew_extends_and_lease_expires_without_it(make_store, any_store_url):
    """A renewed lease outlives its first ttl; an unrenewed one expires."""
    ttl = kind_of(any_store_url).short_ttl
    store = make_store()
    store.acquire("job", holder("a"), ttl=ttl)
    time.sleep(ttl * 0.6)
    assert store.renew("job", "id-a", ttl=ttl)
    time.sleep(ttl * 0.6)
    assert store.read("job") is not None
    time.sleep(ttl * 0.7)
    assert store.read("job") is None
    assert make_store().acquire("job", holder("b"), ttl=ttl).acquired


def test_read_reports_holder_fields(make_store, lease_ttl):
    """read() returns nodename, hostname, pid, token, acquired_at and expiry."""
    store = make_store()
    before = time.time()
    token = store.acquire("job", Holder("x", "w1@h", "h", 4242), ttl=lease_ttl).token
    record = store.read("job")
    assert record is not None
    assert (record.nodename, record.hostname, record.pid, record.token) == (
        "w1@h",
        "h",
        4242,
        token,
    )
    assert before - 1 < record.acquired_at < time.time() + 1
    assert 0 < record.expires_in <= lease_ttl


def test_elections_are_independent(make_store, lease_ttl):
    """Two names have two leases."""
    store = make_store()
    assert store.acquire("one", holder("a"), ttl=lease_ttl).acquired
    assert store.acquire("two", holder("b"), ttl=lease_ttl).acquired


def test_watch_calls_back_on_release(make_store):
    """A watcher hears of a release well before the lease would expire (RELEASE_NOTIFICATION)."""
    store = make_store()
    if not claims(store, Capability.RELEASE_NOTIFICATION):
        assert isinstance(store.watch("job", lambda: None), NullWatch)
        return
    watcher_store = make_store()
    store.acquire("job", holder("a"), ttl=30)  # within Azure's 15..60
    heard = threading.Event()
    watch = watcher_store.watch("job", heard.set)
    try:
        time.sleep(0.3)  # let the subscription settle
        heard.clear()
        started = time.monotonic()
        assert store.release("job", "id-a")
        assert heard.wait(5)
        assert time.monotonic() - started < 5, "heard well before the 30 s lease would expire"
    finally:
        watch.close()


def test_watch_hears_a_release_made_before_it_was_up(make_store):
    """A watch opened just after a release still calls back.

    A follower that looked at the lease, then opened its watch, would
    otherwise sleep out a whole ttl behind a lease nobody holds.
    """
    store = make_store()
    if not claims(store, Capability.RELEASE_NOTIFICATION):
        pytest.skip("the store does not claim release notifications")
    store.acquire("job", holder("a"), ttl=30)
    assert store.release("job", "id-a")
    heard = threading.Event()
    watch = make_store().watch("job", heard.set)
    try:
        assert heard.wait(5), "the watch never called back for the free lease"
    finally:
        watch.close()


def test_fresh_store_reports_hold_off(make_store, lease_ttl, any_store_url):
    """The first acquire in a store with no token history must hold off one ttl.

    The in-memory store (tests only) cannot outlive its holders, so it never holds off.
    """
    result = make_store().acquire("job", holder("a"), ttl=lease_ttl)
    expected = 0 if any_store_url.startswith("memory") else lease_ttl
    assert result.acquired and expected - 0.5 < result.hold_off <= expected
    make_store().release("job", "id-a")
    assert make_store().acquire("job", holder("b"), ttl=lease_ttl).hold_off == 0


def test_state_is_written_only_by_the_holder(make_store, lease_ttl):
    """set_state succeeds for the lease holder only; anyone can read it."""
    store = make_store()
    assert not store.set_state("job", "id-a", "k", "v0"), "no lease, no write"
    store.acquire("job", holder("a"), ttl=lease_ttl)
    assert store.set_state("job", "id-a", "k", "v1")
    assert not store.set_state("job", "id-b", "k", "v2")
    assert make_store().get_state("job") == {"k": "v1"}
    store.release("job", "id-a")
    assert not store.set_state("job", "id-a", "k", "v3")
    assert store.get_state("job") == {"k": "v1"}


def test_many_processes_opening_a_new_sqlite_store_at_once(tmp_path):
    """Eight processes opening a brand-new SQLite store together: none fails to start."""
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path}/race.db"
    code = (
        "import sys, time\n"
        "from celery_leader.stores import open_store\n"
        "from celery_leader.stores.base import Holder\n"
        "from celery_leader.exceptions import StoreError\n"
        f"store = open_store({url!r}, timeout=2)\n"
        "for _ in range(50):\n"
        "    try:\n"
        "        store.acquire('job', Holder.for_this_process(), 5); break\n"
        "    except StoreError:\n"
        "        time.sleep(0.05)\n"
        "else:\n"
        "    sys.exit(3)\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(8)]
    assert [p.wait(60) for p in procs] == [0] * 8


# -- every capability a store claims is checked ------------------------------------------

#: The test that holds a store to each capability it claims: a claim not honoured fails.
CAPABILITY_CHECKS = {
    Capability.RELEASE_NOTIFICATION: "test_watch_calls_back_on_release",
    Capability.FENCING_SURVIVES_DATA_LOSS: "test_claimed_fencing_survives_data_loss",
    Capability.SERVER_TIME: "test_claimed_server_time_ignores_the_clients_clocks",
    Capability.MULTI_HOST: "test_claimed_multi_host_excludes_a_client_on_another_host",
    Capability.LIFELINE: "test_claimed_lifeline_ends_with_its_holder_and_allows_a_takeover",
}


def test_every_capability_has_a_check():
    """A capability no test checks could be claimed and never honoured."""
    assert set(CAPABILITY_CHECKS) == set(Capability)
    assert all(name in globals() for name in CAPABILITY_CHECKS.values())


def test_claimed_fencing_survives_data_loss(running_store, make_store, lease_ttl):
    """FENCING_SURVIVES_DATA_LOSS: after the store lost all its data, the next token is higher.

    The caller passes no floor (min_token 0): the store alone must keep tokens rising.
    Within the stores' stated assumption: the store does not lose its data twice
    within one second (Azure's clock reads whole seconds, and a new store's first
    acquire counts as one loss), so the loss comes more than a second after it.
    """
    store = make_store()
    if not claims(store, Capability.FENCING_SURVIVES_DATA_LOSS):
        pytest.skip("the store does not claim fencing across data loss")
    first = store.acquire("job", holder("a"), ttl=lease_ttl).token
    assert store.release("job", "id-a")
    time.sleep(1.1)
    running_store.lose_data()
    after = make_store().acquire("job", holder("b"), ttl=lease_ttl)
    assert after.acquired
    assert after.token > first, "a token after the loss repeats or goes back"


@contextlib.contextmanager
def on_another_host(monkeypatch, *, wall_clock_ahead: float = 0.0):
    """Code in this block sees another host: its own name, boot id and boot-time clocks.

    The host-local clocks (monotonic, boot time) of two hosts are unrelated: here they
    read one hour ahead. *wall_clock_ahead* skews the wall clock too (a client whose
    wall clock is wrong); hosts synced by NTP agree on it.
    """
    real_time, real_time_ns = time.time, time.time_ns
    real_monotonic, real_now = time.monotonic, clock.now
    real_read_text = Path.read_text

    def read_text(path, *args, **kwargs):
        if str(path) == "/proc/sys/kernel/random/boot_id":
            return "00000000-0000-4000-8000-another-host"
        return real_read_text(path, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(time, "time", lambda: real_time() + wall_clock_ahead)
        patch.setattr(time, "time_ns", lambda: real_time_ns() + int(wall_clock_ahead * 1e9))
        patch.setattr(time, "monotonic", lambda: real_monotonic() + 3600.0)
        patch.setattr(clock, "now", lambda: real_now() + 3600.0)
        patch.setattr(socket, "gethostname", lambda: "another-host")
        patch.setattr(Path, "read_text", read_text)
        yield


def test_claimed_server_time_ignores_the_clients_clocks(make_store, lease_ttl, monkeypatch):
    """SERVER_TIME: a client whose clocks are an hour ahead still finds the lease held.

    Expiry measured on the clients' clocks would let it take the lease at once.
    """
    store = make_store()
    if not claims(store, Capability.SERVER_TIME):
        pytest.skip("the store does not claim server time")
    assert store.acquire("job", holder("a"), ttl=lease_ttl).acquired
    with on_another_host(monkeypatch, wall_clock_ahead=3600.0):
        skewed = make_store()
        refused = skewed.acquire("job", holder("b"), ttl=lease_ttl)
        record = skewed.read("job")
    assert not refused.acquired, "a client with a clock an hour ahead took a live lease"
    assert record is not None and record.nodename == "node-a"
    assert 0 < record.expires_in <= lease_ttl


def test_claimed_multi_host_excludes_a_client_on_another_host(make_store, lease_ttl, monkeypatch):
    """MULTI_HOST: a client on another host (name, boot id, boot-time clock) is held to the lease.

    It is refused while the lease is held here, takes it once released, and then
    this host is refused in turn.
    """
    here = make_store()
    if not claims(here, Capability.MULTI_HOST):
        pytest.skip("the store does not claim several hosts")
    assert here.acquire("job", holder("a"), ttl=lease_ttl).acquired
    with on_another_host(monkeypatch):
        there = make_store()
        assert not there.acquire("job", holder("b"), ttl=lease_ttl).acquired
        record = there.read("job")
        assert record is not None and record.nodename == "node-a"
    assert here.release("job", "id-a")
    with on_another_host(monkeypatch):
        assert there.acquire("job", holder("b"), ttl=lease_ttl).acquired
    assert not here.acquire("job", holder("a"), ttl=lease_ttl).acquired


def test_claimed_lifeline_ends_with_its_holder_and_allows_a_takeover(make_store, lease_ttl):
    """LIFELINE: a lifeline reads kept, then gone once closed; take_over takes only that term.

    The takeover gets a greater token and no hold-off; the old holder cannot renew.
    """
    store, follower = make_store(), make_store()
    if not claims(store, Capability.LIFELINE):
        pytest.skip("the store does not claim lifelines")
    assert store.acquire("job", holder("w"), ttl=lease_ttl).acquired  # a history: no hold-off
    assert store.release("job", "id-w")
    lifeline = store.open_lifeline()
    first = store.acquire("job", dataclasses.replace(holder("a"), lifeline=lifeline.key), lease_ttl)
    assert first.acquired and first.hold_off == 0
    dead = follower.read("job")
    assert dead is not None and dead.lifeline == lifeline.key
    seen = follower.read_lifelines([lifeline.key])
    assert seen.alive == {lifeline.key}
    lifeline.confirm(2.0)
    another_term = dataclasses.replace(dead, token=dead.token - 1)
    assert not follower.take_over("job", holder("b"), lease_ttl, another_term).acquired
    lifeline.close()
    deadline = time.monotonic() + 2.0
    while (
        reading := follower.read_lifelines([lifeline.key])
    ).alive and time.monotonic() < deadline:
        time.sleep(0.01)
    assert reading.alive == frozenset() and reading.session == seen.session
    taken = follower.take_over("job", holder("b"), lease_ttl, dead)
    assert taken.acquired and taken.token > first.token and taken.hold_off == 0
    assert not store.renew("job", "id-a", lease_ttl)


def test_presence_lists_live_members_and_forgets_silent_ones(make_store, lease_ttl):
    """A store that keeps members (Presence): one call announces and lists; silence expires."""
    from celery_leader.stores.base import Presence

    store = make_store()
    if not isinstance(store, Presence):
        pytest.skip(f"the {type(store).__name__} does not keep members (no balancing)")
    group = f"members-{time.monotonic_ns()}"
    assert store.announce(group, "w1", "one", lease_ttl) == {"w1": "one"}
    assert store.announce(group, "w2", "two", 0.3) == {"w1": "one", "w2": "two"}
    assert store.announce(group, "w1", "one again", lease_ttl) == {"w1": "one again", "w2": "two"}
    time.sleep(0.5)
    assert store.announce(group, "w1", "one", lease_ttl) == {"w1": "one"}, "w2 fell silent"
    store.announce(group, "w3", "three", lease_ttl)
    store.withdraw(group, "w3")
    assert store.announce(group, "w1", "one", 5.0) == {"w1": "one"}
    time.sleep(2.2)  # a withdrawal must not shorten the group's life to its own ttl
    assert store.announce(group, "w4", "four", 5.0) == {"w1": "one", "w4": "four"}


def test_call_many_answers_each_lease_as_its_own_call_would(make_store, lease_ttl):
    """A store that batches (BatchCalls): one call, each renewal and acquire judged on its own."""
    from celery_leader.stores.base import AcquireRequest, BatchCalls

    store = make_store()
    if not isinstance(store, BatchCalls):
        pytest.skip(f"the {type(store).__name__} makes one call per lease (no batching)")
    mine, theirs = holder("mine"), holder("theirs")
    base = f"batch-{time.monotonic_ns()}"
    assert store.acquire(f"{base}-a", mine, lease_ttl).acquired
    assert store.acquire(f"{base}-b", theirs, lease_ttl).acquired
    renewed, acquired = store.call_many(
        [(f"{base}-a", mine.lease_id), (f"{base}-b", mine.lease_id), (f"{base}-c", "x")],
        [AcquireRequest(f"{base}-b", mine), AcquireRequest(f"{base}-d", mine, 5)],
        lease_ttl,
    )
    assert renewed == [True, False, False]
    record = store.read(f"{base}-a")
    assert record is not None and record.expires_in > lease_ttl * 0.8
    refused, granted = acquired
    assert isinstance(refused, AcquireResult) and not refused.acquired
    assert refused.holder is not None and refused.holder.nodename == theirs.nodename
    assert refused.retry_in is not None and 0 < refused.retry_in <= lease_ttl
    assert isinstance(granted, AcquireResult) and granted.acquired
    assert granted.token is not None and granted.token > 5
    record = store.read(f"{base}-d")
    assert record is not None and record.nodename == mine.nodename
    assert record.token == granted.token


#: A process that opens a lifeline on the store at argv[1], says its key, and confirms it.
LIFELINE_HOLDER = """
import sys, time
from celery_leader.stores import open_store
store = open_store(sys.argv[1], timeout=2.0)
lifeline = store.open_lifeline()
print(lifeline.key, flush=True)
while True:
    lifeline.confirm(timeout=1.0)
    time.sleep(0.05)
"""


def test_claimed_lifeline_ends_when_its_process_is_killed(make_store, any_store_url):
    """LIFELINE: another process's lifeline reads kept, and gone soon after its SIGKILL.

    Nobody closes it: the kernel does, as the process dies. Both readings come
    from one session, so a follower may take "gone" for "ended".
    """
    import os
    import signal
    import subprocess
    import sys

    store = make_store()
    if not claims(store, Capability.LIFELINE):
        pytest.skip("the store does not claim lifelines")
    proc = subprocess.Popen(
        [sys.executable, "-c", LIFELINE_HOLDER, any_store_url], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        key = proc.stdout.readline().strip()
        assert key, "the holder process opened no lifeline"
        kept = store.read_lifelines([key])
        assert kept.alive == {key}
        os.kill(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 2.0
        while (reading := store.read_lifelines([key])).alive and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not reading.alive, "a killed process's lifeline is still kept after 2 s"
        assert reading.session == kept.session
    finally:
        proc.kill()
        proc.wait()
