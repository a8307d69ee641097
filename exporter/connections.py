"""The connection budget: at most ``--max-connections`` to the target at once (issue 13).

Every database the exporter scrapes wants a connection of its own (PostgreSQL binds
a connection to one database), and each new one costs the server a fork. The
budget keeps the connections of all databases, plus the health probe's, under one
limit: when one more is needed and none is free, the least recently used idle one
is closed first. Choosing what to close is a plain function; :class:`ConnectionBudget`
only keeps the order and the counts, and awaits the closing.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from typing import Protocol, TypeVar

#: Connections the health probe keeps outside the databases' share.
PROBE_CONNECTIONS = 1

K = TypeVar("K")


class Holder(Protocol):
    """Something that holds one connection and can let it go (a ``Server``)."""

    @property
    def label(self) -> str: ...

    async def disconnect(self) -> None: ...


def lru_victims(held: Sequence[K], busy: Collection[K], capacity: int) -> list[K]:
    """The holders to close, least recently used first, so that one more connection fits.

    ``held`` runs from least to most recently used; ``busy`` ones are never chosen.
    Fewer than needed come back when too many are busy: the caller must not exceed.
    """
    excess = len(held) + 1 - capacity
    if excess <= 0:
        return []
    return [holder for holder in held if holder not in busy][:excess]


class ConnectionBudget:
    """The databases' share of the connection budget, in least-recently-used order."""

    def __init__(self, limit: int | None, reserved: int = PROBE_CONNECTIONS) -> None:
        if limit is not None and limit - reserved < 1:
            raise ValueError(f"a budget of {limit} leaves no connection for a database")
        self.limit = limit  # None: no limit (tests that build a Server alone)
        self.capacity = None if limit is None else limit - reserved
        self._held: OrderedDict[Holder, None] = OrderedDict()
        self.opened = 0  # connections opened since start, over every database
        self.opened_by: dict[str, int] = {}  # datname -> opened, while it is scraped
        self.evictions = 0  # connections closed to make room for another database
        self.peak = 0  # most connections the databases held at once

    @classmethod
    def unlimited(cls) -> ConnectionBudget:
        """No limit: one connection per database, as before the budget existed (D5)."""
        return cls(None)

    @property
    def open(self) -> int:
        """Connections the databases hold right now."""
        return len(self._held)

    async def make_room(self, holder: Holder) -> None:
        """Close least recently used connections until ``holder`` may open one."""
        if self.capacity is None:
            return
        victims = lru_victims(list(self._held), {holder}, self.capacity)
        for victim in victims:
            self.evictions += 1
            await victim.disconnect()  # calls released()
        if len(self._held) >= self.capacity and holder not in self._held:
            raise RuntimeError(  # pragma: no cover - one database is connected at a time
                f"connection budget of {self.limit} exhausted: every connection is busy"
            )

    def opened_for(self, holder: Holder) -> None:
        """``holder`` has opened a connection: count it, as the most recently used."""
        self._held[holder] = None
        self._held.move_to_end(holder)
        self.opened += 1
        self.opened_by[holder.label] = self.opened_by.get(holder.label, 0) + 1
        self.peak = max(self.peak, len(self._held))

    def used(self, holder: Holder) -> None:
        """``holder`` uses its connection again: it becomes the most recently used."""
        if holder in self._held:
            self._held.move_to_end(holder)

    def released(self, holder: Holder) -> None:
        """``holder`` has closed its connection (or never had one)."""
        self._held.pop(holder, None)

    def forget(self, label: str) -> None:
        """A database has gone: drop its count, so that discovery churn leaves nothing behind."""
        self.opened_by.pop(label, None)
