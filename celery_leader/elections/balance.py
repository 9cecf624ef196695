"""Which worker should lead which election: a plan every worker computes alike. No I/O.

Each worker announces, once per renew interval, the elections it may lead
(``eligible``) and those it leads (``held``); :func:`plan` turns the live
members' announcements into one assignment, election -> member. Every worker
computes it from the same announcements, so they agree without talking to
each other; where their views differ for a moment, the lease still decides
who leads (a plan never makes two holders: it only delays acquiring and
asks a holder to step down, which releases before anyone else acquires).

The plan:

* **Balanced.** Each member's share is found by water-filling: elections
  with the fewest eligible members first, each to the eligible member with
  the smallest share so far. With every member eligible for every
  election, shares are floor(K/N) or ceil(K/N); otherwise balance holds
  among the eligible ones.
* **Sticky.** An election stays with its current holder while the holder
  is under its share: only the surplus moves (cooperative-sticky
  assignment, as Kafka's and Kinesis's lease balancers do), so a joining
  worker takes its share from the most loaded and nothing else moves.
* **Deterministic.** Ties are broken by member name, so every worker builds
  the same plan from the same view.

:func:`successors` adds, for each election the plan leaves with its holder,
the member that would take it if that holder went: the plan without it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Member:
    """One live worker as it announced itself: the elections it may lead, and those it leads.

    ``yielded``: elections it gave up by a step-down on request, since the set
    of workers last changed. While any member announces one, no surplus is
    handed over (see :mod:`celery_leader.elections.balancer`).
    """

    name: str
    eligible: frozenset[str]
    held: frozenset[str]
    yielded: frozenset[str] = frozenset()

    def payload(self) -> str:
        """The announcement, as stored (``yielded`` only when there is one: older readers)."""
        found: dict[str, list[str]] = {"eligible": sorted(self.eligible), "held": sorted(self.held)}
        if self.yielded:
            found["yielded"] = sorted(self.yielded)
        return json.dumps(found)

    @classmethod
    def parse(cls, name: str, payload: str) -> Member | None:
        """The member *name* announced with *payload*; None for a payload it cannot read."""
        try:
            found = json.loads(payload)
            eligible = frozenset(str(e) for e in found["eligible"])
            held = frozenset(str(e) for e in found["held"])
            yielded = frozenset(str(e) for e in found.get("yielded", ()))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        return cls(name, eligible, held & eligible, yielded)


def shares(members: Mapping[str, Member]) -> dict[str, int]:
    """How many elections each member should lead (water-filling, see the module docstring)."""
    counts = dict.fromkeys(members, 0)
    elections = {e for member in members.values() for e in member.eligible}
    by_scarcity = sorted(
        elections, key=lambda e: (sum(e in m.eligible for m in members.values()), e)
    )
    for election in by_scarcity:
        takers = [name for name, m in members.items() if election in m.eligible]
        # Fewest so far, then the one that leads it now (so shares follow holders), then name.
        chosen = min(
            takers, key=lambda name: (counts[name], election not in members[name].held, name)
        )
        counts[chosen] += 1
    return counts


def plan(members: Mapping[str, Member]) -> dict[str, str]:
    """Election -> the member that should lead it, for every election some member may lead."""
    target = shares(members)
    assigned: dict[str, str] = {}
    load = dict.fromkeys(members, 0)
    holders: dict[str, list[str]] = {}
    for name, member in members.items():
        for election in member.held:
            holders.setdefault(election, []).append(name)

    def scarcity(election: str) -> tuple[int, str]:
        return sum(election in m.eligible for m in members.values()), election

    # Sticky first: each holder keeps what it leads, up to its share; the
    # elections fewest members may lead are kept first (others can take the rest).
    for election in sorted(holders, key=scarcity):
        for name in sorted(holders[election]):
            if load[name] < target[name]:
                assigned[election] = name
                load[name] += 1
                break
    elections = {e for member in members.values() for e in member.eligible}
    for election in sorted(elections - assigned.keys(), key=scarcity):
        takers = [name for name, m in members.items() if election in m.eligible]
        under = [name for name in takers if load[name] < target[name]] or takers
        chosen = min(under, key=lambda name: (load[name] - target[name], name))
        assigned[election] = chosen
        load[chosen] += 1
    return assigned


def successors(members: Mapping[str, Member], assigned: Mapping[str, str]) -> dict[str, str]:
    """Election -> who takes it when its holder lets it go (elections *assigned* to their holder).

    For each election the plan *assigned* leaves with a member that holds
    it, the plan computed without that holder: what every worker plans
    alike once the holder's announcement is gone. Knowing it before then lets
    that one worker try the moment the lease is free (a dead holder's lease
    ran out, or the holder released it on a step-down), while the others
    still see the holder announced; nobody waits for the announcement to
    expire, and only one worker tries. Deterministic, as :func:`plan` is.
    """
    found: dict[str, str] = {}
    for holder in sorted({owner for e, owner in assigned.items() if e in members[owner].held}):
        rest = {name: member for name, member in members.items() if name != holder}
        if not rest:
            continue
        after = plan(rest)
        for election in sorted(members[holder].held):
            if assigned.get(election) == holder and election in after:
                found[election] = after[election]
    return found
