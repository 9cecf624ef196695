"""celery_leader.testing: forced leadership for eager runs, and a real in-process worker."""

from __future__ import annotations

import uuid

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_leader import LeaderElection, LeaseLost, check_leadership, leader_only, lease_lost
from celery_leader.testing import leadership, reset_memory_stores


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
