# test_shop.py
import pytest
from shop import settle, sweep

from celery_leader import LeaseLost


def test_settle_runs_under_the_lease_token(leader_lease):
    assert settle.apply(args=("2026-11-25",)).get()["token"] == leader_lease.token


@pytest.mark.parametrize("leader_lease_token", [42])
def test_a_chosen_token_reaches_the_task(leader_lease):
    assert settle.apply(args=("2026-11-25",)).get()["token"] == 42


def test_sweep_stops_once_the_lease_is_lost(lost_leader_lease):
    assert settle.apply(args=("2026-11-25",)).get()["lost"] is True
    with pytest.raises(LeaseLost):
        sweep.apply().get()


def test_settle_runs_on_a_worker_that_leads(leader_worker):
    result = settle.delay("2026-11-25").get(timeout=10)
    assert result["token"] > 0
    assert result["lost"] is False
