"""Which tasks are leader-only, per app: the decorated ones (maybe still lazy) and their names."""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any


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
    election: str | None = None
    #: ``@leader_only(overlap=...)``, parsed, and ``overlap_key`` (None: the task's name).
    overlap: str = "allow"
    overlap_key: tuple[str, ...] | None = None
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
#: Per app: leader-only task name -> its election (None: the default one).
_names: weakref.WeakKeyDictionary[Any, dict[str, str | None]] = weakref.WeakKeyDictionary()
_lock = threading.RLock()


def note_leader_task(app: Any, name: str | None, election: str | None = None) -> None:
    """Record *name* as a leader-only task of *app*, of *election* (None: the default one)."""
    if name:
        with _lock:
            _names.setdefault(app, {})[name] = election


def _label(spec: _Spec) -> str:
    """A name for *spec* in messages; repr() of a lazy proxy would evaluate it."""
    if spec.name:
        return spec.name
    fun = spec.fun
    return f"{fun.__module__}.{fun.__qualname__}" if fun is not None else "a task"


def leader_task_names(app: Any) -> set[str]:
    """Names of the leader-only tasks known for *app*, and of its pending ones."""
    return set(leader_task_elections(app))


def leader_task_elections(app: Any) -> dict[str, str | None]:
    """Name -> election of the leader-only tasks known for *app*, and of its pending ones."""
    with _lock:
        found = dict(_names.get(app, {}))
        for spec in _specs:
            if spec.app is None or spec.app is app:
                name = spec.name_in(app)
                if name:
                    found.setdefault(name, spec.election)
    return found
