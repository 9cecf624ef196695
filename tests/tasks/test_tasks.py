"""@leader_only, LeaderTask, leader-queue routing and install(), in-process.

Real Celery apps on kombu's in-memory transport (``memory://``): messages are
really published and read back from the queues. The memory transport keeps
its queues per process, so every app gets unique names (main, default queue,
leader queue) from a uuid.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, Task, shared_task

import celery_leader
from celery_leader import ConfigurationError, LeaderElection, LeaderTask, leader_only
from celery_leader.tasks import leader_queue_for, resolve_leader_tasks

ROOT = Path(__file__).resolve().parents[2]
LEADER_REQUEST = "celery_leader.worker.request:LeaderRequest"


pytestmark = pytest.mark.compat


@pytest.fixture(autouse=True)
def _settle_leader_tasks() -> Iterator[None]:
    """Resolve every @leader_only task after each test.

    celery_leader.tasks keeps a process-global registry; resolving what a test
    left lazy keeps every test's tasks settled before the next one starts.
    """
    yield
    resolve_leader_tasks()


def new_app(**conf: Any) -> Celery:
    """A fresh app on the memory broker with unique names; becomes the current app."""
    main = f"t{uuid.uuid4().hex[:12]}"
    app = Celery(main, broker="memory://")
    app.conf.task_default_queue = f"{main}.default"
    app.conf.update(conf)
    return app


def drain(app: Celery, queue: str, expect: int = 0) -> list[str]:
    """Task names of the messages in *queue*: *expect* waited for, then all others; acked."""
    names: list[str] = []
    with app.connection_for_read() as conn:
        simple = conn.SimpleQueue(queue)
        try:
            for _ in range(expect):
                try:
                    message = simple.get(timeout=1)
                except simple.Empty:
                    return names
                names.append(message.headers["task"])
                message.ack()
            while True:
                try:
                    message = simple.get_nowait()
                except simple.Empty:
                    return names
                names.append(message.headers["task"])
                message.ack()
        finally:
            simple.close()


def routed_queue(app: Celery, name: str) -> str:
    """The queue Celery's router picks for task *name* with no options."""
    return str(app.amqp.router.route({}, name)["queue"].name)


# The four ways to declare a leader-only task. Each returns (task, on_loss given).


def bare_form(app: Celery) -> tuple[Any, str | None]:
    # Bare @leader_only over bare @app.task, spelled as the calls the decorators
    # are, so that each app's function (and so its generated task name) is unique.
    def body(x: int = 0) -> int:
        return x

    body.__name__ = body.__qualname__ = f"bare_{app.main}"
    return leader_only(app.task(body)), None


def bound_form(app: Celery) -> tuple[Any, str | None]:
    @leader_only(on_loss="terminate")
    @app.task(bind=True, name=f"{app.main}.bound")
    def bound_leader_task(self: Task, x: int = 0) -> tuple[str, int]:
        return self.name, x

    return bound_leader_task, "terminate"


def shared_form(app: Celery) -> tuple[Any, str | None]:
    @leader_only(on_loss="cancel")
    @shared_task(name=f"{app.main}.shared")
    def shared_leader_task(x: int = 0) -> int:
        return x

    return shared_leader_task, "cancel"


def base_form(app: Celery) -> tuple[Any, str | None]:
    # shared=False keeps this LeaderTask out of the apps that later tests finalize.
    @app.task(base=LeaderTask, name=f"{app.main}.based", shared=False)
    def based_leader_task(x: int = 0) -> int:
        return x

    return based_leader_task, None


FORMS: dict[str, Callable[[Celery], tuple[Any, str | None]]] = {
    "leader_only-app.task": bare_form,
    "leader_only(on_loss)-app.task(bind)": bound_form,
    "leader_only(on_loss)-shared_task": shared_form,
    "app.task(base=LeaderTask)": base_form,
}


@pytest.mark.parametrize("form", FORMS.values(), ids=FORMS.keys())
def test_each_form_makes_a_leader_only_task(form: Callable[..., Any]) -> None:
    """Every declaration form yields a leader-only, acks_late task with the gate's Request."""
    app = new_app()
    task, on_loss = form(app)
    assert task.leader_only is True
    assert task.acks_late is True
    assert task.Request == LEADER_REQUEST
    assert task.leader_on_loss == on_loss
    assert task.app is app
    assert app.tasks[task.name].leader_only is True


