"""LeaderScheduler in-process: missed-slot policy, slot de-duplication, token header.

A real Celery beat scheduler (PersistentScheduler, wrapped) on kombu's
in-memory transport, with its lease in a real redis-server.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery
from celery.schedules import schedule

from celery_leader.beat import TOKEN_HEADER, LeaderScheduler, LeaderSchedulerMixin
from celery_leader.beat.controls import (
    RAN_PREFIX,
    control_slot,
    pause_value,
    resume_value,
    run_value,
)
from celery_leader.beat.occurrence import OCCURRENCE_HEADER
from celery_leader.beat.steering import CONTROL_POLL
from celery_leader.elections.liveness import PUBLISHING
from celery_leader.stores import open_store
from celery_leader.stores.base import Holder


def make_app(redis_url: str, every: float = 1.0, **conf) -> Celery:
    main = f"b{uuid.uuid4().hex[:10]}"
    app = Celery(main, broker="memory://")
    app.conf.update(
        leader_backend_url=redis_url,
        leader_lease_ttl=1.0,
        task_default_queue=f"{main}.default",
        beat_schedule={"tick": {"task": f"{main}.tick", "schedule": every}},
        **conf,
    )
    return app


def seed_mark(redis_url: str, election: str, seconds_ago: float) -> None:
    """Record, as an earlier leader would, that "tick" was sent *seconds_ago*."""
    store = open_store(redis_url, timeout=1)
    holder = Holder.for_this_process("earlier-beat")
    assert store.acquire(election, holder, 1.0).acquired
    mark = {"at": time.time() - seconds_ago, "token": 1}
    assert store.set_state(election, holder.lease_id, "tick", json.dumps(mark))
    assert store.release(election, holder.lease_id)
    store.close()


def take_over(sched) -> None:
    """What beat's first tick as leader does before it may send: read the last sends, anchor."""
    election = sched._election()
    token = election.token()
    assert token is not None and sched._on_elected(token)
    election.seen_token = token


def sent(app: Celery) -> list[dict]:
    queue_name = app.conf.task_default_queue
    with app.connection_for_read() as conn:
        queue = conn.SimpleQueue(queue_name)
        messages = []
        while True:
            try:
                message = queue.get(timeout=0.2)
            except queue.Empty:
                break
            messages.append(message.headers)
            message.ack()
        queue.close()
    return messages


@pytest.fixture
def scheduler(tmp_path, redis_server):
    made = []

    def make(policy: str = "once", seconds_ago: float | None = None, **conf):
        app = make_app(redis_server.url, leader_beat_missed_default=policy, **conf)
        election = f"{app.main}.beat"
        if seconds_ago is not None:
            seed_mark(redis_server.url, election, seconds_ago)
        sched = LeaderScheduler(app=app, schedule_filename=str(tmp_path / app.main), lazy=False)
        made.append(sched)
        assert sched._election().manager.wait_for_leadership(5)
        return app, sched

    yield make
    for sched in made:
        sched.close()


def test_wraps_the_configured_scheduler(scheduler):
    """LeaderScheduler builds the wrapped class (PersistentScheduler by default), led."""
    _, sched = scheduler()
    assert isinstance(sched, LeaderSchedulerMixin)
    mixin, wrapped = type(sched).__bases__
    assert (mixin, wrapped.__name__) == (LeaderSchedulerMixin, "PersistentScheduler")
    assert type(sched)._leader_wrapped() is wrapped


def test_missed_slot_is_sent_once_on_takeover(scheduler):
    """Policy "once": a slot missed in the gap is sent once when this beat starts leading."""
    app, sched = scheduler("once", seconds_ago=5)
    sched.tick()
    messages = sent(app)
    assert len(messages) == 1
    assert messages[0][TOKEN_HEADER] == sched._election().token()
    caught_up = time.time()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and not (messages := sent(app)):
        time.sleep(sched.tick() or 0.01)
    assert len(messages) == 1, "the next regular send follows one period after the catch-up"
    assert 0.7 < time.time() - caught_up < 1.9


def test_missed_slot_is_skipped_by_policy(scheduler):
    """Policy "skip": nothing is sent for the missed slots."""
    app, sched = scheduler("skip", seconds_ago=5)
    sched.tick()
    assert sent(app) == []


