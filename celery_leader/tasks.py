"""Leader-only tasks: ``@leader_only``, ``LeaderTask`` and their routing.

``@leader_only`` is the outermost decorator, over ``@app.task`` or
``@shared_task`` (bare or with options). It never evaluates a lazy task
proxy itself (that would finalize the app at import time): it records the
task and turns it into a leader-only task when Celery creates it, or when
the worker starts, or when a message is routed, whichever comes first.

A leader-only task:

* is routed to the leader queue (``.delay``, ``.apply_async``, signatures,
  and ``app.send_task(name)`` through a router installed on the app);
* is ``acks_late`` unless said otherwise (``@leader_only(acks_late=False)``,
  or ``acks_late=False`` in ``@app.task``), so a message handed back by the
  gate or by revocation goes back to the broker;
* runs only on the worker holding the lease: the worker's gate checks the
  lease before the pool and puts the fencing token into
  ``self.request.leader_token``; the pool child checks again right before
  running, since a job can wait in the pool's buffer after the gate.
"""

from __future__ import annotations

import fnmatch
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from celery import Task
from celery.exceptions import Ignore, Reject
from celery.local import Proxy

from celery_leader.exceptions import ConfigurationError, LeaseLost
from celery_leader.runtime import leader_run, shared_lease

logger = logging.getLogger(__name__)

ON_LOSS_POLICIES = ("terminate", "cancel", "finish")
REQUEST_CLASS = "celery_leader.worker.request:LeaderRequest"

T = TypeVar("T")


def _check_on_loss(on_loss: str | None) -> None:
    if on_loss is not None and on_loss not in ON_LOSS_POLICIES:
        raise ConfigurationError(
            f"on_loss={on_loss!r} is not allowed: use one of {', '.join(ON_LOSS_POLICIES)}"
        )


def leader_queue_for(app: Any) -> str:
    """The leader queue of *app* (``leader_queue``, else ``"<leader_name>.leader"``)."""
    conf = app.conf
    queue = conf.get("leader_queue")
    if queue:
        return str(queue)
    return f"{conf.get('leader_name') or app.main or 'celery'}.leader"


class LeaderTaskMixin:
    """What makes a task leader-only; mixed in front of the task's own class."""

    #: Set to True on every leader-only task class.
    leader_only = True
    #: ``"terminate"``, ``"cancel"``, ``"finish"``, or None for the pool's default.
    leader_on_loss: str | None = None
    Request = REQUEST_CLASS

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Send to the leader queue unless a queue or routing was given explicitly."""
        if not any(options.get(key) for key in ("queue", "exchange", "routing_key")):
            options["queue"] = leader_queue_for(self.app)  # type: ignore[attr-defined]
        return super().apply_async(args, kwargs, **options)  # type: ignore[misc]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run under the lease: a last check in the pool child, then the task body."""
        request = self.request  # type: ignore[attr-defined]
        name = str(self.app.conf.get("leader_name") or self.app.main or "celery")  # type: ignore[attr-defined]
        if request.is_eager or request.called_directly:
            with leader_run(name, None):
                return super().__call__(*args, **kwargs)  # type: ignore[misc]
        token = getattr(request, "leader_token", None)
        shared = shared_lease()
        if token is None or shared is None or not shared.valid_for(token):
            self._hand_back("the lease ended before the run started")
        try:
            with leader_run(name, token):
                return super().__call__(*args, **kwargs)  # type: ignore[misc]
        except LeaseLost:
            self._hand_back("check_leadership() saw the lease lost")

    def _hand_back(self, why: str) -> None:
        """Give the message back for the next leader (acks_late) or record it revoked."""
        request = self.request  # type: ignore[attr-defined]
        logger.warning("celery-leader: %s[%s] handed back: %s", self.name, request.id, why)  # type: ignore[attr-defined]
        if self.acks_late:  # type: ignore[attr-defined]
            raise Reject(why, requeue=True)
        self.backend.mark_as_revoked(request.id, why, request=request)  # type: ignore[attr-defined]
        raise Ignore()


class LeaderTask(LeaderTaskMixin, Task):  # type: ignore[misc]
    """Base class for leader-only tasks: ``@app.task(base=LeaderTask)``."""

    acks_late = True

    @classmethod
    def on_bound(cls, app: Any) -> None:
        """Register the task's name for routing when Celery binds it to *app*."""
        _note_leader_task(app, cls.name)


@dataclass
class _Spec:
    """A task marked leader-only, possibly still a lazy proxy."""

    target: Any
    on_loss: str | None
    acks_late: bool | None
    resolved: dict[int, Any] = field(default_factory=dict)


_specs: list[_Spec] = []
_names: dict[int, set[str]] = {}
_lock = threading.RLock()


def _note_leader_task(app: Any, name: str | None) -> None:
    if name:
        with _lock:
            _names.setdefault(id(app), set()).add(name)
        ensure_router(app)


def _explicit_acks_late(target: Any) -> bool | None:
    """acks_late as given in ``@app.task(...)`` of a pending proxy, without evaluating it."""
    try:
        kwargs = object.__getattribute__(target, "_Proxy__kwargs")
    except AttributeError:
        return None
    value = (kwargs or {}).get("acks_late")
    return None if value is None else bool(value)


