"""Operator pages that need no database to test: /explain never waits for a pass."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp.plugin import AiohttpClient

from exporter.config.definitions import Definitions
from exporter.config.settings import Settings
from exporter.web.app import create_app
from exporter.web.appstate import STATE

Client = TestClient[web.Request, web.Application]
# Nothing listens there: the health probe fails at once and no test needs a database.
NOWHERE = "postgresql://127.0.0.1:1/postgres?sslmode=disable"


async def test_explain_answers_at_once_while_a_pass_holds_the_lock(
    aiohttp_client: AiohttpClient,
) -> None:
    """/explain reads the last plans: with a pass in flight (the lock taken) it answers at
    once, where waiting for the pass would take its 30 s budget."""
    app = create_app(Settings(url=NOWHERE, connect_timeout=0.1), Definitions(()))
    client: Client = await aiohttp_client(app)
    lock = app[STATE].exporter.lock
    await lock.acquire()
    try:
        async with asyncio.timeout(5):
            response = await client.get("/explain")
            text = await response.text()
    finally:
        lock.release()
    assert response.status == 200
    assert text.startswith("nothing planned yet")
