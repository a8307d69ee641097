"""Routing endpoints without PostgreSQL: statuses, paths, methods and the probe's lifetime."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp.plugin import AiohttpClient

from exporter.config.settings import Settings
from exporter.health.probe import HealthProbe, HealthSnapshot, Status
from exporter.pg.bulkheads import HELD_CONNECTIONS
from exporter.web.healthpages import (
    HEALTH_PATHS,
    HEALTH_PROBE,
    PRIMARY_PATHS,
    REPLICA_PATHS,
    ROUTES,
    UP_PATHS,
    Want,
    answer,
    health_context,
    health_handler,
)
from tests.fixtures.clock import FakeClock
from tests.fixtures.polling import poll

Client = TestClient[web.Request, web.Application]
URL = "postgresql://monitor@127.0.0.1:1/postgres?sslmode=disable"


def _add_health_routes(app: web.Application) -> None:
    """Serve only the health and routing paths, every method, as the exporter does."""
    for path, want in ROUTES.items():
        app.router.add_route("*", path, health_handler(want))


@pytest.mark.parametrize(
    ("want", "status", "code"),
    [
        (Want.UP, Status.PRIMARY, 200),
        (Want.UP, Status.REPLICA, 200),
        (Want.PRIMARY, Status.PRIMARY, 200),
        (Want.PRIMARY, Status.REPLICA, 404),
        (Want.REPLICA, Status.REPLICA, 200),
        (Want.REPLICA, Status.PRIMARY, 404),
        *[(w, s, 503) for w in Want for s in (Status.STARTING, Status.DOWN, Status.UNKNOWN)],
    ],
)
def test_answer_follows_the_routing_table(want: Want, status: Status, code: int) -> None:
    """200 for a match, 404 for an up target in the other role, 503 whenever it is not up."""
    assert answer(want, status) == code


def test_health_paths_are_the_compatible_fifteen() -> None:
    """Every path of compatibility §2 is routed, each to its group."""
    assert set(UP_PATHS) == {"/up", "/health", "/liveness", "/readiness", "/read"}
    assert set(PRIMARY_PATHS) == {"/primary", "/leader", "/master", "/read-write", "/rw"}
    assert set(REPLICA_PATHS) == {"/replica", "/standby", "/slave", "/read-only", "/ro"}
    assert len(HEALTH_PATHS) == 15


_METHODS = ("GET", "HEAD", "OPTIONS", "POST", "PUT", "DELETE", "PATCH")


async def _routes_client(aiohttp_client: AiohttpClient, probe: HealthProbe) -> Client:
    app = web.Application()
    app[HEALTH_PROBE] = probe
    _add_health_routes(app)
    client: Client = await aiohttp_client(app)
    return client


@pytest.mark.parametrize("status", list(Status))
async def test_every_route_answers_from_the_snapshot(
    aiohttp_client: AiohttpClient, status: Status
) -> None:
    """Every method on each path gives the routing code (load balancers check with OPTIONS,
    HEAD, GET or POST); the body is the status word, empty for HEAD."""
    clock = FakeClock()
    probe = HealthProbe(URL, 0.1, clock=clock)
    probe.snapshot = HealthSnapshot(status, clock.now)
    client = await _routes_client(aiohttp_client, probe)
    groups = [(UP_PATHS, Want.UP), (PRIMARY_PATHS, Want.PRIMARY), (REPLICA_PATHS, Want.REPLICA)]
    for paths, want in groups:
        for path in paths:
            for method in _METHODS:
                got = await client.request(method, path)
                body = "" if method == "HEAD" else status.value
                assert (got.status, await got.text()) == (answer(want, status), body), (
                    method,
                    path,
                )
                assert got.headers["Cache-Control"] == "no-store"


async def test_a_probe_held_back_answers_not_probed_on_every_path(
    aiohttp_client: AiohttpClient,
) -> None:
    """When the server's bulkhead held the probe back, every health path answers 503
    with why, not a status word: the exporter did not look (issue 29)."""
    clock = FakeClock()
    probe = HealthProbe(URL, 0.1, clock=clock)
    why = f"not probed: {HELD_CONNECTIONS}"
    probe.snapshot = HealthSnapshot(Status.UNKNOWN, clock.now, why, not_probed=True)
    client = await _routes_client(aiohttp_client, probe)
    for path in HEALTH_PATHS:
        got = await client.get(path)
        assert (got.status, await got.text()) == (503, why), path
        assert got.headers["Cache-Control"] == "no-store"


async def test_context_runs_the_probe_for_the_app_lifetime(aiohttp_client: AiohttpClient) -> None:
    """The cleanup context publishes probe results while serving and stops the probe after."""
    app = web.Application()
    _add_health_routes(app)
    app.cleanup_ctx.append(health_context(Settings(url=URL, connect_timeout=0.5), interval=0.05))
    client: Client = await aiohttp_client(app)
    probe = app[HEALTH_PROBE]
    await poll(lambda: probe.snapshot.status is not Status.UNKNOWN)
    got = await client.get("/up")
    assert (got.status, await got.text()) == (503, "down")
    await client.close()
    names = {task.get_name() for task in asyncio.all_tasks()}
    assert "health probe" not in names
