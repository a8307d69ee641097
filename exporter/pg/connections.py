"""The connection limit: at most ``--max-connections`` to the target at once (issue 13).

Every database the exporter scrapes wants a connection of its own (PostgreSQL binds
a connection to one database), and each new one costs the server a fork. The
limit holds the connections of all databases, plus the health probe's, to that
number: when one more is needed and none is free, the least recently used idle one
is closed first, or, when every one is busy (databases walked in parallel), the
walk waits for one to finish. Choosing what to close is a plain function;
:class:`ConnectionLimit` keeps the order and the counts, and awaits the closing.
Every connection is also opened within the bulkhead of the server it reaches, shared
by every target naming that server (:mod:`exporter.pg.bulkheads`, issue 29).
"""

from __future__ import annotations

import asyncio
import logging
import random as _random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import psycopg

from exporter.pg import postgres
from exporter.pg.addresses import ServerKey
from exporter.pg.bulkheads import Bulkheads, Conn, Connector, Lease, LoginsHeld
from exporter.pg.loginrate import LOGIN_CEILING, Random, login_wait, refused_login

log = logging.getLogger(__name__)

#: Connections the health probe keeps outside the databases' share.
PROBE_CONNECTIONS = 1

K = TypeVar("K")
T = TypeVar("T")

__all__ = ["ConnectionLimit", "LoginHeld", "Logins", "lru_victims", "refused_login"]


class LoginHeld(psycopg.OperationalError):
    """No connection attempted: the server refused the last login and its wait is not over."""


@dataclass(slots=True)
class _Refusals:
    """Logins to one database the server refused in a row, and when the next may go."""

    count: int
    retry_at: float  # the clock's seconds
    error: str  # the server's last refusal, first line
    trying: bool = False  # a login is under way: the others wait for its verdict


class Logins:
    """A target's logins: after the server refuses one, the next waits (issue 25).

    Passes and the health probe ask here before connecting, so a wrong password (a
    rotation in progress) costs the server a few failed logins a minute however often
    clients ask, not one per scrape and probe. While a database waits, they fail at
    once with the last refusal, without dialling. Any other failure (a refused or
    timed-out connection: the server is down or restarting) waits nothing, so a server
    coming back is seen as soon as before; a success or a reload forgets the refusals.
    """

    def __init__(
        self,
        servers: Bulkheads | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        random: Random = _random.random,
    ) -> None:
        self.servers = servers or Bulkheads()  # the process's, shared by every target
        self.clock = clock
        self.random = random
        self._refused: dict[str | None, _Refusals] = {}  # by database; None: the URL's
        self.held = 0  # connections not attempted because the server refused the last login
        self.keys: dict[ServerKey, None] = {}  # the servers this target's logins reached

    def reset(self) -> None:
        """Forget every refusal: the operator may have fixed the password (a reload)."""
        self._refused.clear()

    def wait(self, database: str | None = None) -> float:
        """Seconds until ``database``'s next login may go; 0 when it may go now."""
        refused = self._refused.get(database)
        return 0.0 if refused is None else max(0.0, refused.retry_at - self.clock())

    async def open(
        self,
        database: str | None,
        conninfo: str,
        connect_timeout: float,
        *,
        probe: bool,
        connector: Connector = postgres.connect,
    ) -> tuple[Conn, Lease]:
        """A connection to ``database`` and its place at its server: dialled only when the
        target's back-off and the server's bulkhead allow."""
        servers = self.servers
        conn, lease = await self.connect(
            database,
            lambda: servers.connect(conninfo, connect_timeout, probe=probe, connector=connector),
        )
        self.keys[lease.bulkhead.key] = None
        return conn, lease

    async def connect(self, database: str | None, dial: Callable[[], Awaitable[T]]) -> T:
        """``dial()``, unless the server refused ``database``'s last login and the wait is
        not over (or another login to it is under way): then LoginHeld, without dialling."""
        refused = self._refused.get(database)
        if refused is not None:
            if refused.trying or self.clock() < refused.retry_at:
                self.held += 1
                raise LoginHeld(self._held_message(refused))
            refused.trying = True
        try:
            conn = await dial()
        except BaseException as exc:
            self._failed(database, exc)
            raise
        if self._refused.pop(database, None) is not None:
            log.info("the server accepts the login again", extra={"datname": database or ""})
        return conn

    def _held_message(self, refused: _Refusals) -> str:
        wait = max(0.0, refused.retry_at - self.clock())
        return (
            f"{refused.error} (not tried again: the server refused the last {refused.count} "
            f"login(s); the next in {wait:.0f}s, or at once after a reload)"
        )

    def _failed(self, database: str | None, exc: BaseException) -> None:
        """Count a refusal and set its wait; any other failure forgets the refusals (the
        server went away, so what it thinks of us is unknown again)."""
        previous = self._refused.pop(database, None)
        if not refused_login(exc):
            if previous is not None and _no_verdict(exc):
                previous.trying = False
                self._refused[database] = previous
            return
        count = (previous.count if previous else 0) + 1
        wait = login_wait(count, self.random)
        error = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        self._refused[database] = _Refusals(count, self.clock() + wait, error)
        level = logging.WARNING if previous is None else logging.INFO
        log.log(
            level,
            "the server refused the login; the next attempt waits %.1fs, doubling up to "
            "%gs while it refuses (a reload tries at once): %s",
            wait, LOGIN_CEILING, error, extra={"datname": database or ""},
        )  # fmt: skip


