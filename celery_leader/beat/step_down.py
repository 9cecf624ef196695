"""Step-down requests for beat: ``celery leader step-down --beat``, through the lease store.

Beat consumes no broker queue, so the command cannot reach the beat leader
as it reaches a worker. It writes a request, naming the token of the term
it asks to end, into the state of a request slot beside beat's election
(:func:`step_down_channel`: a lease name of its own, which anyone may write
by taking its lease for the moment of the write). Beat's own lease and
state stay the beat holder's alone.

The beat leader looks for a request at most every :data:`STEP_DOWN_POLL`
seconds (and a renew interval) while it sends, one store call bounded by
``leader_store_timeout`` on helpers of its own. A request naming its term's
token makes it save its schedule (as at shutdown) and ask the lease thread
to release and sit out one ttl: the release guard still holds the lease
while a send may land unrecorded, so no slot is sent twice, and another
beat takes over at once. A request for any other term (an earlier one, or
one this beat never led) is ignored: a request can only end the term it
names.
"""

from __future__ import annotations

import json
import logging
import threading
import time

from celery_leader.beat.base import LeaderSchedulerBase
from celery_leader.beat.election import BeatElection
from celery_leader.exceptions import StoreError
from celery_leader.settings import step_down_slot

#: The logger beat's lines have always had (logging configurations name it).
logger = logging.getLogger("celery_leader.beat.scheduler")

#: The state key of the step-down request in its slot.
STEP_DOWN_KEY = "request"
#: The longest a sending beat goes between two looks for a step-down request, seconds.
STEP_DOWN_POLL = 1.0


def step_down_channel(beat_election: str) -> str:
    """The request slot beside beat's election *beat_election*: a lease name of its own.

    The command writes a request into the slot's state (anyone may, by taking
    the slot's lease for the moment of the write); the beat leader reads it.
    Beat's own lease and state stay the beat holder's alone. The name is
    derived in :func:`celery_leader.settings.step_down_slot`.
    """
    return step_down_slot(beat_election)


def step_down_request(token: int, by: str) -> str:
    """The request to end the beat term *token*, as stored (*by* names who asked)."""
    return json.dumps({"token": token, "by": by, "at": time.time()})


def requested_token(state: dict[str, str]) -> int | None:
    """The term the slot's *state* asks to end, or None."""
    try:
        token = json.loads(state[STEP_DOWN_KEY])["token"]
    except (KeyError, TypeError, ValueError):
        return None
    return token if isinstance(token, int) and not isinstance(token, bool) else None


class StepDownRequests(LeaderSchedulerBase):
    """The beat leader's look for step-down requests; see the module docstring."""

    #: When this beat last looked for a step-down request (monotonic clock).
    _leader_step_down_looked_at = 0.0
    #: The term this beat was asked to end (it asks the lease thread once per term).
    _leader_step_down_token: int | None = None

    def _leader_step_down_if_asked(self, election: BeatElection, token: int | None) -> None:
        """Give beat's lease up when ``celery leader step-down --beat`` asked this term to.

        Beat consumes no broker queue, so the request comes through the lease
        store (see :func:`step_down_channel`). While this beat sends, it looks
        at most every :data:`STEP_DOWN_POLL` seconds, one store call bounded by
        ``leader_store_timeout``. A request naming this term's token makes it
        save its schedule (as at shutdown) and ask the lease thread to release
        and sit out one ttl: the release guard still holds the lease while a
        send may land unrecorded, so no slot is sent twice, and another beat
        takes over at once. A request for any other term is ignored.
        """
        now = time.monotonic()
        # At most once a renew interval (and a second): one read each time, per beat leader.
        every = max(STEP_DOWN_POLL, election.settings.timing.renew_interval)
        if (
            token is None
            or token == self._leader_step_down_token
            or now - self._leader_step_down_looked_at < every
        ):
            return
        self._leader_step_down_looked_at = now
        channel = step_down_channel(election.settings.name)
        try:
            # Bounded like beat's other store calls: a hung store holds the tick that long.
            state = election.read_step_down_requests(channel)
        except StoreError:
            return  # looked for again at the next poll
        if requested_token(state) != token:
            return
        self._leader_step_down_token = token
        sit_out = election.settings.timing.ttl
        logger.warning(
            "celery-leader beat: asked to step down (token %d): releasing beat's lease, then "
            "sitting out %g s",
            token,
            sit_out,
        )
        try:
            self.sync()  # type: ignore[attr-defined]
        except Exception:
            logger.exception("celery-leader beat: could not save the schedule")
        # Off beat's loop: the lease thread releases once no send is in flight.
        threading.Thread(
            target=election.manager.step_down,
            kwargs={"sit_out": sit_out},
            name="celery-leader-beat-step-down",
            daemon=True,
        ).start()
