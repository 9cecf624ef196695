"""django-celery-beat under LeaderScheduler, in process: what the takeover reads and writes.

Real Django on a SQLite file, django-celery-beat's DatabaseScheduler wrapped
by LeaderScheduler, the beat lease in a real redis-server, messages on
kombu's in-memory transport. The failover itself, with real beat processes,
is in tests/integration/test_django_beat.py.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid

import pytest
from celery import Celery

from celery_leader.stores import open_store
from celery_leader.stores.base import Holder


@pytest.fixture(scope="module")
def django_db(tmp_path_factory):
    """Django configured once for this process, with django-celery-beat's tables."""
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            SECRET_KEY="celery-leader-tests-only",
            INSTALLED_APPS=["django_celery_beat"],
            DATABASES={
                "default": {
                    "ENGINE": "django.db.backends.sqlite3",
                    "NAME": str(tmp_path_factory.mktemp("django") / "beat.sqlite3"),
                }
            },
            USE_TZ=True,
            TIME_ZONE="UTC",
            DEFAULT_AUTO_FIELD="django.db.models.AutoField",
        )
        django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


@pytest.fixture
def beat_app(django_db, redis_server):
    main = f"d{uuid.uuid4().hex[:8]}"
    app = Celery(main, broker="memory://")
    app.conf.update(
        leader_backend_url=redis_server.url,
        leader_lease_ttl=2.0,
        task_default_queue=f"{main}.q",
        leader_beat_scheduler="django_celery_beat.schedulers:DatabaseScheduler",
        beat_schedule={},
    )
    app.set_current()
    return app


def entry(app, name: str, every: float, **fields):
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    interval, _ = IntervalSchedule.objects.get_or_create(
        every=every, period=IntervalSchedule.SECONDS
    )
    return PeriodicTask.objects.create(
        name=f"{app.main}-{name}", task="x.tick", interval=interval, queue=f"{app.main}.q", **fields
    )


def seed_marks(app, redis_url: str, marks: dict[str, float]) -> None:
    """Record, as an earlier leader would have, when each entry was last sent."""
    election = f"{app.main}.beat"
    store = open_store(redis_url, timeout=5)
    holder = Holder.for_this_process("earlier-beat")
    assert store.acquire(election, holder, 5.0).acquired
    for name, at in marks.items():
        assert store.set_state(election, holder.lease_id, name, json.dumps({"at": at, "token": 1}))
    assert store.release(election, holder.lease_id)
    store.close()


def leader(app, timeout: float = 10):
    """A LeaderScheduler that ticks until it leads (a beat that does not tick is not live)."""
    from celery_leader.beat import LeaderScheduler

    sched = LeaderScheduler(app=app, lazy=False)
    deadline = time.monotonic() + timeout
    while sched._election().leading() is None and time.monotonic() < deadline:
        time.sleep(max(0.0, min(sched.tick() or 0.01, 0.1)))
    assert sched._election().leading() is not None, "it leads"
    return sched


def sent(app) -> list[str]:
    names = []
    with app.connection_for_read() as conn:
        queue = conn.SimpleQueue(f"{app.main}.q")
        while True:
            try:
                message = queue.get(timeout=0.1)
            except queue.Empty:
                break
            names.append(message.headers.get("periodic_task_name"))
            message.ack()
        queue.close()
    return names


