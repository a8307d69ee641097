"""The exporter's aiohttp application: its factory and the runner production uses.

``run_app`` is not used: :mod:`exporter.serve` (the process layer) sets the runner
up, listens, and handles signals.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from exporter.collect.admission import Admission
from exporter.collect.exporter import Exporter
from exporter.config.definitions import Definitions
from exporter.config.settings import Settings
from exporter.config.targetsfile import Declared
from exporter.fleet.members import Fleet
from exporter.fleet.state import State
from exporter.report.selfmetrics import SelfMetrics
from exporter.web.appstate import STATE
from exporter.web.auth import install
from exporter.web.fleetpages import FLEET_PAGES, FleetPages
from exporter.web.fleetrequests import FLEET
from exporter.web.healthpages import HEALTH_PROBE, health_context
from exporter.web.metrics import Throttle
from exporter.web.reloading import RELOADER, Reloader, settle_heap
from exporter.web.routes import add_routes
from exporter.web.webconfig import WebConfig

SHUTDOWN_TIMEOUT = 10.0  # seconds for responses in flight to finish on SIGTERM
MALFORMED_LOG_PERIOD = 10.0  # seconds between two log lines about malformed requests


def create_app(
    settings: Settings, definitions: Definitions, web_config: WebConfig | None = None
) -> web.Application:
    """The exporter's aiohttp application; connections close on cleanup.

    Basic auth and extra headers from the web config apply to every route.
    """
    app = web.Application()
    exporter = Exporter(settings, definitions)
    app[STATE] = State(
        settings=settings,
        exporter=exporter,
        admission=Admission(),
        selfmetrics=SelfMetrics(settings.effective_namespace(), settings.const_labels),
    )
    app[RELOADER] = Reloader(settings, exporter=exporter)
    app.cleanup_ctx.append(_close_exporter)
    app.cleanup_ctx.append(health_context(settings))
    app.cleanup_ctx.append(_scrapes_tell_the_probe)
    add_routes(app, settings.telemetry_path)
    install(app, web_config or WebConfig())
    return app


def create_fleet_app(
    settings: Settings,
    definitions: Definitions,
    declared: Declared,
    web_config: WebConfig | None = None,
) -> web.Application:
    """The application of a fleet: ``/probe?target=NAME`` for every declared target,
    the exporter's own metrics at the telemetry path, and the ``/targets`` page.

    Every member starts (with its health probe) when the application does.
    """
    app = web.Application()
    fleet = Fleet(settings, declared, definitions)
    app[FLEET] = fleet
    app[FLEET_PAGES] = FleetPages.create()
    app[RELOADER] = Reloader(settings, fleet=fleet)
    app.cleanup_ctx.append(_run_fleet)
    add_routes(app, settings.telemetry_path, fleet=True)
    install(app, web_config or WebConfig())
    return app


async def _run_fleet(app: web.Application) -> AsyncIterator[None]:
    fleet = app[FLEET]
    fleet.start()
    settle_heap()
    yield
    await fleet.close()


async def _close_exporter(app: web.Application) -> AsyncIterator[None]:
    yield
    await app[STATE].exporter.close()


async def _scrapes_tell_the_probe(app: web.Application) -> AsyncIterator[None]:
    """A scrape that reads the other role than the health probe's wakes the probe."""
    exporter = app[STATE].exporter
    exporter.recovery_seen = app[HEALTH_PROBE].recovery_seen
    app[HEALTH_PROBE].logins = exporter.connections.logins  # one login back-off (issue 25)
    yield
    exporter.recovery_seen = None


def make_runner(app: web.Application) -> web.AppRunner:
    """The runner used in production (and by tests that need real sockets)."""
    # Handler cancellation is on by choice: a client that hangs up cancels its handler,
    # which stops waiting for the lock at once (B5) and tells the pass, which runs in a
    # task of its own, to start nothing new; a bounded collector in flight is shielded
    # and finishes (B11).
    # On SIGTERM, handlers still running after SHUTDOWN_TIMEOUT are cancelled; the
    # exporter then waits for its pass (SHUTDOWN_GRACE) and closes its connections.
    return web.AppRunner(
        app,
        logger=_REQUEST_ERRORS,
        access_log=None,
        handle_signals=False,
        handler_cancellation=True,
        shutdown_timeout=SHUTDOWN_TIMEOUT,
    )


class MalformedRequests(logging.Filter):
    """aiohttp logs each request it cannot parse (a request line over 8190 bytes, a TLS
    hello on the plain port) at ERROR with a traceback: a log flood anyone can cause.
    Such a record becomes one warning line, at most one a period, quoting nothing the
    client sent; other errors (a handler's failure) keep their traceback."""

    def __init__(self) -> None:
        super().__init__()
        self.throttle = Throttle(MALFORMED_LOG_PERIOD)

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, HttpProcessingError):
            return True
        held = self.throttle.allow()
        if held is None:
            return False
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.msg = "refused a malformed request with %d (%s)%s"
        more = f"; {held} more since the last such line" if held else ""
        record.args = (error.code, type(error).__name__, more)
        record.exc_info, record.exc_text = None, None
        return True


# The logger of the HTTP server's own errors (aiohttp's "aiohttp.server" otherwise).
_REQUEST_ERRORS = logging.getLogger("exporter.web.requests")
MALFORMED = MalformedRequests()
_REQUEST_ERRORS.addFilter(MALFORMED)
