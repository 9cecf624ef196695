"""SQLite store under faults: a replaced or deleted file, a deleted row, crashes, clocks.

Real database files and real LeaseManagers (each with its own connection, as
separate processes would have), checked with the History recorder.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import celery_leader.clock
from celery_leader.exceptions import StoreError
from celery_leader.lease import EventKind, LeaseManager, LossReason
from celery_leader.lease.timing import LeaseTiming
from celery_leader.stores import open_store
from celery_leader.stores.base import Holder
from tests.history import History
from tests.lease.test_election import wait_for, warm_store

TTL = 1.0
TIMING = LeaseTiming.create(TTL)

#: The schema written by the version before the lease end was recorded.
OLD_SCHEMA = """
CREATE TABLE celery_leader_lease (
    name TEXT PRIMARY KEY, lease_id TEXT NOT NULL, nodename TEXT NOT NULL,
    hostname TEXT NOT NULL, pid INTEGER NOT NULL, token INTEGER NOT NULL,
    acquired_at REAL NOT NULL, boot_id TEXT NOT NULL, expires_at_us INTEGER NOT NULL,
    hold_until_us INTEGER NOT NULL
);
CREATE TABLE celery_leader_state (
    name TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (name, key)
);
CREATE TABLE celery_leader_token (name TEXT PRIMARY KEY, last_token INTEGER NOT NULL);
"""


class Group:
    """Managers on one election, each with its own store client, recorded in one History."""

    def __init__(self, url: str, history: History, timing: LeaseTiming = TIMING) -> None:
        self.url, self.history, self.timing = url, history, timing
        self.managers: dict[str, LeaseManager] = {}

    def add(self, *names: str) -> Group:
        for name in names:
            store = open_store(self.url, timeout=self.timing.op_timeout)
            manager = LeaseManager(
                store,
                "job",
                self.timing,
                holder=Holder.for_this_process(name),
                listeners=(self.history.listener(name),),
            )
            self.managers[name] = manager
            manager.start()
        return self

    def wait_leader(self, timeout: float, exclude: LeaseManager | None = None) -> LeaseManager:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, manager in self.managers.items():
                if (
                    manager is not exclude
                    and manager.is_leader()
                    and self.history.has_term(name, manager.current_token())
                ):
                    return manager
            time.sleep(0.005)
        raise AssertionError(f"no leader within {timeout} s")

    def stop(self) -> None:
        for manager in self.managers.values():
            manager.stop()
            manager.store.close()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "leader.db"


@pytest.fixture
def groups():
    made: list[Group] = []
    yield made
    for group in made:
        group.stop()


def url_of(path: Path) -> str:
    return f"sqlite:///{path}"


def remove_database(path: Path) -> None:
    """What ``rm leader.db*`` does: the file and its WAL and shared-memory files."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def check_takeover_after(history: History, event_at: float, before: list[int]) -> None:
    """No overlap; the first term after *event_at* waited one ttl; tokens only rose."""
    assert history.overlaps() == []
    terms = history.terms()
    after = [t for t in terms if t.start > event_at]
    assert after, "someone leads afterwards"
    assert after[0].start - event_at >= TTL * 0.95, "the new holder held off one ttl"
    assert min(t.token for t in after) > max(before), "tokens after exceed all before"
    tokens = [t.token for t in terms]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


def check_old_leader_stopped_in_time(history: History, name: str) -> None:
    lost = [e for h, e in history.events if h == name and e.kind is EventKind.LOST]
    assert lost, "the old leader reports the loss"
    assert lost[0].reason is LossReason.RENEW_REJECTED
    assert lost[0].at <= lost[0].term.valid_until, "loss declared within its validity"


def leader_name(group: Group, manager: LeaseManager) -> str:
    return next(n for n, m in group.managers.items() if m is manager)


def processes_a_and_b(db: Path, groups: list[Group]) -> tuple[str, History, Group, LeaseManager]:
    """Processes a and b on a warmed store at *db*, recorded in a new History; the leader."""
    url = url_of(db)
    warm_store(url)
    history = History()
    old = Group(url, history).add("a", "b")
    groups.append(old)
    return url, history, old, old.wait_leader(TTL * 2 + 3)


def back_up_then_hand_over(
    db: Path, backup: Path, group: Group, leader: LeaseManager
) -> LeaseManager:
    """Copy the database to *backup*, then let one more term begin; its new leader.

    The backup is then behind the latest term, as a restored one would be.
    """
    with sqlite3.connect(db) as conn:
        conn.execute(f"VACUUM INTO '{backup}'")
    leader.step_down(sit_out=TTL * 3)
    return group.wait_leader(TTL * 2 + 3, exclude=leader)