def tick_for(sched, seconds: float) -> None:
    """Beat's own loop: tick, sleep, save when due."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        interval = sched.tick()
        time.sleep(max(0.0, min(interval or 0.01, 0.2)))
        if sched.should_sync():
            sched._do_sync()


def test_a_mark_from_before_the_entry_was_re_enabled_is_ignored(beat_app, redis_server):
    """Disabled, then re-enabled in the admin: it counts from then, as without a leader."""
    from django_celery_beat.models import PeriodicTask

    row = entry(beat_app, "tick", 60)
    seed_marks(beat_app, redis_server.url, {row.name: time.time() - 600})
    row.enabled = False
    row.save()  # django-celery-beat clears last_run_at
    row = PeriodicTask.objects.get(pk=row.pk)
    row.enabled = True
    row.save()
    sched = leader(beat_app)
    try:
        tick_for(sched, 2)
        assert sent(beat_app) == [], "a 60 s entry re-enabled just now is not due"
    finally:
        sched.close()


def test_a_former_leader_does_not_write_older_runs_over_the_new_leaders(beat_app, redis_server):
    """A leader that lost the lease drops its unsaved runs instead of saving them later."""
    from django_celery_beat.models import PeriodicTask

    row = entry(beat_app, "tick", 1)
    first = leader(beat_app)
    second = None
    try:
        tick_for(first, 2.5)
        assert sent(beat_app), "the first leader sends"
        first._election().manager.step_down(sit_out=60)  # it runs on, as a standby
        second = leader(beat_app)
        tick_for(second, 2.5)
        second.sync()
        saved = PeriodicTask.objects.get(pk=row.pk).last_run_at
        first._last_sync = None  # its periodic save comes due now
        tick_for(first, 0.5)
        assert PeriodicTask.objects.get(pk=row.pk).last_run_at >= saved
    finally:
        first.close()
        if second is not None:
            second.close()


def test_taking_over_thousands_of_entries_keeps_the_lease(beat_app, redis_server):
    """Thousands of entries the table says ran an hour ago, the marks a minute ago.

    The takeover reads the table in a few queries and saves the re-anchored
    rows in a few bulk updates: beat's loop keeps turning and keeps the lease.
    """
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    count = 2000
    interval, _ = IntervalSchedule.objects.get_or_create(
        every=3600, period=IntervalSchedule.SECONDS
    )
    hour_ago = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1)
    names = [f"{beat_app.main}-e{i}" for i in range(count)]
    PeriodicTask.objects.bulk_create(
        [
            PeriodicTask(
                name=name,
                task="x.t",
                interval=interval,
                queue=f"{beat_app.main}.q",
                last_run_at=hour_ago,
            )
            for name in names
        ]
    )
    minute_ago = time.time() - 60
    seed_marks(beat_app, redis_server.url, dict.fromkeys(names, minute_ago))
    started = time.monotonic()
    sched = leader(beat_app)
    took = time.monotonic() - started
    try:
        election = sched._election()
        tick_for(sched, 2 * 2.0)
        assert election.leading() is not None, f"still leads ({took:.2f} s to take over)"
        assert sent(beat_app) == [], "every entry was sent a minute ago, hourly"
        saved = PeriodicTask.objects.filter(name__in=names).values_list("last_run_at", flat=True)
        assert {round(when.timestamp()) for when in saved} == {round(minute_ago)}
    finally:
        sched.close()


def test_a_row_added_later_has_its_beat_series_at_zero_before_it_is_due(beat_app, redis_server):
    """The rows loaded at start, and a row added while beat runs (django-celery-beat loads
    it when the table changed), have their send and skip series at 0 before any send."""
    from prometheus_client import REGISTRY

    beat_app.conf.leader_metrics = True
    election = f"{beat_app.main}.beat"

    def series(row) -> list[float | None]:  # type: ignore[no-untyped-def]
        labels = {"election": election, "entry": row.name}
        return [
            REGISTRY.get_sample_value("celery_leader_beat_sends_total", labels),
            REGISTRY.get_sample_value("celery_leader_beat_late_sends_total", labels),
            *(
                REGISTRY.get_sample_value(
                    "celery_leader_beat_slots_skipped_total", {**labels, "reason": reason}
                )
                for reason in ("paused", "window")
            ),
        ]

    first = entry(beat_app, "first", 60)
    sched = leader(beat_app)
    try:
        assert series(first) == [0, 0, 0, 0]
        second = entry(beat_app, "second", 60)
        assert series(second) == [None] * 4
        tick_for(sched, 1.5)
        assert series(second) == [0, 0, 0, 0]
        assert sent(beat_app) == [], "neither is due: both count from now"
    finally:
        sched.close()
