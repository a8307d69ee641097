"""Which member a fleet request names (``?target=NAME``), through a real aiohttp client.

No member connects: a request is answered from the declared names alone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp.plugin import AiohttpClient

from exporter.config.definitions import Definitions
from exporter.config.settings import Settings
from exporter.config.targetsfile import Declared, DeclaredTarget
from exporter.fleet.members import Fleet
from exporter.fleet.state import State
from exporter.web.fleetrequests import FLEET, member_for, state_for

Client = TestClient[web.Request, web.Application]
NOWHERE = "postgresql://monitor@127.0.0.1:1/{}?sslmode=disable"
OWN = web.AppKey("own", State)


def _declared(*names: str) -> Declared:
    targets = tuple(DeclaredTarget(n, Settings(url=NOWHERE.format(n))) for n in names)
    return Declared("/etc/pg_exporter/targets.yml", targets)


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    """A started fleet of two declared targets, closed after the test."""
    started = Fleet(Settings(url=NOWHERE.format("x")), _declared("alpha", "beta"), Definitions(()))
    started.start()
    yield started
    await started.close()


async def _named(request: web.Request) -> web.Response:
    return web.Response(text=member_for(request).name)


async def _client(aiohttp_client: AiohttpClient, fleet: Fleet) -> Client:
    app = web.Application()
    app[FLEET] = fleet
    app.router.add_get("/probe", _named)
    client: Client = await aiohttp_client(app)
    return client


async def test_a_declared_name_reaches_its_member(
    aiohttp_client: AiohttpClient, fleet: Fleet
) -> None:
    """``?target=NAME`` finds the member declared as NAME."""
    client = await _client(aiohttp_client, fleet)
    for name in ("alpha", "beta"):
        response = await client.get("/probe", params={"target": name})
        assert response.status == 200
        assert await response.text() == name


@pytest.mark.parametrize(
    "query",
    ["", "?target=alpha&target=beta", "?target=alpha&x=1", "?module=alpha", "?target=alpha&target"],
)
async def test_anything_but_one_target_is_a_400(
    aiohttp_client: AiohttpClient, fleet: Fleet, query: str
) -> None:
    """No name, two names or another parameter: 400 saying how to ask, and where the
    declared names are listed."""
    client = await _client(aiohttp_client, fleet)
    response = await client.get(f"/probe{query}")
    assert response.status == 400
    text = await response.text()
    assert "?target=NAME" in text
    assert "/targets" in text


async def test_an_undeclared_name_is_a_404_that_does_not_echo_it(
    aiohttp_client: AiohttpClient, fleet: Fleet
) -> None:
    """A name not declared gets 404; the client's text, which may be a URL with a
    password, never comes back in the answer."""
    client = await _client(aiohttp_client, fleet)
    asked = "postgresql://admin:s3cret@db.example:5432/postgres"
    response = await client.get("/probe", params={"target": asked})
    assert response.status == 404
    text = await response.text()
    assert "s3cret" not in text
    assert "db.example" not in text
    assert "/targets" in text


async def test_a_url_is_never_taken_as_a_target(
    aiohttp_client: AiohttpClient, fleet: Fleet
) -> None:
    """A URL naming a declared target's own address is still not a declared name."""
    client = await _client(aiohttp_client, fleet)
    response = await client.get("/probe", params={"target": NOWHERE.format("alpha")})
    assert response.status == 404


async def test_state_for_reads_the_member_in_a_fleet(
    aiohttp_client: AiohttpClient, fleet: Fleet
) -> None:
    """In fleet mode a request's state is the named member's."""
    seen: list[State] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(state_for(request, OWN))
        return web.Response()

    app = web.Application()
    app[FLEET] = fleet
    app.router.add_get("/x", handler)
    client: Client = await aiohttp_client(app)
    assert (await client.get("/x", params={"target": "beta"})).status == 200
    member = fleet.member("beta")
    assert member is not None
    assert seen == [member.state]
    assert (await client.get("/x")).status == 400  # a fleet still needs a name


async def test_state_for_reads_the_app_without_a_fleet(
    aiohttp_client: AiohttpClient, fleet: Fleet
) -> None:
    """Without a fleet the app's own state answers, whatever the query says."""
    member = fleet.member("alpha")
    assert member is not None
    seen: list[State] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(state_for(request, OWN))
        return web.Response()

    app = web.Application()
    app[OWN] = member.state
    app.router.add_get("/x", handler)
    client: Client = await aiohttp_client(app)
    assert (await client.get("/x", params={"target": "nobody"})).status == 200
    assert seen == [member.state]