def test_direct_call_and_apply_run_the_body() -> None:
    """Calling a leader task directly or with .apply() runs its body in this process."""
    app = new_app()
    task, _ = bound_form(app)
    assert task(3) == (f"{app.main}.bound", 3)
    assert task.apply((4,)).get() == (f"{app.main}.bound", 4)


def test_the_body_sees_its_request_under_a_lease() -> None:
    """The task body sees its own request id and token on every supported Celery release.

    Before Celery 5.5, Task.__call__ pushed a fresh request for the body, losing both.
    """
    from celery_leader.testing import leadership

    app = new_app(leader_backend_url="memory://request-seen")

    @leader_only
    @app.task(bind=True)
    def seen(self: Any) -> tuple[Any, Any]:
        return self.request.id, getattr(self.request, "leader_token", None)

    with leadership(7):
        result = seen.apply()
    assert result.get() == (result.id, 7)


def test_leader_only_acks_late_false_is_respected() -> None:
    """@leader_only(acks_late=False) gives an early-ack leader-only task."""
    app = new_app()

    @leader_only(acks_late=False)
    @app.task(name=f"{app.main}.early")
    def early() -> None:
        pass

    assert early.leader_only is True
    assert early.acks_late is False


def test_leader_task_base_acks_late_false_is_respected() -> None:
    """@app.task(base=LeaderTask, acks_late=False) stays early-ack."""
    app = new_app()

    @app.task(base=LeaderTask, acks_late=False, name=f"{app.main}.early", shared=False)
    def early() -> None:
        pass

    assert early.leader_only is True
    assert early.acks_late is False


def _lazy_app_task(app: Celery) -> Any:
    @leader_only
    @app.task(acks_late=False, name=f"{app.main}.early")
    def early() -> None:
        pass

    return early


def _finalized_app_task(app: Celery) -> Any:
    app.finalize()
    return _lazy_app_task(app)


def _shared_task(app: Celery) -> Any:
    @leader_only
    @shared_task(acks_late=False, name=f"{app.main}.early")
    def early() -> None:
        pass

    return early


_AMBIGUOUS = pytest.mark.xfail(
    strict=True,
    reason="documented limitation: once Celery bound the task, acks_late=False given to "
    "@app.task/@shared_task looks the same as the app default; say @leader_only(acks_late=False)",
)


@pytest.mark.parametrize(
    "declare",
    [
        _lazy_app_task,
        pytest.param(_finalized_app_task, marks=_AMBIGUOUS),
        pytest.param(_shared_task, marks=_AMBIGUOUS),
    ],
    ids=["app.task-lazy", "app.task-finalized-app", "shared_task"],
)
def test_task_decorator_acks_late_false_is_respected(declare: Callable[..., Any]) -> None:
    """acks_late=False given to @app.task/@shared_task under @leader_only stays False."""
    app = new_app()
    task = declare(app)
    assert task.leader_only is True
    assert task.acks_late is False


def test_decorating_app_tasks_does_not_finalize_the_app() -> None:
    """Module-level @leader_only over @app.task, and base=LeaderTask, leave the app unfinalized."""
    app = new_app()
    for form in (bare_form, bound_form, base_form):
        form(app)
    assert app.finalized is False


def test_decorating_a_shared_task_does_not_finalize_the_app() -> None:
    """Module-level @leader_only over @shared_task leaves the current app unfinalized."""
    app = new_app()
    shared_form(app)
    assert app.finalized is False


def test_settings_updated_after_decoration_apply_to_leader_tasks() -> None:
    """task_* settings set after the task module was imported apply to leader tasks too."""
    app = new_app()

    @app.task(name=f"{app.main}.plain")
    def plain() -> None:
        pass

    task, _ = bound_form(app)
    app.conf.update(task_track_started=True, task_ignore_result=True)
    assert (plain.track_started, plain.ignore_result) == (True, True)
    assert (task.track_started, task.ignore_result) == (True, True)


def test_unknown_on_loss_is_a_configuration_error() -> None:
    """on_loss="bogus" raises ConfigurationError listing terminate, cancel and finish."""
    app = new_app()
    with pytest.raises(ConfigurationError, match="bogus") as info:

        @leader_only(on_loss="bogus")
        @app.task(name=f"{app.main}.bogus")
        def bogus() -> None:
            pass

    for allowed in ("terminate", "cancel", "finish"):
        assert allowed in str(info.value)


