"""SQLite lifelines: lock files the kernel drops when their process dies, and takeovers.

Real processes on real database files: the lifeline is held by a child process
that the test kills, stops or forks; the readings and takeovers are the test's.
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import replace
from pathlib import Path

import pytest

from celery_leader.stores import open_store
from celery_leader.stores.base import Holder, LifelineEndedError, Lifelines
from celery_leader.stores.sqlite import SQLiteLeaseStore
from tests.lease.test_election import warm_store

TTL = 30.0

#: A process that opens a lifeline, prints its key and sleeps.
HOLD = """
import sys, time
from celery_leader.stores import open_store
store = open_store(sys.argv[1], timeout=2)
lifeline = store.open_lifeline()
print(lifeline.key, flush=True)
time.sleep(60)
"""

#: A process whose lifeline is opened by celery_leader.lease.lifeline (registered: its
#: at-fork hook runs) or directly by the store (not registered); it forks a child that
#: sleeps, prints "<key> <child pid>", and sleeps.
FORK_AND_SLEEP = """
import os, sys, time, warnings
warnings.simplefilter("ignore", DeprecationWarning)  # fork() with the lifeline's thread
from celery_leader.lease.lifeline import for_store
from celery_leader.stores import open_store
url, registered = sys.argv[1], sys.argv[2] == "registered"
store = open_store(url, timeout=2)
if registered:
    holder, _ = for_store(store, url)
    holder.start()
    assert holder.wait_opened(5)
    key = holder.key()
else:
    key = store.open_lifeline().key
child = os.fork()
if child == 0:
    time.sleep(60)
    os._exit(0)
print(key, child, flush=True)
time.sleep(60)
"""

#: A process that forks children which let go of its lifeline in the worst ways a child
#: can (exiting through interpreter shutdown; closing the lifeline object it inherited),
#: then checks that its own lifeline is still confirmed, and prints "<key> <key now>".
FORK_AND_EXIT = """
import os, sys, time, warnings
warnings.simplefilter("ignore", DeprecationWarning)
from celery_leader.lease.lifeline import GRACE, for_store
from celery_leader.stores import open_store
url = sys.argv[1]
store = open_store(url, timeout=2)
holder, _ = for_store(store, url)
holder.start()
assert holder.wait_opened(5)
key = holder.key()
own = store.open_lifeline()  # not registered: no hook, the child has a real copy
for how in ("exit", "close"):
    child = os.fork()
    if child == 0:
        if how == "close":
            own.close()
            os._exit(0)
        sys.exit(0)
    os.waitpid(child, 0)
time.sleep(2 * GRACE)
own.confirm(1.0)
print(key, holder.key(), flush=True)
print(own.key, flush=True)
time.sleep(60)
"""


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/leader.db"


@pytest.fixture
def lifelines(tmp_path: Path) -> Path:
    """The lifelines directory of ``leader.db``: hidden, so ``rm leader.db*`` skips it."""
    return tmp_path / ".leader.db.lifelines"


@pytest.fixture
def store(url: str) -> Iterator[SQLiteLeaseStore]:
    opened = open_store(url, timeout=2)
    assert isinstance(opened, SQLiteLeaseStore)
    assert isinstance(opened, Lifelines)
    yield opened
    opened.close()


@contextmanager
def process(code: str, *args: str) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """Run *code* in a new Python process; yield it and the words of its first line."""
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        words = proc.stdout.readline().split()
        assert words, f"the process printed nothing (exit code {proc.poll()})"
        yield proc, words
    finally:
        proc.kill()  # also a stopped one
        proc.wait(10)


def kill_by_pid(pid: int) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def is_kept(store: SQLiteLeaseStore, key: str) -> bool:
    return key in store.read_lifelines([key]).alive


def seconds_until_gone(store: SQLiteLeaseStore, key: str, since: float, limit: float) -> float:
    """Read *key* until it is not kept; seconds from *since* (perf_counter); inf after *limit*."""
    session = store.read_lifelines([key]).session
    while time.perf_counter() - since < limit:
        reading = store.read_lifelines([key])
        assert reading.session == session, "one database, one boot: one session"
        if key not in reading.alive:
            return time.perf_counter() - since
        time.sleep(0.002)
    return float("inf")


def holder(tag: str, lifeline: str = "") -> Holder:
    return Holder(f"id-{tag}", f"node-{tag}", "host", 100, lifeline=lifeline)


# -- the lifeline ----------------------------------------------------------------------------


def test_a_lifeline_reads_kept_while_its_process_lives_and_gone_within_0_2_s_of_sigkill(
    store, url, lifelines
):
    """SIGKILL of the holding process: a reader sees its lifeline gone within 0.2 s."""
    with process(HOLD, url) as (proc, (key,)):
        assert is_kept(store, key)
        time.sleep(0.2)
        assert is_kept(store, key), "a live process's lifeline reads kept, again and again"
        killed_at = time.perf_counter()
        proc.send_signal(signal.SIGKILL)
        gone_after = seconds_until_gone(store, key, killed_at, limit=2.0)
    print(f"lifeline read gone {gone_after * 1000:.1f} ms after SIGKILL")
    assert gone_after < 0.2
    assert not (lifelines / key).exists(), "the reader removed the dead file"


def test_a_stopped_process_keeps_its_lifeline(store, url):
    """SIGSTOP: the process keeps its lock, and its lifeline reads kept for 2 s."""
    with process(HOLD, url) as (proc, (key,)):
        proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            assert is_kept(store, key), "a stopped process's lifeline read as gone"
            time.sleep(0.05)
        proc.send_signal(signal.SIGCONT)


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_lock_file_deleted_or_replaced_ends_the_holders_lifeline(store, how, lifelines):
    """The lock file removed or replaced: readers see it gone, the holder's confirm raises."""
    lifeline = store.open_lifeline()
    path = lifelines / lifeline.key
    lifeline.confirm(1.0)
    assert is_kept(store, lifeline.key)
    if how == "deleted":
        path.unlink()
    else:
        other = path.with_name("other")
        other.write_text("")
        other.rename(path)
    with pytest.raises(LifelineEndedError, match=how):
        lifeline.confirm(1.0)
    lifeline.close()
    assert path.exists() is (how == "replaced"), "close removes only its own file"
    assert not is_kept(store, lifeline.key)
    assert not path.exists(), "the reader removed the unlocked file"


