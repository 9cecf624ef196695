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
import inspect
import logging
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from celery import Task, current_app
from celery._state import connect_on_app_finalize
from celery.local import Proxy

from celery_leader.exceptions import ConfigurationError, LeaseLost
from celery_leader.runtime import eager_token, leader_run, shared_lease
from celery_leader.settings import default_name, default_queue, leader_task_patterns
from celery_leader.term_end import OnLoss
from celery_leader.term_end.in_run import (
    UnwatchableRunError,
    stop_run_in_task,
    unwatch_run,
    watch_run,
)

logger = logging.getLogger(__name__)

REQUEST_CLASS = "celery_leader.worker.request:LeaderRequest"

T = TypeVar("T")


def leader_queue_for(app: Any) -> str:
    """The leader queue of *app* (``leader_queue``, else ``"<leader_name>.leader"``)."""
    return default_queue(app.conf, app.main)


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

    def push_request(self, *args: Any, **kwargs: Any) -> None:
        """Push a request that keeps the current one's fields (id, leader_token, ...).

        ``Task.__call__`` pushes a request for the body. Celery 5.5 and later
        merge the current request into it; earlier releases push a fresh one,
        and the body would see ``self.request.id`` None and no leader token.
        Merging here gives every supported release 5.5's behaviour.
        """
        current = self.request  # type: ignore[attr-defined]
        merged = {**vars(current), **kwargs} if current is not None else kwargs
        super().push_request(*args, **merged)  # type: ignore[misc]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run under the lease: a last check in the pool child, then the task body."""
        request = self.request  # type: ignore[attr-defined]
        name = default_name(self.app.conf, self.app.main)  # type: ignore[attr-defined]
        if request.is_eager or request.called_directly:
            # Eager runs hold no lease, unless a test forced one (celery_leader.testing):
            # then they see its token, and LeaseLost reaches the caller as it is.
            forced = eager_token()
            if not request.called_directly:
                request.leader_token = forced
            with leader_run(name, forced):
                return super().__call__(*args, **kwargs)  # type: ignore[misc]
        token = getattr(request, "leader_token", None)
        shared = shared_lease(name)
        if token is None or shared is None or not shared.valid_for(token):
            stop_run_in_task(self, "the lease ended before the run started")
        assert shared is not None
        assert token is not None
        # Recorded for the release guard; under terminate the watchdog also
        # ends the run at its term's deadline.
        terminate = getattr(request, "leader_on_loss", None) == OnLoss.TERMINATE.value
        try:
            watched = watch_run(shared, token, terminate=terminate)
        except UnwatchableRunError as refused:
            logger.error("celery-leader: %s", refused)  # noqa: TRY400 - no traceback: one line says it
            stop_run_in_task(self, str(refused))
        if not shared.valid_for(token):  # revoked while we registered
            unwatch_run(shared, watched)
            stop_run_in_task(self, "the lease ended before the run started")
        try:
            with leader_run(name, token):
                return super().__call__(*args, **kwargs)  # type: ignore[misc]
        except LeaseLost:
            stop_run_in_task(self, "check_leadership() saw the lease lost")
        finally:
            unwatch_run(shared, watched)


class LeaderTask(LeaderTaskMixin, Task):  # type: ignore[misc]
    """Base class for leader-only tasks: ``@app.task(base=LeaderTask)``."""

    acks_late = True

    @classmethod
    def on_bound(cls, app: Any) -> None:
        """Register the task's name for routing when Celery binds it to *app*."""
        _note_leader_task(app, cls.name)


@dataclass
class _Spec:
    """A task marked leader-only, possibly still a lazy proxy.

    What can be known without evaluating the proxy is read at decoration:
    the app (``@app.task`` proxies), the task's function and name, and the
    options given to ``@app.task`` (for ``acks_late``).
    """

    target: Any
    on_loss: str | None
    acks_late: bool | None
    app: Any = None
    name: str | None = None
    fun: Any = None
    resolved: dict[int, Any] = field(default_factory=dict)

    def name_in(self, app: Any) -> str | None:
        """The task's name in *app*, without creating the task."""
        if self.name:
            return self.name
        if self.fun is not None:
            return str(app.gen_task_name(self.fun.__name__, self.fun.__module__))
        return None


_specs: list[_Spec] = []
_names: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
_lock = threading.RLock()


def _note_leader_task(app: Any, name: str | None) -> None:
    if name:
        with _lock:
            _names.setdefault(app, set()).add(name)
        ensure_router(app)


def _proxy_parts(target: Any) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """The factory, args and kwargs a Celery proxy was built with (it is not evaluated)."""
    get = object.__getattribute__
    try:
        local = get(target, "_Proxy__local")
    except AttributeError:
        local = None
    try:
        args = tuple(get(target, "_Proxy__args") or ())
        kwargs = dict(get(target, "_Proxy__kwargs") or {})
    except AttributeError:
        args, kwargs = (), {}
    return local, args, kwargs


def _describe(spec: _Spec) -> None:
    """Fill in app, function, name and explicit acks_late of a proxy, without evaluating it."""
    local, args, kwargs = _proxy_parts(spec.target)
    owner = getattr(local, "__self__", None)
    if owner is not None and hasattr(owner, "_task_from_fun"):  # @app.task's PromiseProxy
        spec.app = owner
        spec.fun = args[0] if args else None
        spec.name = kwargs.get("name")
        if spec.acks_late is None and kwargs.get("acks_late") is not None:
            spec.acks_late = bool(kwargs["acks_late"])
    elif callable(local):  # @shared_task's Proxy: name and function live in its closure
        closure = inspect.getclosurevars(local).nonlocals
        spec.fun = closure.get("fun")
        spec.name = closure.get("name")


