"""Every page parses (issue 36, guarantee 8): with auto-discovery, a real PostgreSQL and
collectors that would make one series on several databases, the page serves each series
once, a strict parser takes it, and the log says once what was left out and why.

Finding 6: an untagged collector without a ``datname`` label ran on every database and
served each of its series once per database, identical; the OpenMetrics parser refused
the whole page (Prometheus keeps one of them at random).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from pytest_aiohttp.plugin import AiohttpClient

from exporter.web.app import create_app
from rigs.localpg import LocalCluster
from tests.fixtures.helpers import settings_for, write_collectors
from tests.fixtures.promtool import unexpected_problems

Client = TestClient[web.Request, web.Application]
OPENMETRICS = "application/openmetrics-text; version=1.0.0"

COLLECTORS = """
nodb:
  desc: untagged and without datname, as in finding 6
  query: SELECT k::text AS k, 1 AS v FROM generate_series(1, 2) AS k
  ttl: 0
  timeout: 5
  metrics:
    - k: {{usage: LABEL, description: key}}
    - v: {{usage: GAUGE, description: value}}
clusterwide:
  desc: a datname label, but read from a cluster-wide view on every database
  query: SELECT datname, 1 AS up FROM pg_database WHERE datname LIKE '{prefix}%'
  ttl: 0
  timeout: 5
  metrics:
    - datname: {{usage: LABEL, description: database}}
    - up: {{usage: GAUGE, description: one}}
perdb:
  query: SELECT current_database() AS datname, 1 AS one
  ttl: 0
  timeout: 5
  metrics:
    - datname: {{usage: LABEL, description: database}}
    - one: {{usage: GAUGE, description: one}}
"""


@pytest.fixture(scope="module")
def databases(pg18: LocalCluster) -> Iterator[list[str]]:
    """Two databases for auto-discovery to find, dropped at the end."""
    prefix = f"uniq_{uuid.uuid4().hex[:6]}"
    names = [f"{prefix}_a", f"{prefix}_b"]
    pg18.psql("\n".join(f"CREATE DATABASE {name};" for name in names))
    yield names
    pg18.psql("\n".join(f"DROP DATABASE IF EXISTS {name} WITH (FORCE);" for name in names))


async def _client(
    aiohttp_client: AiohttpClient, cluster: LocalCluster, tmp_path: Path, names: list[str]
) -> Client:
    prefix = names[0].rsplit("_", 1)[0]
    definitions = write_collectors(tmp_path, COLLECTORS.format(prefix=prefix))
    settings = settings_for(
        cluster, auto_discovery=True, include_databases=tuple(names), openmetrics=True
    )
    client: Client = await aiohttp_client(create_app(settings, definitions))
    return client


def _lines(page: str, name: str) -> list[str]:
    """The sample lines of one family, literally (a parser might fold repeats)."""
    return [line for line in page.splitlines() if line.startswith((name + " ", name + "{"))]


async def test_each_series_is_served_once_and_the_page_parses(
    aiohttp_client: AiohttpClient,
    pg18: LocalCluster,
    tmp_path: Path,
    databases: list[str],
    *,
    promtool: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Planning keeps the collector without datname on the main database; rendering keeps
    the cluster-wide rows the discovered databases repeat out of the page. Both pages
    parse, every series is there once, each database's own series are all there, and
    two scrapes log each cause once, naming the collector and the databases."""
    client = await _client(aiohttp_client, pg18, tmp_path, databases)
    with caplog.at_level(logging.WARNING, logger="exporter"):
        for _ in range(2):
            answer = await client.get("/metrics", headers={"Accept": OPENMETRICS})
            assert answer.status == 200
            page = await answer.text()
            parsed = list(text_string_to_metric_families(page))  # type: ignore[no-untyped-call]
            assert {"nodb_v", "clusterwide_up", "perdb_one"} <= {f.name for f in parsed}
            assert sorted(_lines(page, "nodb_v")) == ['nodb_v{k="1"} 1', 'nodb_v{k="2"} 1']
            assert len(_lines(page, "clusterwide_up")) == 2
            assert len(_lines(page, "perdb_one")) == 3  # the main database and both others
    text = await (await client.get("/metrics")).text()
    assert unexpected_problems(promtool, text.encode()) == []
    assert len(_lines(text, "nodb_v")) == 2
    planned = [r.getMessage() for r in caplog.records if "nodb" in r.getMessage()]
    assert len(planned) == 1, planned
    assert f"not on {databases[0]}, {databases[1]}" in planned[0]
    assert "no datname label" in planned[0]
    rendered = [r.getMessage() for r in caplog.records if "clusterwide" in r.getMessage()]
    assert len(rendered) == 2, rendered  # once for each discovered database
    assert all("clusterwide_up" in m and "left out" in m for m in rendered)
    assert {r.datname for r in caplog.records if "clusterwide" in r.getMessage()} == set(databases)  # type: ignore[attr-defined]
    explain = await (await client.get("/explain")).text()
    assert explain.count("nodb (name nodb): its series carry no datname label") == 2