def test_a_lock_let_go_under_the_holder_ends_its_lifeline(store):
    """A copy of the descriptor unlocks (a child that had it): the holder's confirm raises."""
    lifeline = store.open_lifeline()
    copy = os.dup(lifeline.fileno())
    try:
        fcntl.flock(copy, fcntl.LOCK_UN)
        with pytest.raises(LifelineEndedError, match="let go"):
            lifeline.confirm(1.0)  # the path still names the file: only the lock tells
        assert not is_kept(store, lifeline.key)
    finally:
        os.close(copy)
        lifeline.close()


def test_close_ends_the_lifeline_and_confirm_then_raises(store, lifelines):
    """close(): the file is gone, readers see it gone, and confirm raises."""
    lifeline = store.open_lifeline()
    path = lifelines / lifeline.key
    lifeline.close()
    lifeline.close()  # idempotent
    assert not path.exists()
    assert not is_kept(store, lifeline.key)
    assert lifeline.fileno() == -1
    with pytest.raises(LifelineEndedError):
        lifeline.confirm(1.0)


def test_readers_create_nothing_and_touch_nothing_but_keys(store, tmp_path, lifelines):
    """A reading creates no directory or file, and a key that is no key opens no path."""
    victim = tmp_path / "victim"
    victim.write_text("not a lifeline")
    keys = ["0" * 32, "../victim", "../../victim", "", "ABC"]
    assert store.read_lifelines(keys).alive == frozenset()
    assert not lifelines.exists(), "a reader made the directory"
    mine = store.open_lifeline()  # the directory now exists
    assert store.read_lifelines(keys).alive == frozenset()
    assert [p.name for p in lifelines.iterdir()] == [mine.key]
    assert victim.read_text() == "not a lifeline", "a reader removed a file outside"
    mine.close()


def test_opening_a_lifeline_removes_dead_ones(store, url, lifelines):
    """Lock files left by killed processes are removed by the next lifeline opened."""
    directory = lifelines
    with process(HOLD, url) as (proc, (dead,)):
        proc.kill()
        proc.wait(10)
    assert (directory / dead).exists(), "nobody read it yet: still there"
    with process(HOLD, url) as (_, (alive,)):
        mine = store.open_lifeline()
        assert sorted(p.name for p in directory.iterdir()) == sorted([alive, mine.key])
        mine.close()


# -- forked children ----------------------------------------------------------------------