def _no_verdict(exc: BaseException) -> bool:
    """True when the server never judged the login: it was cancelled with its request, or
    the server's bulkhead held it back (issue 29)."""
    return not isinstance(exc, psycopg.Error) or isinstance(exc, LoginsHeld)


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


class ConnectionLimit:
    """The databases' share of the connection limit, in least-recently-used order.

    Databases scraped in parallel each reserve a place before connecting; a place is
    free again only once the closed backend has ended, so the server never sees more
    connections than the limit, however the walks interleave.
    """

    def __init__(
        self,
        limit: int | None,
        reserved: int = PROBE_CONNECTIONS,
        *,
        servers: Bulkheads | None = None,
    ) -> None:
        if limit is not None and limit - reserved < 1:
            raise ValueError(f"a limit of {limit} leaves no connection for a database")
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
        self.logins = Logins(servers)  # refused logins, shared with the target's health probe
        self._leases: dict[Holder, Lease] = {}  # each open connection's place at its server

    @classmethod
    def unlimited(cls) -> ConnectionLimit:
        """No limit: one connection per database, as before the limit existed (D5)."""
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

    @property
    def servers(self) -> Bulkheads:
        """The per-server bulkheads every connection is opened within (issue 29)."""
        return self.logins.servers

    async def dial(
        self,
        holder: Holder,
        database: str | None,
        conninfo: str,
        connect_timeout: float,
        connector: Connector = postgres.connect,
    ) -> Conn:
        """``holder``'s connection to ``database``, within the target's login back-off and
        the bulkhead of the server it reaches; ``opened_for`` then counts it."""
        conn, lease = await self.logins.open(
            database, conninfo, connect_timeout, probe=False, connector=connector
        )
        lease.holder = holder
        lease.role = postgres.role_of(conninfo)
        self._leases[holder] = lease
        return conn

    def guard_logins(self, holder: Holder, options: str | None) -> None:
        """From now on ``holder``'s role logs in at its server with ``options`` (this
        server's guards, its session proven direct), or without (None: it was not, issue
        36)."""
        lease = self._leases.get(holder)
        if lease is None:
            return
        refused = lease.role in lease.bulkhead.login_refused
        lease.bulkhead.login_options[lease.role] = None if refused else options

    def opened_for(self, holder: Holder) -> None:
        """``holder`` has opened a connection: count it, as the most recently used."""
        if (lease := self._leases.get(holder)) is not None:
            lease.use(busy=holder in self._busy)
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
        """``holder`` lets its connection go; its places (here and at its server) are free
        once ``closing`` is done."""
        self._held.pop(holder, None)
        lease = self._leases.pop(holder, None)
        if lease is not None:
            lease.use(busy=True)  # closing: not one to close again for room
        self._closing += 1
        try:
            await closing
        finally:
            self._closing -= 1
            if lease is not None:
                lease.release()
            self._notify()

    def busy(self, holder: Holder, *, busy: bool) -> None:
        """``holder`` starts (True) or ends (False) walking its collectors."""
        if busy:
            self._busy.add(holder)
        else:
            self._busy.discard(holder)
            self._notify()
        if (lease := self._leases.get(holder)) is not None:
            lease.use(busy=busy)

    def forget(self, label: str) -> None:
        """A database has gone: drop its count, so that discovery churn leaves nothing behind."""
        self.opened_by.pop(label, None)
