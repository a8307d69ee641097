"""Basic auth wired into the real exporter app: no endpoint answers anonymous requests."""

from __future__ import annotations

import aiohttp
import bcrypt
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp.plugin import AiohttpClient

from exporter.localpg import LocalCluster
from exporter.web import create_app
from exporter.webconfig import WebConfig
from tests.integration.helpers import settings_for, value, write_collectors

PATHS = ["/metrics", "/", "/explain", "/stat", "/version", "/nowhere"]
USER, PASSWORD = "prom", "right horse"


def _auth(user: str, password: str) -> dict[str, str]:
    return {"Authorization": aiohttp.encode_basic_auth(user, password)}


@pytest.fixture
async def client(
    aiohttp_client: AiohttpClient, pg18: LocalCluster, tmp_path: pytest.TempPathFactory
) -> TestClient[web.Request, web.Application]:
    """The exporter app with one basic-auth user and an extra response header."""
    definitions = write_collectors(
        tmp_path,  # type: ignore[arg-type]
        "one:\n  query: SELECT 1 AS v\n  timeout: 5\n  metrics:\n"
        "    - v: {usage: GAUGE, description: one}\n",
    )
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4))
    web_config = WebConfig(users={USER: hashed}, headers=(("X-Frame-Options", "deny"),))
    app = create_app(settings_for(pg18, auto_discovery=False), definitions, web_config)
    return await aiohttp_client(app)


@pytest.mark.parametrize("path", PATHS)
async def test_anonymous_and_wrong_password_get_401(
    client: TestClient[web.Request, web.Application], path: str
) -> None:
    """Every endpoint answers 401 without credentials or with a wrong password."""
    anonymous = await client.get(path)
    assert anonymous.status == 401
    assert anonymous.headers["WWW-Authenticate"].startswith("Basic")
    wrong = await client.get(path, headers=_auth(USER, "wrong"))
    assert wrong.status == 401


async def test_right_password_scrapes_with_headers(
    client: TestClient[web.Request, web.Application],
) -> None:
    """With the right password the exposition is served, carrying the configured header."""
    response = await client.get("/metrics", headers=_auth(USER, PASSWORD))
    assert response.status == 200
    assert response.headers["X-Frame-Options"] == "deny"
    assert value(await response.text(), "one_v") == 1
