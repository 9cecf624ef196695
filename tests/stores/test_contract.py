"""The lease store contract, run against every store on a real server or file."""

from __future__ import annotations

import threading
import time

import pytest

from celery_leader.stores.base import Holder


def holder(tag: str) -> Holder:
    return Holder(lease_id=f"id-{tag}", nodename=f"node-{tag}", hostname="host", pid=100)


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
    ttl = 15.0 if any_store_url.startswith("azureblob") else 0.6
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
    """A watcher hears of a release well before the lease would expire."""
    store = make_store()
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
