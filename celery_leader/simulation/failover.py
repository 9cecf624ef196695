"""How long an election goes without a leader after the leader's process dies, measured.

One scenario per seed, run twice, without and with lifelines (:mod:`.lifelines`):
the seed's nodes (their clocks, starts and jitter), its message delays and
nothing else of its plan (no loss, no other fault); at :data:`CRASH_AT` the
leader's process is killed (SIGKILL, never restarted). The failover time is
from the kill to the next election, in virtual seconds of real time:
without lifelines, the rest of the dead leader's lease and the followers'
look at it (with their jitter); with lifelines, the FIN, the followers'
next reading of the lifeline, :data:`~celery_leader.lease.lifeline.TAKEOVER_WAIT`
and the take-over.

``python -m celery_leader.simulation --failover [N]`` prints both.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, replace

from celery_leader.simulation.faults import Fault, Kind
from celery_leader.simulation.models import DEFAULT
from celery_leader.simulation.network import NetworkProfile
from celery_leader.simulation.world import World, quiet_loggers

#: The leader's process is killed (real seconds).
CRASH_AT = 12.0
#: The run ends this long after the kill (real seconds): longer than any failover.
AFTER = 10.0


@dataclass(frozen=True)
class Failover:
    """One seed's failover: seconds without a leader, and whether a take-over ended them."""

    seed: int
    seconds: float | None
    """None when no node was elected within :data:`AFTER` of the kill."""
    taken_over: bool


def failover(seed: int, *, lifelines: bool, store: str = DEFAULT) -> Failover:
    """Seed *seed*'s failover after the leader's process was killed (see the module docstring)."""
    with quiet_loggers():
        world = World(seed, lifelines=lifelines, store=store, trace_limit=1)
        world.plan = replace(
            world.plan,
            duration=CRASH_AT + AFTER,
            faults=[Fault(CRASH_AT, Kind.CRASH, leader=True, age=2 * AFTER)],
        )
        # The seed's delays, without loss, slow, late or duplicated messages.
        world.network.profile = NetworkProfile(
            min_delay=world.plan.network.min_delay, max_delay=world.plan.network.max_delay
        )
        result = world.run()
    if result.violation is not None:
        raise AssertionError(f"seed {seed}: {result.violation}")
    elected = [at for at, _, _ in world.elected if at > CRASH_AT]
    seconds = elected[0] - CRASH_AT if elected else None
    return Failover(seed, seconds, any(at > CRASH_AT for at in world.take_overs))


@dataclass(frozen=True)
class Summary:
    """Failover times of many seeds, with or without lifelines."""

    lifelines: bool
    times: list[float]
    taken_over: int
    stuck: int

    def line(self) -> str:
        """One row of the table :func:`report` prints."""
        times = sorted(self.times)
        if not times:
            return f"{'on' if self.lifelines else 'off':<9} no failover measured"
        p90 = times[min(len(times) - 1, int(0.9 * len(times)))]
        row = (
            f"{'on' if self.lifelines else 'off':<9} {statistics.mean(times):>6.3f} "
            f"{statistics.median(times):>6.3f} {p90:>6.3f} {times[-1]:>6.3f} {len(times):>6}"
        )
        if self.lifelines:
            row += f"   ({self.taken_over} taken over)"
        if self.stuck:
            row += f"   ({self.stuck} without a new leader)"
        return row


def measure(seeds: Iterable[int], *, lifelines: bool, store: str = DEFAULT) -> Summary:
    """Failover times over *seeds*, with or without lifelines."""
    runs = [failover(seed, lifelines=lifelines, store=store) for seed in seeds]
    times = [run.seconds for run in runs if run.seconds is not None]
    return Summary(
        lifelines=lifelines,
        times=times,
        taken_over=sum(run.taken_over for run in runs),
        stuck=sum(run.seconds is None for run in runs),
    )


def report(seeds: Iterable[int], *, store: str = DEFAULT) -> str:
    """The failover times without and with lifelines over *seeds*, as a small table."""
    chosen = list(seeds)
    lines = [
        f"failover after the leader's process is killed ({store} model, {len(chosen)} seeds, "
        "virtual seconds from the kill to the next election)",
        f"{'lifelines':<9} {'mean':>6} {'median':>6} {'p90':>6} {'max':>6} {'seeds':>6}",
    ]
    for lifelines in (False, True):
        lines.append(measure(chosen, lifelines=lifelines, store=store).line())
    return "\n".join(lines)
