"""The token and hold-off rules every store applies on acquire: pure functions, no I/O.

This module is the one statement of the rules. The Python stores (SQLite,
Azure Blob, etcd, the simulation's model store) call it; the Redis and
PostgreSQL stores cannot (their rule runs on the server, in a Lua script and
in the function ``celery_leader_acquire()``, so that an acquire is one
request), so ``tests/stores/test_rules_oracle.py`` drives this module, and
every store, through the same inputs and checks that each returns what
these functions compute.

The two rules, for one acquire that succeeds:

* **The next fencing token** is ``max(last + 1, store clock, min_token + 1)``:
  above every token the counter handed out, above the clock (so that a counter
  lost or restored behind cannot produce an earlier token, provided the store's
  clock does not go back by more than the time between two acquisitions), and
  above the highest token the caller has seen. When the counter itself is
  missing, the clock stands in for it at the latest time its reading may mean
  (a clock that reads whole seconds may already be most of a second on).
* **The hold-off**: when the store may have forgotten the last term (see
  :func:`store_forgot`), the old holder may still trust its local validity for
  up to one ttl, so the new holder waits one ttl before acting. A holder that
  re-acquires its own lease (its earlier reply was lost) keeps what is left of
  its earlier hold-off. When all that changed is that the store's server
  restarted, keeping the identity of its data (PostgreSQL: the same cluster,
  on the same timeline), the wait ends one ttl after the server started,
  not one ttl after the acquire (see :func:`hold_off`).

Units are the caller's: tokens are integers (microseconds on the clock the
store uses for tokens); hold-off inputs may be integer microseconds or float
seconds, as long as one call uses one unit throughout.
"""

from __future__ import annotations

from typing import TypeVar

#: A time or a duration in the caller's unit (int microseconds or float seconds).
Time = TypeVar("Time", int, float)


def next_token(
    last: int | None, clock: int, min_token: int, *, clock_latest: int | None = None
) -> int:
    """The fencing token of a new term: ``max(last + 1, clock, min_token + 1)``.

    *last* is the store's counter, None when the store has none (new, or lost
    with the data). *clock* is the store clock's reading in token units
    (microseconds). *clock_latest* is the latest time that reading may stand
    for, when the clock reads in coarser steps than a token (Azure's ``Date``
    header reads whole seconds: ``clock + 1 s``); it defaults to *clock*.

    With a counter, the token is above it and above *clock*. Without one,
    earlier tokens may have run ahead of the clock's reading within its step,
    so the token is above *clock_latest* instead. Either way it is above
    *min_token*, and at least 1.

    Assumes the store's clock does not go back by more than the time between
    two acquisitions: only then is a token after a loss above every earlier one.
    """
    floor = int(min_token) + 1
    if last is None:
        latest = clock if clock_latest is None else clock_latest
        return max(1, latest, floor)
    return max(last + 1, clock, floor)


def lease_vanished_early(lease_present: bool, recorded_end: Time, now: Time) -> bool:
    """True when no lease is there although the end recorded for the last one is still ahead.

    The lease was removed behind the store's back (evicted, deleted by hand):
    its holder may still trust it until that end.
    """
    return not lease_present and recorded_end > now


def store_forgot(
    *,
    counter_missing: bool = False,
    data_replaced: bool = False,
    vanished_early: bool = False,
    ended_early: bool = False,
    cannot_tell: bool = False,
) -> bool:
    """Whether the store may have forgotten the last term, so the next holder must hold off.

    * *counter_missing*: no record of the last term (a new store, or one that
      lost its data).
    * *data_replaced*: the data is not the data the last term was recorded in
      (Redis: another incarnation; SQLite: another file).
    * *vanished_early*: see :func:`lease_vanished_early`.
    * *ended_early*: the store ended the last lease before its time (Azure: a
      broken lease, or one that ended between the look and the acquire).
    * *cannot_tell*: the store cannot see whether any of the above happened
      (Redis: an ACL user refused ``INFO``).

    Each store decides what it can observe; any one of them means a hold-off.
    """
    return counter_missing or data_replaced or vanished_early or ended_early or cannot_tell


def hold_off(
    *,
    now: Time,
    ttl: Time,
    own_hold_until: Time,
    forgot: bool,
    now_latest: Time | None = None,
    restarted_at: Time | None = None,
) -> tuple[Time, Time]:
    """The new term's hold-off: ``(hold_until, wait)``, both in the unit of the arguments.

    *now* is the store clock's reading at the acquire, *ttl* the new lease's
    length, *own_hold_until* the hold-off end recorded in the caller's own
    live lease (a re-acquire after a lost reply; 0 otherwise), *forgot* what
    :func:`store_forgot` says. *now_latest* is the latest time the reading may
    stand for (default *now*; Azure: the end of the whole second).

    ``hold_until`` is the end to record with the lease, on the store's clock,
    for readers that compare it with their own reading of that clock: with a
    store that forgot, one ttl from *now_latest*, never earlier than the own
    lease's end. ``wait`` is what the caller waits from the reply: what is left
    of its own hold-off, and with a store that forgot at least one ttl (the
    reply comes after the grant, so one ttl from it covers the old holder).

    *restarted_at* (on the store's clock) is when the store's server started,
    given when nothing but a restart changed since the last term: the server
    kept the identity of its data, so only an older copy of the same data
    started in its place (a file-system snapshot) could lack a term, and the
    store cannot tell that from a restart that kept every write. A holder of a
    term such a copy lacks wrote it to the server before the server stopped,
    so before *restarted_at*, and its local validity ends within one ttl of
    that: ``hold_until`` is then ``restarted_at + ttl`` and ``wait`` what is
    left of it (nothing once that passed), never less than the own hold-off.
    Assumes the old server stopped before the new one started (no two servers
    took writes for the data at once). Ignored when *forgot*.
    """
    zero = ttl * 0  # 0 in the caller's unit, int or float
    wait = max(zero, own_hold_until - now)
    until = own_hold_until
    if forgot:
        latest = now if now_latest is None else now_latest
        until = max(until, latest + ttl)
        wait = max(wait, ttl)
    elif restarted_at is not None:
        until = max(until, restarted_at + ttl)
        wait = max(wait, restarted_at + ttl - now)
    return until, wait
