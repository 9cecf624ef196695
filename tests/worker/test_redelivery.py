"""The record of leader runs by task id that keeps a redelivered copy from running beside them."""

from __future__ import annotations

from celery import Celery

from celery_leader.tasks.message_id import HEADER
from celery_leader.worker.redelivery import (
    COMPLETED,
    DROP,
    FAILED,
    PARK,
    RUN,
    SUPERSEDED,
    WAIT,
    Redeliveries,
    outlasting_tasks,
    release_copies,
    visibility_timeout,
)


class Delivery:
    def __init__(self, tag):
        self.delivery_tag = tag


class Message:
    """Stands for a request: its task id, the id its message was stamped with, its state.

    A broker that delivers a message again hands back its headers, with the
    stamp (*tag*); another message under the same task id has a stamp of its
    own. *tag* None: a message published without a stamp, on a transport
    whose delivery tags name nothing (AMQP's count per channel).
    """

    def __init__(self, task_id, tag="tag-1"):
        self.id, self.acknowledged = task_id, False
        self._request_dict = {HEADER: tag} if tag is not None else {}
        self._message = Delivery(1)

    def acknowledge(self):
        self.acknowledged = True

    def humaninfo(self):
        return f"task[{self.id}]"


def test_a_copy_waits_for_its_run_and_is_dropped_when_the_run_completed():
    runs = Redeliveries()
    original, copy, later = Message("a"), Message("a"), Message("a")
    assert runs.admit(original) == RUN
    assert runs.admit(copy) == PARK
    assert runs.parked() == 1
    assert runs.settle(original, COMPLETED) == [copy]
    assert runs.settle(original, COMPLETED) == [], "a second report settles nothing"
    assert runs.admit(later) == DROP, "a copy arriving after completion is not run"


def test_a_copy_runs_when_the_run_did_not_complete():
    runs = Redeliveries()
    original, first, second = Message("b"), Message("b"), Message("b")
    assert runs.admit(original) == RUN
    assert runs.admit(first) == PARK
    assert runs.admit(second) == PARK
    assert runs.settle(original, FAILED) == [first, second]
    assert runs.admit(first) == RUN, "one copy runs"
    assert runs.admit(second) == PARK, "the others wait behind it"


def test_a_run_settled_without_a_report_does_not_hold_its_copies():
    """An original already acknowledged (its report missed) never parks a copy for ever."""
    runs = Redeliveries()
    original, copy = Message("c"), Message("c")
    assert runs.admit(original) == RUN
    original.acknowledged = True
    assert runs.admit(copy) == RUN


def test_completed_ids_are_remembered_up_to_a_bound():
    runs = Redeliveries(remembered=2)
    for task_id in "xyz":
        message = Message(task_id)
        runs.admit(message)
        runs.settle(message, COMPLETED)
    assert runs.admit(Message("x")) == RUN, "the oldest was forgotten"
    assert runs.admit(Message("z")) == DROP


def test_visibility_timeout_per_broker():
    app = Celery("v", broker="redis://127.0.0.1:1/0")
    assert visibility_timeout(app) == 3600.0
    app.conf.broker_transport_options = {"visibility_timeout": 40}
    assert visibility_timeout(app) == 40.0
    assert visibility_timeout(Celery("v", broker="amqp://guest@127.0.0.1//")) is None
    assert visibility_timeout(Celery("v", broker="sqs://")) == 1800.0


def test_the_warning_names_leader_tasks_that_may_outlast_the_visibility_timeout():
    app = Celery("v", broker="redis://127.0.0.1:1/0")
    app.conf.broker_transport_options = {"visibility_timeout": 60}

    @app.task(acks_late=True)
    def unbounded():
        pass

    @app.task(acks_late=True, time_limit=30)
    def bounded():
        pass

    @app.task(acks_late=True, time_limit=90)
    def too_long():
        pass

    @app.task(acks_late=False)
    def acked_early():
        pass

    tasks = [unbounded, bounded, too_long, acked_early]
    assert outlasting_tasks(app, tasks) == (60.0, sorted([unbounded.name, too_long.name]))
    app.conf.task_time_limit = 10
    assert outlasting_tasks(app, tasks) == (60.0, [too_long.name])


def test_a_run_that_retried_or_was_replaced_drops_its_copies_and_its_retry_runs_after_it():
    """The retry (or the replacement) is another message under the same id: it waits for the
    run it replaces, then goes through the gate again and runs."""
    runs = Redeliveries()
    original, copy = Message("r"), Message("r")
    assert runs.admit(original) == RUN
    assert runs.admit(copy) == PARK
    retry = Message("r", tag="tag-2")
    assert runs.admit(retry) == WAIT, "not beside the run it replaces"
    assert runs.settle(original, SUPERSEDED) == [copy, retry]
    acknowledged, redispatched = release(original, [copy, retry], SUPERSEDED)
    assert (acknowledged, redispatched) == ([copy], [retry])
    assert runs.admit(retry) == RUN, "through the gate again, it runs"
    assert runs.admit(Message("r")) == DROP, "a later copy of the first message"
    assert runs.admit(Message("r", tag="tag-2")) == PARK, "a copy of the retry waits for it"