def beat_series(election: str, entry: str) -> list[float | None]:
    """Sends, late sends and slots skipped by each reason, of *entry*, in the default registry."""
    from prometheus_client import REGISTRY

    labels = {"election": election, "entry": entry}
    return [
        REGISTRY.get_sample_value("celery_leader_beat_sends_total", labels),
        REGISTRY.get_sample_value("celery_leader_beat_late_sends_total", labels),
        REGISTRY.get_sample_value(
            "celery_leader_beat_slots_skipped_total", {**labels, "reason": "paused"}
        ),
        REGISTRY.get_sample_value(
            "celery_leader_beat_slots_skipped_total", {**labels, "reason": "window"}
        ),
    ]


def test_each_entry_has_its_beat_series_at_zero_before_its_first_send_also_one_added_later(
    scheduler,
):
    """From the first tick each entry's series exist, at 0 for an entry not sent yet; an
    entry the schedule gains later has them from the next tick; sends count on from 0."""
    app, sched = scheduler("once", leader_metrics=True)
    election = sched._election().settings.name
    hourly = {"task": f"{app.main}.tick", "schedule": 3600.0}
    sched.update_from_dict({"hourly": hourly})
    sched.tick()
    assert beat_series(election, "hourly") == [0, 0, 0, 0]
    sched.update_from_dict({"later": hourly})
    sched.tick()
    assert beat_series(election, "later") == [0, 0, 0, 0]
    _tick_for(sched, 1.5)
    sends = len([m for m in sent(app) if m["task"] == f"{app.main}.tick"])
    assert sends >= 1, "the 1 s entry was sent"
    assert beat_series(election, "tick")[0] == sends
    assert beat_series(election, "hourly") == beat_series(election, "later") == [0, 0, 0, 0]


@pytest.mark.parametrize(("window", "expected"), [(30, 1), (3, 0)])
def test_missed_slot_is_sent_only_within_its_catch_up_window(scheduler, window, expected):
    """A window in seconds: a 10 s entry last sent 25 s ago missed slots 15 s and 5 s ago;
    the latest (5 s old) is sent under a 30 s window, skipped under a 3 s one."""
    app, sched = scheduler(window, seconds_ago=25, every=10.0)
    sched.tick()
    messages = sent(app)
    assert len(messages) == expected, messages
    if expected == 0:
        # Counted from now: the next send is a whole period away, not at once.
        next_due = sched.schedule["tick"].is_due()[1]
        assert next_due > 5, next_due


def test_window_is_per_entry_over_the_default(scheduler):
    """leader_beat_missed names the entry: its window wins over the default policy."""
    app, sched = scheduler("once", seconds_ago=25, every=10.0, leader_beat_missed={"tick": 1})
    sched.tick()
    assert sent(app) == []


def test_slot_sent_by_the_previous_leader_is_not_sent_again(scheduler):
    """A slot the previous leader sent 0.3 s ago is not sent again, though due locally.

    The entry runs every 30 s, so that the previous leader's send stays within the
    period however slowly this beat starts (with a 1 s period a loaded machine's start
    made the next slot really due, and its send correct)."""
    app, sched = scheduler("once", seconds_ago=0.3, every=30.0)
    sched.tick()  # takes the lead: reads the previous leader's last sends
    assert sent(app) == [], "a slot sent 0.3 s ago was not missed"
    entry = sched.schedule["tick"]
    entry.last_run_at = datetime.now(timezone.utc) - timedelta(seconds=31)
    sched.apply_entry(entry, producer=sched.producer)
    assert sent(app) == []
    anchored = sched.schedule["tick"].last_run_at.timestamp()
    mark = sched._election().marks["tick"]["at"]
    assert abs(anchored - mark) < 0.001, "the schedule counts from that send"


def test_due_entry_is_sent_with_the_token_and_recorded(scheduler, redis_server):
    """A due send carries the beat token header and is recorded as the entry's last send."""
    app, sched = scheduler("once", seconds_ago=None)
    take_over(sched)
    entry = sched.schedule["tick"]
    sched.apply_entry(entry, producer=sched.producer)
    messages = sent(app)
    token = sched._election().token()
    assert [m[TOKEN_HEADER] for m in messages] == [token]
    state = open_store(redis_server.url, timeout=1).get_state(f"{app.main}.beat")
    assert json.loads(state["tick"])["token"] == token