def _leaderize(task: Any, spec: _Spec) -> Any:
    """Turn a created task instance into a leader-only one (idempotent)."""
    if not getattr(task, "leader_only", False):
        cls = type(task)
        explicit = cls.__dict__.get("acks_late")
        task.__class__ = type(cls.__name__, (LeaderTaskMixin, cls), {"__module__": cls.__module__})
        if spec.acks_late is None and explicit is False and task.app.conf.task_acks_late:
            spec.acks_late = False  # said explicitly: differs from the app's default
    task.acks_late = True if spec.acks_late is None else spec.acks_late
    if spec.on_loss is not None:
        task.leader_on_loss = spec.on_loss
    task._exec_options = None  # Celery caches routing options per task
    _note_leader_task(task.app, task.name)
    return task


def _task_for(spec: _Spec, app: Any) -> Any:
    if spec.app is not None:
        return spec.target._get_current_object() if _is_proxy(spec.target) else spec.target
    if not _is_proxy(spec.target):
        return spec.target
    name = spec.name_in(app)
    if name is None:
        return spec.target._get_current_object()
    # A shared task exists only in apps finalized after it was defined.
    return app.tasks.get(name)


def _resolve(spec: _Spec, app: Any = None) -> Any:
    if app is None:
        app = spec.app if spec.app is not None else current_app._get_current_object()
    task = _task_for(spec, app)
    if task is None:
        return None
    key = id(task)
    if key not in spec.resolved:
        spec.resolved[key] = _leaderize(task, spec)
    return task


def resolve_leader_tasks(app: Any = None) -> list[Any]:
    """Create (where still lazy) and mark the ``@leader_only`` tasks of *app*.

    Without *app*: of the current app. Tasks of other apps are left alone.
    A task that cannot be made leader-only is logged and skipped.
    """
    app = app if app is not None else current_app._get_current_object()
    with _lock:
        specs = [s for s in _specs if s.app is None or s.app is app]
    tasks = []
    for spec in specs:
        try:
            task = _resolve(spec, app)
        except Exception:
            logger.exception("celery-leader: could not make %s leader-only", _label(spec))
            continue
        if task is not None:
            tasks.append(task)
    return tasks


def _label(spec: _Spec) -> str:
    """A name for *spec* in messages; repr() of a lazy proxy would evaluate it."""
    if spec.name:
        return spec.name
    fun = spec.fun
    return f"{fun.__module__}.{fun.__qualname__}" if fun is not None else "a task"


def leader_task_names(app: Any) -> set[str]:
    """Names of the leader-only tasks known for *app*, and of its pending ones."""
    with _lock:
        names = set(_names.get(app, set()))
        for spec in _specs:
            if spec.app is None or spec.app is app:
                name = spec.name_in(app)
                if name:
                    names.add(name)
    return names


def _on_finalize(app: Any) -> None:
    """After *app* created its tasks, mark its leader-only ones (the worker sees them so)."""
    ensure_router(app)
    app.on_after_finalize.connect(lambda sender, **_: resolve_leader_tasks(sender), weak=False)
    if app.finalized:
        resolve_leader_tasks(app)


class _LazyTask:
    """What ``@leader_only`` returns: the task, made leader-only on first use."""

    def __init__(self, spec: _Spec) -> None:
        object.__setattr__(self, "_spec", spec)

    def _task(self) -> Any:
        spec = object.__getattribute__(self, "_spec")
        task = _resolve(spec)
        if task is None:
            raise ConfigurationError(f"{_label(spec)} is not registered in the current app")
        return task

    def __getattr__(self, name: str) -> Any:
        return getattr(self._task(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._task(), name, value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._task()(*args, **kwargs)

    def __repr__(self) -> str:
        spec = object.__getattribute__(self, "_spec")
        return f"<@leader_only {_label(spec)}>"

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
    OnLoss.parse(on_loss)

    def wrap(target: Any) -> Any:
        # type(), never isinstance() or hasattr(): on a lazy proxy those evaluate
        # it, which creates the task (and may finalize the app) at import time.
        if type(target) is _LazyTask:
            raise ConfigurationError("@leader_only is applied twice to the same task")
        is_proxy = _is_proxy(target)
        if not is_proxy and not isinstance(target, Task):
            raise ConfigurationError(
                "@leader_only must be the outermost decorator, over @app.task or "
                f"@shared_task; it was given {target!r}"
            )
        spec = _Spec(target, on_loss, acks_late)
        if is_proxy:
            _describe(spec)
        else:
            spec.app, spec.name = target.app, target.name
        with _lock:
            _specs.append(spec)
        if not is_proxy:
            _resolve(spec)
        elif spec.app is not None:
            _on_finalize_when_ready(spec.app)
        else:
            connect_on_app_finalize(_on_finalize)
        return _LazyTask(spec)

    if task is not None:
        return wrap(task)
    return wrap


def _on_finalize_when_ready(app: Any) -> None:
    """Install the router now (or once configured) and mark tasks when *app* finalizes."""
    with _lock:
        if getattr(app, "_celery_leader_finalize_hook", False):
            return
        app._celery_leader_finalize_hook = True
    _on_finalize(app)


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
        patterns = leader_task_patterns(self.app.conf)
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


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
    amqp = app.amqp
    table = amqp._rtable  # Celery's prepared routes, if already built (a list or a tuple)
    if table is not None and router not in table:
        routes = [router, *table]
        amqp._rtable = routes
        built = amqp.__dict__.get("router")  # Celery's Router keeps its own reference
        if built is not None:
            built.routes = routes
