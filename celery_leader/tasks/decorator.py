"""``@leader_only``: makes a Celery task leader-only, without evaluating a lazy task."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any, TypeVar, overload

from celery import Task, current_app
from celery._state import connect_on_app_finalize
from celery.local import Proxy

from celery_leader.exceptions import ConfigurationError
from celery_leader.settings import check_election_name
from celery_leader.tasks.base import LeaderTaskMixin
from celery_leader.tasks.overlap import Overlap, check_key_names
from celery_leader.tasks.registry import _label, _lock, _Spec, _specs
from celery_leader.tasks.routing import ensure_router, route_leader_task
from celery_leader.term_end import OnLoss

logger = logging.getLogger(__name__)

T = TypeVar("T")


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
    if spec.overlap != Overlap.ALLOW and not task.acks_late:
        # The gate knows a run is over when its message is acknowledged: at its end
        # only with acks_late. Said explicitly on the task class, not to @leader_only.
        logger.warning(
            "celery-leader: %s has overlap=%r, which needs acks_late: it is acks_late",
            task.name,
            spec.overlap,
        )
        task.acks_late = True
    task.leader_overlap = spec.overlap
    task.leader_overlap_key = spec.overlap_key
    if spec.on_loss is not None:
        task.leader_on_loss = spec.on_loss
    task.leader_election = spec.election
    task._exec_options = None  # Celery caches routing options per task
    route_leader_task(task.app, task.name, spec.election)
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
    task: None = None,
    *,
    on_loss: str | None = None,
    acks_late: bool | None = None,
    election: str | None = None,
    overlap: str = "allow",
    overlap_key: list[str] | tuple[str, ...] | None = None,
) -> Callable[[T], T]: ...


def leader_only(
    task: Any = None,
    *,
    on_loss: str | None = None,
    acks_late: bool | None = None,
    election: str | None = None,
    overlap: str = "allow",
    overlap_key: list[str] | tuple[str, ...] | None = None,
) -> Any:
    """Make a Celery task leader-only. Use it as the outermost decorator.

    ``on_loss`` says what happens to a run when the lease is lost:
    ``"terminate"`` (default where the pool can kill: prefork) kills it and
    hands the message back; ``"cancel"`` lets the task notice through
    :func:`celery_leader.lease_lost` / :func:`celery_leader.check_leadership`;
    ``"finish"`` lets it run to the end (unsafe: it can overlap the next
    leader's work; fence its writes).

    ``election`` names the election the task runs under (letters, digits,
    ``-`` and ``_``; ``beat`` is reserved): its own lease, fencing tokens and
    queue ``"<leader_name>.<election>.leader"``, so its runs may lead on
    another worker than the default election's. None (the default): the
    default election.

    ``overlap`` says what a message does when a run of its key is in
    progress on the leader: ``"allow"`` (default) runs it beside;
    ``"skip"`` acknowledges it without running (result state ``SKIPPED``);
    ``"buffer_one"`` waits for the running one, at most one per key (a
    further one is skipped). The key is the task's name, or with
    ``overlap_key`` (argument names) the name and those arguments' values.
    Kept in the leader's main process, never in a store: nothing is left
    behind by a crash, a kill, a revoke or a lease loss. Needs ``acks_late``
    (the default), and a worker that runs two tasks at once: the policy is
    applied when a message reaches the pool, and on ``-c 1`` (with a
    prefetch multiplier of 1) or the solo pool a message sent during a run
    gets there only after it, and runs (the worker warns at start:
    :mod:`celery_leader.worker.one_slot`). See
    :mod:`celery_leader.worker.overlap`.
    """
    OnLoss.parse(on_loss)
    if election is not None:
        check_election_name(election, "@leader_only(election)")
    policy = Overlap.parse(overlap)
    if overlap_key is not None and policy is Overlap.ALLOW:
        raise ConfigurationError(
            "@leader_only(overlap_key) needs overlap='skip' or overlap='buffer_one'"
        )
    if policy is not Overlap.ALLOW and acks_late is False:
        raise ConfigurationError(
            f"@leader_only(overlap={policy.value!r}) needs acks_late: the leader knows a run"
            " is over when its message is acknowledged at its end"
        )

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
        spec = _Spec(target, on_loss, acks_late, election, overlap=policy.value)
        if is_proxy:
            _describe(spec)
        else:
            spec.app, spec.name, spec.fun = target.app, target.name, target.run
        spec.overlap_key = check_key_names(overlap_key, spec.fun, _label(spec))
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
