"""Health and traffic routing: handlers answer from the probe's snapshot, never the database.

Load balancers poll these endpoints often and act on the answer at once, so no
handler ever waits on the database: :mod:`exporter.health.probe` keeps what the
target is, and the handlers only read it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from exporter.config.settings import Settings
from exporter.health.probe import PROBE_INTERVAL, HealthProbe, Status
from exporter.health.probeslots import NOT_PROBED
from exporter.web.fleetrequests import FLEET, member_for

CleanupContext = Callable[[web.Application], AsyncIterator[None]]


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


def answer(want: Want, status: Status) -> int:
    """HTTP status of a routing endpoint: 200 match, 404 up in the other role, 503 not up."""
    if not status.is_up:
        return 503
    if want is Want.UP or want.value == status.value:
        return 200
    return 404


HEALTH_PROBE = web.AppKey("health_probe", HealthProbe)
ALIVE_PATH = "/alive"


async def alive_handler(request: web.Request) -> web.Response:
    """200 whenever the exporter's event loop answers, whatever the database does: the
    liveness probe of a container (``/liveness`` is Go's name for "the target is up")."""
    return web.Response(text="alive", headers=_HEADERS)


def health_handler(
    want: Want, key: web.AppKey[HealthProbe] = HEALTH_PROBE
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The handler of a routing endpoint: it reads the probe's snapshot, never the database."""

    async def handler(request: web.Request) -> web.Response:
        if FLEET in request.app:
            snapshot = await request.app[FLEET].health(member_for(request))
            if snapshot is None:  # the probe ceiling: an honest "not probed", never "down"
                return web.Response(status=503, text=NOT_PROBED, headers=_HEADERS)
        else:
            snapshot = request.app[key].current()
        if snapshot.not_probed:  # the server's bulkhead held the probe back (issue 29)
            return web.Response(status=503, text=snapshot.error, headers=_HEADERS)
        status = snapshot.status
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
