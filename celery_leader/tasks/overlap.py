"""``@leader_only(overlap=...)``: what a run's key is, and which policies there are.

A leader-only task runs on one worker at a time, and a term's runs end
before the next term's begin where they can be stopped: ``on_loss``
``"terminate"`` in a prefork pool, and ``"cancel"`` for a run that polls
:func:`celery_leader.lease_lost` and returns (see
:mod:`celery_leader.term_end`). A run under ``"finish"``, or under
``"cancel"`` (the only policy in the threads, solo, gevent and eventlet
pools) that never polls, goes on after its term, beside the next leader's
run of its key: the worker says so at start for each such task
(:mod:`celery_leader.worker.unkillable_runs`). Given that, "is a run of
this job in progress?" has one place to be answered: the leader's main process, which
sees every run it hands to its pool. The policy is enforced there
(:mod:`celery_leader.worker.overlap`); this module only says what the policy
and the key of a message are. Nothing is kept in a store: a crash, a kill,
a revoke or a lease loss leaves nothing behind to go stale.

The key is the task's name, or with ``overlap_key`` (argument names) the
name and those arguments' values: bound through the task's signature, so a
positional and a keyword argument give the same key and defaults apply,
and compared by their JSON form.
"""

from __future__ import annotations

import enum
import inspect
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from celery_leader.exceptions import ConfigurationError


class Overlap(str, enum.Enum):
    """What a message does when a run of its key is in progress on the leader.

    Judged when the message reaches the worker's pool: on a worker that runs
    one task at a time (``-c 1`` with a prefetch multiplier of 1, the solo
    pool) a message sent during a run gets there only after the run, so
    ``SKIP`` skips nothing and ``BUFFER_ONE`` runs every message; such a
    worker warns at start (:mod:`celery_leader.worker.one_slot`). Run it
    with ``-c 2`` or more.
    """

    #: Run it beside the other (the behaviour without the option).
    ALLOW = "allow"
    #: Acknowledge it without running: state ``SKIPPED``, reason ``overlap``.
    SKIP = "skip"
    #: Wait for the running one and run after it; at most one waits, a further one is skipped.
    BUFFER_ONE = "buffer_one"

    @classmethod
    def parse(cls, value: object, setting: str = "@leader_only(overlap)") -> Overlap:
        """*value* as a policy; ConfigurationError naming *setting* and the allowed values."""
        if isinstance(value, Overlap):
            return value
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(repr(policy.value) for policy in cls)
            raise ConfigurationError(
                f"{setting}={value!r} is not allowed: use one of {allowed}"
            ) from None


class OverlapKeyError(ValueError):
    """An argument named in ``overlap_key`` has a value with no JSON form."""


def check_key_names(names: object, function: Any, label: str) -> tuple[str, ...] | None:
    """``overlap_key`` as a tuple of argument names of *function* (None: the task's name).

    Raises ConfigurationError for anything else: not a list of strings, or a
    name the function does not take (when the function is known).
    """
    if names is None:
        return None
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise ConfigurationError(
            f"@leader_only(overlap_key={names!r}) of {label}: give a list of argument names,"
            " e.g. overlap_key=['account_id']"
        )
    found = tuple(names)
    if not found or not all(isinstance(name, str) and name for name in found):
        raise ConfigurationError(
            f"@leader_only(overlap_key={names!r}) of {label}: give a non-empty list of"
            " argument names"
        )
    if function is not None:
        parameters = _parameters(function)
        unknown = [name for name in found if name not in parameters]
        if unknown:
            raise ConfigurationError(
                f"@leader_only(overlap_key) of {label} names {unknown}, which the task does"
                f" not take; its arguments: {', '.join(parameters) or 'none'}"
            )
    return found


def _parameters(function: Any) -> list[str]:
    """The argument names a task's function takes (a bound task's first one included)."""
    return [
        p.name
        for p in inspect.signature(function).parameters.values()
        if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]


def overlap_key(
    task: Any, names: Sequence[str] | None, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> str | None:
    """The key of a run of *task* with *args* and *kwargs*; None when they do not bind.

    Arguments that do not fit the signature make the run fail by itself (a
    TypeError in the task): it is not held back for a key it does not have.
    Raises :class:`OverlapKeyError` when a named argument's value has no JSON form.
    """
    if not names:
        return str(task.name)
    try:
        bound = _signature(task).bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    values = []
    for name in names:
        value = bound.arguments.get(name)
        try:
            values.append(json.dumps(value, sort_keys=True, separators=(",", ":")))
        except (TypeError, ValueError):
            raise OverlapKeyError(
                f"overlap_key argument {name!r} of {task.name} is {type(value).__name__}, which has"
                " no JSON form: give the task JSON-serialisable values for its overlap_key"
            ) from None
    return f"{task.name}[{','.join(values)}]"


def _signature(task: Any) -> inspect.Signature:
    """The signature of *task*'s function, read once per task (the gate asks per message)."""
    found = task.__dict__.get("_leader_signature")
    if found is None:
        found = inspect.signature(task.run)
        task.__dict__["_leader_signature"] = found
    return found  # type: ignore[no-any-return]