def test_standby_sends_nothing(scheduler, redis_server):
    """A beat that does not hold the lease sends nothing, even for a due entry."""
    app, leader = scheduler("once")
    standby = LeaderScheduler(
        app=app, schedule_filename=leader.schedule_filename + "-2", lazy=False
    )
    try:
        time.sleep(0.3)
        assert standby._election().token() is None
        entry = standby.schedule["tick"]
        entry.last_run_at = datetime.now(timezone.utc) - timedelta(seconds=2)
        standby.apply_entry(entry, producer=standby.producer)
        assert sent(app) == []
    finally:
        standby.close()


def test_bad_standby_mode_is_refused(redis_server, tmp_path):
    """leader_beat_standby outside auto/reserve/idle stops beat with a clear message."""
    from celery.exceptions import ImproperlyConfigured

    app = make_app(redis_server.url, leader_beat_standby="sometimes")
    with pytest.raises(ImproperlyConfigured, match="leader_beat_standby='sometimes'"):
        LeaderScheduler(app=app, schedule_filename=str(tmp_path / "s"), lazy=True)


def test_new_leader_carries_on_from_the_previous_leaders_last_send(scheduler):
    """On taking over, an entry's schedule counts from the previous leader's last send."""
    _, sched = scheduler("once", seconds_ago=0.4)
    sched.tick()
    mark = sched._election().marks["tick"]["at"]
    assert abs(sched.schedule["tick"].last_run_at.timestamp() - mark) < 0.001


