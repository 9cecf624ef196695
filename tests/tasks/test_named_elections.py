"""Named elections on the task side: the decorator, routing, sending by name, settings.

Real Celery apps on kombu's in-memory transport, as in test_tasks.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_leader import ConfigurationError, LeaderTask, leader_only
from celery_leader.settings import ElectionChoice, load_app_settings
from celery_leader.tasks import leader_queue_for
from tests.tasks.test_tasks import _settle_leader_tasks, drain, new_app, routed_queue

__all__ = ["_settle_leader_tasks"]  # the autouse fixture, shared

pytestmark = pytest.mark.compat


def test_a_task_of_a_named_election_goes_to_that_elections_queue() -> None:
    app = new_app()

    @leader_only(election="billing")
    @app.task(name=f"{app.main}.settle")
    def settle() -> None:
        pass

    @leader_only
    @app.task(name=f"{app.main}.compact")
    def compact() -> None:
        pass

    assert settle.leader_election == "billing"
    assert compact.leader_election is None
    assert leader_queue_for(app, "billing") == f"{app.main}.billing.leader"
    assert routed_queue(app, settle.name) == f"{app.main}.billing.leader"
    assert routed_queue(app, compact.name) == f"{app.main}.leader"
    settle.delay()
    compact.delay()
    assert drain(app, f"{app.main}.billing.leader", expect=1) == [settle.name]
    assert drain(app, f"{app.main}.leader", expect=1) == [compact.name]


def test_a_lazy_shared_style_task_keeps_its_election_before_and_after_finalize() -> None:
    app = new_app()

    @leader_only(election="reports")
    @app.task(name=f"{app.main}.render", shared=False)
    def render() -> None:
        pass

    assert routed_queue(app, f"{app.main}.render") == f"{app.main}.reports.leader"
    app.finalize()
    assert app.tasks[f"{app.main}.render"].leader_election == "reports"


def test_a_leader_task_class_may_name_its_election() -> None:
    app = new_app()

    class Billing(LeaderTask):
        leader_election = "billing"

    @app.task(base=Billing, name=f"{app.main}.invoice")
    def invoice() -> None:
        pass

    invoice.delay()
    assert drain(app, f"{app.main}.billing.leader", expect=1) == [invoice.name]


@pytest.mark.parametrize("bad", ["", "a.b", "two words", "beat", 3])
def test_a_bad_election_name_is_refused_with_the_allowed_form(bad: Any) -> None:
    app = new_app()
    with pytest.raises(ConfigurationError, match=r"election") as refused:

        @leader_only(election=bad)
        @app.task(name=f"{app.main}.x")
        def x() -> None:
            pass

    message = str(refused.value)
    assert "reserved" in message if bad == "beat" else "letters, digits" in message


def test_sending_by_name_routes_each_pattern_to_its_election() -> None:
    """A process that does not import the tasks: ``leader_tasks`` maps patterns to elections."""
    app = new_app()
    app.conf.leader_tasks = {"billing.*": "billing", "jobs.compact": ""}
    from celery_leader.tasks import ensure_router

    ensure_router(app)
    assert routed_queue(app, "billing.settle") == f"{app.main}.billing.leader"
    assert routed_queue(app, "jobs.compact") == f"{app.main}.leader"
    assert routed_queue(app, "jobs.other") == app.conf.task_default_queue
    app.send_task("billing.settle")
    assert drain(app, f"{app.main}.billing.leader", expect=1) == ["billing.settle"]


def test_a_bad_leader_tasks_mapping_names_the_setting() -> None:
    with pytest.raises(ConfigurationError, match=r"leader_tasks\['x'\]='a b' is not allowed"):
        load_app_settings({"leader_backend_url": "redis://h", "leader_tasks": {"x": "a b"}})


def test_the_elections_a_worker_competes_in() -> None:
    conf = {
        "leader_backend_url": "redis://h",
        "leader_name": "app",
        "leader_elections": ["reports", "audit"],
        "leader_elections_exclude": ["audit"],
    }
    settings = load_app_settings(conf)
    assert settings.choice == ElectionChoice(("reports", "audit"), frozenset({"audit"}), True)
    assert settings.choice.elections(["billing", None, "billing"]) == (None, "billing", "reports")
    billing = settings.for_named("billing")
    assert (billing.name, billing.queue) == ("app.billing", "app.billing.leader")
    assert billing.timing == settings.worker.timing
    names = settings.names
    assert names.election_of_queue("app.billing.leader") == (True, "billing")
    assert names.election_of_queue("app.leader") == (True, None)
    assert names.election_of_queue("app.default") == (False, None)
    assert names.election_of_queue("other.billing.leader") == (False, None)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("leader_elections", ["ok", "not ok"], "leader_elections='not ok' is not allowed"),
        ("leader_elections_exclude", ["beat"], "'beat' is reserved"),
        ("leader_elections", 5, "leader_elections=5 is not allowed: it must be a list"),
        ("leader_balance", "yes", "leader_balance='yes' is not allowed: it must be True or False"),
    ],
)
def test_bad_election_settings_name_the_setting(key: str, value: Any, expected: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        load_app_settings({"leader_backend_url": "redis://h", key: value})
    assert expected in str(refused.value)


def test_a_worker_refuses_too_many_elections_and_a_name_clash() -> None:
    from celery_leader.elections.shared_lease import MAX_ELECTIONS
    from celery_leader.worker.bootsteps import WorkerConfigurationError, _check_elections

    _check_elections((None, "a", "b"), "app")
    many = (None, *(f"e{i}" for i in range(MAX_ELECTIONS)))
    with pytest.raises(WorkerConfigurationError, match="at most 128: leave some out"):
        _check_elections(many, "app")
    with pytest.raises(WorkerConfigurationError, match="'app' has the name of leader_name"):
        _check_elections((None, "app"), "app")


def test_install_keeps_the_elections_of_leader_tasks() -> None:
    """install(app, tasks=[...]) adds names without flattening a {pattern: election} mapping."""
    from celery_leader import install

    app = new_app(leader_tasks={"billing.*": "billing"})
    install(app, tasks=["jobs.compact", "billing.*"])
    assert app.conf.leader_tasks == {"billing.*": "billing", "jobs.compact": ""}
    assert routed_queue(app, "billing.settle") == f"{app.main}.billing.leader"
    assert routed_queue(app, "jobs.compact") == f"{app.main}.leader"
    plain = new_app(leader_tasks=["a"])
    install(plain, tasks=["b", "a"])
    assert plain.conf.leader_tasks == ["a", "b"], "the list form stays a list"
