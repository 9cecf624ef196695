"""Taking a beat term over: count every entry from the last send of any earlier leader.

A beat that takes a term over (its first tick with a new token) reads the
send marks of every earlier leader (:mod:`celery_leader.beat.election`)
and the schedule controls, and sends nothing until both are known. It then
counts each entry from the previous leaders' last send (the later of that
mark and the scheduler's own shared record, see
:mod:`celery_leader.beat.state`), so it neither sends early nor skips; a
slot that passed while nobody led is sent once, skipped, or sent only
within a catch-up window by the missed policy: ``leader_beat_missed`` (a
dict of entry name to ``"once"``, ``"skip"`` or seconds) with
``leader_beat_missed_default`` (``"once"``); see
:mod:`celery_leader.beat.catch_up`. It never sends an entry whose last send
(by anyone) already covers the current slot (:func:`_slot_already_sent`).
RedBeat writes its own last runs to Redis before each publish and needs
none of the marks: the missed policy is applied to its own record.

What each policy guarantees. A publish and its mark are two writes to two
systems, so a window of milliseconds between them cannot be closed. An old
leader that published and died inside it (or whose mark the store did not
take within ``leader_store_timeout``) leaves the slot unmarked.
``"once"`` then sends that slot again: at least once per slot. ``"skip"``
does not: at most once per slot. Outside that window, no slot is sent before
its time, none twice, and none skipped.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
from typing import Any

from celery_leader.beat.base import LeaderSchedulerBase
from celery_leader.beat.catch_up import catch_up
from celery_leader.beat.state import schedule_time
from celery_leader.skip_reasons import SLOT_WINDOW

#: The logger beat's lines have always had (logging configurations name it).
logger = logging.getLogger("celery_leader.beat.scheduler")

#: A send counts as covering the current slot when less than this fraction of
#: the period was left after it (ticks jitter by milliseconds).
SLOT_TOLERANCE = 0.1


def _slot_already_sent(entry: Any, mark: dict[str, Any] | None) -> bool:
    """True when the last send (*mark*) already covers the slot *entry* is due for now."""
    if not mark:
        return False
    last = schedule_time(entry, float(mark["at"]))
    remaining = entry.schedule.remaining_estimate(last).total_seconds()
    elapsed = max(0.0, time.time() - float(mark["at"]))
    return bool(remaining > SLOT_TOLERANCE * (remaining + elapsed))


def _slot_missed(entry: Any, last_sent: float) -> bool:
    """True when at least one slot passed since the last send (unix time *last_sent*)."""
    last = schedule_time(entry, last_sent)
    return bool(entry.schedule.remaining_estimate(last).total_seconds() <= 0)


class TakingOver(LeaderSchedulerBase):
    """The led scheduler's takeover of a term; see the module docstring."""

    def _on_elected(self, token: int) -> bool:
        """Count every entry from the previous leaders' last send, by the missed policy.

        A slot that passed while nobody led is then due: the next tick sends
        it once (the scheduler's own checks, such as a one-off entry already
        run, still apply), or, under ``"skip"``, the entry counts from now.
        False when the last sends could not be read: nothing is sent until
        they are.
        """
        election = self._election()
        if not election.refresh_marks():
            return False
        if not election.steering.take_over(election.own_state, election.manager.holder.lease_id):
            return False  # a pause must hold across failovers: nothing sent before it is known
        logger.info("celery-leader beat: this beat sends now (token %d)", token)
        state = self._leader_state
        state.reload(self)
        if not state.uses_marks:
            # The scheduler's shared state already holds every leader's sends.
            self._leader_window_on_own_record()
            return True
        entries = list(self.schedule.values())  # type: ignore[attr-defined]
        marks = {
            entry.name: float(election.marks[entry.name]["at"])
            for entry in entries
            if entry.name in election.marks
        }
        try:
            last_sent = state.last_sent(self, marks)
        except Exception as exc:  # noqa: BLE001 - a database hiccup must not stop beat
            logger.warning(
                "celery-leader beat: could not read the schedule's last runs (%s); counting "
                "from the lease store's record",
                exc,
            )
            last_sent = marks
        for entry in entries:
            if entry.name in last_sent:
                try:
                    self._take_over(entry, last_sent[entry.name])
                except Exception:
                    logger.exception("celery-leader beat: could not take %s over", entry.name)
        self._save_anchors()
        return True

    def _save_anchors(self) -> None:
        try:
            self._leader_state.save_anchors(self)
        except Exception as exc:  # noqa: BLE001 - the scheduler's own sync tries again
            logger.warning("celery-leader beat: could not save the re-anchored entries: %s", exc)

    def _take_over(self, entry: Any, last_sent: float) -> None:
        """Count *entry* from *last_sent*, or from now if its missed slot is out of its window.

        See :mod:`celery_leader.beat.catch_up`: ``"once"`` sends the missed
        slot whatever its age, ``"skip"`` never, a window in seconds only
        when the latest missed slot is that young.
        """
        state = self._leader_state
        state.note_sent(self, entry, last_sent)
        if _slot_missed(entry, last_sent) and not self._leader_catch_up(entry, last_sent):
            if self._leader_mode != "reserve":  # a reserving standby already moved on
                state.anchor(self, entry, time.time())
            return
        # Carry on from the last send, not from this beat's own record of the
        # entry (a standby's, which may lie almost a period later, or a
        # database's, which may be minutes old).
        state.anchor(self, entry, last_sent)

    def _leader_catch_up(self, entry: Any, last_sent: float) -> bool:
        """*entry* missed a slot since *last_sent*: True to send it once, by its missed policy."""
        if self._election().steering.paused_until(entry.name) is not None:
            logger.info("celery-leader beat: %s missed a slot; it is paused", entry.name)
            return True  # counted from its last send; its paused slots are consumed as they come
        window = self._leader_beat.catch_up_window(entry.name)
        if catch_up(entry, last_sent, window, time.time()):
            logger.info("celery-leader beat: %s missed a slot; sending it once", entry.name)
            return True
        logger.info(
            "celery-leader beat: %s missed a slot; none within its catch-up window (%s): "
            "skipped, counting from now",
            entry.name,
            "skip" if window == 0 else f"{window:g} s",
        )
        self._leader_count_skip(entry.name, SLOT_WINDOW)
        return False

    def _leader_window_on_own_record(self) -> None:
        """For schedulers that keep their own last runs (RedBeat): the missed policy on those.

        Their standbys do not tick, so at takeover an entry whose last run is
        a slot or more behind is due; under ``"skip"`` or a window it is
        moved on to now unless a slot fell within the window. ``"once"``
        leaves the scheduler to send it, as it would.
        """
        entries = self._leader_entries()
        for entry in (entries or {}).values():
            if math.isinf(self._leader_beat.catch_up_window(entry.name)):
                continue
            last = getattr(entry, "last_run_at", None)
            if not isinstance(last, dt.datetime):
                continue
            if last.tzinfo is None:
                last = last.replace(tzinfo=dt.timezone.utc)
            sent = last.timestamp()
            try:
                if _slot_missed(entry, sent) and not self._leader_catch_up(entry, sent):
                    self._leader_state.anchor(self, entry, time.time())
            except Exception:
                logger.exception("celery-leader beat: could not take %s over", entry.name)
