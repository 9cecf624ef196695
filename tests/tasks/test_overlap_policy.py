"""``@leader_only(overlap=..., overlap_key=...)``: its checks at decoration and its keys."""

from __future__ import annotations

import pytest
from celery import Celery

from celery_leader import leader_only
from celery_leader.exceptions import ConfigurationError
from celery_leader.tasks.overlap import OverlapKeyError, overlap_key
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
    """A request as the record sees it (pure logic: acknowledged or not, and its key)."""

    def __init__(self) -> None:
        self.acknowledged = False
        self.leader_overlap_key: str | None = None


def test_the_record_runs_one_per_key_lets_one_wait_and_forgets_a_settled_run():
    from celery_leader.tasks.overlap import Overlap

    record = Overlaps()
    first, second, third = FakeRequest(), FakeRequest(), FakeRequest()
    for request in (first, second, third):
        request.leader_overlap_key = "k"
    assert record.admit(first, "k", Overlap.BUFFER_ONE) == RUN
    assert record.admit(second, "k", Overlap.BUFFER_ONE) == WAIT
    assert record.admit(third, "k", Overlap.BUFFER_ONE) == SKIP
    assert record.settle(first) is second
    assert record.settle(first) is None, "settling twice releases nothing more"
    assert record.admit(second, "k", Overlap.BUFFER_ONE) == RUN
    other = FakeRequest()
    assert record.admit(other, "other", Overlap.SKIP) == RUN, "another key is not held"
    second.acknowledged = True  # its message settled without a report (a kill)
    assert record.admit(FakeRequest(), "k", Overlap.SKIP) == RUN
