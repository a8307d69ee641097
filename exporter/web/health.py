"""Health and traffic routing: a background probe keeps a snapshot that handlers only read.

Load balancers poll these endpoints often and act on the answer at once, so no
handler ever waits on the database. One probe task, on its own connection, asks
the server once per interval within the connect timeout and publishes an
immutable snapshot; a hung server costs the probe its deadline, never a handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import psycopg
from aiohttp import web

from exporter import postgres
from exporter.settings import Settings

log = logging.getLogger(__name__)

Conn = psycopg.AsyncConnection[tuple[object, ...]]
Connector = Callable[[str, float], Awaitable[Conn]]
CleanupContext = Callable[[web.Application], AsyncIterator[None]]

PROBE_INTERVAL = 1.0  # seconds between the starts of two probes
ABANDON_LIMIT = 1.0  # seconds spent at most unwinding a probe that missed its deadline
STALE_PERIODS = 3  # a snapshot older than this many probe periods is no longer trusted
# libpq reports no SQLSTATE when the server refuses a connection, so 57P03 is
# recognised by the server's (English) message; every 57P03 text starts like this.
CANNOT_CONNECT_NOW = "57P03"
_CANNOT_CONNECT_NOW_TEXT = "the database system is "


class Status(enum.Enum):
    """What the target is, as the health endpoints say it."""

    PRIMARY = "primary"
    REPLICA = "replica"
    STARTING = "starting"
    DOWN = "down"
    UNKNOWN = "unknown"

    @property
    def is_up(self) -> bool:
        """True when the target answers queries (pgBouncer counts as a primary)."""
        return self in (Status.PRIMARY, Status.REPLICA)


class Want(enum.Enum):
    """What a routing endpoint asks of the target."""

    UP = "up"
    PRIMARY = "primary"
    REPLICA = "replica"


UP_PATHS = ("/up", "/health", "/liveness", "/readiness", "/read")
PRIMARY_PATHS = ("/primary", "/leader", "/master", "/read-write", "/rw")
REPLICA_PATHS = ("/replica", "/standby", "/slave", "/read-only", "/ro")
ROUTES: dict[str, Want] = {
    **dict.fromkeys(UP_PATHS, Want.UP),
    **dict.fromkeys(PRIMARY_PATHS, Want.PRIMARY),
    **dict.fromkeys(REPLICA_PATHS, Want.REPLICA),
}
HEALTH_PATHS = tuple(ROUTES)
# A load balancer or proxy must never serve a remembered answer.
_HEADERS = {"Cache-Control": "no-store"}


@dataclass(frozen=True, slots=True)
class HealthSnapshot:
    """The outcome of one probe."""

    status: Status
    checked_at: float  # the probe's clock when the outcome was known
    error: str = ""  # why the target is not up; empty when it is


def answer(want: Want, status: Status) -> int:
    """HTTP status of a routing endpoint: 200 match, 404 up in the other role, 503 not up."""
    if not status.is_up:
        return 503
    if want is Want.UP or want.value == status.value:
        return 200
    return 404


def classify(exc: BaseException) -> Status:
    """STARTING for SQLSTATE 57P03 (starting, recovering, shutting down), else DOWN."""
    if getattr(exc, "sqlstate", None) == CANNOT_CONNECT_NOW:
        return Status.STARTING
    if isinstance(exc, psycopg.Error) and _CANNOT_CONNECT_NOW_TEXT in str(exc):
        return Status.STARTING
    return Status.DOWN


class HealthProbe:
    """Probes one target on one connection, once per interval, and keeps the snapshot."""

    def __init__(
        self,
        url: str,
        connect_timeout: float,
        *,
        interval: float = PROBE_INTERVAL,
        pgbouncer: bool = False,
        clock: Callable[[], float] = time.monotonic,
        connector: Connector = postgres.connect,
    ) -> None:
        if connect_timeout <= 0 or interval <= 0:
            raise ValueError("connect_timeout and interval must be positive")
        self.connect_timeout = connect_timeout
        self.interval = interval
        self.pgbouncer = pgbouncer
        # pgBouncer's console speaks only the simple protocol and has no functions.
        self.sql = "SHOW VERSION" if pgbouncer else "SELECT pg_is_in_recovery()"
        self.stale_after = STALE_PERIODS * (interval + connect_timeout) + ABANDON_LIMIT
        self._conninfo = postgres.conninfo_for(url, None, connect_timeout)
        self._clock = clock
        self._connector = connector
        self._conn: Conn | None = None
        self.snapshot = HealthSnapshot(Status.UNKNOWN, clock(), "not probed yet")

    def current(self) -> HealthSnapshot:
        """The snapshot, or UNKNOWN when the probe has stopped refreshing it."""
        age = self._clock() - self.snapshot.checked_at
        if age <= self.stale_after:
            return self.snapshot
        return HealthSnapshot(Status.UNKNOWN, self.snapshot.checked_at, f"no probe for {age:.0f}s")

    async def run(self) -> None:
        """Probe once per interval until cancelled; probes never overlap."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await self.probe_once()
            await asyncio.sleep(max(0.0, self.interval - (loop.time() - started)))

    async def probe_once(self) -> HealthSnapshot:
        """Ask the target once, within the connect timeout, and publish the outcome."""
        task = asyncio.create_task(self._ask(), name="health probe query")
        try:
            done, _ = await asyncio.wait({task}, timeout=self.connect_timeout)
            if task in done:
                self._publish(*_outcome(task))
            else:
                self._publish(Status.DOWN, f"no answer within {self.connect_timeout:g}s")
        finally:
            if not task.done():
                await _abandon(task)
        return self.snapshot

    async def close(self) -> None:
        """Close the probe's connection."""
        conn, self._conn = self._conn, None
        await postgres.close_quietly(conn)

    async def _ask(self) -> Status:
        """One question, on the kept connection or a new one; any failure drops it."""
        try:
            conn = self._conn
            if conn is not None and not conn.closed and not conn.broken:
                try:
                    return await self._query(conn)
                except psycopg.Error as exc:  # e.g. the server restarted: try a fresh one
                    log.debug("health probe connection failed, reconnecting: %s", exc)
                    await self.close()
            self._conn = await self._connector(self._conninfo, self.connect_timeout)
            return await self._query(self._conn)
        except BaseException:
            await self.close()
            raise

    async def _query(self, conn: Conn) -> Status:
        cur = await conn.execute(self.sql, prepare=False)
        if self.pgbouncer:
            return Status.PRIMARY  # any answer from the console means pgBouncer is up
        row = await cur.fetchone()
        return Status.REPLICA if row is not None and row[0] is True else Status.PRIMARY

    def _publish(self, status: Status, error: str) -> None:
        old = self.snapshot.status
        self.snapshot = HealthSnapshot(status, self._clock(), error)
        if status is not old:
            level = logging.INFO if status.is_up or old is Status.UNKNOWN else logging.WARNING
            log.log(level, "health status changed", extra=_change(old, status, error))