def test_failed_publish_leaves_the_slot_unmarked_and_gives_up_the_lease(tmp_path, redis_server):
    """A publish that fails is not marked sent, and a beat that cannot publish hands over."""
    from harness.servers import free_port

    main = f"b{uuid.uuid4().hex[:10]}"
    app = Celery(main, broker=f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    app.conf.update(
        leader_backend_url=redis_server.url,
        leader_lease_ttl=1.0,
        task_default_queue=f"{main}.default",
        task_publish_retry=False,
        broker_connection_retry=False,
        broker_connection_max_retries=0,
        beat_schedule={"tick": {"task": f"{main}.tick", "schedule": 1.0}},
    )
    sched = LeaderScheduler(app=app, schedule_filename=str(tmp_path / main), lazy=False)
    try:
        election = sched._election()
        assert election.manager.wait_for_leadership(5)
        token = election.token()
        take_over(sched)
        entry = sched.schedule["tick"]
        entry.last_run_at = datetime.now(timezone.utc) - timedelta(seconds=2)
        sched.apply_entry(entry)  # Celery logs the failed publish and carries on
        store = open_store(redis_server.url, timeout=1)
        assert "tick" not in store.get_state(f"{main}.beat"), "a failed send is not marked"
        assert not election.is_live()
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and store.read(f"{main}.beat") is not None:
            time.sleep(0.05)
        assert store.read(f"{main}.beat") is None, "the beat that cannot publish released"
        assert election.token() is None
        time.sleep(0.5)
        record = store.read(f"{main}.beat")
        assert record is None or record.token != token, "it does not take the lease back"
        store.close()
    finally:
        sched.close()


def test_a_publish_in_flight_keeps_beat_live_for_one_ttl_and_its_lease_unreleased(scheduler):
    """A slow publish does not cost the lease mid-send, and no release happens while it may land."""
    _, sched = scheduler()
    election = sched._election()
    ttl = election.settings.timing.ttl
    election.loop.last_tick -= 3600  # beat's loop has not ticked: it is inside a publish
    assert not election.is_live()
    election.publishing()
    assert election.is_live()
    assert election.no_publish_in_flight(None) is False
    election.loop.waits[PUBLISHING] -= 2 * ttl  # blocked for longer than a ttl: hand over
    assert not election.is_live()
    assert election.no_publish_in_flight(None) is False, "but never release mid-send"
    election.published(ok=True)
    assert election.no_publish_in_flight(None) is True


@pytest.mark.compat
def test_a_daily_crontab_sent_today_is_not_due_again_after_takeover(tmp_path, redis_server):
    """Outside UTC, the takeover hands the schedule its own zone's time.

    Celery before 5.7 matches crontab fields in whatever zone the last run is
    given in: an anchor in UTC would make a daily entry, sent minutes ago in
    Europe/Berlin, due again within hours.
    """
    from zoneinfo import ZoneInfo

    from celery.schedules import crontab

    zone = "Europe/Berlin"
    slot = (datetime.now(ZoneInfo(zone)) - timedelta(minutes=2)).replace(second=0, microsecond=0)
    main = f"b{uuid.uuid4().hex[:10]}"
    app = Celery(main, broker="memory://")
    app.conf.update(
        timezone=zone,
        leader_backend_url=redis_server.url,
        leader_lease_ttl=1.0,
        task_default_queue=f"{main}.default",
        beat_schedule={
            "daily": {
                "task": f"{main}.daily",
                "schedule": crontab(minute=slot.minute, hour=slot.hour),
            }
        },
    )
    store = open_store(redis_server.url, timeout=1)
    holder = Holder.for_this_process("earlier-beat")
    assert store.acquire(f"{main}.beat", holder, 1.0).acquired
    mark = json.dumps({"at": slot.timestamp(), "token": 1})
    assert store.set_state(f"{main}.beat", holder.lease_id, "daily", mark)
    assert store.release(f"{main}.beat", holder.lease_id)
    store.close()
    sched = LeaderScheduler(app=app, schedule_filename=str(tmp_path / main), lazy=False)
    try:
        assert sched._election().manager.wait_for_leadership(5)
        sched.tick()
        assert sent(app) == []
        due, next_in = sched.schedule["daily"].is_due()
        assert not due
        assert next_in > 12 * 3600, f"due again in {next_in / 3600:.1f} h"
    finally:
        sched.close()


def _pause(redis_url: str, election: str, value: str) -> None:
    """Write a pause into the control slot, as ``celery leader schedule pause`` does."""
    store = open_store(redis_url, timeout=1)
    holder = Holder.for_this_process("ops")
    slot = control_slot(election)
    try:
        assert store.acquire(slot, holder, 1.0).acquired
        assert store.set_state(slot, holder.lease_id, "pause:tick", value)
        store.release(slot, holder.lease_id)
    finally:
        store.close()


def _tick_for(sched, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(max(0.0, min(sched.tick() or 0.01, 0.1)))


def test_pause_skips_slots_resume_sends_on_and_metrics_count_both(scheduler, redis_server):
    """Paused: due slots are consumed unsent (counted as skipped, reason paused); resumed:
    the next slot is sent, not the missed ones; sends are counted per entry."""
    from prometheus_client import REGISTRY

    app, sched = scheduler("once", leader_metrics=True)
    election = sched._election().settings.name
    labels = {"election": election, "entry": "tick"}
    _tick_for(sched, 1.5)
    assert sent(app), "the entry is sent while not paused"
    assert REGISTRY.get_sample_value("celery_leader_beat_sends_total", labels) >= 1

    _pause(redis_server.url, election, pause_value(None, "ops"))
    _tick_for(sched, CONTROL_POLL + 0.6)  # read within a poll, then one tick
    sent(app)
    _tick_for(sched, 2.5)
    assert sent(app) == [], "a paused entry is not sent"
    skipped = {**labels, "reason": "paused"}
    assert REGISTRY.get_sample_value("celery_leader_beat_slots_skipped_total", skipped) >= 2

    _pause(redis_server.url, election, resume_value("ops"))
    _tick_for(sched, CONTROL_POLL + 1.6)
    resumed = sent(app)
    assert 1 <= len(resumed) <= 2, "resumed: the next due slots only, no burst"


@pytest.mark.parametrize(("window", "expected"), [(30, 1), (3, 0)])
def test_catch_up_window_applies_to_redbeats_own_record(tmp_path, redis_server, window, expected):
    """RedBeat keeps its last runs itself (no send marks): the window is judged on those."""
    from redbeat.schedulers import RedBeatSchedulerEntry

    app = make_app(
        redis_server.url,
        every=10.0,
        leader_beat_scheduler="redbeat.RedBeatScheduler",
        leader_beat_missed_default=window,
        redbeat_redis_url=redis_server.url,
    )
    app.conf.redbeat_key_prefix = f"redbeat-{app.main}:"
    # An earlier leader ran it 25 s ago: slots 15 s and 5 s ago were missed.
    entry = RedBeatSchedulerEntry("tick", f"{app.main}.tick", schedule(10.0), app=app).save()
    entry.reschedule(last_run_at=datetime.now(timezone.utc) - timedelta(seconds=25))
    sched = LeaderScheduler(app=app, lazy=False)
    try:
        assert sched._election().manager.wait_for_leadership(5)
        sched.tick()
        sched.tick()
        assert len(sent(app)) == expected
    finally:
        sched.close()


def test_run_now_is_sent_once_and_recorded_before_the_send_is_over(scheduler, redis_server):
    """A run-now request: one send with a manual occurrence, its record in beat's state as
    the send returns (under the publish guard: a release right after cannot lose it), and
    no second send for the same request."""
    app, sched = scheduler("once")
    election = sched._election()
    _tick_for(sched, 1.2)
    sent(app)
    store = open_store(redis_server.url, timeout=1)
    holder = Holder.for_this_process("ops")
    slot = control_slot(election.settings.name)
    at = time.time()
    try:
        assert store.acquire(slot, holder, 1.0).acquired
        value = run_value("req-1", at, at + 10, "ops")
        assert store.set_state(slot, holder.lease_id, "run:tick", value)
        store.release(slot, holder.lease_id)
        deadline = time.monotonic() + 3
        manual: list[dict] = []
        while not manual and time.monotonic() < deadline:
            sched.tick()
            manual = [m for m in sent(app) if "@manual:" in m.get(OCCURRENCE_HEADER, "")]
            time.sleep(0.05)
        assert len(manual) == 1, "sent once"
        record = json.loads(store.get_state(election.settings.name)[f"{RAN_PREFIX}tick"])
        assert record["id"] == "req-1" and record["occurrence"] == manual[0][OCCURRENCE_HEADER]
        _tick_for(sched, 1.5)
        assert not [m for m in sent(app) if "@manual:" in m.get(OCCURRENCE_HEADER, "")]
    finally:
        store.close()


@pytest.mark.parametrize("mode", ["idle", "reserve"])
def test_a_standby_wakes_as_soon_as_it_is_elected(scheduler, monkeypatch, mode):
    """A standby sleeps in its tick, on its election: the leader's release ends that sleep at
    once, not at the end of the standby's tick (made 5 s here), so the first send can follow."""
    import threading

    from celery_leader.beat import scheduler as scheduler_module

    monkeypatch.setattr(scheduler_module, "STANDBY_TICK", 5.0)
    app, leader = scheduler("once", leader_beat_standby=mode)
    standby = LeaderScheduler(
        app=app, schedule_filename=leader.schedule_filename + "-2", lazy=False
    )
    try:
        assert standby._election().token() is None  # it competes from its start: a standby
        returned: list[float] = []
        took: list[float] = []

        def tick() -> None:
            started = time.monotonic()
            returned.append(standby.tick())
            took.append(time.monotonic() - started)

        ticking = threading.Thread(target=tick)
        ticking.start()
        _tick_for(leader, 0.5)  # the leader's loop runs (a leader whose loop stalls steps down)
        assert not took, "the standby's tick returned before anything happened"
        leader.close()  # releases: the standby acquires at once (it hears the release)
        ticking.join(10)
        assert took, "the standby's tick did not return"
        assert returned == [0.0], "an elected standby's tick asks beat's loop to tick again now"
        assert took[0] < 3.0, f"the standby slept {took[0]:.2f} s of its 5 s tick"
        assert standby._election().token() is not None
    finally:
        standby.close()


def test_a_standby_with_an_entry_overdue_does_not_sleep():
    """The wrapped scheduler's interval may be zero or negative (an entry overdue): the
    standby's sleep is then none at all, as Celery's loop would take it."""
    from celery_leader.beat.scheduler import _standby_sleep

    class NeverElected:
        def wait_for_election(self, timeout: float) -> bool:
            raise AssertionError(f"waited {timeout} s for an entry already due")

    assert _standby_sleep(NeverElected(), -0.5) == -0.5  # type: ignore[arg-type]
    assert _standby_sleep(NeverElected(), 0.0) == 0.0  # type: ignore[arg-type]
