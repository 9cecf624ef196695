"""Signals sent in the worker's main process when leadership changes.

Connect as with any Celery signal::

    from celery_leader.signals import leader_elected

    @leader_elected.connect
    def on_elected(sender, token, name, **kwargs): ...

``sender`` is the worker's nodename (``celery@host``). Every signal carries
``name`` (the election) and ``token`` (the term's fencing token);
``leader_lost`` also carries ``reason`` (``"renew-rejected"``,
``"store-unreachable"``, ``"expired"`` or ``"not-live"``);
``leader_task_skipped`` carries ``task``, ``task_id``, ``reason`` and ``key``
(and ``occurrence`` when the reason is ``"occurrence"``).

Receivers run in a dedicated thread, in order, never in the lease manager's
thread: a slow receiver cannot delay a renewal. One that raises is logged.
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

__all__ = ["leader_elected", "leader_lost", "leader_released", "leader_task_skipped"]

#: This worker became leader. Arguments: ``token``, ``name``.
leader_elected = Signal(name="leader_elected")
#: This worker stopped being leader without choosing to. Arguments: ``token``, ``name``, ``reason``.
leader_lost = Signal(name="leader_lost")
#: This worker gave leadership up (step-down, shutdown). Arguments: ``token``, ``name``.
leader_released = Signal(name="leader_released")
#: The leader acknowledged a message without running it. Arguments: ``token``, ``name``,
#: ``task`` (the task's name), ``task_id``, ``reason`` and ``key``: ``"overlap"`` with the
#: overlap key, or ``"occurrence"`` with ``key`` None and ``occurrence`` (the header).
leader_task_skipped = Signal(name="leader_task_skipped")
