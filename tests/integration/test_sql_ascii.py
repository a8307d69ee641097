"""A SQL_ASCII cluster for real: text comes back as bytes from psycopg there, and the
exporter decodes it by its one rule (UTF-8, invalid bytes as ``\\xNN``) everywhere:
labels, discovered database names, /stat and /explain (issue 25)."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp.plugin import AiohttpClient

from exporter.web.app import create_app
from rigs.localpg import LocalCluster, pg18_bindir
from tests.fixtures.helpers import settings_for, value, write_collectors

Client = TestClient[web.Request, web.Application]

LATIN1_NAME = b"caf\xe9"  # é in Latin-1: not UTF-8, as a SQL_ASCII server may well hold
COLLECTORS = """
perdb:
  query: SELECT current_database() AS datname, 1 AS one
  timeout: 5
  metrics:
    - datname: {usage: LABEL, description: database}
    - one: {usage: GAUGE, description: one}
names:
  query: SELECT datname, word, 1 AS one FROM pg_database, words WHERE datname = 'postgres'
         OR datname LIKE 'caf%'
  timeout: 5
  predicate_queries:
    - name: words exist
      predicate_query: SELECT count(*) > 0 FROM words WHERE word LIKE 'caf%'
  tags: [cluster]
  metrics:
    - datname: {usage: LABEL, description: database}
    - word: {usage: LABEL, description: a word}
    - one: {usage: GAUGE, description: one}
"""


@pytest.fixture(scope="module")
def sql_ascii() -> Iterator[LocalCluster]:
    """A PostgreSQL 18 cluster initialised with ``-E SQL_ASCII --locale=C``, holding a
    database ``plain``, one named by Latin-1 bytes, and a table of words in both encodings."""
    with LocalCluster(pg18_bindir(), encoding="SQL_ASCII") as cluster:
        cluster.psql("CREATE DATABASE plain")
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
            conn.execute(b'CREATE DATABASE "' + LATIN1_NAME + b'"')
            conn.execute("CREATE TABLE words (word text)")
            conn.execute(b"INSERT INTO words VALUES ('caf\xe9'), ('caf\xc3\xa9')")
        yield cluster


async def _client(aiohttp_client: AiohttpClient, cluster: LocalCluster, tmp_path: Path) -> Client:
    definitions = write_collectors(tmp_path, COLLECTORS)
    settings = settings_for(
        cluster, auto_discovery=True, exclude_databases=("template0", "template1")
    )
    client: Client = await aiohttp_client(create_app(settings, definitions))
    return client


async def test_sql_ascii_text_is_decoded_and_discovery_reaches_utf8_names(
    aiohttp_client: AiohttpClient,
    sql_ascii: LocalCluster,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Labels carry decoded names, never ``b'...'``; invalid bytes show as ``\\xe9``; the
    UTF-8-named databases are discovered and scraped; the one no connection can name is
    left out with one warning, not failed on every pass."""
    client = await _client(aiohttp_client, sql_ascii, tmp_path)
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            response = await client.get("/metrics")
            assert response.status == 200
            body = await response.text()
    assert "b'" not in body
    assert value(body, "pg_up") == 1
    assert value(body, "perdb_one", datname="postgres") == 1
    assert value(body, "perdb_one", datname="plain") == 1  # discovered and scraped
    assert value(body, "names_one", datname="caf\\xe9", word="café") == 1
    assert value(body, "names_one", datname="postgres", word="caf\\xe9") == 1
    assert math.isnan(value(body, "perdb_one", datname="caf\\xe9"))
    assert value(body, "pg_exporter_server_scrape_error_count", datname="plain") == 0
    warned = [r for r in caplog.records if "not valid UTF-8" in r.getMessage()]
    assert len(warned) == 1
    assert "caf\\xe9" in warned[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    for page in ("/stat", "/explain"):
        text = await (await client.get(page)).text()
        assert "b'" not in text
        assert "plain" in text
