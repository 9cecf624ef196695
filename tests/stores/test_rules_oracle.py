"""The token and hold-off rules of celery_leader/stores/rules.py, and every store held to them.

``rules.py`` is the oracle. SQLite, Azure Blob and the model store call it;
the Redis store's rule runs in Lua and PostgreSQL's in a server-side
function, and neither can. So each store (a real redis-server, a real SQLite
file, Azurite, a real PostgreSQL server, the model store on a clock the test
sets) is driven through the same sequences, and what it returns (the token,
the hold-off, the hold-off end it records) must be what the oracle computes
from the same inputs: the last token, the store's clock, the caller's floor,
and whether the store forgot the last term. A store's clock is read just
before and just after the acquire, so for clock-derived values the check is
a bound: between the oracle's value at the first reading and at the second.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

import psycopg
import pytest

from celery_leader import clock
from celery_leader.simulation.model_store import ModelStore
from celery_leader.stores import open_store, rules
from celery_leader.stores.base import AcquireResult, Holder
from celery_leader.stores.redis import lease_key, token_key
from harness.servers import PostgresServer
from tests.store_matrix import STORES

A = Holder(lease_id=uuid.uuid4().hex, nodename="a", hostname="h", pid=1)
B = Holder(lease_id=uuid.uuid4().hex, nodename="b", hostname="h", pid=2)
FAR = 10**12  # a token or floor far above the clock (about 11 days of microseconds)

# -- the oracle alone ----------------------------------------------------------------------


def test_next_token_is_above_counter_clock_and_floor():
    assert rules.next_token(10, 5, 0) == 11
    assert rules.next_token(10, 50, 0) == 50
    assert rules.next_token(10, 50, 99) == 100
    assert rules.next_token(None, 50, 0) == 50
    assert rules.next_token(None, 0, 0) == 1


def test_a_lost_counter_counts_from_the_end_of_the_clocks_step():
    """A clock that reads whole seconds: a lost counter may have run up to the next second."""
    assert rules.next_token(None, 7_000_000, 0, clock_latest=8_000_000) == 8_000_000
    assert rules.next_token(7_000_005, 7_000_000, 0, clock_latest=8_000_000) == 7_000_006


def test_hold_off_is_one_ttl_after_the_store_forgot():
    assert rules.hold_off(now=100, ttl=5, own_hold_until=0, forgot=True) == (105, 5)
    assert rules.hold_off(now=100, ttl=5, own_hold_until=0, forgot=False) == (0, 0)


def test_an_own_lease_keeps_what_is_left_of_its_hold_off():
    assert rules.hold_off(now=100, ttl=5, own_hold_until=103, forgot=False) == (103, 3)
    assert rules.hold_off(now=100, ttl=5, own_hold_until=99, forgot=False) == (99, 0)
    # Never shortened by a store that forgot again.
    assert rules.hold_off(now=100, ttl=5, own_hold_until=109, forgot=True) == (109, 9)


def test_a_coarse_clock_records_the_end_from_the_end_of_its_step():
    """Azure: the end is recorded from the end of the second; the wait counts from the reply."""
    assert rules.hold_off(
        now=100.0, ttl=15.0, own_hold_until=0.0, forgot=True, now_latest=101.0
    ) == (116.0, 15.0)


def test_hold_off_keeps_the_callers_unit():
    until, wait = rules.hold_off(now=1.5, ttl=2.0, own_hold_until=0.0, forgot=False)
    assert (until, wait) == (0.0, 0.0) and isinstance(wait, float)


def test_what_makes_a_store_forget():
    assert not rules.store_forgot()
    for reason in ("counter_missing", "data_replaced", "vanished_early", "ended_early"):
        assert rules.store_forgot(**{reason: True})
    assert rules.store_forgot(cannot_tell=True)
    assert rules.lease_vanished_early(False, 10, 5)
    assert not rules.lease_vanished_early(True, 10, 5)
    assert not rules.lease_vanished_early(False, 5, 5)


# -- every store against the oracle --------------------------------------------------------


@dataclass
class Reading:
    """The store's clocks read once: the token clock (us) and the hold-off clock (store unit)."""

    token_clock: int
    token_clock_latest: int
    hold_clock: float | int
    hold_clock_latest: float | int | None = None


