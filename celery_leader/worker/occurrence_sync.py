"""An election's completed occurrences in its lease store: read at each term, written through.

The record of completed occurrences (:mod:`celery_leader.worker.occurrences`)
lives beside the election's lease, in its state (``LeaseStore.get_state`` /
``set_state``), one key per task: ``occurrences:<task name>``, the task's
whole record as JSON with the token of the term that wrote it. Per worker
election, one daemon thread makes every store call for it, so none runs on
the consumer's loop, the lease thread or a pool thread; each call is bounded
by the store timeout (``leader_store_timeout``) on a bounded caller of its
own (:mod:`celery_leader.lease.bounded`).

Guarantees:

* **A term starts with the record read.** When the election is elected,
  the lease thread only marks the term; the thread reads the state and
  merges it into memory. Until that read returned or failed,
  :meth:`OccurrenceSync.ready` is False for the term: the gate admits no
  leader message under it and the leader queue is not consumed. That costs
  at most one store timeout at the start of a term.
* **A failed read does not stop the term.** A warning is logged and the
  term goes on with what this worker remembers (at-least-once, as without
  the record); the read is retried every renew interval while the term
  lasts, and merged when it succeeds. Nothing is written before a read of
  the term succeeded: a write would replace the stored record with this
  worker's partial one.
* **Completions are written through.** When a run completes, its task's
  record is written under the term's lease id: the store refuses a holder
  whose lease is gone (fenced), and a refused write is dropped at debug
  level. Writes coalesce per task (the latest record wins). One that fails
  while the term lasts is retried every renew interval.
* **Writes are finished before a release.** The election's release guard
  gives the writes of the ending term up to one store timeout
  (:meth:`OccurrenceSync.flush`), so a step-down or a warm shutdown hands
  the next leader a complete record.
* **Nothing is lost by a re-election.** At the next term this worker
  writes back what it remembers and the store lacks.

Limits: a run that completes after its term ended (``on_loss="finish"``)
is remembered in this worker's memory only, until this worker leads again.
The record lasts as long as the store keeps its state: a store that lost its
data (an empty Redis) starts the next term with none.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from celery_leader.exceptions import StoreError
from celery_leader.lease.bounded import BoundedCaller, store_call
from celery_leader.stores.base import LeaseStore
from celery_leader.worker.occurrences import STATE_PREFIX, Occurrences

logger = logging.getLogger(__name__)

Job = Callable[[], None]
#: How often :meth:`OccurrenceSync.flush` looks whether the runs settled, seconds.
_SETTLE_POLL = 0.02


@dataclass
class _Term:
    """A term of the election, as the sync thread serves it."""

    token: int
    lease_id: str
    #: A read of the state succeeded in this term: writes may go out.
    loaded: bool = False
    #: The gate may admit messages under this term (read, or the read failed).
    ready: bool = False
    #: A failed read was logged at warning level in this term.
    warned: bool = False
    #: A failed write was logged at warning level in this term.
    write_warned: bool = False
    #: When the next read or write may be tried (monotonic; after a failure).
    retry_at: float = 0.0


class OccurrenceSync:
    """Reads and writes one election's completed occurrences; see the module docstring.

    *leading(token)* says whether the election still leads in term *token*
    (failed calls are retried only then); *on_ready(token)* is told, on
    the sync thread, once the gate may admit messages under *token*.
    """

    def __init__(
        self,
        occurrences: Occurrences,
        store: LeaseStore,
        name: str,
        *,
        timeout: float,
        retry_every: float,
        leading: Callable[[int], bool],
        on_ready: Callable[[int], None],
    ) -> None:
        self._occurrences = occurrences
        self._store = store
        self._name = name
        self._timeout = timeout
        self._retry_every = retry_every
        self._leading = leading
        self._on_ready = on_ready
        self._calls = BoundedCaller(f"{name}:occurrences")
        self._cond = threading.Condition()
        self._term: _Term | None = None
        #: Tasks whose record changed since it was last written.
        self._dirty: set[str] = set()
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None

    # -- any thread -----------------------------------------------------------

    def begin_term(self, token: int, lease_id: str) -> None:
        """Term *token* (held under *lease_id*) began: read the record (lease thread)."""
        with self._cond:
            if self._closed:
                return
            # What an earlier term left unwritten is found again by the read (absorb).
            self._term = _Term(token, lease_id)
            self._dirty.clear()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"celery-leader-occurrences[{self._name}]", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def ready(self, token: int | None) -> bool:
        """True once the gate may admit messages under term *token*."""
        term = self._term
        return term is not None and term.token == token and term.ready

    def completed(self, task: str) -> None:
        """Task *task*'s record grew: write it (coalesced with other changes)."""
        with self._cond:
            if self._closed:
                return
            self._dirty.add(task)
            self._cond.notify_all()

    def flush(self, token: int, timeout: float) -> bool:
        """Wait up to *timeout* s for the writes of term *token*; True when none is left.

        Also waits for the runs the gate handed out to be settled: a run whose
        child finished may not be reported to this process yet (its result is
        on its way), and its completion belongs in the record.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._flushed(token) or self._occurrences.running():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                # A run that settles without completing wakes nobody: look again soon.
                self._cond.wait(min(left, _SETTLE_POLL))
            return True

    def close(self) -> None:
        """Stop the thread once its call in progress returns; nothing more is written."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._calls.close()

    def _flushed(self, token: int) -> bool:
        term = self._term
        if self._busy:
            return False
        return term is None or term.token != token or not term.loaded or not self._dirty

    # -- the sync thread ------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                job = self._next_job()
                while job is None and not self._closed:
                    self._cond.wait(self._idle_time())
                    job = self._next_job()
                if job is None or self._closed:
                    return
                self._busy = True
            try:
                job()
            except Exception:
                logger.exception("celery-leader: error while syncing completed occurrences")
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _next_job(self) -> Job | None:
        """What to do now (under the lock): read, write, or nothing."""
        term = self._term
        if term is None or time.monotonic() < term.retry_at:
            return None
        if not term.loaded:
            return lambda: self._load(term)
        if self._dirty:
            tasks = sorted(self._dirty)
            self._dirty.clear()
            return lambda: self._write(term, tasks)
        return None

    def _idle_time(self) -> float | None:
        """How long to sleep with nothing to do now: until a retry is due, or until woken."""
        term = self._term
        if term is None or (term.loaded and not self._dirty) or math.isinf(term.retry_at):
            return None
        return max(term.retry_at - time.monotonic(), 0.0)

    def _load(self, term: _Term) -> None:
        try:
            state = store_call(
                self._calls.call,
                lambda: self._store.get_state(self._name),
                self._timeout,
                "read completed occurrences",
                self._store.url,
            )
        except StoreError as exc:
            with self._cond:
                first = not term.warned
                term.warned = True
                # Retried while the term lasts; a term over is never read again.
                again = self._leading(term.token)
                term.retry_at = time.monotonic() + self._retry_every if again else math.inf
                ready = self._make_ready(term)
            if first:
                logger.warning(
                    "celery-leader: could not read the completed occurrences of election %r "
                    "(token %d): %s; until they are read, a message of an occurrence that "
                    "completed under an earlier leader may run again (retrying every %g s)",
                    self._name,
                    term.token,
                    exc,
                    self._retry_every,
                )
            if ready:
                self._on_ready(term.token)
            return
        behind, unreadable = self._occurrences.absorb(state)
        if unreadable:
            logger.warning(
                "celery-leader: election %r: state keys %s hold no occurrence record this "
                "version can read; they are replaced at the next completion",
                self._name,
                ", ".join(sorted(unreadable)),
            )
        with self._cond:
            if self._term is term:
                term.loaded = True
                term.retry_at = 0.0
                self._dirty.update(behind)
            ready = self._make_ready(term)
            retried = term.warned
        if retried:
            logger.info(
                "celery-leader: read the completed occurrences of election %r (token %d)",
                self._name,
                term.token,
            )
        if ready:
            self._on_ready(term.token)

    def _make_ready(self, term: _Term) -> bool:
        """Mark *term* ready when it is still the current one; True when it just became so."""
        if self._term is not term or term.ready:
            return False
        term.ready = True
        return True

    def _write(self, term: _Term, tasks: list[str]) -> None:
        failed: list[str] = []
        error: StoreError | None = None
        for task in tasks:
            key = STATE_PREFIX + task
            value = self._occurrences.snapshot(task, term.token)
            try:
                written = store_call(
                    self._calls.call,
                    functools.partial(self._store.set_state, self._name, term.lease_id, key, value),
                    self._timeout,
                    "write completed occurrences",
                    self._store.url,
                )
            except StoreError as exc:
                failed.append(task)
                error = exc
                continue
            if not written:
                logger.debug(
                    "celery-leader: election %r: the completed occurrences of %s were not "
                    "written: the lease of term %d is gone",
                    self._name,
                    task,
                    term.token,
                )
        if not failed:
            return
        with self._cond:
            again = self._term is term and self._leading(term.token)
            if again:
                self._dirty.update(failed)
                term.retry_at = time.monotonic() + self._retry_every
            loud = again and not term.write_warned
            term.write_warned = term.write_warned or loud
        logger.log(
            logging.WARNING if loud else logging.DEBUG,
            "celery-leader: election %r: could not write the completed occurrences of %s "
            "(token %d): %s%s",
            self._name,
            ", ".join(failed),
            term.token,
            error,
            f"; retrying in {self._retry_every:g} s" if again else "; the term is over",
        )