def test_leader_only_under_app_task_is_a_configuration_error() -> None:
    """@leader_only applied to a plain function (under @app.task) raises ConfigurationError."""
    app = new_app()
    with pytest.raises(ConfigurationError, match="outermost decorator"):

        @app.task(name=f"{app.main}.wrong")
        @leader_only
        def wrong_order() -> None:
            pass

    with pytest.raises(ConfigurationError, match="outermost decorator"):
        leader_only(on_loss="finish")(lambda: None)


def test_leader_only_twice_is_a_configuration_error() -> None:
    """@leader_only over @leader_only raises ConfigurationError."""
    app = new_app()
    with pytest.raises(ConfigurationError, match="twice"):

        @leader_only
        @leader_only
        @app.task(name=f"{app.main}.twice")
        def twice() -> None:
            pass


WRAPPED_SCRIPT = """
import functools, json
from celery import Celery
from celery_leader import leader_only

def retried(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper

out = {}
app = Celery("wrapsapp", broker="memory://")
try:
    @app.task(name="wrapsapp.job")
    @leader_only
    @retried
    def job():
        pass
    out["decorate"] = "no error"
except Exception as exc:
    out["decorate"] = type(exc).__name__

other = Celery("otherapp", broker="memory://")

@leader_only
@other.task(name="otherapp.job")
def other_job():
    pass

other_job.name  # first use: installs other's router
try:
    out["route"] = other.amqp.router.route({}, "otherapp.plain")["queue"].name
except Exception as exc:
    out["route"] = type(exc).__name__
print(json.dumps(out))
"""


def test_leader_only_under_app_task_over_wrapped_function() -> None:
    """Wrong order over a functools.wraps'd function: ConfigurationError, routing unharmed."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", WRAPPED_SCRIPT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"decorate": "ConfigurationError", "route": "celery"}


# Routing


@pytest.mark.parametrize("form", FORMS.values(), ids=FORMS.keys())
def test_router_sends_leader_tasks_to_the_leader_queue(form: Callable[..., Any]) -> None:
    """Celery's router gives "<app.main>.leader" for a leader task, the default for others."""
    app = new_app()

    @app.task(name=f"{app.main}.plain")
    def plain() -> None:
        pass

    task, _ = form(app)
    name = task.name
    assert leader_queue_for(app) == f"{app.main}.leader"
    assert routed_queue(app, name) == f"{app.main}.leader"
    assert routed_queue(app, f"{app.main}.plain") == app.conf.task_default_queue
    assert routed_queue(app, f"{app.main}.unknown") == app.conf.task_default_queue


def test_leader_queue_follows_leader_name() -> None:
    """With leader_name set, the leader queue is "<leader_name>.leader"."""
    group = f"grp{uuid.uuid4().hex[:8]}"
    app = new_app(leader_name=group)
    task, _ = bound_form(app)
    name = task.name
    assert routed_queue(app, name) == f"{group}.leader"


def test_leader_queue_setting_wins() -> None:
    """leader_queue, when set, is the queue leader tasks are routed to."""
    app = new_app(leader_name="ignored-here")
    app.conf.leader_queue = f"{app.main}.only-the-leader"
    task, _ = bound_form(app)
    name = task.name
    assert routed_queue(app, name) == f"{app.main}.only-the-leader"


@pytest.mark.parametrize("form", FORMS.values(), ids=FORMS.keys())
def test_delay_and_apply_async_publish_to_the_leader_queue(form: Callable[..., Any]) -> None:
    """.delay(), .apply_async() and .s().delay() put the message in the leader queue only."""
    app = new_app()
    task, _ = form(app)
    task.delay(1)
    task.apply_async((2,))
    task.s(3).delay()
    assert drain(app, f"{app.main}.leader", expect=3) == [task.name] * 3
    assert drain(app, app.conf.task_default_queue) == []


def test_send_task_by_name_after_first_use_goes_to_the_leader_queue() -> None:
    """app.send_task(name) in the task's own app, once the task was used, uses the leader queue."""
    app = new_app()
    task, _ = bound_form(app)
    name = task.name
    app.send_task(name, (1,))
    assert drain(app, f"{app.main}.leader", expect=1) == [name]
    assert drain(app, app.conf.task_default_queue) == []


