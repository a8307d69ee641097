"""The default collector library on real PostgreSQL 18 and 15, primary and replica (D13)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp.plugin import AiohttpClient

from exporter.cache import Outcome
from exporter.loading import load_definitions
from exporter.localpg import LocalCluster
from exporter.settings import with_sslmode
from exporter.state import STATE
from exporter.web import create_app
from tests.integration.helpers import COLLECTORS, samples, settings_for, value, wait_for
from tests.promtool import unexpected_problems

Client = TestClient[web.Request, web.Application]

MONITOR_ROLE = "pgexp_monitor"
APP_DB = "libapp"
# Floors, not exact counts: the library may grow, but never silently shrink.
MIN_PLANNED_MAIN = 14
MIN_FAMILIES = 150

_WORKLOAD = f"""
CREATE EXTENSION IF NOT EXISTS pg_stat_statements;
DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{MONITOR_ROLE}') THEN
    CREATE ROLE {MONITOR_ROLE} LOGIN NOSUPERUSER CONNECTION LIMIT 10 IN ROLE pg_monitor;
  END IF;
END $$;
SELECT 'CREATE DATABASE {APP_DB}' WHERE NOT EXISTS
  (SELECT FROM pg_database WHERE datname = '{APP_DB}') \\gexec
"""

_APP_OBJECTS = """
CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, customer int, total numeric);
CREATE INDEX IF NOT EXISTS orders_customer ON orders (customer);
CREATE SEQUENCE IF NOT EXISTS ticket_seq;
CREATE OR REPLACE FUNCTION order_count() RETURNS bigint LANGUAGE sql AS
  'SELECT count(*) FROM orders';
INSERT INTO orders (customer, total) SELECT i % 40, i * 1.5 FROM generate_series(1, 2000) i;
DELETE FROM orders WHERE id % 7 = 0;
ANALYZE orders;
SELECT order_count(), nextval('ticket_seq');
"""


def _prepare(cluster: LocalCluster) -> None:
    """A monitoring role, an application database with some activity."""
    cluster.psql(_WORKLOAD)
    cluster.psql(_APP_OBJECTS, dbname=APP_DB)


async def _scrape_library(
    aiohttp_client: AiohttpClient, cluster: LocalCluster, user: str
) -> tuple[str, Client]:
    settings = replace(
        settings_for(cluster),
        url=with_sslmode(cluster.dsn(user=user)),
        include_databases=(APP_DB,),
    )
    client: Client = await aiohttp_client(create_app(settings, load_definitions(str(COLLECTORS))))
    response = await client.get("/metrics")
    assert response.status == 200
    return await response.text(), client


def _failures(client: Client) -> list[str]:
    """Every planned collector whose last outcome was not ok or skipped, with its error."""
    exporter = client.app[STATE].exporter
    failures = []
    for server in exporter.servers:
        assert server.plan is not None, f"database {server.label} was never planned"
        for collector in server.plan.planned:
            entry = server.entries.get(collector.key)
            if entry is None or entry.outcome not in (Outcome.OK, Outcome.SKIPPED):
                failures.append(f"{server.label}/{collector.key}: {entry and entry.error}")
    return failures


@pytest.mark.parametrize("user", ["postgres", MONITOR_ROLE])
async def test_library_runs_clean_on_primary(
    aiohttp_client: AiohttpClient, pg: LocalCluster, user: str, promtool: str
) -> None:
    """Every planned default collector succeeds, as superuser and as a pg_monitor role."""
    _prepare(pg)
    body, client = await _scrape_library(aiohttp_client, pg, user)
    assert _failures(client) == []
    assert value(body, "pg_up") == 1
    exporter = client.app[STATE].exporter
    planned_main = len(exporter.main.plan.planned) if exporter.main.plan else 0
    families = {name for name, _ in samples(body)}
    print(
        f"{pg.version} as {user}: {planned_main} collectors planned on the main database, "
        f"{len(exporter.discovered)} discovered, {len(families)} sample names"
    )
    assert planned_main >= MIN_PLANNED_MAIN
    assert len(families) >= MIN_FAMILIES
    assert APP_DB in exporter.discovered
    assert any(labels and dict(labels).get("datname") == APP_DB for _, labels in samples(body))
    assert unexpected_problems(promtool, body.encode()) == []


async def test_library_runs_clean_on_replica(
    aiohttp_client: AiohttpClient, pg18: LocalCluster, pg18_replica: LocalCluster, promtool: str
) -> None:
    """On a streaming replica the replica branches run, all of them without errors."""
    _prepare(pg18)
    wait_for(
        lambda: (
            pg18_replica.psql(
                f"SELECT count(*) FROM pg_database WHERE datname = '{APP_DB}'"
            ).strip()
            == "1"
        ),
        "the replica to replay the application database",
    )
    body, client = await _scrape_library(aiohttp_client, pg18_replica, MONITOR_ROLE)
    assert _failures(client) == []
    assert value(body, "pg_up") == 1
    assert value(body, "pg_in_recovery") == 1
    assert unexpected_problems(promtool, body.encode()) == []
