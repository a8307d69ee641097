"""The connection budget: at most ``--max-connections`` to the target at once (issue 13).

Every database the exporter scrapes wants a connection of its own (PostgreSQL binds
a connection to one database), and each new one costs the server a fork. The
budget keeps the connections of all databases, plus the health probe's, under one
limit: when one more is needed and none is free, the least recently used idle one
is closed first, or, when every one is busy (databases walked in parallel), the
walk waits for one to finish. Choosing what to close is a plain function;
:class:`ConnectionBudget` keeps the order and the counts, and awaits the closing.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Collection, Sequence
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
    """The databases' share of the connection budget, in least-recently-used order.

    Databases scraped in parallel each reserve a place before connecting; a place is
    free again only once the closed backend has ended, so the server never sees more
    connections than the budget, however the walks interleave.
    """

    def __init__(self, limit: int | None, reserved: int = PROBE_CONNECTIONS) -> None:
        if limit is not None and limit - reserved < 1:
            raise ValueError(f"a budget of {limit} leaves no connection for a database")
        self.limit = limit  # None: no limit (tests that build a Server alone)
        self.capacity = None if limit is None else limit - reserved
        self._held: OrderedDict[Holder, None] = OrderedDict()
        self._busy: set[Holder] = set()  # walking their collectors: never closed for room
        self._reserved = 0  # places taken by connections being opened
        self._closing = 0  # connections closed whose backend may not have ended yet
        self._changed = asyncio.Event()  # replaced at each change; waiters hold the old one
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

    def _taken(self) -> int:
        return len(self._held) + self._reserved + self._closing

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def make_room(self, holder: Holder) -> None:
        """Reserve a place for ``holder``'s next connection, closing the least recently
        used idle ones or waiting for a busy one to finish; ``opened_for`` or ``cancel``
        then settles the reservation."""
        if self.capacity is None:
            return
        while self._taken() >= self.capacity:
            victims = lru_victims(list(self._held), self._busy | {holder}, 1)
            if victims:
                self.evictions += 1
                await victims[0].disconnect()  # through close(): the place frees after
            else:
                await self._changed.wait()
        self._reserved += 1

    def cancel(self) -> None:
        """A reserved connection was not opened (it failed, or its request ended)."""
        if self.capacity is not None:
            self._reserved -= 1
            self._notify()

    def opened_for(self, holder: Holder) -> None:
        """``holder`` has opened a connection: count it, as the most recently used."""
        if self.capacity is not None:
            self._reserved -= 1
        self._held[holder] = None
        self._held.move_to_end(holder)
        self.opened += 1
        self.opened_by[holder.label] = self.opened_by.get(holder.label, 0) + 1
        self.peak = max(self.peak, len(self._held))

    def used(self, holder: Holder) -> None:
        """``holder`` uses its connection again: it becomes the most recently used."""
        if holder in self._held:
            self._held.move_to_end(holder)

    async def close(self, holder: Holder, closing: Awaitable[None]) -> None:
        """``holder`` lets its connection go; its place is free once ``closing`` is done."""
        self._held.pop(holder, None)
        self._closing += 1
        try:
            await closing
        finally:
            self._closing -= 1
            self._notify()

    def busy(self, holder: Holder, *, busy: bool) -> None:
        """``holder`` starts (True) or ends (False) walking its collectors."""
        if busy:
            self._busy.add(holder)
        else:
            self._busy.discard(holder)
            self._notify()

    def forget(self, label: str) -> None:
        """A database has gone: drop its count, so that discovery churn leaves nothing behind."""
        self.opened_by.pop(label, None)