class Driver:
    """One store, driven through a scenario: the inputs the oracle needs, read from the store."""

    ttl: float

    def acquire(self, holder: Holder, min_token: int = 0, ttl: float | None = None):
        raise NotImplementedError

    def release(self, holder: Holder) -> None:
        raise NotImplementedError

    def read_clock(self) -> Reading:
        raise NotImplementedError

    def last_token(self) -> int | None:
        raise NotImplementedError

    def set_last_token(self, token: int) -> None:
        raise NotImplementedError

    def lose_data(self) -> None:
        raise NotImplementedError

    def end_lease_early(self) -> None:
        """Remove or end the live lease behind the store's back (eviction, DEL, Break Lease)."""
        raise NotImplementedError

    def recorded_hold_until(self) -> float | int:
        """The hold-off end recorded with the live lease, in the store's unit."""
        raise NotImplementedError

    def ttl_units(self, ttl: float) -> float | int:
        raise NotImplementedError


def check(
    driver: Driver,
    holder: Holder,
    *,
    forgot: bool,
    min_token: int = 0,
    ttl=None,
    restarted_at=None,
):
    """Acquire once; the token, hold-off and recorded end must be within the oracle's bounds."""
    ttl = driver.ttl if ttl is None else ttl
    last = driver.last_token()
    own = driver.recorded_hold_until() if holder is A and driver.holds(A) else 0
    own = type(driver.ttl_units(ttl))(own)
    before = driver.read_clock()
    result: AcquireResult = driver.acquire(holder, min_token, ttl)
    after = driver.read_clock()
    assert result.acquired

    low = rules.next_token(
        last, before.token_clock, min_token, clock_latest=before.token_clock_latest
    )
    high = rules.next_token(
        last, after.token_clock, min_token, clock_latest=after.token_clock_latest
    )
    assert low <= result.token <= high, (last, min_token, before, after)

    def oracle(reading: Reading):
        return rules.hold_off(
            now=reading.hold_clock,
            ttl=driver.ttl_units(ttl),
            own_hold_until=own,
            forgot=forgot,
            now_latest=reading.hold_clock_latest,
            restarted_at=restarted_at,
        )

    (until_low, wait_high), (until_high, wait_low) = oracle(before), oracle(after)
    wait = driver.wait_units(result.hold_off)
    assert wait_low <= wait <= wait_high, (forgot, own, before, after, result)
    assert until_low <= driver.recorded_hold_until() <= until_high
    return result


def run_scenario(driver: Driver, scenario: str) -> None:
    """The sequences every store is driven through, each ending in one checked acquire."""
    if scenario == "fresh":
        check(driver, A, forgot=True)
        return
    driver.acquire(A)
    if scenario == "own-lease-again":  # a lost reply: the holder asks again
        check(driver, A, forgot=False)
        return
    if scenario == "lease-ended-early":
        driver.end_lease_early()
        check(driver, B, forgot=True)
        return
    driver.release(A)
    if scenario == "handover":
        check(driver, B, forgot=False)
    elif scenario == "counter-ahead":
        driver.set_last_token(driver.read_clock().token_clock + FAR)
        check(driver, B, forgot=False)
    elif scenario == "floor-ahead":
        check(driver, B, forgot=False, min_token=driver.read_clock().token_clock + FAR)
    elif scenario == "data-lost":
        time.sleep(1.1)  # the stores assume at most one loss a second (Azure reads seconds)
        driver.lose_data()
        check(driver, B, forgot=True)
    else:
        raise AssertionError(scenario)


SCENARIOS = [
    "fresh",
    "own-lease-again",
    "lease-ended-early",
    "handover",
    "counter-ahead",
    "floor-ahead",
    "data-lost",
]


def us(seconds: float) -> int:
    return int(seconds * 1_000_000)