def test_explicit_queue_wins_over_the_leader_queue() -> None:
    """apply_async(queue=...) publishes to that queue, not the leader queue."""
    app = new_app()
    task, _ = bound_form(app)
    explicit = f"{app.main}.explicit"
    task.apply_async((1,), queue=explicit)
    assert drain(app, explicit, expect=1) == [task.name]
    assert drain(app, f"{app.main}.leader") == []
    assert drain(app, app.conf.task_default_queue) == []


def test_plain_task_is_published_to_the_default_queue() -> None:
    """A plain task of an app that has leader tasks still goes to the default queue."""
    app = new_app()
    task, _ = bound_form(app)
    assert task.leader_only

    @app.task(name=f"{app.main}.plain")
    def plain() -> None:
        pass

    plain.delay()
    assert drain(app, app.conf.task_default_queue, expect=1) == [f"{app.main}.plain"]
    assert drain(app, f"{app.main}.leader") == []


def worker_and_client() -> tuple[Celery, Celery, str]:
    """A worker-side app declaring "<group>.job" and a client app of the same group."""
    group = f"proj{uuid.uuid4().hex[:8]}"
    worker = new_app(leader_name=group)

    @leader_only
    @worker.task(name=f"{group}.job", shared=False)
    def job() -> None:
        pass

    assert job.leader_only
    client = new_app(leader_name=group)
    assert f"{group}.job" not in client._tasks
    return worker, client, f"{group}.job"


def test_client_send_task_without_install_goes_to_the_default_queue() -> None:
    """A client app that never saw the task sends it by name to its default queue."""
    worker, client, name = worker_and_client()
    client.send_task(name)
    assert drain(client, client.conf.task_default_queue, expect=1) == [name]
    assert drain(client, leader_queue_for(worker)) == []


@pytest.mark.parametrize("pattern", ["exact", "glob"])
def test_client_send_task_after_install_goes_to_the_leader_queue(pattern: str) -> None:
    """install(client, tasks=[name or "proj.*"]) routes send_task(name) to the leader queue."""
    worker, client, name = worker_and_client()
    group = name.split(".", 1)[0]
    returned = celery_leader.install(client, tasks=[name if pattern == "exact" else f"{group}.*"])
    assert returned is client
    assert LeaderElection in client.steps["worker"]
    assert routed_queue(client, name) == f"{group}.leader"
    client.send_task(name, (1,))
    client.send_task("other.plain")
    assert leader_queue_for(client) == leader_queue_for(worker) == f"{group}.leader"
    assert drain(client, f"{group}.leader", expect=1) == [name]
    assert drain(client, client.conf.task_default_queue, expect=1) == ["other.plain"]


# Known bugs, pinned by failing tests.


def test_leader_task_first_used_after_a_plain_send() -> None:
    """A leader task first used after the app sent a plain task is published to the leader queue."""
    app = new_app()

    @app.task(name=f"{app.main}.plain", shared=False)
    def plain() -> None:
        pass

    @leader_only
    @app.task(name=f"{app.main}.job", shared=False)
    def job() -> None:
        pass

    plain.delay()
    job.delay()
    assert drain(app, f"{app.main}.leader", expect=1) == [f"{app.main}.job"]


def test_install_after_the_client_sent_a_task() -> None:
    """install() on a client that already sent a task still routes leader tasks."""
    worker, client, name = worker_and_client()
    client.send_task("other.plain")
    celery_leader.install(client, tasks=[name])
    client.send_task(name)
    assert drain(client, leader_queue_for(worker), expect=1) == [name]


def test_send_task_by_name_before_first_use_goes_to_the_leader_queue() -> None:
    """app.send_task(name) right after import (task still lazy) uses the leader queue."""
    app = new_app()

    @leader_only
    @app.task(name=f"{app.main}.job", shared=False)
    def job() -> None:
        pass

    app.send_task(f"{app.main}.job")
    assert drain(app, f"{app.main}.leader", expect=1) == [f"{app.main}.job"]


def test_signature_by_name_after_finalize_goes_to_the_leader_queue() -> None:
    """app.signature(name).delay() of a not-yet-used leader task uses the leader queue."""
    app = new_app()

    @leader_only
    @app.task(name=f"{app.main}.job", shared=False)
    def job() -> None:
        pass

    app.finalize()
    assert getattr(app.tasks[f"{app.main}.job"], "leader_only", False) is True
    app.signature(f"{app.main}.job").delay()
    assert drain(app, f"{app.main}.leader", expect=1) == [f"{app.main}.job"]
