"""pgBouncer mode against a real pgBouncer: console commands only, no transactions (D4)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from pytest_aiohttp.plugin import AiohttpClient

from exporter.collect.cache import Outcome
from exporter.config.loading import load_definitions
from exporter.config.settings import Settings
from exporter.web.app import create_app
from exporter.web.appstate import STATE
from rigs.localbouncer import LocalPgBouncer
from tests.fixtures.helpers import COLLECTORS, samples, value


async def test_default_pgbouncer_collectors_run_clean(
    aiohttp_client: AiohttpClient, pgbouncer18: LocalPgBouncer
) -> None:
    """The pgbouncer_* collectors run with zero errors, under the pgbouncer namespace, with
    pgbouncer_up 1 and the version read from SHOW VERSION."""
    settings = replace(Settings(url=pgbouncer18.dsn()), connect_timeout=5.0)
    assert settings.is_pgbouncer
    client = await aiohttp_client(create_app(settings, load_definitions(str(COLLECTORS))))
    response = await client.get("/metrics")
    assert response.status == 200
    body = await response.text()
    main = client.app[STATE].exporter.main
    assert main.plan is not None
    planned = {c.name for c in main.plan.planned}
    assert planned == {"pgbouncer_list", "pgbouncer_database", "pgbouncer_stat", "pgbouncer_pool"}
    failures = [key for key, r in main.runtimes.items() if r.outcome is not Outcome.OK]
    assert failures == []
    assert value(body, "pgbouncer_up") == 1
    assert value(body, "pgbouncer_version") >= 11800
    assert "pg_up" not in {name for name, _ in samples(body)}
    assert any(name.startswith("pgbouncer_pool_") for name, _ in samples(body))
    assert not client.app[STATE].exporter.discovered  # no discovery in pgBouncer mode
    log = pgbouncer18.log_path.read_text()
    assert "unsupported" not in log.lower()


async def test_pgbouncer_health_reads_up(
    aiohttp_client: AiohttpClient, pgbouncer18: LocalPgBouncer
) -> None:
    """Health endpoints report the console as up once the probe has run."""
    settings = replace(Settings(url=pgbouncer18.dsn()), connect_timeout=5.0)
    client = await aiohttp_client(create_app(settings, load_definitions(str(COLLECTORS))))
    deadline = time.monotonic() + 10  # the probe runs once a second
    while (response := await client.get("/up")).status != 200:
        assert time.monotonic() < deadline, await response.text()
        await asyncio.sleep(0.05)
    assert await response.text() == "primary"