class RedisDriver(Driver):
    """The Lua script on a real redis-server: microseconds of the server's TIME."""

    def __init__(self, server, ttl: float) -> None:
        self.server, self.ttl = server, ttl
        self.client = server.client()
        self.store = open_store(server.url, timeout=2)

    def acquire(self, holder, min_token=0, ttl=None):
        return self.store.acquire("job", holder, self.ttl if ttl is None else ttl, min_token)

    def release(self, holder):
        assert self.store.release("job", holder.lease_id)

    def holds(self, holder):
        value = self.client.get(lease_key("job"))
        return value is not None and json.loads(value)["lease_id"] == holder.lease_id

    def read_clock(self):
        seconds, micros = self.client.time()
        now = int(seconds) * 1_000_000 + int(micros)
        return Reading(now, now, now)

    def last_token(self):
        value = self.client.get(token_key("job"))
        return None if value is None else int(value)

    def set_last_token(self, token):
        self.client.set(token_key("job"), str(token))

    def lose_data(self):
        self.client.flushall()

    def end_lease_early(self):
        self.client.delete(lease_key("job"))

    def recorded_hold_until(self):
        return int(json.loads(self.client.get(lease_key("job")))["hold_until_us"])

    def ttl_units(self, ttl):
        return max(1, int(ttl * 1000)) * 1000

    def wait_units(self, hold_off):
        return round(hold_off * 1e6)


class SQLiteDriver(Driver):
    """A real SQLite file: tokens on the wall clock, hold-offs on the lease clock (us)."""

    def __init__(self, path: Path, ttl: float) -> None:
        self.path, self.ttl = path, ttl
        self.store = open_store(f"sqlite:///{path}", timeout=2)

    def _query(self, sql, *args):
        """One statement on the file as it is; None when the file or table is missing."""
        try:
            with sqlite3.connect(f"file:{self.path}?mode=rw", uri=True) as conn:
                return conn.execute(sql, args).fetchone()
        except sqlite3.OperationalError:
            return None

    def acquire(self, holder, min_token=0, ttl=None):
        return self.store.acquire("job", holder, self.ttl if ttl is None else ttl, min_token)

    def release(self, holder):
        assert self.store.release("job", holder.lease_id)

    def holds(self, holder):
        row = self._query("SELECT lease_id FROM celery_leader_lease WHERE name = 'job'")
        return row is not None and row[0] == holder.lease_id

    def read_clock(self):
        wall = time.time_ns() // 1000
        return Reading(wall, wall, us(clock.now()))

    def last_token(self):
        row = self._query("SELECT last_token FROM celery_leader_token WHERE name = 'job'")
        return None if row is None else int(row[0])

    def set_last_token(self, token):
        self._query("UPDATE celery_leader_token SET last_token = ? WHERE name = 'job'", token)

    def lose_data(self):
        for file in self.path.parent.glob(self.path.name + "*"):
            file.unlink()

    def end_lease_early(self):
        self._query("DELETE FROM celery_leader_lease WHERE name = 'job'")

    def recorded_hold_until(self):
        row = self._query("SELECT hold_until_us FROM celery_leader_lease WHERE name = 'job'")
        return int(row[0])

    def ttl_units(self, ttl):
        return int(ttl * 1e6)

    def wait_units(self, hold_off):
        return round(hold_off * 1e6)


class PostgresDriver(Driver):
    """celery_leader_acquire() on a real PostgreSQL server: microseconds of its clock."""

    def __init__(self, server: PostgresServer, ttl: float) -> None:
        self.server, self.ttl = server, ttl
        self.conn = psycopg.connect(server.url, autocommit=True)
        self.store = open_store(server.url, timeout=2)
        assert self.store.read("job") is None  # the schema is there from now on

    def _one(self, sql, *args):
        """One statement's first row; None when a table or the sequence is missing."""
        try:
            cursor = self.conn.execute(sql, args)
        except psycopg.errors.UndefinedTable:
            return None
        return cursor.fetchone() if cursor.description else None

    def acquire(self, holder, min_token=0, ttl=None):
        return self.store.acquire("job", holder, self.ttl if ttl is None else ttl, min_token)

    def release(self, holder):
        assert self.store.release("job", holder.lease_id)

    def holds(self, holder):
        row = self._one("SELECT lease_id FROM celery_leader_lease WHERE name = 'job'")
        return row is not None and row[0] == holder.lease_id

    def read_clock(self):
        (now,) = self._one("SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint")
        return Reading(int(now), int(now), int(now))

    def last_token(self):
        row = self._one("SELECT last_value, is_called FROM celery_leader_token_seq")
        return None if row is None else int(row[0]) - (0 if row[1] else 1)

    def set_last_token(self, token):
        self._one("SELECT setval('celery_leader_token_seq', %s)", token)

    def lose_data(self):
        self._one(
            "DROP TABLE IF EXISTS celery_leader_lease, celery_leader_state,"
            " celery_leader_member; DROP SEQUENCE IF EXISTS celery_leader_token_seq"
        )
        # The store's session sees the tables gone at once (it makes sure of them on connect).
        self._one(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'celery-leader'"
        )

    def end_lease_early(self):
        self._one("UPDATE celery_leader_lease SET lease_id = NULL, expires_at_us = 0")

    def recorded_hold_until(self):
        return int(self._one("SELECT hold_until_us FROM celery_leader_lease")[0])

    def ttl_units(self, ttl):
        return int(ttl * 1e6)

    def wait_units(self, hold_off):
        return round(hold_off * 1e6)

    def close(self) -> None:
        self.store.close()
        self.conn.close()


