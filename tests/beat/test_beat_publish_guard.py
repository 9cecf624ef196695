"""Beat's publish guard and the bound on beat's own store calls.

A real Celery beat scheduler (PersistentScheduler, wrapped) on kombu's
in-memory transport, with its lease in a real redis-server (through a fault
proxy where the store must be slow). What is faked is only *when* things
happen: a hook that runs the lease thread's step-down, or lets beat's loop
go quiet, at the exact point of a send where the old code let the lease go.

The guard's promise: from the moment beat decides to send until the send's
mark is in the store, the lease is never released, so no other beat can take
over and send the same slot. The bound's promise: a slow store never holds
beat's tick longer than ``leader_store_timeout`` per call.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis as redis_lib
from celery import Celery

from celery_leader import clock as lease_clock
from celery_leader.beat import TOKEN_HEADER, LeaderScheduler
from celery_leader.lease import Role
from celery_leader.stores import open_store
from harness.proxy import FaultProxy
from tests.beat.test_beat_scheduler import sent, take_over

TTL = 2.0
STORE_TIMEOUT = 1.0


def make_app(backend_url: str) -> Celery:
    """An app whose one entry runs every minute: a test makes it due by hand."""
    main = f"g{uuid.uuid4().hex[:10]}"
    app = Celery(main, broker="memory://")
    app.conf.update(
        leader_backend_url=backend_url,
        leader_lease_ttl=TTL,
        leader_store_timeout=STORE_TIMEOUT,
        leader_beat_standby="reserve",
        task_default_queue=f"{main}.default",
        beat_schedule={"tick": {"task": f"{main}.tick", "schedule": 60.0}},
    )
    return app


def lead(sched: Any) -> Any:
    """Wait until *sched* leads (a new store holds the first holder off one ttl); its election.

    Beat's loop counts as ticking meanwhile, as it would in a running beat.
    """
    election = sched._election()
    deadline = time.monotonic() + 3 * TTL
    while time.monotonic() < deadline and not election.manager.is_leader():
        election.loop.tick()
        time.sleep(0.02)
    assert election.manager.is_leader()
    return election


def make_due(sched: Any) -> Any:
    """The scheduler's "tick" entry, due now (its last run two periods ago)."""
    entry = sched.schedule["tick"]
    entry.last_run_at = datetime.now(timezone.utc) - timedelta(seconds=120)
    return entry


@pytest.fixture
def beats(tmp_path):
    """Make LeaderSchedulers for an app; all are closed after the test."""
    made: list[Any] = []

    def make(app: Celery) -> Any:
        sched = LeaderScheduler(
            app=app, schedule_filename=str(tmp_path / f"{app.main}-{len(made)}"), lazy=False
        )
        made.append(sched)
        return sched

    yield make
    for sched in made:
        sched.close()


def run_after_leading(election: Any, action: Callable[[], None]) -> None:
    """Run *action* once, right after the next ``leading()`` of *election* returned."""
    original = election.leading

    def leading() -> int | None:
        token = original()
        election.leading = original
        action()
        return token

    election.leading = leading


class StoreWithHook:
    """The real store, with *before_write* run right before each ``set_state`` reaches it."""

    def __init__(self, store: Any, before_write: Callable[[], None]) -> None:
        self._store = store
        self._before_write = before_write

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def set_state(self, *args: Any) -> bool:
        self._before_write()
        return bool(self._store.set_state(*args))


def sends_of_standby(standby: Any, app: Celery, within: float) -> list[dict]:
    """Tick *standby* until it has led for a few ticks (or *within* s pass); what it sent."""
    election = standby._election()
    deadline = time.monotonic() + within
    led_ticks = 0
    while time.monotonic() < deadline and led_ticks < 5:
        standby.tick()
        if election.leading() is not None:
            led_ticks += 1
        time.sleep(0.05)
    assert election.leading() is not None, "the standby never took over"
    return sent(app)


def step_down(election: Any) -> Callable[[], None]:
    """The lease thread gives the term up (and sits out), as it would when beat is not live."""
    return lambda: election.manager.step_down(sit_out=10 * TTL)


def loop_goes_quiet(election: Any) -> Callable[[], None]:
    """Beat's loop looks stuck until the lease thread has given the term up (or held on)."""

    def action() -> None:
        election.loop.last_tick -= 3600
        deadline = time.monotonic() + 2 * election.settings.timing.renew_interval + 0.5
        while time.monotonic() < deadline and election.manager.state().role is Role.LEADER:
            time.sleep(0.005)
        if election.manager.state().role is not Role.LEADER:
            # Given up: let the release (if the guard allowed one) reach the store.
            store = open_store(election.settings.backend_url, timeout=1)
            until = time.monotonic() + 1
            while time.monotonic() < until and store.read(election.settings.name) is not None:
                time.sleep(0.01)
            store.close()
        election.loop.tick()

    return action