def _change(old: Status, new: Status, error: str) -> dict[str, str]:
    fields = {"from": old.value, "to": new.value}
    return fields | {"reason": error} if error else fields


def _outcome(task: asyncio.Task[Status]) -> tuple[Status, str]:
    exc = task.exception()
    if exc is None:
        return task.result(), ""
    if not isinstance(exc, psycopg.Error):
        log.warning("health probe failed unexpectedly", exc_info=exc)
    return classify(exc), _first_line(exc)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


async def _abandon(task: asyncio.Task[Status]) -> None:
    """Unwind a probe that missed its deadline without waiting on the server.

    psycopg answers the first cancellation of a running query by asking the
    server to cancel it and waiting for that, which against a hung server takes
    seconds; a further cancellation makes it close the connection at once.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ABANDON_LIMIT
    while not task.done() and loop.time() < deadline:
        task.cancel()
        await asyncio.wait({task}, timeout=0.01)
    if not task.done():  # pragma: no cover - psycopg always yields to a repeated cancel
        log.warning("health probe did not stop within %gs; leaving it behind", ABANDON_LIMIT)


HEALTH_PROBE = web.AppKey("health_probe", HealthProbe)


def health_handler(
    want: Want, key: web.AppKey[HealthProbe] = HEALTH_PROBE
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The handler of a routing endpoint: it reads the probe's snapshot, never the database."""

    async def handler(request: web.Request) -> web.Response:
        status = request.app[key].current().status
        return web.Response(status=answer(want, status), text=status.value, headers=_HEADERS)

    return handler


def health_context(
    settings: Settings,
    key: web.AppKey[HealthProbe] = HEALTH_PROBE,
    *,
    interval: float = PROBE_INTERVAL,
) -> CleanupContext:
    """A cleanup context that runs the probe for the application's lifetime."""

    async def probing(app: web.Application) -> AsyncIterator[None]:
        probe = HealthProbe(
            settings.target.conninfo,
            settings.connect_timeout,
            interval=interval,
            pgbouncer=settings.is_pgbouncer,
        )
        app[key] = probe
        task = asyncio.create_task(probe.run(), name="health probe")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await probe.close()

    return probing
