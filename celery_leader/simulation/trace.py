"""The trace of one simulated run: what happened, when, to whom.

Entries are kept unformatted (a format string and its arguments) and only
turned into text when a trace is printed: a run records hundreds of entries
and prints none when nothing went wrong. A bounded trace keeps the last
*limit* entries, which is what a failing seed prints.
"""

from __future__ import annotations

from collections import deque

#: One entry: real (virtual) time, who, a %-format string and its arguments.
Entry = tuple[float, str, str, tuple[object, ...]]


class Trace:
    """A ring of the latest entries (all of them when *limit* is None)."""

    __slots__ = ("_entries",)

    def __init__(self, limit: int | None = 30) -> None:
        self._entries: deque[Entry] = deque(maxlen=limit)

    def add(self, time: float, who: str, message: str, *args: object) -> None:
        """Record *message* % *args* at *time*, said by *who*."""
        self._entries.append((time, who, message, args))

    def lines(self) -> list[str]:
        """The entries as text, oldest first."""
        return [
            f"{time:10.6f}  {who:<8} {message % args if args else message}"
            for time, who, message, args in self._entries
        ]
