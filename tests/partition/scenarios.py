"""Partition scenarios: a cluster on hosts of a harness.netbed bed, one network fault each.

A scenario starts the lease store, the broker and three ``celery worker``
processes of tests/integration/leaderapp.py, each on a host (a network
namespace) of its own; the run history lives on the controller, outside the
fault model. It streams leader-only ``chaos_work`` runs (0.2 s each, every
0.1 s; each writes through the fence with its token), finds the leader,
applies one :class:`Fault` against it (or a follower), heals, and judges the
history with the chaos checker (tests/chaos/checker.py): no run in flight
across a term change, no stale start, no stale write accepted, no message
lost (a duplicate is at-least-once delivery, counted, allowed).

Besides the checker's rules, each scenario measures and bounds:

* **new leader** (faults that take the lease from the leader): from the
  fault to the first run of a newer term; within ``ttl + NEW_LEADER_BOUND``, plus
  the time the fault takes to be noticed (:attr:`Fault.noticed_within`);
  and the old leader's ``leader_lost`` signal comes before the next
  leader's ``leader_elected``;
* **resumed**: from the heal to the first run started after it, within
  ``ttl + RESUME_BOUND``: after any partition heals, there is a leader
  running work again;
* **terms**: a fault that must not move the lease (a follower cut off)
  leaves one term. The leader cut from the broker alone does lose it: its
  consumer's loop waits on the broker and stops turning, and a worker whose
  loop does not turn is not live (it renews no more), so a worker that
  reaches the broker leads instead.

Stores and brokers plug in through :data:`STORES` and :data:`BROKERS` (a
function that starts the server on its hosts of the bed): Redis, PostgreSQL,
etcd (three members), Redis Sentinel (primary, replica, three sentinels;
also with ``min-replicas-to-write 1``) and Azure Blob (Azurite, ttl 15 s);
Redis and RabbitMQ. Where a store cannot keep guarantee 1 through a fault
(:attr:`Fault.expect`), the scenario shows what happens instead: the split
must be visible and the fence must refuse every stale write.
``python -m tests.partition`` runs every fault on every pair it applies to
and prints a table.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any, Protocol

from celery_leader.exceptions import StoreError
from celery_leader.stores import open_store
from harness.cluster import ROOT, Cluster, Worker
from harness.netbed import NetBed
from harness.servers import (
    AzuriteServer,
    EtcdCluster,
    EtcdMember,
    PostgresServer,
    RabbitMQServer,
    RedisServer,
    SentinelRedis,
)
from tests.chaos.checker import Summary, check, run_ends
from tests.chaos.run import RunWatcher
from tests.integration.streaming import streaming

#: The lease ttl of every store kind but those of :data:`STORE_TTL`.
TTL = 2.0
#: Store kinds whose rules want another ttl: Azure leases last 15..60 s.
STORE_TTL: dict[str, float] = {"azure": 15.0}
#: The share of the ttl between renewals by default (Azure's store renews every ttl/4).
RENEW_FRACTION: dict[str, float] = {"azure": 0.25}
#: Seconds past the ttl for a new term's first run after the leader lost its lease:
#: the lease running out, the follower noticing, kombu consuming the leader queue
#: (about a second), on a loaded machine.
NEW_LEADER_BOUND = 5.0
#: Seconds past the ttl, from a heal, for the leader (old or new) to run work again:
#: TCP retransmission backs off (a connection silent for seconds retries only every
#: second or more), then the client and kombu go on.
RESUME_BOUND = 6.0
#: Seconds past the ttl, from the heal, for a Sentinel store that refused every write
#: during the partition (min-replicas-to-write 1 with one replica) to have a leader
#: running work again: the sentinels turn the old primary into a replica only after it
#: has answered for 8 s (SENTINEL_PUBLISH_PERIOD * 4), a full sync follows, then the
#: promoted primary's hold-off of one ttl (another run id), then kombu consuming.
SENTINEL_HEAL_BOUND = 20.0
#: Seconds past the ttl, from the fault, for the sentinels to promote the replica and a
#: worker on their side to lead (after the hold-off of one ttl) while the old leader
#: still renews on the old primary.
SPLIT_BOUND = 20.0


def hold_past_two_ttls(ttl: float) -> float:
    """How long a fault that leaves the lease where it is lasts: past two ttls."""
    return 2 * ttl + 1.0


def hold_past_gap_bound(ttl: float) -> float:
    """Longer than the bound on a gap in the runs."""
    return ttl + NEW_LEADER_BOUND + 3.0


#: Workers are hosts w1, w2, w3; their node names start with the host's name.
WORKERS = 3


@dataclass
class Stage:
    """What a fault acts on: the bed, the leader's and the followers' hosts, the store."""

    net: NetBed
    leader: str
    followers: list[str]
    #: Host name -> the worker on it.
    workers: dict[str, Worker]
    #: The lease ttl and the default renew interval of this store kind.
    ttl: float
    renew: float
    #: The hosts the store runs on (one, or one per member), with their client ports.
    store_hosts: dict[str, int]
    broker_port: int
    store_url: str
    election: str
    store: BedServer
    #: When the store's server was started again after a fault that restarted it (taken
    #: just before the start: the server's own start time is no earlier).
    store_back_at: float | None = None


@dataclass(frozen=True)
class Fault:
    name: str
    description: str
    apply: Callable[[Stage], None]
    #: True: the leader must lose its lease during the fault, and another worker lead.
    #: False: the lease must stay where it is (one term). None: either.
    moves_lease: bool | None
    #: Seconds the fault lasts (given the ttl) when it does not wait for a newer term.
    hold: Callable[[float], float] = hold_past_two_ttls
    #: The store kinds the fault means something for (None: every kind).
    stores: tuple[str, ...] | None = None
    #: Undoes what a heal of the network does not (a process continued), before the heal.
    undo: Callable[[Stage], None] | None = None
    #: Store kind -> what the fault does there when it is not the rule:
    #: "split": two terms act at once until the heal (a guarantee the store cannot keep:
    #: only fencing is judged, and the split must show); "leaderless": no one leads while
    #: the fault lasts (the store refuses every write), a leader after the heal.
    expect: dict[str, str] = field(default_factory=dict)
    #: Seconds (given the ttl) the longest gap in the runs may exceed the usual bound by:
    #: the time the fault keeps the store away.
    gap_allowance: Callable[[float], float] = lambda ttl: 0.0
    #: Seconds (given the ttl and the renew interval) the bounds on a new leader and on a
    #: gap in the runs exceed the usual ones by: the time the fault takes to be noticed.
    noticed_within: Callable[[float, float], float] = lambda ttl, renew: 0.0
    #: The store restarts: the first acquire after it holds its holder off until one ttl
    #: after the server started, so the first run of a newer term starts at least a ttl
    #: after the store's server was started again.
    holds_off: bool = False


def _cut_store(stage: Stage) -> None:
    for host in stage.store_hosts:
        stage.net.cut(stage.leader, host)


def _cut_both(stage: Stage) -> None:
    _cut_store(stage)
    stage.net.cut(stage.leader, "broker")


def _one_way_store(stage: Stage) -> None:
    for host in stage.store_hosts:
        stage.net.cut_one_way(stage.leader, host)


def _slow_store(stage: Stage) -> None:
    # A round trip late by more than the renew interval: no renewal lands in time.
    for host, port in stage.store_hosts.items():
        stage.net.slow(stage.leader, host, port, delay_ms=stage.renew * 1000 * 1.5)


def _etcd_leader_minority(stage: Stage) -> None:
    """The etcd member the workers reach first (the first of the URL), made raft leader,
    cut from the other two members; the workers still reach every member. It is a
    minority of one: it cannot commit, and the other two elect a leader of their own."""
    assert isinstance(stage.store, EtcdOnBed)
    cluster = stage.store.cluster
    first = cluster.members[0]
    stage.store.lead(first)
    host = stage.store.host_of(first)
    for other in stage.store_hosts:
        if other != host:
            stage.net.cut(host, other)


#: Run inside a follower's host: opens a session as the PostgreSQL store opens its own,
#: takes the lease row's lock as an acquire does (SELECT ... FOR UPDATE inside its
#: transaction), says "locked", and waits to be killed before it commits.
_MID_ACQUIRE = """
import sys, time
from celery_leader.stores.postgres import _connect
conn = _connect(sys.argv[1], float(sys.argv[3]), "celery-leader")
conn.execute("BEGIN")
conn.execute("SELECT 1 FROM celery_leader_lease WHERE name = %s FOR UPDATE", (sys.argv[2],))
print("locked", flush=True)
time.sleep(600)
"""


def _follower_mid_acquire(stage: Stage) -> None:
    """A follower's store session cut off between its locking read and its commit.

    The follower's host is cut from the store while a session of it holds the
    lease row's lock inside a transaction; its process then dies, and its FIN
    is lost in the partition: to the server the session is idle in its
    transaction for as long as the partition lasts.
    """
    host = stage.followers[0]
    store_timeout = stage.renew / 2  # the store timeout a worker has by default
    locker = subprocess.Popen(
        [
            *stage.net.wrapper(host),
            sys.executable, "-c", _MID_ACQUIRE, stage.store_url, stage.election,
            str(store_timeout),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert locker.stdout is not None
        assert locker.stdout.readline().strip() == "locked", "the session took no lock"
        for store_host in stage.store_hosts:
            stage.net.cut(host, store_host)
    finally:
        locker.kill()
        locker.wait()


def _restart_store(stage: Stage) -> None:
    """The store's server killed (``kill -9``, as a crash) and started again on its host.

    PostgreSQL recovers from its WAL (the lease rows survive); its start time is
    another, so the next acquire holds its holder off until one ttl after the start
    (docs/stores/postgresql.md).
    """
    server = stage.store
    assert isinstance(server, PostgresServer)
    server.kill()
    server.start()


def _cut_store_and_restart_it(stage: Stage) -> None:
    """The leader cut from the store, and the store's server crashed and started again.

    Every lifeline ends with the restart, the cut-off leader's with the others, though
    it never hears of it: its confirmations stop coming back, so its term pauses within
    the lifeline's grace whatever it hears. The followers' readings start a new session
    and prove nothing: no early takeover. Redis comes back empty, PostgreSQL from its
    WAL; either way the next acquire holds off until one ttl after the start.
    """
    _cut_store(stage)
    server = stage.store
    assert isinstance(server, (PostgresServer, RedisServer))
    server.kill()
    stage.store_back_at = time.monotonic()
    server.start()


def _store_down_past_ttl(stage: Stage) -> None:
    """The store's server killed, left down past the ttl, and started again.

    The leader cannot renew and loses its lease; whoever acquires next finds another
    server start time and holds off until one ttl after it (docs/stores/postgresql.md).
    """
    server = stage.store
    assert isinstance(server, PostgresServer)
    server.kill()
    time.sleep(stage.ttl + 1.0)
    stage.store_back_at = time.monotonic()
    server.start()


def _freeze_follower(stage: Stage) -> None:
    """A follower's whole process group stopped (SIGSTOP) wherever it was: inside a store
    call, its watch's (a Redis follower's watch thread waits in a pub/sub read, a
    PostgreSQL one's in LISTEN's, an etcd one's in a watch stream; others poll), and
    wherever its lease manager was. It is continued after the hold, past the ttl; the
    scenario goes on a ttl more, in which it must not act (one term throughout)."""
    stage.workers[stage.followers[0]].signal(signal.SIGSTOP)


def _continue_follower(stage: Stage) -> None:
    stage.workers[stage.followers[0]].signal(signal.SIGCONT)


def _split_with_primary(stage: Stage) -> None:
    """{the leader, the primary} cut from {the followers, the replica, the sentinels}.

    The broker and the controller stay reachable from both sides: the leader keeps
    consuming, and renews on the old primary for as long as that primary takes writes,
    while the sentinels promote the replica and a follower leads there.
    """
    assert isinstance(stage.store, SentinelOnBed)
    others = [*stage.followers, *(h for h in stage.store_hosts if h != "store")]
    for side in (stage.leader, "store"):
        for other in others:
            stage.net.cut(side, other)


FAULTS = {
    fault.name: fault
    for fault in (
        Fault(
            "leader-store",
            "the leader cut from the store, both ways",
            _cut_store,
            moves_lease=True,
        ),
        Fault(
            # Its consumer's loop waits on the broker and stops turning: a worker whose
            # loop does not turn is not live and renews no more, so another worker, one
            # that reaches the broker, leads (the same as a stuck loop).
            "leader-broker",
            "the leader cut from the broker, both ways",
            lambda s: s.net.cut(s.leader, "broker"),
            moves_lease=True,
            # A loop is not live once it stood still for its liveness window: two renew
            # intervals, at least 1 s (celery_leader/worker/coordinator.py); 7.5 s on Azure.
            noticed_within=lambda ttl, renew: max(2 * renew, 1.0),
        ),
        Fault(
            "leader-both",
            "the leader cut from the store and the broker",
            _cut_both,
            moves_lease=True,
        ),
        Fault(
            "follower-off",
            "a follower cut off from every host",
            lambda s: s.net.isolate(s.followers[0]),
            moves_lease=False,
        ),
        Fault(
            "leader-store-oneway",
            "every packet from the leader to the store lost (the other way passes)",
            _one_way_store,
            moves_lease=True,
        ),
        Fault(
            "leader-store-slow",
            "the leader's round trips to the store 1.5 renew intervals late",
            _slow_store,
            moves_lease=True,
        ),
        Fault(
            "follower-mid-acquire",
            "a follower cut from the store mid-acquire, holding the lease row's lock",
            _follower_mid_acquire,
            moves_lease=None,
            hold=hold_past_gap_bound,
            stores=("postgres",),
        ),
        Fault(
            "etcd-leader-minority",
            "the etcd member the workers use, raft leader, cut from the other two members",
            _etcd_leader_minority,
            moves_lease=None,
            hold=hold_past_gap_bound,
            stores=("etcd",),
        ),
        Fault(
            "store-restart",
            "the store's server killed and started again (WAL recovery) while runs stream",
            _restart_store,
            moves_lease=None,
            hold=hold_past_gap_bound,
            stores=("postgres",),
        ),
        Fault(
            "store-down-restart",
            "the store's server killed, down past the ttl, then started again",
            _store_down_past_ttl,
            moves_lease=None,
            hold=hold_past_gap_bound,
            stores=("postgres",),
            gap_allowance=lambda ttl: ttl + 1.0,
            holds_off=True,
        ),
        Fault(
            "leader-store-restart",
            "the leader cut from the store, and the store's server restarted meanwhile",
            _cut_store_and_restart_it,
            moves_lease=True,
            stores=("redis", "postgres"),
            # The next term waits for one ttl after the store's start, not after the cut: the
            # restart's own time (a PostgreSQL crash recovery) comes on top of both bounds.
            noticed_within=lambda ttl, renew: 3.0,
            holds_off=True,
        ),
        Fault(
            "follower-frozen",
            "a follower's whole process group stopped (SIGSTOP) past the ttl, then continued",
            _freeze_follower,
            moves_lease=False,
            undo=_continue_follower,
        ),
        Fault(
            "sentinel-primary-split",
            "the leader and the primary cut from the followers, the replica and the sentinels",
            _split_with_primary,
            moves_lease=True,
            hold=lambda ttl: 2 * ttl + 4.0,  # past the failover and the promoted hold-off
            stores=("sentinel", "sentinel-minrep"),
            expect={"sentinel": "split", "sentinel-minrep": "leaderless"},
        ),
    )
}


@dataclass
class Outcome:
    """What one scenario showed; :meth:`failures` says what breaks a rule or a bound."""

    fault: Fault
    store: str
    broker: str
    summary: Summary
    #: Seconds from the fault to the first run of a newer term (None: none came).
    new_leader_s: float | None = None
    #: Seconds from the heal to the first run started after it (None: none came).
    resumed_s: float | None = None
    #: Seconds from the old leader's leader_lost signal to the next leader_elected
    #: (negative: elected before the old one knew it had lost).
    handover_gap_s: float | None = None
    #: The longest time without a run starting, from the fault to the heal.
    longest_gap_s: float | None = None
    #: The lease ttl the workers had, and their renew interval.
    ttl: float = TTL
    renew: float = TTL / 3
    #: Seconds from the fault to the heal.
    held_s: float | None = None
    #: Seconds from the store's server being started again to the first run of a newer
    #: term (faults that restart the store).
    after_restart_s: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def mode(self) -> str:
        """ "rule" (the checker's rules and the bounds), "split" or "leaderless" (see Fault)."""
        return self.fault.expect.get(self.store, "rule")

    def failures(self) -> list[str]:
        if self.mode == "split":
            return self._split_failures()
        found = list(self.summary.violations())
        if self.summary.lost:
            found.append(f"{len(self.summary.lost)} messages lost: {self.summary.lost[:10]}")
        if self.mode == "leaderless":
            return found + self._leaderless_failures()
        return found + self._rule_failures()

    def _leaderless_failures(self) -> list[str]:
        """No one leads while the fault lasts: a newer term comes after the heal."""
        found = []
        if self.new_leader_s is None or self.held_s is None:
            found.append("no newer term ran after the heal")
        elif self.new_leader_s - self.held_s > self.ttl + SENTINEL_HEAL_BOUND:
            found.append(
                f"the newer term ran {self.new_leader_s - self.held_s:.2f} s after the heal "
                f"(bound: ttl + {SENTINEL_HEAL_BOUND:g} s)"
            )
        if self.handover_gap_s is None:
            found.append("no leader_lost of the old term followed by a leader_elected")
        elif self.handover_gap_s < 0:
            found.append(f"elected before the old leader's loss ({self.handover_gap_s:.3f} s)")
        if self.resumed_s is None or self.resumed_s > self.ttl + SENTINEL_HEAL_BOUND:
            found.append(
                f"no run within ttl + {SENTINEL_HEAL_BOUND:g} s of the heal ({self.resumed_s})"
            )
        return found

    def _rule_failures(self) -> list[str]:
        """The bounds of a fault the store keeps the guarantees through."""
        found = []
        ttl = self.ttl
        noticed = self.fault.noticed_within(ttl, self.renew)
        if self.fault.moves_lease:
            bound = ttl + noticed + NEW_LEADER_BOUND
            if self.new_leader_s is None or self.new_leader_s > bound:
                found.append(
                    f"no newer term ran within {bound:g} s of the fault ({self.new_leader_s})"
                )
            if self.handover_gap_s is None:
                found.append("no leader_lost of the old term followed by a leader_elected")
            elif self.handover_gap_s < 0:
                found.append(
                    "the next leader was elected before the old one signalled its loss "
                    f"({self.handover_gap_s:.3f} s)"
                )
        elif self.fault.moves_lease is False and self.summary.terms != 1:
            found.append(f"{self.summary.terms} terms: the lease moved, it should not have")
        if self.fault.holds_off and (self.after_restart_s is None or self.after_restart_s < ttl):
            found.append(
                f"a newer term ran {self.after_restart_s} s after the store was started again: "
                f"no hold-off until one ttl ({ttl:g} s) after the start"
            )
        gap_bound = ttl + noticed + NEW_LEADER_BOUND + self.fault.gap_allowance(ttl)
        if self.longest_gap_s is None or self.longest_gap_s > gap_bound:
            found.append(
                f"no run for {self.longest_gap_s} s during the fault (bound: {gap_bound:g} s)"
            )
        if self.resumed_s is None or self.resumed_s > ttl + RESUME_BOUND:
            found.append(f"no run within ttl + {RESUME_BOUND:g} s of the heal ({self.resumed_s})")
        return found

    @property
    def split_runs(self) -> int:
        """Runs of an older term that started, or were still going, once a newer one ran."""
        return len(self.summary.stale_starts) + len(self.summary.in_flight_overlaps)

    def _split_failures(self) -> list[str]:
        """Where the store cannot keep guarantee 1: the split must show, and the fence hold."""
        s = self.summary
        found = []
        if self.new_leader_s is None or (
            self.held_s is not None and self.new_leader_s > self.held_s
        ):
            found.append(f"no newer term ran before the heal ({self.new_leader_s})")
        if not self.split_runs:
            found.append("no two terms ran at once: the split did not show")
        if s.stale_writes_accepted:
            found.append(
                f"{len(s.stale_writes_accepted)} stale writes accepted: "
                f"{s.stale_writes_accepted[:3]}"
            )
        if not s.writes_refused:
            found.append("no stale write refused: the fence was never tested")
        if s.never_ended:
            found.append(f"{len(s.never_ended)} runs never ended")
        if s.lost:
            found.append(f"{len(s.lost)} messages lost: {s.lost[:10]}")
        if self.resumed_s is None or self.resumed_s > self.ttl + RESUME_BOUND:
            found.append(f"no run within ttl + {RESUME_BOUND:g} s of the heal ({self.resumed_s})")
        return found

    def report(self) -> str:
        """The checker's table, the times, the term changes and the failures, for a reader."""
        return "\n".join(
            [
                f"{self.store}/{self.broker} {self.fault.name}: {self.fault.description}",
                self.summary.table(),
                f"  new leader {_seconds(self.new_leader_s)} s, longest gap "
                f"{_seconds(self.longest_gap_s)} s, resumed {_seconds(self.resumed_s)} s, "
                f"handover gap {_seconds(self.handover_gap_s)} s, held {_seconds(self.held_s)} s"
                + (
                    f", newer term {_seconds(self.after_restart_s)} s after the store's start"
                    if self.fault.holds_off
                    else ""
                ),
                *(f"  {note}" for note in self.notes),
                *(f"  FAIL: {failure}" for failure in self.failures()),
            ]
        )

    def row(self) -> dict[str, Any]:
        """The matrix table's row: the columns of the docs' table, then the checks behind them."""
        s = self.summary
        return {
            "store": self.store,
            "broker": self.broker,
            "fault": self.fault.name,
            "terms": s.terms,
            "stale starts": len(s.stale_starts),
            "stale writes accepted": len(s.stale_writes_accepted),
            "stale writes refused": s.writes_refused,
            "lost": len(s.lost),
            "duplicated": s.duplicates,
            "new leader after s": _seconds(self.new_leader_s),
            "work again after heal s": _seconds(self.resumed_s),
            "in flight at a term change": len(s.in_flight_overlaps),
            "longest gap s": _seconds(self.longest_gap_s),
            "verdict": self.verdict(),
        }

    def verdict(self) -> str:
        """ok, FAIL, or "split shown" where the store cannot keep guarantee 1 (fence held)."""
        if self.failures():
            return "FAIL"
        return "split shown, fence held" if self.mode == "split" else "ok"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(outcomes: list[Outcome]) -> str:
    """The outcomes as a text table, one row each."""
    rows = [o.row() for o in outcomes]
    if not rows:
        return "(no scenario ran)"
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    lines = ["  ".join(f"{c:<{widths[c]}}" for c in columns)]
    lines += ["  ".join(f"{r[c]!s:<{widths[c]}}" for c in columns) for r in rows]
    return "\n".join(lines)


#: The docs' table (docs/verification.md): the row's columns up to this one.
README_COLUMNS = 11


def markdown(outcomes: list[Outcome]) -> str:
    """The outcomes as the docs' Markdown table: store, broker, fault and the figures."""
    rows = [o.row() for o in outcomes]
    if not rows:
        return "(no scenario ran)"
    columns = list(rows[0])[:README_COLUMNS]
    numeric = columns[3:]
    lines = [
        "| " + " | ".join(f"{c[:-2]} (s)" if c.endswith(" s") else c for c in columns) + " |",
        "|" + "|".join("---:" if c in numeric else "---" for c in columns) + "|",
    ]
    lines += ["| " + " | ".join(str(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


# -- servers on hosts: one function per kind -------------------------------------------


class BedServer(Protocol):
    """A server on a host of the bed: what the scenarios need of it."""

    port: int

    @property
    def url(self) -> str: ...

    def stop(self) -> None: ...


def redis_on(net: NetBed, host: str, tmp: Path) -> RedisServer:
    """A redis-server on *host* of the bed."""
    workdir = tmp / host
    workdir.mkdir(parents=True, exist_ok=True)
    return RedisServer(workdir, host=net.address(host), wrapper=net.wrapper(host)).start()


def rabbitmq_on(net: NetBed, host: str, tmp: Path) -> RabbitMQServer:
    """A private RabbitMQ node on *host* of the bed."""
    return RabbitMQServer(tmp / host, host=net.address(host), wrapper=net.wrapper(host)).start()


class SentinelOnBed:
    """A Sentinel set on the bed: the primary on "store", the replica on "replica", each
    sentinel on a host of its own. With *min_replicas*, the primary and the replica
    (which the sentinels may promote) refuse writes that no replica acknowledged within
    1 s (``min-replicas-to-write 1``, ``min-replicas-max-lag 1``, below the ttl of 2 s).
    """

    def __init__(self, net: NetBed, tmp: Path, *, min_replicas: bool) -> None:
        self.net = net
        extra = ["--min-replicas-to-write", "1", "--min-replicas-max-lag", "1"]
        self.servers = SentinelRedis(
            tmp / "sentinel",
            hosts={
                role: (net.address(host), net.wrapper(host))
                for role, host in zip(SENTINEL_ROLES, STORE_HOSTS["sentinel"], strict=True)
            },
            extra=extra if min_replicas else None,
        ).start()
        self.port = self.servers.primary.port

    @property
    def url(self) -> str:
        return self.servers.url

    def ports(self) -> dict[str, int]:
        """Host -> the port clients reach there (the servers', then the sentinels')."""
        ports = [s.port for s in self.servers.servers] + [s.port for s in self.servers.sentinels]
        return dict(zip(STORE_HOSTS["sentinel"], ports, strict=True))

    def stop(self) -> None:
        self.servers.stop()


class AzuriteOnBed:
    """Azurite's blob service on the "store" host; a container of its own per bed."""

    def __init__(self, net: NetBed, tmp: Path) -> None:
        workdir = tmp / "store"
        workdir.mkdir(parents=True, exist_ok=True)
        self.server = AzuriteServer(
            workdir, host=net.address("store"), wrapper=net.wrapper("store")
        ).start()
        self.port = self.server.port
        self.container = f"c{uuid.uuid4().hex[:10]}"

    @property
    def url(self) -> str:
        return f"azureblob://{self.container}/leases"

    def env(self) -> dict[str, str]:
        """What the workers (and the test's store reads) need besides the URL."""
        return {"AZURE_STORAGE_CONNECTION_STRING": self.server.connection_string}

    def stop(self) -> None:
        self.server.stop()


def postgres_on(net: NetBed, host: str, tmp: Path) -> PostgresServer:
    """A private PostgreSQL cluster on *host* of the bed."""
    return PostgresServer(host=net.address(host), wrapper=net.wrapper(host)).start()


class EtcdOnBed:
    """A three-member etcd cluster, one member on each store host of the bed."""

    def __init__(self, net: NetBed, hosts: tuple[str, ...], tmp: Path) -> None:
        self.net = net
        self.cluster = EtcdCluster(
            tmp / "etcd", size=len(hosts), hosts=[(net.address(h), net.wrapper(h)) for h in hosts]
        )
        self.cluster.start()
        self.port = self.cluster.members[0].client_port

    @property
    def url(self) -> str:
        return self.cluster.url

    def host_of(self, member: EtcdMember) -> str:
        (host,) = (h.name for h in self.net.hosts.values() if h.address == member.host)
        return host

    def lead(self, member: EtcdMember) -> None:
        """Move the raft leadership to *member* (etcdctl move-leader) and wait for it."""
        statuses = {m.name: own for m, own, _, _ in self.cluster._statuses()}
        if self.cluster.wait_leader(10) is not member:
            done = self.cluster.etcdctl("move-leader", f"{statuses[member.name]:x}")
            if done.returncode != 0:
                raise RuntimeError(f"etcdctl move-leader failed: {done.stderr.strip()}")
        deadline = time.monotonic() + 10
        while self.cluster.leader() is not member:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{member.name} did not become the etcd leader")
            time.sleep(0.05)

    def ports(self) -> dict[str, int]:
        return {self.host_of(m): m.client_port for m in self.cluster.members}

    def stop(self) -> None:
        self.cluster.close()


#: The roles of a Sentinel set, on the hosts of STORE_HOSTS["sentinel"] in this order.
SENTINEL_ROLES = ("primary", "replica", "sentinel1", "sentinel2", "sentinel3")
#: Store kind -> the bed's hosts it runs on (default: one, "store").
STORE_HOSTS: dict[str, tuple[str, ...]] = {
    "etcd": ("store", "store2", "store3"),
    "sentinel": ("store", "replica", "sentinel1", "sentinel2", "sentinel3"),
    "sentinel-minrep": ("store", "replica", "sentinel1", "sentinel2", "sentinel3"),
}
#: Store kind -> a function that starts one on its hosts of the bed. A store of another
#: kind plugs in here (its server class taking a host address and a wrapper).
STORES: dict[str, Callable[[NetBed, Path], BedServer]] = {
    "redis": lambda net, tmp: redis_on(net, "store", tmp),
    "postgres": lambda net, tmp: postgres_on(net, "store", tmp),
    "etcd": lambda net, tmp: EtcdOnBed(net, STORE_HOSTS["etcd"], tmp),
    "sentinel": lambda net, tmp: SentinelOnBed(net, tmp, min_replicas=False),
    "azure": AzuriteOnBed,
    # Sentinel with min-replicas-to-write 1: run for the split of the primary alone.
    "sentinel-minrep": lambda net, tmp: SentinelOnBed(net, tmp, min_replicas=True),
}
#: Store kind -> the only faults it runs (default: every fault that applies to it).
STORE_FAULTS: dict[str, tuple[str, ...]] = {"sentinel-minrep": ("sentinel-primary-split",)}


def applies(fault: Fault, store: str) -> bool:
    """Whether the matrix runs *fault* on a *store*: a fault of another store's (a
    PostgreSQL row lock, say) does not, nor one the store kind is not run for."""
    only = STORE_FAULTS.get(store)
    if only is not None:
        return fault.name in only
    return fault.stores is None or store in fault.stores


def ttl_of(store: str) -> float:
    return STORE_TTL.get(store, TTL)


def renew_of(store: str) -> float:
    return ttl_of(store) * RENEW_FRACTION.get(store, 1 / 3)


#: Broker kind -> a function that starts one on the bed's "broker" host.
BROKERS: dict[str, Callable[[NetBed, Path], BedServer]] = {
    "redis": lambda net, tmp: redis_on(net, "broker", tmp),
    "rabbitmq": lambda net, tmp: rabbitmq_on(net, "broker", tmp),
}


@dataclass
class PartitionBed:
    """A bed, its servers and the cluster on it."""

    net: NetBed
    cluster: Cluster
    store: str
    broker: str
    store_server: BedServer
    broker_server: BedServer

    @property
    def ttl(self) -> float:
        return ttl_of(self.store)

    def host_of(self, worker: Worker) -> str:
        return worker.nodename.split("@", 1)[0]

    def stage(self, leader: Worker) -> Stage:
        hosts = [self.host_of(w) for w in self.cluster.workers]
        return Stage(
            net=self.net,
            leader=self.host_of(leader),
            followers=[h for h in hosts if h != self.host_of(leader)],
            workers={self.host_of(w): w for w in self.cluster.workers},
            ttl=self.ttl,
            renew=renew_of(self.store),
            store_hosts=(
                self.store_server.ports()
                if isinstance(self.store_server, EtcdOnBed | SentinelOnBed)
                else {"store": self.store_server.port}
            ),
            broker_port=self.broker_server.port,
            store_url=self.store_server.url,
            election=self.cluster.name,
            store=self.store_server,
        )


@contextmanager
def partition_bed(
    tmp: Path, store: str = "redis", broker: str = "redis", *, fast_failover: bool = False
) -> Iterator[PartitionBed]:
    """A bed (hosts store, broker, w1..w3) with the servers and three workers running.

    With *fast_failover* the workers run with ``leader_fast_failover = True``.

    The run history is a Redis on the controller's address (never faulted).
    Everything is stopped and the bed removed at the end of the block, whatever failed.
    """
    with ExitStack() as stack:
        store_hosts = STORE_HOSTS.get(store, ("store",))
        workers = [f"w{n}" for n in range(1, WORKERS + 1)]
        net = NetBed([*store_hosts, "broker", *workers]).start()
        stack.callback(net.close)  # last: kills whatever still runs in the namespaces
        (tmp / "history").mkdir(parents=True, exist_ok=True)
        history = RedisServer(tmp / "history", host=net.controller).start()
        stack.callback(history.stop)
        store_server = STORES[store](net, tmp)
        stack.callback(store_server.stop)
        broker_server = BROKERS[broker](net, tmp)
        stack.callback(broker_server.stop)
        cluster = Cluster(
            tmp,
            broker,
            broker_server.url,  # used for a broker that is not Redis
            data=broker_server if isinstance(broker_server, RedisServer) else history,
            store=store_server if isinstance(store_server, RedisServer) else None,
            store_url=store_server.url,
            history=history,
        )
        cluster.env["LEADER_TTL"] = f"{ttl_of(store):g}"
        if fast_failover:
            cluster.env["LEADER_FAST_FAILOVER"] = "1"
        if isinstance(store_server, AzuriteOnBed):
            cluster.env.update(store_server.env())
        stack.callback(cluster.close)
        for n in range(1, WORKERS + 1):
            cluster.start(1, wait=False, wrapper=net.wrapper(f"w{n}"))
        for worker in cluster.workers:
            worker.wait_ready(60)
        yield PartitionBed(net, cluster, store, broker, store_server, broker_server)


def _lease_token(cluster: Cluster) -> int:
    options = {}
    if cluster.env.get("AZURE_STORAGE_CONNECTION_STRING"):
        options["leader_azure_connection_string"] = cluster.env["AZURE_STORAGE_CONNECTION_STRING"]
    store = open_store(cluster.env["LEADER_STORE"], timeout=2, options=options)
    try:
        record = store.read(cluster.name)
    except StoreError:
        record = None
    finally:
        store.close()
    assert record is not None, "no lease to read"
    return record.token


def _wait_start(
    cluster: Cluster, predicate: Callable[[dict[str, Any]], bool], timeout: float
) -> dict[str, Any] | None:
    """The first start row (oldest) matching *predicate*, waiting up to *timeout* s."""
    deadline = time.monotonic() + timeout
    while True:
        found = [r for r in cluster.history() if r["kind"] == "start" and predicate(r)]
        if found:
            return min(found, key=lambda r: float(r["at"]))
        if time.monotonic() > deadline:
            return None
        time.sleep(0.1)


def run_scenario(bed: PartitionBed, fault: Fault) -> Outcome:
    """Stream runs, apply *fault*, heal; the checker's summary and the measured times."""
    cluster = bed.cluster
    leader = cluster.leader_worker(timeout=60)
    token = _lease_token(cluster)
    stage = bed.stage(leader)
    # Watches every run until the end (a run killed after the stream stopped has a gone
    # row too): the stream's own watcher would stop with the stream.
    watcher = RunWatcher(cluster.env["LEADER_HISTORY"])
    watcher.start()
    try:
        sent, longest_gap_s, resumed_s, faulted, healed = _stream_through(bed, fault, stage, token)
        # Every message sent must run: one a cut-off leader had taken comes back after the
        # Redis broker's visibility timeout (4 s).
        cluster.wait_history(
            lambda rows: {r["i"] for r in rows if r["kind"] == "start"} >= set(range(sent)), 30
        )
        watcher.settle(10)
        # Read the history once every run has its end (or gone) row, not at a guess: on a
        # loaded machine the last runs' rows may come late.
        cluster.wait_history(_all_ended, 15)
    finally:
        watcher.stop()
        watcher.close()
    rows = cluster.history()
    newer = [float(r["at"]) for r in rows if r["kind"] == "start" and int(r["token"]) > token]
    outcome = Outcome(
        fault,
        bed.store,
        bed.broker,
        check(rows, sent),
        new_leader_s=min(newer) - faulted if newer else None,
        resumed_s=resumed_s,
        longest_gap_s=longest_gap_s,
        ttl=bed.ttl,
        renew=renew_of(bed.store),
        held_s=healed - faulted,
        notes=_term_changes(rows, faulted, healed),
    )
    if fault.moves_lease:
        outcome.handover_gap_s = _handover_gap(rows, token)
    if stage.store_back_at is not None:
        back = [at for at in newer if at > stage.store_back_at]
        outcome.after_restart_s = min(back) - stage.store_back_at if back else None
    return outcome


def _all_ended(rows: list[dict[str, Any]]) -> bool:
    """True when every start row has its end row, or the watcher's gone row."""
    starts = [row for row in rows if row["kind"] == "start"]
    return all(end is not None for end in run_ends(starts, rows))


def _term_changes(rows: list[dict[str, Any]], faulted: float, healed: float) -> list[str]:
    """When each term's first and last runs started, from the fault and the heal."""
    starts: dict[int, list[float]] = {}
    for row in rows:
        if row["kind"] == "start":
            starts.setdefault(int(row["token"]), []).append(float(row["at"]))
    return [
        f"term {token}: first run {min(at) - faulted:+.2f} s from the fault, last run "
        f"{max(at) - healed:+.2f} s from the heal"
        for token, at in sorted(starts.items())
    ]


def _stream_through(
    bed: PartitionBed, fault: Fault, stage: Stage, token: int
) -> tuple[int, float, float | None, float, float]:
    """Stream runs through the fault and the heal: (messages sent, the longest gap in the
    runs during the fault, resumed s, fault time, heal time).

    A fault that moves the lease lasts until a newer term ran (and 1 s more, while the
    old leader is still cut off); where the fault splits the store, 3 s more (both terms
    run); any other fault, its hold.
    """
    cluster = bed.cluster
    ttl = bed.ttl
    mode = fault.expect.get(bed.store, "rule")
    resumed_s = None
    after_heal = ttl + (SENTINEL_HEAL_BOUND if mode == "leaderless" else RESUME_BOUND)
    with streaming(cluster, every=0.1, task="chaos_work", args=(0.2,), watch=False) as sent:
        time.sleep(1.5)  # runs of the first term
        faulted = time.monotonic()
        fault.apply(stage)
        if fault.moves_lease and mode != "leaderless":
            noticed = fault.noticed_within(ttl, renew_of(bed.store))
            wait = ttl + noticed + (SPLIT_BOUND if mode == "split" else NEW_LEADER_BOUND) + 2
            newer = _wait_start(cluster, lambda r: int(r["token"]) > token, wait)
            if newer is not None:
                time.sleep(3.0 if mode == "split" else 1.0)
        else:
            time.sleep(fault.hold(ttl))
        if fault.undo is not None:
            fault.undo(stage)
        bed.net.heal()
        healed = time.monotonic()
        longest_gap_s = _longest_gap(cluster.history(), faulted, healed)
        after = _wait_start(cluster, lambda r: float(r["at"]) > healed, after_heal + 2)
        if after is not None:
            resumed_s = float(after["at"]) - healed
        # A process continued (undo) gets a ttl to act wrongly in; the others a second.
        time.sleep(max(ttl, 1.0) if fault.undo is not None else 1.0)
    return sent[0], longest_gap_s, resumed_s, faulted, healed


def _longest_gap(rows: list[dict[str, Any]], begin: float, end: float) -> float:
    """The longest time in [begin, end] in which no run started."""
    starts = sorted(float(r["at"]) for r in rows if r["kind"] == "start" and begin < r["at"] < end)
    edges = [begin, *starts, end]
    return max(b - a for a, b in pairwise(edges))


def _handover_gap(rows: list[dict[str, Any]], token: int) -> float | None:
    """From the old leader's leader_lost (of *token*) to the first leader_elected after it."""
    lost = [r["at"] for r in rows if r["kind"] == "signal-lost" and r["token"] == token]
    elected = [r["at"] for r in rows if r["kind"] == "signal-elected" and r["token"] > token]
    if not lost or not elected:
        return None
    return float(min(elected)) - float(min(lost))
