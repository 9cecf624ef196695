"""Why leader work was not done: the reasons results, signals and metrics carry.

Each set is written here once. The worker's gate and beat report these
values, and :mod:`celery_leader.observe.metrics` makes one series per value
at 0 before the first event, so what is reported and what is counted from
start cannot drift apart. This module imports nothing: every floor may use
it.
"""

from __future__ import annotations

#: A leader message acknowledged without running: a run of its overlap key was in
#: progress (``@leader_only(overlap="skip")``, or a second message waiting under
#: ``"buffer_one"``).
TASK_OVERLAP = "overlap"
#: A leader message acknowledged without running: its occurrence (beat's entry and
#: slot) runs or completed already.
TASK_OCCURRENCE = "occurrence"
#: Every reason a leader message is skipped (``leader_task_skipped``'s ``reason``,
#: the ``reason`` of a ``SKIPPED`` result and of ``celery_leader_tasks_skipped_total``).
TASK_SKIP_REASONS = (TASK_OVERLAP, TASK_OCCURRENCE)

#: A beat slot consumed without a send: its entry is paused (``celery leader schedule pause``).
SLOT_PAUSED = "paused"
#: A beat slot consumed without a send: missed while nobody led, and older than its
#: catch-up window (or its entry's missed policy is ``skip``).
SLOT_WINDOW = "window"
#: Every reason beat's leader consumes a slot unsent (``celery_leader_beat_slots_skipped_total``).
SLOT_SKIP_REASONS = (SLOT_PAUSED, SLOT_WINDOW)
