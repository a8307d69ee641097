"""The application factories and the production runner, without PostgreSQL: what each
app wires on start-up and undoes on cleanup, handler cancellation on a real socket, and
the filter that turns malformed-request tracebacks into one throttled line."""

from __future__ import annotations

import asyncio
import logging
import sys
import time

import pytest
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong
from aiohttp.test_utils import TestClient
from pytest_aiohttp.plugin import AiohttpClient

from exporter.config.definitions import Definitions
from exporter.config.settings import Settings
from exporter.config.targetsfile import Declared, DeclaredTarget
from exporter.web.app import (
    MALFORMED_LOG_PERIOD,
    MalformedRequests,
    create_app,
    create_fleet_app,
    make_runner,
)
from exporter.web.appstate import STATE
from exporter.web.fleetrequests import FLEET
from exporter.web.healthpages import HEALTH_PROBE
from exporter.web.reloading import RELOADER
from exporter.web.webconfig import WebConfig

Client = TestClient[web.Request, web.Application]
NOWHERE = "postgresql://monitor@127.0.0.1:1/{}?sslmode=disable"
WAIT = 30.0  # seconds: a deadline on what happens in milliseconds


def _settings() -> Settings:
    return Settings(url=NOWHERE.format("postgres"), connect_timeout=0.1, auto_discovery=False)


def _declared(*names: str) -> Declared:
    targets = tuple(DeclaredTarget(n, Settings(url=NOWHERE.format(n))) for n in names)
    return Declared("/etc/pg_exporter/targets.yml", targets)


async def test_the_single_target_app_wires_probe_exporter_and_reloader() -> None:
    """Started, the exporter tells the health probe what it sees and shares its login
    back-off, and /reload reloads the exporter that serves; cleanup unhooks the probe."""
    app = create_app(_settings(), Definitions(()))
    runner = make_runner(app)
    await runner.setup()
    exporter, probe = app[STATE].exporter, app[HEALTH_PROBE]
    try:
        assert exporter.recovery_seen == probe.recovery_seen
        assert probe.logins is exporter.connections.logins
        assert app[RELOADER].exporter is exporter
        assert app[RELOADER].fleet is None
    finally:
        await runner.cleanup()
    assert exporter.recovery_seen is None


async def test_the_web_config_applies_to_every_route(aiohttp_client: AiohttpClient) -> None:
    """The web config's headers reach the exposition (streamed), pages and health paths."""
    config = WebConfig(headers=(("X-Frame-Options", "deny"),))
    client: Client = await aiohttp_client(create_app(_settings(), Definitions(()), config))
    for path in ("/metrics", "/version", "/alive", "/"):
        response = await client.get(path)
        assert response.headers.get("X-Frame-Options") == "deny", path


async def test_the_fleet_app_starts_and_closes_its_members(aiohttp_client: AiohttpClient) -> None:
    """A fleet app builds every declared member on start-up (none connects), routes
    /probe to them, and closes them on cleanup."""
    app = create_fleet_app(_settings(), Definitions(()), _declared("a", "b"))
    fleet = app[FLEET]
    assert fleet.members == {}
    client: Client = await aiohttp_client(app)
    assert sorted(fleet.members) == ["a", "b"]
    assert app[RELOADER].fleet is fleet
    assert (await client.get("/probe", params={"target": "zz"})).status == 404
    assert "a" in await (await client.get("/sd")).text()
    await client.close()
    assert fleet.members == {}


async def test_head_on_the_fleets_metrics_sends_no_body(aiohttp_client: AiohttpClient) -> None:
    """The fleet's own metrics answer HEAD with headers only; the connection stays
    usable for the next request."""
    app = create_fleet_app(_settings(), Definitions(()), _declared("a"))
    client: Client = await aiohttp_client(app)
    head = await client.head("/metrics")
    assert head.status == 200
    assert await head.read() == b""
    after = await client.get("/metrics")
    assert after.status == 200
    assert "pg_exporter_fleet_targets" in await after.text()


async def test_a_client_that_hangs_up_cancels_its_handler() -> None:
    """The production runner cancels a handler whose client left (handler cancellation
    on, so a hung-up scrape stops waiting at once: B5)."""
    entered, cancelled = asyncio.Event(), asyncio.Event()

    async def forever(request: web.Request) -> web.Response:
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return web.Response()

    app = web.Application()
    app.router.add_get("/wait", forever)
    runner = make_runner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /wait HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        async with asyncio.timeout(WAIT):
            await entered.wait()
        writer.close()
        await writer.wait_closed()
        async with asyncio.timeout(WAIT):
            await cancelled.wait()
    finally:
        await runner.cleanup()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """time.monotonic frozen at ``clock[0]``, which the test moves."""
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    return now


def _record(error: BaseException) -> logging.LogRecord:
    try:
        raise error
    except BaseException:
        return logging.LogRecord(
            "exporter.web.requests", logging.ERROR, __file__, 1, "Error handling request",
            None, sys.exc_info(),
        )  # fmt: skip


def test_a_malformed_request_becomes_one_warning_without_traceback(clock: list[float]) -> None:
    """aiohttp's traceback for an unparsable request becomes a warning naming the status
    and the error's class, quoting nothing the client sent."""
    record = _record(LineTooLong(b"GET /" + b"secret" * 2000, "8190"))
    assert MalformedRequests().filter(record)
    assert record.levelno == logging.WARNING
    assert record.levelname == "WARNING"
    assert record.exc_info is None
    assert record.getMessage() == "refused a malformed request with 400 (LineTooLong)"
    assert "secret" not in record.getMessage()


def test_malformed_requests_log_at_most_once_a_period(clock: list[float]) -> None:
    """Within the period further lines are dropped; the next one says how many were."""
    malformed = MalformedRequests()
    assert malformed.filter(_record(BadHttpMessage("x")))
    assert not malformed.filter(_record(BadHttpMessage("y")))
    assert not malformed.filter(_record(BadHttpMessage("z")))
    clock[0] += MALFORMED_LOG_PERIOD
    record = _record(BadHttpMessage("w"))
    assert malformed.filter(record)
    assert record.getMessage().endswith("; 2 more since the last such line")


def test_other_errors_keep_their_traceback(clock: list[float]) -> None:
    """A handler's own failure is not throttled nor rewritten."""
    malformed = MalformedRequests()
    for _ in range(3):
        record = _record(RuntimeError("handler broke"))
        assert malformed.filter(record)
        assert record.levelno == logging.ERROR
        assert record.exc_info is not None
