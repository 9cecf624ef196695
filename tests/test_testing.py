"""celery_leader.testing: forced leadership for eager runs, and a real in-process worker."""

from __future__ import annotations

import time
import uuid

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_leader import LeaderElection, LeaseLost, check_leadership, leader_only, lease_lost
from celery_leader.tasks.runtime import shared_lease
from celery_leader.testing import leadership, reset_memory_stores, start_leader_worker
from celery_leader.worker.coordinator import current_coordinator


def make_app() -> tuple[Celery, object, object]:
    app = Celery(f"t{uuid.uuid4().hex[:10]}", broker="memory://", backend="cache+memory://")
    app.conf.update(leader_backend_url="memory://", leader_lease_ttl=2.0)

    @leader_only
    @app.task(bind=True, name=f"{app.main}.token_of")
    def token_of(self):
        return self.request.leader_token, lease_lost()

    @leader_only
    @app.task(bind=True, name=f"{app.main}.must_lead")
    def must_lead(self):
        check_leadership()
        return "done"

    return app, token_of, must_lead


def test_eager_runs_hold_no_lease_by_default():
    """Without leadership(), an eager leader-only run has no token and never loses a lease."""
    _, token_of, _ = make_app()
    assert token_of.apply().get() == (None, False)


def test_leadership_gives_eager_runs_a_token_and_can_be_lost():
    """Inside leadership(token), eager runs see the token; lose() makes them see the loss."""
    _, token_of, must_lead = make_app()
    with leadership(token=7) as lead:
        assert token_of.apply().get() == (7, False)
        assert must_lead.apply().get() == "done"
        lead.lose()
        assert token_of.apply().get() == (7, True)
        with pytest.raises(LeaseLost):
            must_lead.apply().get()
        lead.regain()
        assert token_of.apply().get() == (8, False)
    assert token_of.apply().get() == (None, False), "leadership() restores the default"


def test_leadership_refuses_a_token_that_is_not_positive():
    """Tokens are positive, as real ones are."""
    with pytest.raises(ValueError, match="positive"), leadership(token=0):
        pass


def test_real_in_process_worker_on_the_memory_store_runs_leader_tasks():
    """start_worker + memory:// store: the worker leads and runs leader tasks with a token."""
    reset_memory_stores()
    app, token_of, _ = make_app()
    app.steps["worker"].add(LeaderElection)
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
        token, lost = token_of.delay().get(timeout=10)
    assert token > 0
    assert lost is False


def production_like_app() -> tuple[Celery, object]:
    """An app with its own lease store and the default lease ttl, on in-memory transports."""
    app = Celery(f"t{uuid.uuid4().hex[:10]}", broker="memory://", backend="cache+memory://")
    app.conf.leader_backend_url = "redis://example.invalid:6379/0"  # the project's own store

    @leader_only
    @app.task(bind=True, name=f"{app.main}.token_of")
    def token_of(self):
        return self.request.leader_token, lease_lost()

    return app, token_of


def assert_left_as_before(app: Celery) -> None:
    assert current_coordinator() is None
    assert shared_lease() is None
    assert app.conf.leader_backend_url == "redis://example.invalid:6379/0"
    assert LeaderElection not in app.steps["worker"]
    assert app.conf.broker_transport_options == {}


def test_start_leader_worker_leads_runs_leader_tasks_and_stops_in_well_under_a_second():
    """On entry the worker leads and takes leader tasks at once; its stop waits neither for
    the blocking loop's 2 s turns nor for the timer's sleep; the app and process are left
    as they were."""
    app, token_of = production_like_app()
    with start_leader_worker(app):
        coordinator = current_coordinator()
        assert coordinator is not None and coordinator.manager.is_leader()
        token = coordinator.manager.current_token()
        started = time.monotonic()
        assert token_of.delay().get(timeout=10, interval=0.01) == [token, False]
        assert time.monotonic() - started < 0.5, "the in-memory broker is polled often"
        stopping = time.monotonic()
    assert time.monotonic() - stopping < 1.0
    assert_left_as_before(app)


def test_start_leader_worker_stops_as_fast_and_cleans_up_when_the_block_raises():
    """An error in the block: the worker still stops in well under a second, nothing is left."""
    app, _ = production_like_app()
    stopping: list[float] = []

    def failing_test() -> None:
        with start_leader_worker(app):
            stopping.append(time.monotonic())
            raise AssertionError("the test failed")

    with pytest.raises(AssertionError, match="the test failed"):
        failing_test()
    assert time.monotonic() - stopping[0] < 1.0
    assert_left_as_before(app)


def test_start_leader_worker_with_celerys_ping_check_registers_the_ping_task():
    """perform_ping_check=True: Celery's check runs, its celery.ping task registered here."""
    app, token_of = production_like_app()
    with start_leader_worker(app, perform_ping_check=True):
        assert "celery.ping" in app.tasks
        assert token_of.delay().get(timeout=10)[0] > 0
    assert_left_as_before(app)
