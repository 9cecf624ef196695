"""Crash failover of ``celery beat`` with ``leader_fast_failover``: the rounds of one store and ttl.

Run through :mod:`benchmarks.fast_failover` (``--what beat``). Two real
``celery beat`` processes (``LeaderScheduler`` over PersistentScheduler, standby
mode ``reserve``) and one worker that runs what they send, Redis broker, a
lease store of the kind given, ``leader_fast_failover = True``. The schedule
has one entry every 0.1 s, so that it adds at most a tenth of a second to the
first send. Each round waits for the sending beat, strikes at a random point
of its renew cycle, SIGKILLs it, and measures two things:

* **takeover**: from the kill to the standby's "leads election" log line (it
  holds beat's lease; the line says "whose process died" when the lifeline,
  not the lease's expiry, let it in). The log's clock is the wall clock, in
  milliseconds.
* **first send**: from the kill to the worker's run of the first message the
  standby sent (the first carrying the new term's token), on the monotonic
  clock the worker and this process share.

A new beat replaces the dead one before the next round. Every round also
checks that the new term's token is higher, and counts the slots (the
occurrence each message carries) that reached the worker twice.
"""

from __future__ import annotations

import datetime as dt
import random
import re
import signal
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.cluster import Beat, Cluster
from tests.store_matrix import STORES

#: The schedule's period, seconds: the longest the schedule itself can delay a first send.
EVERY = 0.1


@dataclass
class BeatFigures:
    """Seconds from each SIGKILL of the sending beat, per round; what each round saw."""

    takeover: list[float] = field(default_factory=list)
    first_send: list[float] = field(default_factory=list)
    #: Rounds in which the standby took over at the lease's expiry, not by the lifeline.
    expired: int = 0
    #: Slots that reached the worker twice (a send whose mark the killed beat never wrote).
    twice: int = 0

    def as_json(self) -> dict[str, object]:
        return {
            "takeover": self.takeover,
            "first_send": self.first_send,
            "expired": self.expired,
            "twice": self.twice,
        }


def _elected_line(election: str, token: int) -> re.Pattern[str]:
    return re.compile(
        r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): [^\]]*\] celery-leader: \S+ leads election "
        + re.escape(repr(election))
        + rf" \(token {token}\)(.*)$",
        re.MULTILINE,
    )


def _elected_at(beat: Beat, election: str, token: int) -> tuple[float, bool] | None:
    """Unix time of *beat*'s "leads election" line for *token*, and whether a death let it in."""
    found = _elected_line(election, token).search(beat.text())
    if found is None:
        return None
    at = dt.datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return at, "whose process died" in found.group(2)


def _wait_following(beat: Beat, election: str, timeout: float) -> None:
    """Wait until *beat* has looked at beat's lease and seen it led (it follows the leader)."""
    deadline = time.monotonic() + timeout
    seen = f"election {election!r} is led by"
    while time.monotonic() < deadline:
        if seen in beat.text():
            return
        if beat.proc.poll() is not None:
            raise RuntimeError(f"{beat.nodename} exited:\n{beat.text()[-3000:]}")
        time.sleep(0.05)
    raise RuntimeError(f"{beat.nodename} does not follow:\n{beat.text()[-3000:]}")


def _sent_under_another(cluster: Cluster, token: int) -> bool:
    return any(s["token"] != token for s in cluster.beat_sends())


@contextmanager
def fast_cluster(kind: str, ttl: float, tmp: Path) -> Iterator[Cluster]:
    """A cluster (Redis broker) with ``leader_fast_failover`` on a fresh store of *kind*.

    Started empty; closed (every process stopped) on exit, then the store.
    """
    with (
        pytest.MonkeyPatch.context() as monkeypatch,
        STORES[kind].run(tmp / "store", monkeypatch) as store,
    ):
        cluster = Cluster(tmp / "cluster", "redis", store_url=store.url)
        cluster.env["LEADER_TTL"] = f"{ttl:g}"
        cluster.env["LEADER_FAST_FAILOVER"] = "1"
        try:
            yield cluster
        finally:
            cluster.close()


def beat_failover_rounds(kind: str, ttl: float, rounds: int, tmp: Path) -> BeatFigures:
    """*rounds* SIGKILLs of the sending beat on a store of *kind* with lease *ttl*."""
    figures = BeatFigures()
    rng = random.Random(1)
    with fast_cluster(kind, ttl, tmp) as cluster:
        cluster.env["LEADER_BEAT_EVERY"] = f"{EVERY:g}"
        election = cluster.beat_election
        cluster.prime_store(cluster.name, election)
        cluster.start(1)
        for _ in range(2):
            cluster.start_beat()
        for index in range(rounds):
            old, token = cluster.sending_beat(timeout=ttl * 3 + 20)
            (standby,) = [b for b in cluster.beats if b is not old and b.proc.poll() is None]
            _wait_following(standby, election, timeout=30)
            cluster.history_client.delete("history")
            time.sleep(0.5 + rng.uniform(0, ttl / 3))
            killed_wall, killed_at = time.time(), time.monotonic()
            old.signal(signal.SIGKILL)
            deadline = killed_at + ttl * 3 + 10
            while not _sent_under_another(cluster, token) and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.3)  # the slots sent meanwhile reach the worker
            sends = cluster.beat_sends()
            new = [s for s in sends if s["token"] != token]
            where = f"{kind}, ttl {ttl:g}, round {index}"
            if not new:
                raise RuntimeError(f"{where}: nothing sent after the kill")
            first = new[0]
            if min(s["token"] for s in new) <= token:
                raise RuntimeError(f"{where}: a token not above the killed beat's {token}")
            elected = _elected_at(standby, election, first["token"])
            if elected is None:
                raise RuntimeError(f"{where}: the standby has no line for {first['token']}")
            figures.takeover.append(elected[0] - killed_wall)
            figures.first_send.append(first["at"] - killed_at)
            figures.expired += not elected[1]
            occurrences = Counter(s["occurrence"] for s in sends)
            figures.twice += sum(n > 1 for n in occurrences.values())
            old.proc.wait(10)
            cluster.start_beat()
    return figures