def test_a_message_sent_again_under_the_same_id_runs_after_the_run_never_beside_it():
    """Only a broker's redelivery (same tag) is a copy: another message under the id (sent
    again on purpose, or twice by a publisher's retry) runs, but after the run, whatever its
    outcome."""
    for outcome in (COMPLETED, SUPERSEDED, FAILED):
        runs = Redeliveries()
        first = Message("fixed")
        assert runs.admit(first) == RUN
        second, its_copy = Message("fixed", tag="tag-2"), Message("fixed", tag="tag-2")
        assert runs.admit(second) == WAIT, "not beside the first"
        assert runs.admit(its_copy) == WAIT, "its copy too"
        assert runs.settle(first, outcome) == [second, its_copy]
        assert release(first, [second, its_copy], outcome) == ([], [second, its_copy])
        assert runs.admit(second) == RUN, "after it, as sent"
        assert runs.admit(its_copy) == PARK, "the copy, back at the gate, waits for it"
        copy_of_first = runs.admit(Message("fixed"))
        # Failed, the first message runs again, after the task id's run that goes on now.
        assert copy_of_first == (WAIT if outcome == FAILED else DROP)


def release(run, copies, outcome):
    """What release_copies does with *copies* of *run*: (acknowledged, sent to the gate)."""
    redispatched: list = []
    release_copies(copies, outcome, run=run, redispatch=redispatched.append, unpark=lambda _: None)
    return [c for c in copies if c.acknowledged], redispatched


def test_retry_ignore_and_reject_hand_the_message_on_while_other_errors_fail():
    from billiard.einfo import ExceptionWithTraceback
    from celery.exceptions import Ignore, Reject, Retry

    from celery_leader.worker.request import _hands_on

    for handed_on in (Retry(), Retry(exc=ValueError("cause")), Ignore(), Reject(requeue=False)):
        assert _hands_on(handed_on)
        assert _hands_on(ExceptionWithTraceback(handed_on, ""))
    # Requeued (a run stopped at its term's end): the message must run again.
    assert not _hands_on(Reject(requeue=True))
    assert not _hands_on(ExceptionWithTraceback(Reject(requeue=True), ""))
    assert not _hands_on(ValueError("bug"))
    assert not _hands_on(ExceptionWithTraceback(KeyError("k"), ""))


def test_a_message_nothing_names_is_never_dropped_nor_taken_for_a_copy():
    """Without a stamp, on a transport whose tags name nothing, a message proves nothing: it
    waits for a run of its task id, then runs (at least once beats lost)."""
    runs = Redeliveries()
    first = Message("u", tag=None)
    assert runs.admit(first) == RUN
    again = Message("u", tag=None)
    assert runs.admit(again) == WAIT, "not taken for a copy of the run: it waits"
    assert runs.settle(first, COMPLETED) == [again]
    assert release(first, [again], COMPLETED) == ([], [again]), "to the gate, not acknowledged"
    assert runs.admit(again) == RUN
    assert runs.settle(again, COMPLETED) == []
    assert runs.admit(Message("u", tag=None)) == RUN, "a completed run proves nothing of it"


def test_copies_that_waited_are_forgotten_when_their_connection_is_gone():
    runs = Redeliveries()
    original, copy, retry = Message("f"), Message("f"), Message("f", tag="tag-2")
    assert runs.admit(original) == RUN
    assert runs.admit(copy) == PARK
    assert runs.admit(retry) == WAIT
    assert runs.forget_parked() == [copy, retry]
    assert runs.parked() == 0
    assert runs.settle(original, COMPLETED) == [], "nothing is released twice"
    assert runs.admit(Message("f")) == DROP, "the run stays recorded"


def test_a_retry_is_never_taken_for_the_message_it_retries_even_under_its_id():
    """A publish hook that copies the running message's id into its retry: the retry count
    still tells them apart."""
    runs = Redeliveries()
    first = Message("h", tag="copied")
    first._request_dict["retries"] = 0
    assert runs.admit(first) == RUN
    assert runs.settle(first, SUPERSEDED) == []
    retry = Message("h", tag="copied")
    retry._request_dict["retries"] = 1
    assert runs.admit(retry) == RUN, "the retry runs"
    again = Message("h", tag="copied")
    again._request_dict["retries"] = 0
    assert runs.admit(again) == DROP, "a copy of the first message, whose run retried"