def _leaderize(task: Any, spec: _Spec) -> Any:
    """Turn a created task instance into a leader-only one (idempotent)."""
    if not getattr(task, "leader_only", False):
        cls = type(task)
        task.__class__ = type(cls.__name__, (LeaderTaskMixin, cls), {"__module__": cls.__module__})
    acks_late = spec.acks_late
    if acks_late is None:
        acks_late = _explicit_acks_late(spec.target)
    task.acks_late = True if acks_late is None else acks_late
    if spec.on_loss is not None:
        task.leader_on_loss = spec.on_loss
    task._exec_options = None  # Celery caches routing options per task
    _note_leader_task(task.app, task.name)
    return task


def _resolve(spec: _Spec) -> Any:
    # shared_task gives a plain Proxy (the current app's task), @app.task a
    # PromiseProxy (created on first use): both resolve to the task instance.
    task = spec.target._get_current_object() if _is_proxy(spec.target) else spec.target
    key = id(task)
    if key not in spec.resolved:
        spec.resolved[key] = _leaderize(task, spec)
    return task


def resolve_leader_tasks() -> list[Any]:
    """Create (where still lazy) and mark every ``@leader_only`` task; return them."""
    with _lock:
        specs = list(_specs)
    return [_resolve(spec) for spec in specs]


def leader_task_names(app: Any) -> set[str]:
    """Names of the leader-only tasks known for *app* (plus ``leader_tasks`` patterns)."""
    with _lock:
        return set(_names.get(id(app), set()))


class _LazyTask:
    """What ``@leader_only`` returns: the task, made leader-only on first use."""

    def __init__(self, spec: _Spec) -> None:
        object.__setattr__(self, "_spec", spec)

    def _task(self) -> Any:
        return _resolve(object.__getattribute__(self, "_spec"))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._task(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._task(), name, value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._task()(*args, **kwargs)

    def __repr__(self) -> str:
        spec = object.__getattribute__(self, "_spec")
        return f"<@leader_only {spec.target!r}>"

    def __reduce__(self) -> Any:
        return self._task().__reduce__()


@overload
def leader_only(task: T) -> T: ...
@overload
def leader_only(
    task: None = None, *, on_loss: str | None = None, acks_late: bool | None = None
) -> Callable[[T], T]: ...


def leader_only(
    task: Any = None, *, on_loss: str | None = None, acks_late: bool | None = None
) -> Any:
    """Make a Celery task leader-only. Use it as the outermost decorator.

    ``on_loss`` says what happens to a run when the lease is lost:
    ``"terminate"`` (default where the pool can kill: prefork) kills it and
    hands the message back; ``"cancel"`` lets the task notice through
    :func:`celery_leader.lease_lost` / :func:`celery_leader.check_leadership`;
    ``"finish"`` lets it run to the end (unsafe: it can overlap the next
    leader's work; fence its writes).
    """
    _check_on_loss(on_loss)

    def wrap(target: Any) -> Any:
        if isinstance(target, _LazyTask):
            raise ConfigurationError("@leader_only is applied twice to the same task")
        if isinstance(target, type) or not (
            hasattr(target, "__wrapped__") or hasattr(target, "apply_async") or _is_proxy(target)
        ):
            raise ConfigurationError(
                "@leader_only must be the outermost decorator, over @app.task or @shared_task"
            )
        spec = _Spec(target, on_loss, acks_late)
        with _lock:
            _specs.append(spec)
        if not _is_proxy(target):
            _resolve(spec)
        return _LazyTask(spec)

    if task is not None:
        return wrap(task)
    return wrap


def _is_proxy(obj: Any) -> bool:
    return isinstance(type(obj), type) and Proxy in type(obj).__mro__


class LeaderRouter:
    """A task router that sends leader-only tasks to the leader queue.

    Knows a name when its task was created in this process, when a
    ``@leader_only`` proxy can be created for it, or when it matches a
    pattern in ``app.conf.leader_tasks`` (for processes that send by name
    without importing the task modules).
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    def __call__(
        self, name: str, args: Any, kwargs: Any, options: Any, task: Any = None, **kw: Any
    ) -> dict[str, str] | None:
        """Route *name* to the leader queue when it is a leader-only task."""
        if self._is_leader_task(name):
            return {"queue": leader_queue_for(self.app)}
        return None

    def _is_leader_task(self, name: str) -> bool:
        if name in leader_task_names(self.app):
            return True
        patterns = self.app.conf.get("leader_tasks") or ()
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
            return True
        resolve_leader_tasks()
        return name in leader_task_names(self.app)


def ensure_router(app: Any) -> None:
    """Put a :class:`LeaderRouter` first in *app*'s routes (once)."""
    with _lock:
        if getattr(app, "_celery_leader_router", None) is not None:
            return
        router = LeaderRouter(app)
        app._celery_leader_router = router
    if app.configured:
        _add_router(app, router)
    else:
        app.on_after_configure.connect(lambda sender, **_: _add_router(sender, router), weak=False)


def _add_router(app: Any, router: LeaderRouter) -> None:
    routes = app.conf.task_routes
    if routes is None:
        existing: list[Any] = []
    elif isinstance(routes, (list, tuple)):
        existing = list(routes)
    else:
        existing = [routes]
    if router not in existing:
        app.conf.task_routes = [router, *existing]
    table = app.amqp._rtable  # Celery's prepared routes, if already built
    if table is not None and router not in table:
        table.insert(0, router)
