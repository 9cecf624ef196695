"""The led scheduler's side of the schedule controls: pauses, run-now requests, the view.

``celery leader schedule pause|resume|run`` write into the control slot
(:mod:`celery_leader.beat.controls`); the beat leader's
:class:`~celery_leader.beat.steering.Steering` reads it on a helper thread.
This part of the scheduler acts on what it read, on beat's loop, while this
beat leads a term it took over:

* a paused entry's slot is consumed without a send: marked (under the
  publish guard, as a send's mark) with ``skipped: "paused"``, so neither
  this beat nor a later leader sends it; after ``resume`` the next send is
  the entry's next due slot;
* a run-now request is sent once, as the manual occurrence
  ``"<entry>@manual:<request time>"``, also for a paused entry, without
  moving the entry's next due time (no send mark); its record in beat's
  state is written before the publish guard is lowered, so a takeover does
  not find the request undone;
* the view of every entry (``celery leader schedule list``) is published
  when due.

Nothing here reads the store: the steering thread did. What is written
from here (a paused slot's mark) is bounded by ``leader_store_timeout``;
the view is handed to the steering thread to write.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from typing import Any

from celery_leader.beat.base import LeaderSchedulerBase
from celery_leader.beat.controls import RunRequest
from celery_leader.beat.election import BeatElection
from celery_leader.beat.occurrence import manual_occurrence
from celery_leader.skip_reasons import SLOT_PAUSED

#: The logger beat's lines have always had (logging configurations name it).
logger = logging.getLogger("celery_leader.beat.scheduler")


class Steered(LeaderSchedulerBase):
    """Pauses, run-now requests and the view, on beat's loop; see the module docstring."""

    #: The manual occurrence of the run-now send in progress (apply_async reads it).
    _leader_manual: str | None = None
    #: (occurrence, sent_at, token) of the last run-now send, set by apply_async.
    _leader_sent_manual: tuple[str, float, int] | None = None
    #: The run-now request being carried out (apply_async records it as done).
    _leader_manual_request: RunRequest | None = None

    def _leader_skip_paused(self, election: BeatElection, entry: Any, token: int) -> bool:
        """True when *entry* is paused: its slot is consumed (marked) without a send.

        The entry has moved on already (Celery reserved it), so the slots it
        misses while paused are never sent; the mark keeps a takeover from
        sending them either.
        """
        if election.steering.paused_until(entry.name) is None:
            return False
        logger.info("celery-leader beat: %s is paused; slot skipped", entry.name)
        election.publishing()  # the mark is written under the publish guard, as a send's
        try:
            # Read again under the flag (raised first, as for a send): a term that ended
            # meanwhile writes no mark.
            if election.leading() == token:
                election.mark_sent(entry.name, token, time.time(), skipped=SLOT_PAUSED)
        finally:
            election.published(None)
        election.steering.sent()
        self._leader_count_skip(entry.name, SLOT_PAUSED)
        return True

    def _leader_steer(self, election: BeatElection, token: int) -> None:
        """Send what was asked to run now; publish the view (when due). Never waits on the store."""
        pending = election.steering.pending_runs()
        entries: dict[str, Any] | None = None
        if pending:
            entries = self._leader_entries()
            if entries is not None:
                for request in pending:
                    self._leader_run_now(election, request, entries.get(request.entry), token)
        if election.steering.publish_due():
            # Marked published before the view is built: a change read meanwhile
            # makes it due again, and is not lost with this one.
            election.steering.publishing()
            if entries is None:
                entries = self._leader_entries()
            if entries is not None:  # a failed read keeps the last good view
                self._leader_publish_view(election, entries, token)

    def _leader_run_now(
        self, election: BeatElection, request: RunRequest, entry: Any, token: int
    ) -> None:
        """Send *entry* once for the run-now *request*, as a manual occurrence."""
        # Done in this term whatever happens next: a send that raises is not retried
        # at every tick (the broker is gone: this beat hands over, and the next
        # leader, finding no record, tries once more).
        election.steering.attempted(request)
        if entry is None:
            logger.warning(
                "celery-leader beat: asked to run %r now, but the schedule has no such entry",
                request.entry,
            )
            return
        self._leader_manual = manual_occurrence(
            entry.name, dt.datetime.fromtimestamp(request.at, tz=dt.timezone.utc)
        )
        self._leader_manual_request = request
        self._leader_sent_manual = None
        try:
            self.apply_async(entry, producer=self.producer, advance=False)  # type: ignore[attr-defined]
        except Exception:
            logger.exception("celery-leader beat: could not send %s now", entry.name)
            return
        finally:
            self._leader_manual = None
            self._leader_manual_request = None
        sent = self._leader_sent_manual
        if sent is not None:
            logger.info("celery-leader beat: %s sent now, as asked (%s)", entry.name, sent[0])
            election.steering.sent()

    def _leader_publish_view(
        self, election: BeatElection, entries: dict[str, Any], token: int
    ) -> None:
        def describe(entry: Any) -> dict[str, Any]:
            task = self.app.tasks.get(entry.task)  # type: ignore[attr-defined]
            overlap = getattr(task, "leader_overlap", None) if task is not None else None
            missed = self._leader_beat.missed_policy(entry.name)
            return {"overlap": str(getattr(overlap, "value", overlap or "allow")), "missed": missed}

        wrapped = self._leader_wrapped()
        view = {
            "election": self._leader_settings.name,
            "token": token,
            "holder": election.holder.nodename,
            "scheduler": f"{wrapped.__module__}:{wrapped.__qualname__}",
            "published_at": time.time(),
            "entries": election.steering.view(entries.values(), election.marks, describe),
        }
        election.steering.publish(view)