class ModelDriver(Driver):
    """The simulation's model store on a clock the test sets: the oracle's values exactly.

    The clock moves on between the steps of a scenario, never during the checked
    acquire, so both readings are the acquire's own time.
    """

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self.now = 1000.0
        self.store = ModelStore(lambda: self.now)

    def acquire(self, holder, min_token=0, ttl=None):
        return self.store.acquire("job", holder, self.ttl if ttl is None else ttl, min_token)

    def release(self, holder):
        self.now += 0.25
        assert self.store.release("job", holder.lease_id)
        self.now += 0.25

    def holds(self, holder):
        lease = self.store.data.lease
        return lease is not None and lease.lease_id == holder.lease_id

    def read_clock(self):
        return Reading(us(self.now), us(self.now), self.now)

    def last_token(self):
        return self.store.data.counter

    def set_last_token(self, token):
        self.store.data = replace(self.store.data, counter=token)

    def lose_data(self):
        self.store.restart_empty()
        self.now += 0.25

    def end_lease_early(self):
        self.now += 0.25
        assert self.store.evict_lease()

    def recorded_hold_until(self):
        return self.store.data.lease.hold_until

    def ttl_units(self, ttl):
        return float(ttl)

    def wait_units(self, hold_off):
        return hold_off


class AzureDriver(Driver):
    """Blob leases on Azurite: tokens and recorded ends on Azure's clock (the Date header).

    Azurite runs on this host, so its clock is this host's wall clock, read by
    the store in whole seconds.
    """

    def __init__(self, url: str, connection_string: str, ttl: float) -> None:
        from azure.storage.blob import BlobServiceClient

        self.ttl = ttl
        self.store = open_store(url, timeout=5)
        container, prefix = url.removeprefix("azureblob://").split("/", 1)
        self.service = BlobServiceClient.from_connection_string(connection_string)
        self.blob = self.service.get_blob_client(container, f"{prefix}/job")

    def _content(self):
        from azure.core.exceptions import ResourceNotFoundError

        try:
            raw = self.blob.download_blob().readall()
        except ResourceNotFoundError:
            return {}
        return json.loads(raw) if raw else {}

    def acquire(self, holder, min_token=0, ttl=None):
        return self.store.acquire("job", holder, self.ttl if ttl is None else ttl, min_token)

    def release(self, holder):
        assert self.store.release("job", holder.lease_id)

    def holds(self, holder):
        from celery_leader.stores.azure_blob import lease_guid

        return self._content().get("holder", {}).get("lease") == lease_guid(holder.lease_id)

    def read_clock(self):
        second = math.floor(time.time())
        return Reading(
            second * 1_000_000, (second + 1) * 1_000_000, float(second), float(second + 1)
        )

    def last_token(self):
        return self._content().get("last_token")

    def set_last_token(self, token):
        content = self._content()
        content["last_token"] = token
        self.blob.upload_blob(json.dumps(content).encode(), overwrite=True)

    def lose_data(self):
        self.blob.delete_blob()

    def end_lease_early(self):
        from azure.storage.blob import BlobLeaseClient

        BlobLeaseClient(self.blob).break_lease(lease_break_period=0)

    def recorded_hold_until(self):
        return float(self._content()["holder"]["hold_until"])

    def ttl_units(self, ttl):
        return float(ttl)

    def wait_units(self, hold_off):
        return hold_off


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_redis_lua_follows_the_oracle(scenario, redis_server):
    run_scenario(RedisDriver(redis_server, STORES["redis"].lease_ttl), scenario)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_sqlite_follows_the_oracle(scenario, tmp_path):
    run_scenario(SQLiteDriver(tmp_path / "leader.db", STORES["sqlite"].lease_ttl), scenario)