@pytest.mark.parametrize("term_ends", [step_down, loop_goes_quiet], ids=["step-down", "not-live"])
def test_a_term_ending_as_a_send_begins_keeps_its_lease_until_the_send_landed(
    redis_server, beats, term_ends
):
    """The lease thread gives the term up right after beat read "leading": no hand-over mid-send.

    The old code read ``leading()`` first and raised its in-flight flag
    after: the lease thread found no publish in flight, released, and a
    standby took over and sent the same slot.
    """
    app = make_app(redis_server.url)
    leader = beats(app)
    election = lead(leader)
    take_over(leader)
    token = election.token()
    standby = beats(app)
    make_due(standby)
    run_after_leading(election, term_ends(election))

    leader.apply_async(make_due(leader), producer=leader.producer)

    store = open_store(redis_server.url, timeout=1)
    record = store.read(election.settings.name)
    marks = store.get_state(election.settings.name)
    store.close()
    assert record is not None and record.token == token, (
        "the lease was handed over before the send it allowed had landed"
    )
    assert json.loads(marks["tick"])["token"] == token
    first = sent(app)
    assert [m[TOKEN_HEADER] for m in first] == [token]
    again = sends_of_standby(standby, app, within=4 * TTL)
    assert again == [], "the standby sent the slot the old leader had sent"


def test_the_lease_is_not_released_before_the_send_is_marked(redis_server, beats):
    """The term ends while the send's mark is on its way: the next leader still sees the mark.

    The old code lowered its in-flight flag when the publish returned, before
    the mark was written: the lease was released, the mark refused, and the
    next leader sent the slot again.
    """
    app = make_app(redis_server.url)
    leader = beats(app)
    election = lead(leader)
    take_over(leader)
    token = election.token()
    standby = beats(app)
    make_due(standby)
    stepped = []

    def before_write() -> None:
        if not stepped:
            stepped.append(election.manager.step_down(sit_out=10 * TTL))

    election.store = StoreWithHook(election.store, before_write)

    leader.apply_async(make_due(leader), producer=leader.producer)

    assert stepped, "the mark was never written"
    store = open_store(redis_server.url, timeout=1)
    marks = store.get_state(election.settings.name)
    store.close()
    assert "tick" in marks, "the send's mark was refused: the lease was released before it"
    assert json.loads(marks["tick"])["token"] == token
    assert [m[TOKEN_HEADER] for m in sent(app)] == [token]
    again = sends_of_standby(standby, app, within=4 * TTL)
    assert again == [], "the standby sent the slot the old leader had sent"


@pytest.fixture
def slow_store(redis_server):
    """A proxy to the test's redis-server; ``slow_down(election)`` makes every reply late."""
    proxy = FaultProxy(redis_server.port)
    admin = redis_lib.Redis.from_url(redis_server.url)

    def slow_down(election: Any) -> None:
        # Every reply 0.4 s late, inside the 0.5 s read timeout, on fresh
        # connections (connect, CLIENT SETNAME, SETINFO) and with no cached
        # scripts (EVALSHA meets NOSCRIPT, then SCRIPT LOAD): a call takes
        # several round trips, each one just in time.
        proxy.set_mode("trickle", delay=0.4, hang_after=10**6)
        election.store._client.connection_pool.disconnect()
        admin.script_flush()

    proxy.slow_down = slow_down  # type: ignore[attr-defined]
    yield proxy
    proxy.set_mode("pass")
    proxy.close()
    admin.close()


def test_a_slow_store_does_not_hold_the_send_mark_past_the_store_timeout(
    redis_server, slow_store, beats
):
    """Writing a send's mark to a slow store takes at most ``leader_store_timeout``.

    And once the store stops answering, beat's ticks stay that short, and it
    sends nothing after its lease could have ended.
    """
    app = make_app(f"redis://127.0.0.1:{slow_store.port}/0")
    leader = beats(app)
    election = lead(leader)
    take_over(leader)
    token = election.token()
    slow_store.slow_down(election)

    started = time.monotonic()
    leader.apply_async(make_due(leader), producer=leader.producer)
    took = time.monotonic() - started

    assert [m[TOKEN_HEADER] for m in sent(app)] == [token]
    assert took < STORE_TIMEOUT + 0.4, f"the send and its mark held beat's loop {took:.2f} s"
    # The mark given up on is still on its way (it takes about 3 s here):
    # until it lands or fails, the lease is not released under it.
    assert election.no_publish_in_flight(None) is False

    slow_store.set_mode("blackhole")  # no renewal can land from now on
    valid_until = election.manager.state().valid_until
    assert valid_until is not None
    deadline = time.monotonic() + 2 * TTL
    while time.monotonic() < deadline:
        make_due(leader)
        started_at, started = lease_clock.now(), time.monotonic()
        leader.tick()
        took = time.monotonic() - started
        assert took < STORE_TIMEOUT + 0.4, f"a tick took {took:.2f} s"
        if sent(app):
            assert started_at < valid_until, "beat sent after its lease could have ended"
    assert election.token() is None


def test_a_slow_store_does_not_hold_the_takeover_past_the_store_timeout(
    redis_server, slow_store, beats
):
    """Reading the last sends at takeover from a slow store takes at most ``leader_store_timeout``.

    Nothing is sent before they were read.
    """
    app = make_app(f"redis://127.0.0.1:{slow_store.port}/0")
    leader = beats(app)
    election = lead(leader)
    make_due(leader)
    slow_store.slow_down(election)

    started = time.monotonic()
    leader.tick()  # the first tick as leader reads the last sends
    took = time.monotonic() - started

    assert took < STORE_TIMEOUT + 0.4, f"reading the last sends held beat's loop {took:.2f} s"
    assert election.seen_token is None, "the takeover went on without the last sends"
    assert sent(app) == []
