"""The route table: the app, the landing page and the telemetry-path check read one list."""

from __future__ import annotations

import re

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp.plugin import AiohttpClient

from exporter.config.definitions import Definitions
from exporter.config.settings import Settings
from exporter.web.app import create_app
from exporter.web.routes import ROUTES, Route, telemetry_path_problems

Client = TestClient[web.Request, web.Application]
# Nothing listens there: the health probe fails at once and no test needs a database.
NOWHERE = "postgresql://127.0.0.1:1/postgres?sslmode=disable"


async def _client(aiohttp_client: AiohttpClient, telemetry_path: str = "/metrics") -> Client:
    settings = Settings(url=NOWHERE, connect_timeout=0.1, telemetry_path=telemetry_path)
    client: Client = await aiohttp_client(create_app(settings, Definitions(())))
    return client


def test_every_fixed_route_is_refused_as_telemetry_path() -> None:
    """No fixed route can be taken by the exposition, and ordinary paths can."""
    for route in ROUTES:
        assert f"clashes with the fixed route {route.path}" in telemetry_path_problems(route.path)
    assert telemetry_path_problems("/metrics") == []
    assert telemetry_path_problems("/pg/metrics") == []


async def test_landing_page_links_the_linked_routes(aiohttp_client: AiohttpClient) -> None:
    """The landing page links the telemetry path, then every linked route in table order."""
    client = await _client(aiohttp_client, "/pg")
    for path in ("/", "/nowhere"):
        page = await (await client.get(path)).text()
        links = re.findall(r'href="([^"]+)"', page)
        assert links == ["/pg", *(r.path for r in ROUTES if r.linked)]
    assert links == [
        "/pg",
        "/explain",
        "/stat",
        "/version",
        "/up",
        "/primary",
        "/replica",
        "/alive",
        "/reload",
    ]


@pytest.mark.parametrize("route", [r for r in ROUTES if r.path != "/reload"], ids=lambda r: r.path)
async def test_every_route_is_served_by_its_handler(
    aiohttp_client: AiohttpClient, route: Route
) -> None:
    """Each fixed path reaches its own handler (not the landing page) with the methods the
    table gives it."""
    client = await _client(aiohttp_client)
    methods = ("GET", "POST", "OPTIONS") if route.method == "*" else ("GET",)
    for method in methods:
        response = await client.request(method, route.path)
        assert "<h1>pg_exporter" not in await response.text(), (method, route.path)


async def test_alive_answers_200_while_the_target_is_down(aiohttp_client: AiohttpClient) -> None:
    """/alive reflects the exporter alone: 200 while /liveness (the target) says 503."""
    client = await _client(aiohttp_client)
    for method in ("GET", "HEAD", "OPTIONS"):
        response = await client.request(method, "/alive")
        assert response.status == 200, method
        assert response.headers["Cache-Control"] == "no-store"
    assert (await client.get("/liveness")).status == 503
