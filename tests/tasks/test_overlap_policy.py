"""``@leader_only(overlap=..., overlap_key=...)``: its checks at decoration and its keys."""

from __future__ import annotations

import pytest
from celery import Celery

from celery_leader import leader_only
from celery_leader.exceptions import ConfigurationError
from celery_leader.tasks.overlap import Overlap, OverlapKeyError, overlap_key
from celery_leader.worker.overlap import RUN, SKIP, WAIT, Overlaps


@pytest.fixture
def app():
    return Celery("overlap-test", set_as_current=False)


def test_the_key_binds_positional_and_keyword_arguments_alike_with_defaults(app):
    @leader_only(overlap="skip", overlap_key=["account_id", "region"])
    @app.task(bind=True, shared=False)
    def sync(self, account_id, region="eu", force=False):
        return account_id

    task = app.tasks[sync.name]
    by_position = overlap_key(task, ("account_id", "region"), (7,), {})
    by_keyword = overlap_key(task, ("account_id", "region"), (), {"account_id": 7, "force": True})
    assert by_position == by_keyword == f'{sync.name}[7,"eu"]'
    assert overlap_key(task, ("account_id", "region"), (8, "us"), {}) == f'{sync.name}[8,"us"]'
    assert overlap_key(task, None, (1,), {}) == sync.name
    assert overlap_key(task, ("account_id",), (), {"nope": 1}) is None, "does not bind: run it"


def test_a_value_without_a_json_form_is_a_clear_error(app):
    @leader_only(overlap="skip", overlap_key=["account"])
    @app.task(shared=False)
    def sync(account):
        return account

    with pytest.raises(OverlapKeyError, match=r"'account'.*object.*JSON"):
        overlap_key(app.tasks[sync.name], ("account",), (object(),), {})


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"overlap": "never"}, "'allow', 'skip', 'buffer_one'"),
        ({"overlap_key": ["a"]}, "needs overlap='skip' or overlap='buffer_one'"),
        ({"overlap": "skip", "acks_late": False}, "needs acks_late"),
        ({"overlap": "skip", "overlap_key": "a"}, "give a list of argument names"),
        ({"overlap": "skip", "overlap_key": ["b"]}, "names ['b'], which the task does not take"),
    ],
)
def test_bad_options_are_refused_at_decoration(app, options, fragment):
    with pytest.raises(ConfigurationError) as caught:

        @leader_only(**options)
        @app.task(shared=False)
        def job(a):
            return a

    assert fragment in str(caught.value)


def test_the_task_carries_its_policy_and_key_names(app):
    @leader_only(overlap="buffer_one", overlap_key=("a",))
    @app.task(shared=False)
    def job(a):
        return a

    task = app.tasks[job.name]
    assert (task.leader_overlap, task.leader_overlap_key, task.acks_late) == (
        "buffer_one",
        ("a",),
        True,
    )


class FakeRequest:
    """A request as the record sees it (pure logic: its task id, parent and key)."""

    count = 0

    def __init__(self, id: str | None = None, parent_id: str | None = None) -> None:
        FakeRequest.count += 1
        self.id = id or f"task-{FakeRequest.count}"
        self.parent_id = parent_id
        self.leader_overlap_key: str | None = "k"


def test_the_record_runs_one_per_key_lets_one_wait_and_releases_it_when_the_run_settles():
    record = Overlaps()
    first, second, third = FakeRequest(), FakeRequest(), FakeRequest()
    assert record.admit(first, "k", Overlap.BUFFER_ONE) == RUN
    assert record.admit(second, "k", Overlap.BUFFER_ONE) == WAIT
    assert record.admit(third, "k", Overlap.BUFFER_ONE) == SKIP
    assert record.settle(first) == [second]
    assert record.settle(first) == [], "settling twice releases nothing more"
    assert record.admit(second, "k", Overlap.BUFFER_ONE) == RUN
    assert record.admit(FakeRequest(), "other", Overlap.SKIP) == RUN, "another key is not held"


def test_what_the_run_itself_sent_waits_under_skip_too_and_is_never_skipped():
    """A retry (the run's id), a chain's next step or a callback (the run's id as parent):
    skipping one would lose it."""
    record = Overlaps()
    run = FakeRequest()
    assert record.admit(run, "k", Overlap.SKIP) == RUN
    retry = FakeRequest(id=run.id)
    follow_up = FakeRequest(parent_id=run.id)
    stranger = FakeRequest()
    assert record.admit(retry, "k", Overlap.SKIP) == WAIT
    assert record.admit(follow_up, "k", Overlap.SKIP) == WAIT
    assert record.admit(stranger, "k", Overlap.SKIP) == SKIP
    assert record.settle(run) == [retry, follow_up]


def test_a_run_the_worker_forgot_holds_nothing_and_a_reconnect_forgets_the_waiting():
    import gc

    record = Overlaps()
    run = FakeRequest()
    assert record.admit(run, "k", Overlap.BUFFER_ONE) == RUN
    assert record.admit(FakeRequest(), "k", Overlap.BUFFER_ONE) == WAIT
    record.forget_waiting()  # the broker gives the waiting message back on a reconnect
    assert record.settle(run) == []
    again = FakeRequest()
    assert record.admit(again, "k", Overlap.BUFFER_ONE) == RUN
    del again
    gc.collect()
    assert record.admit(FakeRequest(), "k", Overlap.SKIP) == RUN, "no record outlives its run"


def test_a_retry_keeps_the_runs_occurrence_header() -> None:
    """Celery keeps Context's own names out of a retry's headers; leader_occurrence is one
    (so that self.request.leader_occurrence exists everywhere): it is carried on by hand."""
    from celery import Celery
    from celery.app.task import Context

    from celery_leader import leader_only

    app = Celery("retry-occurrence", broker="memory://", set_as_current=False)

    @leader_only
    @app.task(bind=True)
    def nightly(self):  # type: ignore[no-untyped-def]
        return None

    occurrence = "nightly@2026-11-25T09:30:00.000Z"
    request = Context(
        {
            "id": "abc",
            "args": (),
            "kwargs": {},
            "leader_occurrence": occurrence,
            "headers": {"custom": "kept"},
            "delivery_info": {"exchange": "", "routing_key": "q"},
        }
    )
    headers = nightly.signature_from_request(request).options["headers"]
    assert headers["leader_occurrence"] == occurrence
    assert headers["custom"] == "kept"
    plain = Context({"id": "def", "args": (), "kwargs": {}, "delivery_info": {}})
    assert "leader_occurrence" not in (
        nightly.signature_from_request(plain).options.get("headers") or {}
    )