@pytest.mark.parametrize("how", ["deleted", "restored-from-backup"])
def test_file_replaced_under_a_leader_never_splits_the_election(db, groups, how):
    """The database file is deleted, or replaced by an older backup, while a leader leads.

    Processes that were running keep the old (unlinked) file open; a process
    started afterwards opens the new one. The old leader must stop within its
    validity, the new holder must hold off one ttl, and tokens must rise.
    """
    url, history, old, leader = processes_a_and_b(db, groups)
    backup = db.parent / "backup.db"
    if how == "restored-from-backup":
        leader = back_up_then_hand_over(db, backup, old, leader)
    time.sleep(0.2)
    before = [t.token for t in history.terms()]
    remove_database(db)
    if how == "restored-from-backup":
        os.replace(backup, db)
    replaced_at = celery_leader.clock.now()
    new = Group(url, history).add("c", "d")  # started after the change: they see the new file
    groups.append(new)
    assert wait_for(lambda: not leader.is_leader(), TTL + 0.5), "the old leader stops"
    check_old_leader_stopped_in_time(history, leader_name(old, leader))
    # Someone leads on the new file: a new process, or an old one that opened it again.
    assert wait_for(lambda: any(t.start > replaced_at for t in history.terms()), TTL * 3 + 3)
    time.sleep(TTL)
    check_takeover_after(history, replaced_at, before)


def test_backup_moved_in_after_a_process_recreated_the_file_never_splits(db, groups):
    """``rm leader.db*``, a running process opens the path and writes (a new database and
    its ``-wal``), then the backup is moved in: SQLite reads the backup mixed with that
    ``-wal`` (the store's docstring says so). The election must still not split: the old
    leader stops within its validity, and whoever leads afterwards held off one ttl with a
    higher token (the mix may also read as malformed; then nobody leads, which is safe).
    """
    url, history, old, leader = processes_a_and_b(db, groups)
    backup = db.parent / "backup.db"
    leader = back_up_then_hand_over(db, backup, old, leader)
    time.sleep(0.2)
    before = [t.token for t in history.terms()]
    remove_database(db)
    # A running process between the two commands: it creates the file and writes.
    between = open_store(url, timeout=TIMING.op_timeout)
    between.acquire("other", Holder.for_this_process("between"), TTL)
    assert Path(f"{db}-wal").exists(), "the process in between left a -wal beside the path"
    os.replace(backup, db)
    replaced_at = celery_leader.clock.now()
    new = Group(url, history).add("c", "d")
    groups.append(new)
    try:
        assert wait_for(lambda: not leader.is_leader(), TTL + 0.5), "the old leader stops"
        wait_for(lambda: any(t.start > replaced_at for t in history.terms()), TTL * 3 + 3)
        time.sleep(TTL)
    finally:
        between.close()
    assert history.overlaps() == []
    after = [t for t in history.terms() if t.start > replaced_at]
    if after:
        assert after[0].start - replaced_at >= TTL * 0.95, "the new holder held off one ttl"
        assert min(t.token for t in after) > max(before), "tokens after exceed all before"


def test_lease_row_deleted_makes_the_next_holder_wait(db, groups):
    """An operator's DELETE of the lease row before its end: the next holder holds off one ttl."""
    url = url_of(db)
    warm_store(url)
    history = History()
    group = Group(url, history).add("a", "b", "c")
    groups.append(group)
    leader = group.wait_leader(TTL * 2 + 3)
    time.sleep(0.2)
    before = [t.token for t in history.terms()]
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM celery_leader_lease")
    deleted_at = celery_leader.clock.now()
    assert wait_for(lambda: not leader.is_leader(), TTL + 0.5)
    check_old_leader_stopped_in_time(history, leader_name(group, leader))
    group.wait_leader(TTL * 3 + 3)
    time.sleep(TTL)
    check_takeover_after(history, deleted_at, before)


def test_lease_row_expired_early_makes_the_next_holder_wait(db):
    """A lease row whose end was moved before the recorded end (tampering): hold off one ttl."""
    url = url_of(db)
    warm_store(url)
    store = open_store(url, timeout=1)
    try:
        assert store.acquire("job", Holder.for_this_process("a"), 5.0).acquired
        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE celery_leader_lease SET expires_at_us = 0")
        result = store.acquire("job", Holder.for_this_process("b"), 5.0)
        assert result.acquired and result.hold_off >= 4.9
    finally:
        store.close()


def test_released_lease_does_not_make_the_next_holder_wait(db):
    """A normal release (no data lost) hands over with no hold-off."""
    url = url_of(db)
    warm_store(url)
    store = open_store(url, timeout=1)
    try:
        first = Holder.for_this_process("a")
        assert store.acquire("job", first, 5.0).hold_off == 0
        assert store.renew("job", first.lease_id, 5.0)
        assert store.release("job", first.lease_id)
        assert store.acquire("job", Holder.for_this_process("b"), 5.0).hold_off == 0
    finally:
        store.close()


