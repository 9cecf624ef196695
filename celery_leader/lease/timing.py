"""Lease timing: the arithmetic of validity, renewal and retry, and nothing else.

Pure functions over numbers on one monotonic clock, so they can be tested with
a fake clock and reasoned about alone.

The model (see "Guarantees and design" in the docs):

* Validity is counted from the moment a request was *sent*, never from when
  its reply came: ``valid_until = t_sent + ttl - margin``. The store starts its
  own TTL when it *processes* the request, which is later, so the local view
  always ends first, by at least ``margin`` (the allowance for clock-rate drift
  between this process and the store).
* Renewals start every ``renew_interval``. A renewal is only started when it
  can finish (``op_timeout``) before ``valid_until``; when it cannot, the holder
  declares the lease lost *now*. A longer leaderless gap is better than two
  leaders.
"""

from __future__ import annotations

from dataclasses import dataclass

from celery_leader.exceptions import ConfigurationError

#: Fraction of the ttl kept back for clock-rate drift between hosts.
DEFAULT_DRIFT_FRACTION = 0.02
#: The smallest drift margin, in seconds, whatever the ttl.
MIN_MARGIN = 0.05
#: No single store call may take longer than this by default, in seconds.
MAX_DEFAULT_OP_TIMEOUT = 5.0


@dataclass(frozen=True)
class LeaseTiming:
    """The timing parameters of one election, validated.

    Build it with :meth:`create`, which fills in defaults and checks ranges.
    """

    ttl: float
    renew_interval: float
    margin: float
    op_timeout: float

    @classmethod
    def create(
        cls,
        ttl: float,
        renew_interval: float | None = None,
        margin: float | None = None,
        op_timeout: float | None = None,
        *,
        renew_fraction: float = 1 / 3,
    ) -> LeaseTiming:
        """Return validated timing, deriving what was not given.

        Raises :class:`ConfigurationError` naming the setting and its allowed
        range when a value makes a safe lease impossible.
        """
        if not ttl > 0:
            raise ConfigurationError(
                f"leader_lease_ttl={ttl:g} is not allowed: it must be a number of seconds > 0"
            )
        if renew_interval is None:
            renew_interval = ttl * renew_fraction
        if not 0 < renew_interval < ttl / 2:
            raise ConfigurationError(
                f"leader_renew_interval={renew_interval:g} is not allowed with "
                f"leader_lease_ttl={ttl:g}: it must be > 0 and < ttl/2 ({ttl / 2:g}) "
                "so that a failed renewal can be retried before the lease runs out"
            )
        margin_given = margin is not None
        if margin is None:
            margin = max(MIN_MARGIN, ttl * DEFAULT_DRIFT_FRACTION)
        if not 0 <= margin <= ttl / 4:
            # The margin must fit in a quarter of the ttl: the lowest ttl it fits is 4 x margin.
            lowest = f"the lowest usable ttl for a margin of {margin:g} s is {4 * margin:g} s"
            if not margin_given:
                # Only the ttl was set (a default margin never fails the default ttl): blame
                # the ttl, not a margin the user never wrote.
                raise ConfigurationError(
                    f"leader_lease_ttl={ttl:g} is not allowed: it is too short for "
                    f"leader_lease_margin, which is not set and takes its default "
                    f"(max({MIN_MARGIN:g}, {DEFAULT_DRIFT_FRACTION:.0%} of ttl) = {margin:g} s); "
                    f"{lowest}"
                )
            raise ConfigurationError(
                f"leader_lease_margin={margin:g} is not allowed with leader_lease_ttl={ttl:g}: "
                f"it must be >= 0 and <= ttl/4 ({ttl / 4:g})"
                + (f"; {lowest}" if margin > 0 else "")
            )
        if op_timeout is None:
            op_timeout = min(renew_interval / 2, MAX_DEFAULT_OP_TIMEOUT)
        room = ttl - margin - renew_interval
        if not 0 < op_timeout < room:
            raise ConfigurationError(
                f"leader_store_timeout={op_timeout:g} is not allowed with "
                f"leader_lease_ttl={ttl:g} and leader_renew_interval={renew_interval:g}: "
                f"it must be > 0 and < ttl - margin - renew_interval ({room:g})"
            )
        return cls(ttl=ttl, renew_interval=renew_interval, margin=margin, op_timeout=op_timeout)

    def valid_until(self, t_sent: float) -> float:
        """Local end of validity for a grant whose request was sent at *t_sent*."""
        return t_sent + self.ttl - self.margin

    def can_renew_in_time(self, now: float, valid_until: float) -> bool:
        """True when a renewal started at *now* is sure to finish before *valid_until*."""
        return now + self.op_timeout <= valid_until

    def renew_retry_delay(self, rand: float) -> float:
        """Pause before retrying a failed renewal; *rand* is uniform in [0, 1).

        Short, since the lease is running out: a quarter of the interval at
        most, jittered so that retries do not fall in step.
        """
        return min(self.renew_interval / 4, 0.25) * (0.5 + rand / 2)

    def acquire_backoff(self, failures: int, rand: float) -> float:
        """Pause before the next acquire after *failures* store errors in a row.

        Exponential from 0.1 s, capped at one renew interval, with full jitter
        so that followers do not return to a recovered store all at once.
        """
        ceiling = min(self.renew_interval, 0.1 * 2.0 ** min(failures, 16))
        return max(0.01, ceiling * rand)

    def follower_jitter(self, rand: float) -> float:
        """Spread of follower attempts after a release or an expiry, in seconds."""
        return min(0.05, self.ttl * 0.01) * rand