def test_forked_children_exiting_or_closing_keep_their_parents_lifeline(store, url):
    """A forked child that exits, or closes the lifeline it inherited, leaves the parent's kept."""
    with process(FORK_AND_EXIT, url) as (proc, (key, key_now)):
        assert key_now == key, "the parent's registered lifeline stopped being confirmed"
        assert proc.stdout is not None
        own = proc.stdout.readline().strip()
        assert own, "the parent's own lifeline could not be confirmed after its child closed it"
        assert is_kept(store, key)
        assert is_kept(store, own)


@pytest.mark.parametrize("registered", [True, False], ids=["at-fork-hook", "no-hook"])
def test_a_child_living_on_after_its_parent_was_killed(store, url, registered):
    """The parent SIGKILLed, its forked child alive: the hook lets the lifeline end with it.

    Without the hook (a lifeline opened outside celery_leader.lease.lifeline) the
    child's copy of the descriptor keeps the lock: that is what the hook is for.
    """
    argument = "registered" if registered else "direct"
    with process(FORK_AND_SLEEP, url, argument) as (proc, (key, child)):
        try:
            assert is_kept(store, key)
            killed_at = time.perf_counter()
            proc.send_signal(signal.SIGKILL)
            gone_after = seconds_until_gone(store, key, killed_at, limit=1.0)
            os.kill(int(child), 0)  # the child still lives
        finally:
            kill_by_pid(int(child))
    if registered:
        print(f"lifeline read gone {gone_after * 1000:.1f} ms after the parent's SIGKILL")
        assert gone_after < 0.2
    else:
        assert gone_after == float("inf"), "the child's copy kept the lock: expected kept"


# -- the lease row and take_over ------------------------------------------------------------


def test_records_carry_the_holders_lifeline_key(store, url):
    """acquire writes the holder's lifeline key; read and a refused acquire return it."""
    lifeline = store.open_lifeline()
    assert store.acquire("job", holder("a", lifeline.key), TTL).acquired
    other = open_store(url, timeout=2)
    try:
        record = other.read("job")
        assert record is not None and record.lifeline == lifeline.key
        refused = other.acquire("job", holder("b"), TTL)
        assert not refused.acquired
        assert refused.holder is not None and refused.holder.lifeline == lifeline.key
        # A new term of the same holder with no lifeline records none.
        assert store.release("job", "id-a")
        assert store.acquire("job", holder("a"), TTL).acquired
        record = other.read("job")
        assert record is not None and record.lifeline == ""
    finally:
        other.close()
        lifeline.close()


def test_take_over_only_from_the_dead_term(store, url):
    """take_over: refused for another term or a kept lifeline; granted once the process died.

    Granted with a greater token and no hold-off; the old holder's renew then fails.
    """
    warm_store(url)
    follower = open_store(url, timeout=2)
    assert isinstance(follower, SQLiteLeaseStore)
    try:
        with process(HOLD, url) as (proc, (key,)):
            first = store.acquire("job", holder("a", key), TTL)
            assert first.acquired and first.hold_off == 0
            dead = follower.read("job")
            assert dead is not None and dead.lifeline == key
            b = holder("b")
            for other_term in (
                replace(dead, token=dead.token - 1),
                replace(dead, lifeline="0" * 32),
                replace(dead, lifeline=""),
            ):
                refused = follower.take_over("job", b, TTL, other_term)
                assert not refused.acquired, f"took over another term: {other_term}"
                assert refused.holder is not None and refused.holder.nodename == "node-a"
            assert not follower.take_over("job", b, TTL, dead).acquired, "its lifeline is kept"
            proc.kill()
            proc.wait(10)
        assert seconds_until_gone(follower, key, time.perf_counter(), 1.0) < 1.0
        taken = follower.take_over("job", b, TTL, dead)
        assert taken.acquired
        assert taken.token is not None and first.token is not None
        assert taken.token > first.token
        assert taken.hold_off == 0, "freeing the dead term caused a hold-off"
        assert not store.renew("job", "id-a", TTL), "the old holder renewed after the takeover"
        record = store.read("job")
        assert record is not None and record.nodename == "node-b" and record.token == taken.token
        # The same takeover again: the lease is b's now, the dead term is gone.
        assert not store.take_over("job", holder("c"), TTL, dead).acquired
    finally:
        follower.close()


def test_take_over_of_a_free_lease_or_an_unlifelined_term_answers_as_acquire(store, url):
    """The lease free: take_over acquires; held by a term with no lifeline: refused."""
    warm_store(url)
    assert store.acquire("job", holder("gone"), TTL).acquired
    ended = store.read("job")
    assert ended is not None and store.release("job", "id-gone")
    granted = store.take_over("job", holder("a"), TTL, replace(ended, lifeline="f" * 32))
    assert granted.acquired and granted.hold_off == 0
    term = store.read("job")
    assert term is not None and term.lifeline == ""
    refused = store.take_over("job", holder("b"), TTL, term)
    assert not refused.acquired