def test_tokens_come_from_the_wall_clock_on_every_acquire(db):
    """A counter far behind (an old copy): the next token is still above the wall clock."""
    url = url_of(db)
    warm_store(url)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE celery_leader_token SET last_token = 5")
    store = open_store(url, timeout=1)
    try:
        floor = time.time_ns() // 1000
        result = store.acquire("job", Holder.for_this_process("a"), 5.0)
        assert result.acquired and result.token >= floor
    finally:
        store.close()


def test_deleted_file_under_an_open_store_fails_renew_and_holds_off(db):
    """One client: after its file is deleted, renew is refused and the next acquire holds off."""
    url = url_of(db)
    warm_store(url)
    store = open_store(url, timeout=1)
    try:
        holder = Holder.for_this_process("a")
        first = store.acquire("job", holder, 5.0)
        assert first.acquired and first.hold_off == 0
        remove_database(db)
        assert not store.renew("job", holder.lease_id, 5.0), "the lease is not in the new file"
        assert not store.set_state("job", holder.lease_id, "k", "v")
        assert store.read("job") is None
        again = store.acquire("job", Holder.for_this_process("b"), 5.0)
        assert again.acquired and again.hold_off >= 4.9 and again.token > first.token
        assert db.exists()
    finally:
        store.close()


def test_synchronous_full_so_a_committed_acquire_survives_an_os_crash(db):
    """WAL with synchronous=NORMAL may lose the last commits on an OS crash: FULL it is."""
    store = open_store(url_of(db), timeout=1)
    try:
        store.acquire("job", Holder.for_this_process("a"), 5.0)
        assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert store._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        store.close()


def test_expiry_is_measured_on_the_lease_clock(db, monkeypatch):
    """The store and the manager count on one clock, celery_leader.clock."""
    store = open_store(url_of(db), timeout=1)
    try:
        assert store.acquire("job", Holder.for_this_process("a"), 5.0).acquired
        assert store.read("job") is not None
        real = celery_leader.clock.now
        monkeypatch.setattr(celery_leader.clock, "now", lambda: real() + 6.0)
        assert store.read("job") is None, "5 s later on the lease clock the lease is over"
        assert store.acquire("job", Holder.for_this_process("b"), 5.0).acquired
    finally:
        store.close()


def test_database_from_the_previous_schema_is_upgraded(db):
    """A file written by the previous version: columns are added, tokens keep rising."""
    with sqlite3.connect(db) as conn:
        conn.executescript(OLD_SCHEMA)
        conn.execute("INSERT INTO celery_leader_token VALUES ('job', ?)", (2**60,))
    url = url_of(db)
    stores = [open_store(url, timeout=2) for _ in range(3)]
    try:
        results = [
            s.acquire("job", Holder.for_this_process(f"m{i}"), 5.0) for i, s in enumerate(stores)
        ]
        assert [r.acquired for r in results] == [True, False, False]
        assert results[0].token == 2**60 + 1
        with sqlite3.connect(db) as conn:
            columns = {row[1] for row in conn.execute("PRAGMA table_info(celery_leader_token)")}
        assert {"last_token", "lease_end_us", "boot_id", "file_id"} <= columns
    finally:
        for store in stores:
            store.close()


def test_unusable_directory_is_a_store_error_not_a_crash(tmp_path):
    """The database's directory vanishes: every call raises StoreError, nothing else."""
    folder = tmp_path / "gone"
    folder.mkdir()
    store = open_store(url_of(folder / "leader.db"), timeout=0.5)
    try:
        holder = Holder.for_this_process("a")
        assert store.acquire("job", holder, 5.0).acquired
        for name in os.listdir(folder):
            (folder / name).unlink()
        folder.rmdir()
        with pytest.raises(StoreError):
            store.renew("job", holder.lease_id, 5.0)
        with pytest.raises(StoreError):
            store.acquire("job", holder, 5.0)
    finally:
        store.close()


def test_a_process_stopped_in_a_transaction_blocks_the_file_until_it_dies(tmp_path):
    """The limit the safety statement names: a process stopped while it holds the write
    lock blocks every other process's call, which fails at the store timeout (the leader
    steps down: fail closed); its death, even by SIGKILL, frees the file at once."""
    path = tmp_path / "leader.db"
    store = open_store(f"sqlite:///{path}", timeout=0.5)
    # The lease is taken before the holder starts: taken after, it raced the holder's
    # BEGIN IMMEDIATE and lost whenever the child's start beat the call.
    assert store.acquire("job", Holder("a", "n", "h", 1), 5.0).acquired
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys, time\n"
            f"conn = sqlite3.connect({str(path)!r}, isolation_level=None)\n"
            "conn.execute('BEGIN IMMEDIATE')\n"
            "print('locked', flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        os.kill(holder.pid, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(StoreError):
            store.renew("job", "a", 5.0)
        assert time.monotonic() - started < 3.0, "the call outlived the store timeout"
        holder.kill()
        holder.wait(timeout=10)
        assert store.renew("job", "a", 5.0), "the file stayed locked after the holder died"
    finally:
        holder.kill()
        holder.wait(timeout=10)
        store.close()