@pytest.fixture
def postgres_server():
    server = PostgresServer().start()
    yield server
    server.stop()


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_postgres_function_follows_the_oracle(scenario, postgres_server):
    driver = PostgresDriver(postgres_server, STORES["postgres"].lease_ttl)
    try:
        run_scenario(driver, scenario)
    finally:
        driver.close()


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_model_store_follows_the_oracle(scenario):
    run_scenario(ModelDriver(STORES["redis"].lease_ttl), scenario)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_azure_follows_the_oracle(scenario, tmp_path, monkeypatch):
    with STORES["azure"].run(tmp_path, monkeypatch) as running:
        import os

        connection = os.environ["AZURE_STORAGE_CONNECTION_STRING"]
        run_scenario(AzureDriver(running.url, connection, STORES["azure"].lease_ttl), scenario)


# -- where a store and the oracle disagree -------------------------------------------------


def test_redis_keeps_an_own_hold_off_when_the_store_forgets_again(redis_server):
    """An own lease re-acquired with a shorter ttl after the data's incarnation changed.

    Reachable only when the same holder asks again with a shorter ttl (or the
    server's clock went back): the holders of one election share one ttl.
    """
    driver = RedisDriver(redis_server, 10.0)
    driver.acquire(A)  # a fresh store: hold off until now + 10 s
    redis_server.client(db=1).flushdb()  # another incarnation; the lease in db 0 stays
    check(driver, A, forgot=True, ttl=2.0)


def test_postgres_keeps_an_own_hold_off_when_the_store_forgets_again(postgres_server):
    """The same on PostgreSQL: data of another cluster or timeline is another incarnation."""
    driver = PostgresDriver(postgres_server, 10.0)
    try:
        driver.acquire(A)  # a fresh store: hold off until now + 10 s
        # As a promotion records it: the next acquire reads another timeline.
        driver._one("UPDATE celery_leader_lease SET incarnation = '0:00000009:' || incarnation")
        check(driver, A, forgot=True, ttl=2.0)
    finally:
        driver.close()


def test_postgres_holds_off_until_one_ttl_after_a_restart(postgres_server):
    """A restart that kept the rows (kill -9, a start recovering from the WAL): the oracle's
    hold-off with the server's start time, until one ttl after it, for another holder and
    for the holder of a lease the restart kept."""
    driver = PostgresDriver(postgres_server, 10.0)
    try:
        driver.acquire(A)  # a fresh store: hold off until now + 10 s
        driver.release(A)
        driver.acquire(B, ttl=1.0)
        postgres_server.kill()
        postgres_server.start()
        driver.conn.close()
        driver.conn = psycopg.connect(postgres_server.url, autocommit=True)
        (started,) = driver._one(
            "SELECT (extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint"
        )
        time.sleep(1.1)  # B's lease ran out
        result = check(driver, A, forgot=False, restarted_at=int(started))
        assert 0 < result.hold_off < 10.0 and result.restarted_ago is not None, result
        # The holder asks again (a lost reply): the restart is recorded now, what is left
        # of its own hold-off remains.
        again = check(driver, A, forgot=False)
        assert 0 < again.hold_off <= result.hold_off and again.restarted_ago is None, again
    finally:
        driver.close()


def test_model_store_keeps_an_own_hold_off_when_the_store_forgets_again():
    """The same sequence on the model store, which calls the oracle."""
    driver = ModelDriver(10.0)
    driver.acquire(A)
    driver.store.restart_keeping_data()
    result = check(driver, A, forgot=True, ttl=2.0)
    assert result.hold_off == 10.0