def test_take_over_keeps_what_is_left_of_the_dead_terms_hold_off(store, url):
    """The dead term was in a hold-off (a new store): the new holder waits out the rest."""
    with process(HOLD, url) as (proc, (key,)):
        first = store.acquire("job", holder("a", key), 2.0)
        assert first.hold_off == pytest.approx(2.0)
        dead = store.read("job")
        assert dead is not None
        proc.kill()
        proc.wait(10)
    time.sleep(0.5)
    taken = store.take_over("job", holder("b"), TTL, dead)
    assert taken.acquired
    assert 0.5 < taken.hold_off < 1.6, "the rest of the dead term's hold-off, no more"


def test_a_term_taken_by_an_earlier_version_has_no_lifeline(tmp_path):
    """A file from before the column gets it; a term an earlier version writes has none.

    An earlier version's acquire names only the columns it knows, so a row it
    replaces loses the lifeline key of the term before: no takeover of its term.
    """
    db = tmp_path / "old.db"
    url = f"sqlite:///{db}"
    warm_store(url)
    with sqlite3.connect(db) as conn:
        conn.execute("ALTER TABLE celery_leader_lease DROP COLUMN lifeline")
    store = open_store(url, timeout=2)  # adds it back
    assert isinstance(store, SQLiteLeaseStore)
    lifeline = store.open_lifeline()
    try:
        assert store.acquire("job", holder("a", lifeline.key), TTL).acquired
        record = store.read("job")
        assert record is not None and record.lifeline == lifeline.key
        with sqlite3.connect(db) as conn:  # what an earlier version's acquire writes
            conn.execute(
                "INSERT OR REPLACE INTO celery_leader_lease (name, lease_id, nodename,"
                " hostname, pid, token, acquired_at, boot_id, expires_at_us, hold_until_us,"
                " ttl_us) SELECT name, 'id-old', 'node-old', hostname, pid, token + 1,"
                " acquired_at, boot_id, expires_at_us, 0, ttl_us FROM celery_leader_lease"
            )
        lifeline.close()
        old_term = store.read("job")
        assert old_term is not None and old_term.nodename == "node-old"
        assert old_term.lifeline == ""
        assert not store.take_over("job", holder("b"), TTL, old_term).acquired
    finally:
        store.close()


# -- end to end: lease managers with lifelines -------------------------------------------

#: A lease manager with this process's lifeline on the store; prints "ready", then
#: "leader <token>" once it leads.
NODE = """
import sys, time
from celery_leader.lease import LeaseManager
from celery_leader.lease.lifeline import for_store
from celery_leader.lease.timing import LeaseTiming
from celery_leader.stores import open_store
from celery_leader.stores.base import Holder
url, name = sys.argv[1], sys.argv[2]
timing = LeaseTiming.create(5.0)
store = open_store(url, timeout=timing.op_timeout)
lifeline, monitor = for_store(store, url)
lifeline.start()
assert lifeline.wait_opened(5)
manager = LeaseManager(
    store, "job", timing, holder=Holder.for_this_process(name),
    lifeline=lifeline, lifelines=monitor,
)
manager.start()
print("ready", flush=True)
while not manager.is_leader():
    time.sleep(0.002)
print("leader", manager.current_token(), flush=True)
time.sleep(60)
"""


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline().strip() if ready else ""


def test_a_follower_leads_within_a_second_of_its_leaders_sigkill(url):
    """Lease managers with lifelines, ttl 5 s: the leader SIGKILLed, the follower leads in < 1 s."""
    warm_store(url)
    with process(NODE, url, "a") as (a, _), process(NODE, url, "b") as (b, _):
        first = read_line(a, 5.0).split()
        assert first[0] == "leader", "a did not lead"
        time.sleep(0.5)  # b has seen a, and read its lifeline kept
        assert read_line(b, 0.0) == "", "b led beside a"
        killed_at = time.perf_counter()
        a.send_signal(signal.SIGKILL)
        line = read_line(b, 5.0).split()
        took = time.perf_counter() - killed_at
    print(f"the follower led {took:.3f} s after its leader's SIGKILL (ttl 5 s)")
    assert line[:1] == ["leader"] and int(line[1]) > int(first[1])
    assert took < 1.0
