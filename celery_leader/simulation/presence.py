"""The store's member list (``Presence``) as the simulated balancer reaches it.

A model of the Redis store's ``ANNOUNCE_LUA``: each member of a group is
kept with its payload until ``ttl`` after its last announcement, on the
store's clock; an announcement answers every live member's payload in the
same call. A restart of the store, with or without data, forgets the list
(the balancer only plans with it: safety does not rest on it, so the model
need not be kinder).

:class:`PresenceClient` is what a simulated balancer holds as its store:
each call goes through the :class:`~.network.Network` (delay, loss, a
paused or restarting store, the caller's timeout), as the real balancer's
own store client does.
"""

from __future__ import annotations

from collections.abc import Callable

from celery_leader.simulation.network import Caller, Network


class ModelPresence:
    """Groups of members, each with a payload and an end on the store's clock."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._groups: dict[str, dict[str, tuple[str, float]]] = {}

    def announce(self, group: str, member: str, payload: str, ttl: float) -> dict[str, str]:
        """Record *member* until ``now + ttl``; every live member's payload (itself included)."""
        now = self._clock()
        members = self._groups.setdefault(group, {})
        members[member] = (payload, now + ttl)
        for gone in [name for name, (_, until) in members.items() if until <= now]:
            del members[gone]
        return {name: payload for name, (payload, _) in members.items()}

    def withdraw(self, group: str, member: str) -> None:
        """Remove *member* now."""
        self._groups.get(group, {}).pop(member, None)

    def forget(self) -> None:
        """The store restarted: no member is known until it announces again."""
        self._groups.clear()


class PresenceClient:
    """One balancer's client of the member list: every call crosses the network."""

    def __init__(
        self, network: Network, caller: Caller, presence: ModelPresence, timeout: float
    ) -> None:
        self._network = network
        self._caller = caller
        self._presence = presence
        self._timeout = timeout

    def announce(self, group: str, member: str, payload: str, ttl: float) -> dict[str, str]:
        """See :meth:`ModelPresence.announce`; raises StoreError as a real client would."""
        presence = self._presence
        answer: dict[str, str] = self._network.call(
            self._caller,
            lambda: presence.announce(group, member, payload, ttl),
            self._timeout,
            "announce",
        )
        return answer

    def withdraw(self, group: str, member: str) -> None:
        """See :meth:`ModelPresence.withdraw`."""
        presence = self._presence
        self._network.call(
            self._caller, lambda: presence.withdraw(group, member), self._timeout, "withdraw"
        )

    def close(self) -> None:
        """Nothing to close."""
