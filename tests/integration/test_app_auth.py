"""Basic auth wired into the real exporter app: no endpoint answers anonymous requests,
and a password flood does not keep a scraper out."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import bcrypt
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp.plugin import AiohttpClient

from exporter.web.app import create_app
from exporter.web.webconfig import WebConfig
from rigs.localpg import LocalCluster
from tests.fixtures.helpers import settings_for, value, write_collectors
from tests.fixtures.rawhttp import serving
from tests.fixtures.webrig import FLOOD, flooding, median_login

PATHS = ["/metrics", "/", "/explain", "/stat", "/version", "/nowhere"]
USER, PASSWORD = "prom", "right horse"
ONE = (
    "one:\n  query: SELECT 1 AS v\n  timeout: 5\n  metrics:\n"
    "    - v: {usage: GAUGE, description: one}\n"
)


def _auth(user: str, password: str) -> dict[str, str]:
    return {"Authorization": aiohttp.encode_basic_auth(user, password)}


@pytest.fixture
async def client(
    aiohttp_client: AiohttpClient, pg18: LocalCluster, tmp_path: pytest.TempPathFactory
) -> TestClient[web.Request, web.Application]:
    """The exporter app with one basic-auth user and an extra response header."""
    definitions = write_collectors(tmp_path, ONE)  # type: ignore[arg-type]
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


async def test_scrapes_go_on_during_a_password_flood(pg18: LocalCluster, tmp_path: Path) -> None:
    """With 20 wrong-password loops from 5 addresses, a scraper's first scrape (bcrypt
    included) takes about what it takes alone, and later ones stay fast."""
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=11))  # about 0.2 s
    early, late = ["early1", "early2", "early3"], ["late1", "late2", "late3"]
    web_config = WebConfig(users=dict.fromkeys(early + late, hashed))
    settings = settings_for(pg18, auto_discovery=False)
    definitions = write_collectors(tmp_path, ONE)
    async with serving(settings, definitions, web_config) as served:
        url = f"http://127.0.0.1:{served.port}/metrics"
        alone = await median_login(url, early, PASSWORD)
        async with flooding(url, served.app):
            first = await median_login(url, late, PASSWORD)
            remembered = await median_login(url, early, PASSWORD)
    print(
        f"\nscrape alone {alone:.3f} s; flood: first {first:.3f} s, remembered {remembered:.3f} s"
    )
    assert first < FLOOD / 2 * alone  # queued behind the flood it was about FLOOD times alone
    assert remembered < alone
