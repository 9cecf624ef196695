"""An election's completed occurrences in its lease store: read at each term, written through.

The record of completed occurrences (:mod:`celery_leader.worker.occurrences`)
lives beside the election's lease, in its state (``LeaseStore.get_state`` /
``set_state``), one key per *shard*: per task and entry,
``occurrences:["<task>","<entry>"]``, and per task for its other headers,
``occurrences:["<task>"]`` (:func:`~celery_leader.worker.occurrences.state_key`),
each the shard's record as JSON with the token of the term that wrote it. A
completion rewrites its own entry's shard only, never the task's other
entries. Per worker election, one daemon thread makes every store call for
it, so none runs on the consumer's loop, the lease thread or a pool thread;
each call is bounded by the store timeout (``leader_store_timeout``) on a
bounded caller of its own (:mod:`celery_leader.lease.bounded`).

Guarantees:

* **A term starts with the record read.** When the election is elected,
  the lease thread only marks the term; the thread reads the state and
  merges it into memory. Until that read returned or failed,
  :meth:`OccurrenceSync.ready` is False for the term: the gate admits no
  leader message under it and the leader queue is not consumed. That costs
  at most two store timeouts at the start of a term: one call of an
  earlier term still in flight (a write job stops before its next key once
  the term changed, and the read goes before any write), then the read.
* **A failed read does not stop the term.** A warning is logged and the
  term goes on with what this worker remembers (at-least-once, as without
  the record); the read is retried every renew interval while the term
  lasts, and merged when it succeeds. The same holds for any error while
  merging what was read. A key whose value cannot be read (malformed, of
  another version) is skipped, and logged at warning level once. Nothing
  is written before a read of the term succeeded: a write would replace a
  stored shard with this worker's partial one.
* **Completions are written through, at most once per renew interval per
  key.** The first change of a shard is written at once; further changes
  within a renew interval of its last write are coalesced into one write
  when that interval is over. Writes go under the term's lease id: the
  store refuses a holder whose lease is gone (fenced), and a refused write
  is dropped at debug level. A write job stops at its first failure (one
  store timeout at most); what it had left is retried every renew interval
  while the term lasts. Each shard is copied under the record's lock and
  pruned and serialised outside it.
* **Writes are finished before a release.** The election's release guard
  gives the ending term up to one store timeout (:meth:`OccurrenceSync.flush`):
  it waits for the term's runs whose completion may still be on its way
  (not those whose process is known gone, none at all when the term ended
  by a loss), then writes every changed shard at once, whatever the rate
  limit and the retry interval, so a step-down or a warm shutdown hands the
  next leader a complete record.
* **Nothing is lost by a re-election.** At the next term this worker
  writes back what it remembers and the store lacks.
* **Memory is pruned.** Every :data:`SWEEP_EVERY` seconds every shard is
  pruned to the retention rules; a shard forgotten whole is written empty
  while the term lasts.

Limits: a run that completes after its term ended (``on_loss="finish"``)
is remembered in this worker's memory only, until this worker leads again.
The record lasts as long as the store keeps its state: a store that lost its
data (an empty Redis) starts the next term with none. The store interface
has no delete: the key of a shard stays, emptied (tens of bytes) once its
entry is forgotten; an entry name used once (a one-off entry) leaves one
such key. Azure Blob keeps the whole state in one blob: there, every write
still rewrites all of it, and the rate limit is what bounds the volume.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from celery_leader.exceptions import StoreError
from celery_leader.lease.bounded import BoundedCaller, store_call
from celery_leader.stores.base import LeaseStore
from celery_leader.worker.occurrences import Occurrences, Shard, state_key

logger = logging.getLogger(__name__)

#: How often :meth:`OccurrenceSync.flush` looks whether the runs settled, seconds.
_SETTLE_POLL = 0.02
#: How often every shard in memory is pruned, seconds.
SWEEP_EVERY = 600.0
_READ, _WRITE, _SWEEP = "read", "write", "sweep"


@dataclass
class _Term:
    """A term of the election, as the sync thread serves it."""

    token: int
    lease_id: str
    #: When the term began here (monotonic).
    began: float = field(default_factory=time.monotonic)
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


@dataclass
class _Job:
    """One turn of the sync thread: a read or a write for *term*, or a sweep."""

    kind: str
    term: _Term | None
    #: A write's shards still to write, the next one last.
    shards: list[Shard] = field(default_factory=list)


class OccurrenceSync:
    """Reads and writes one election's completed occurrences; see the module docstring.

    *leading(token)* says whether the election still leads in term *token*
    (failed calls are retried only then); *on_ready(token)* is told, on
    the sync thread, once the gate may admit messages under *token*. Each
    key is written at most once per *retry_every* seconds (the renew
    interval), except by :meth:`flush`.
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
        sweep_every: float = SWEEP_EVERY,
    ) -> None:
        self._occurrences = occurrences
        self._store = store
        self._name = name
        self._timeout = timeout
        self._retry_every = retry_every
        self._leading = leading
        self._on_ready = on_ready
        self._sweep_every = sweep_every
        self._calls = BoundedCaller(f"{name}:occurrences")
        self._cond = threading.Condition()
        self._term: _Term | None = None
        #: Shards whose record changed since it was last written.
        self._dirty: set[Shard] = set()
        #: When each shard written within the last renew interval was (monotonic).
        self._written_at: dict[Shard, float] = {}
        #: The token of the term a release flush is under way for: no rate limit then.
        self._flushing: int | None = None
        self._sweep_at = time.monotonic() + sweep_every
        #: State keys found unreadable and logged (each is logged once).
        self._warned_keys: set[str] = set()
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None

    # -- any thread -----------------------------------------------------------

    def begin_term(self, token: int, lease_id: str) -> None:
        """Term *token* (held under *lease_id*) began: read the record (lease thread)."""
        with self._cond:
            if self._closed:
                return
            # What an earlier term left unwritten is found again by the read (absorb); a
            # write job of that term stops before its next key, so this read goes first.
            self._term = _Term(token, lease_id)
            self._dirty.clear()
            self._flushing = None
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

    def reading_for(self, token: int | None) -> float | None:
        """Seconds term *token* has waited for its record to be read; None when not waiting."""
        term = self._term
        if term is None or term.token != token or term.ready:
            return None
        return time.monotonic() - term.began

    def completed(self, shard: Shard) -> None:
        """Shard *shard*'s record grew: write it (coalesced, at most once per renew interval)."""
        with self._cond:
            if self._closed:
                return
            self._dirty.add(shard)
            self._cond.notify_all()

    def flush(
        self,
        token: int,
        timeout: float,
        *,
        settle_runs: bool = True,
        gone: Callable[[Any], bool] | None = None,
    ) -> bool:
        """Write what term *token* changed now, waiting up to *timeout* s; True when none is left.

        First waits for the runs of the term still unsettled (their child may
        have finished before this process heard of it: the completion is on
        its way and belongs in the record), not counting those *gone* says
        ended with their process (killed: nothing is on its way); with
        *settle_runs* False (a term ended by a loss: the loop may be stuck,
        and would settle none), for none. Every changed shard is then written
        at once, whatever the rate limit, and a write that failed earlier is
        tried again now rather than after the retry interval.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            term = self._term
            if term is None or term.token != token:
                return True
            self._flushing = token
            if term.loaded and not math.isinf(term.retry_at):
                term.retry_at = 0.0  # the retry interval is longer than this wait: try now
            self._cond.notify_all()
            try:
                while True:
                    runs = settle_runs and self._occurrences.unsettled(token, gone) > 0
                    if not runs and self._flushed(token):
                        return True
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    # A run that settles without completing wakes nobody: look again soon.
                    self._cond.wait(min(left, _SETTLE_POLL))
            finally:
                if self._flushing == token:
                    self._flushing = None
                    self._cond.notify_all()  # the thread may sleep with no sweep planned

    def close(self) -> None:
        """Stop the thread once its call in progress returns; nothing more is written."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._calls.close()

    def _flushed(self, token: int) -> bool:
        term = self._term
        if term is None or term.token != token or not term.loaded:
            return True  # another term's now, or nothing may be written in this one
        return not self._busy and not self._dirty

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
                if job.kind == _READ:
                    self._load(job)
                elif job.kind == _WRITE:
                    self._write(job)
                else:
                    self._sweep()
            except Exception:
                logger.exception("celery-leader: error while syncing completed occurrences")
                try:
                    self._failed(job)
                except Exception:  # the thread must go on: it serves every later term too
                    logger.exception("celery-leader: error while syncing completed occurrences")
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _next_job(self) -> _Job | None:
        """What to do now (under the lock): the term's read first, then writes, then a sweep."""
        now = time.monotonic()
        term = self._term
        if term is not None and now >= term.retry_at:
            if not term.loaded:
                return _Job(_READ, term)
            due = self._due(term, now)
            if due:
                self._dirty.difference_update(due)
                gap = self._retry_every
                self._written_at = {s: t for s, t in self._written_at.items() if t + gap > now}
                self._written_at.update(dict.fromkeys(due, now))
                return _Job(_WRITE, term, due)
        if self._flushing is None and now >= self._sweep_at:
            self._sweep_at = now + self._sweep_every
            return _Job(_SWEEP, None)
        return None

    def _due(self, term: _Term, now: float) -> list[Shard]:
        """The changed shards that may be written now.

        All of them during a flush; else those not written within the last renew interval.
        """
        if self._flushing == term.token:
            return list(self._dirty)
        gap = self._retry_every
        return [s for s in self._dirty if self._written_at.get(s, -math.inf) + gap <= now]

    def _idle_time(self) -> float | None:
        """How long to sleep with nothing to do now: until a retry, a write or a sweep is due."""
        now = time.monotonic()
        waits = [] if self._flushing is not None else [self._sweep_at - now]
        term = self._term
        if term is not None and not math.isinf(term.retry_at):
            if term.retry_at > now:
                if not term.loaded or self._dirty:
                    waits.append(term.retry_at - now)
            elif term.loaded and self._dirty:
                gap = self._retry_every
                waits.append(
                    min(self._written_at.get(s, -math.inf) for s in self._dirty) + gap - now
                )
        return max(min(waits), 0.0) if waits else None

    def _failed(self, job: _Job) -> None:
        """*job* raised something unexpected: retry later, and never leave its term unready."""
        term = job.term
        if term is None:
            return  # a sweep: the next one is due in its time
        with self._cond:
            if self._term is not term:
                return
            again = self._leading(term.token)
            term.retry_at = time.monotonic() + self._retry_every if again else math.inf
            if job.kind == _WRITE and again:
                self._dirty.update(job.shards)
            ready = self._make_ready(term)
        if ready:
            self._tell_ready(term.token)

    def _load(self, job: _Job) -> None:
        term = job.term
        assert term is not None
        try:
            state = store_call(
                self._calls.call,
                lambda: self._store.get_state(self._name),
                self._timeout,
                "read completed occurrences",
                self._store.url,
            )
            behind, unreadable = self._occurrences.absorb(state)
        except Exception as exc:  # noqa: BLE001 - the store's or the merge's: either way unread
            self._unread(term, exc)
            return
        fresh = sorted(set(unreadable) - self._warned_keys)
        if fresh:
            self._warned_keys.update(fresh)
            logger.warning(
                "celery-leader: election %r: state keys %s hold no occurrence record this "
                "version can read; they are ignored (a shard's key is replaced at its next "
                "completion)",
                self._name,
                ", ".join(fresh),
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
            self._tell_ready(term.token)

    def _unread(self, term: _Term, exc: Exception) -> None:
        """The read of *term* failed (*exc*): the term goes on, and the read is retried."""
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
                exc if isinstance(exc, StoreError) else f"{type(exc).__name__}: {exc}",
                self._retry_every,
                exc_info=not isinstance(exc, StoreError),
            )
        if ready:
            self._tell_ready(term.token)

    def _make_ready(self, term: _Term) -> bool:
        """Mark *term* ready when it is still the current one; True when it just became so."""
        if self._term is not term or term.ready:
            return False
        term.ready = True
        return True

    def _tell_ready(self, token: int) -> None:
        try:
            self._on_ready(token)
        except Exception:
            logger.exception("celery-leader: error while starting to consume after a read")

    def _write(self, job: _Job) -> None:
        term = job.term
        assert term is not None
        error: StoreError | None = None
        while job.shards:
            with self._cond:
                if self._term is not term or self._closed:
                    # A new term: its read goes first, and finds again what is left here.
                    return
            shard = job.shards[-1]
            value = self._occurrences.snapshot(shard, term.token)
            try:
                written = store_call(
                    self._calls.call,
                    functools.partial(
                        self._store.set_state, self._name, term.lease_id, state_key(shard), value
                    ),
                    self._timeout,
                    "write completed occurrences",
                    self._store.url,
                )
            except StoreError as exc:
                # The rest would most likely fail too, each after a store timeout: retry later.
                error = exc
                break
            job.shards.pop()
            if not written:
                logger.debug(
                    "celery-leader: election %r: the completed occurrences of %s were not "
                    "written: the lease of term %d is gone",
                    self._name,
                    state_key(shard),
                    term.token,
                )
        if error is None:
            return
        with self._cond:
            again = self._term is term and self._leading(term.token)
            if again:
                self._dirty.update(job.shards)
                term.retry_at = time.monotonic() + self._retry_every
            loud = again and not term.write_warned
            term.write_warned = term.write_warned or loud
        logger.log(
            logging.WARNING if loud else logging.DEBUG,
            "celery-leader: election %r: could not write the completed occurrences of %d "
            "shards (token %d): %s%s",
            self._name,
            len(job.shards),
            term.token,
            error,
            f"; retrying in {self._retry_every:g} s" if again else "; the term is over",
        )

    def _sweep(self) -> None:
        emptied = self._occurrences.sweep()
        if not emptied:
            return
        with self._cond:
            term = self._term
            if term is not None and term.loaded and self._leading(term.token):
                self._dirty.update(emptied)  # written empty: the store forgets them too
