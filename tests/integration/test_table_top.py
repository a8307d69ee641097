"""pg_table names its 256 busiest tables and pg_index its 512 busiest indexes, and each
sums the rest into one remainder series per metric and database (issue 38): a probe
lists every table or index with the blocks it touched, the exporter ranks them, and the
query reads the named ones alone. Through the exporter, on every major (each branch).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import psycopg
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp.plugin import AiohttpClient

from exporter.config.definitions import Definitions
from exporter.config.loading import load_definitions
from exporter.web.app import create_app
from rigs.localpg import LocalCluster
from tests.fixtures.helpers import COLLECTORS, samples, settings_for
from tests.fixtures.polling import wait_for

DB = "toptables"
OTHER = (("datname", DB), ("relname", "other"), ("schemaname", "other"))
OTHER_INDEX = (
    ("datname", DB), ("idxname", "other"), ("relid", "other"), ("relname", "other"),
    ("schemaname", "other"),
)  # fmt: skip
Client = TestClient[web.Request, web.Application]


def _pg_table_and_index() -> Definitions:
    """The library's pg_table and pg_index branches alone."""
    definitions = load_definitions(str(COLLECTORS))
    kept = tuple(c for c in definitions.collectors if c.name in ("pg_table", "pg_index"))
    return replace(definitions, collectors=kept)


def _inserted(conn: psycopg.Connection[Any], table: str, rows: int) -> bool:
    """Whether the statistics views show ``rows`` inserted into ``many.<table>`` (before 15
    the statistics collector reports a moment after the change)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    found = conn.execute(
        "SELECT n_tup_ins FROM pg_stat_user_tables WHERE schemaname = 'many' AND relname = %s",
        (table,),
    ).fetchone()
    return found is not None and found[0] >= rows


def _flush(conn: psycopg.Connection[Any], version: int) -> None:
    """Report this session's counts now (15+); before 15 the caller waits for them."""
    if version >= 150000:
        conn.execute("SELECT pg_stat_force_next_flush()")


async def _scrape(client: Client) -> tuple[dict[str, float], dict[str, float]]:
    """One scrape's pg_table_n_tup_ins by relname and pg_index_idx_scan by idxname, each
    remainder as ``other``."""
    response = await client.get("/metrics")
    assert response.status == 200
    tables, indexes = {}, {}
    for (name, labels), value in samples(await response.text()).items():
        found = dict(labels)
        if found.get("datname") != DB:
            continue
        if name == "pg_table_n_tup_ins":
            tables["other" if labels == OTHER else found["relname"]] = value
        elif name == "pg_index_idx_scan":
            indexes["other" if labels == OTHER_INDEX else found["idxname"]] = value
    return tables, indexes


async def test_tables_and_indexes_name_the_busiest_and_the_remainder_counts_the_rest(
    aiohttp_client: AiohttpClient, every_pg: LocalCluster
) -> None:
    """With 260 tables of two indexes each: nothing named in the first run (no rates
    yet), then 256 tables and 512 indexes (those with the most blocks touched, though
    the last by name, as no rate moves), one remainder per metric; rows
    inserted into a table that was not named, and a scan of an index that was not,
    show in the remainders' counters exactly, whether or not the table or index is named
    after (its increase of that interval is the remainder's either way)."""
    pg = every_pg
    pg.psql(f"SELECT 'CREATE DATABASE {DB}' WHERE NOT EXISTS"
            f" (SELECT FROM pg_database WHERE datname = '{DB}') \\gexec")  # fmt: skip
    with psycopg.connect(pg.dsn(DB), autocommit=True) as conn:
        conn.execute(
            "DROP SCHEMA IF EXISTS many CASCADE; CREATE SCHEMA many;"
            "DO $$ BEGIN FOR n IN 1..260 LOOP EXECUTE"
            " format('CREATE TABLE many.t%s (v int PRIMARY KEY, w int UNIQUE)', n);"
            " END LOOP; END $$"
        )
        busy = [f"t{n}" for n in (96, 97, 98, 99)]  # t1 < t10 < t100 < ... < t99
        for n, table in enumerate(busy, start=1):
            conn.execute(
                f"INSERT INTO many.{table} SELECT g, g FROM generate_series(1, {100 * n}) g"
            )
        conn.execute(f"VACUUM ANALYZE {', '.join(f'many.{t}' for t in busy)}")
        _flush(conn, pg.version)
        wait_for(lambda: _inserted(conn, busy[-1], 400), "the inserts in pg_stat_user_tables")
        settings = replace(
            settings_for(pg), url=pg.dsn(DB), auto_discovery=False, disable_cache=True
        )
        client: Client = await aiohttp_client(create_app(settings, _pg_table_and_index()))
        tables, indexes = await _scrape(client)  # no rates yet: the remainders alone
        assert tables == {"other": 0}
        assert indexes == {"other": 0}
        tables, indexes = await _scrape(client)
        named = set(tables) - {"other"}
        assert len(named) == 256
        assert {f"many.{t}" for t in busy} <= named
        assert tables["other"] == 0  # the remainder counts from the first run on
        assert len(set(indexes) - {"other"}) == 512
        assert {f"many.{t}_pkey" for t in busy} | {f"many.{t}_w_key" for t in busy} <= set(indexes)
        assert indexes["other"] == 0
        quiet = next(f"t{n}" for n in range(1, 261) if f"many.t{n}" not in named)
        conn.execute(f"INSERT INTO many.{quiet} SELECT g, g FROM generate_series(1, 1000) g")
        _flush(conn, pg.version)
        wait_for(lambda: _inserted(conn, quiet, 1000), "the insert in pg_stat_user_tables")
        second, indexes = await _scrape(client)
        unnamed = next(
            f"t{n}" for n in range(1, 261) if f"many.t{n}_pkey" not in indexes and f"t{n}" != quiet
        )
        conn.execute("SET enable_seqscan = off")
        conn.execute(f"SELECT v FROM many.{unnamed} WHERE v = 1")
        _flush(conn, pg.version)
        wait_for(lambda: _scanned(conn, f"{unnamed}_pkey"), "the scan in pg_stat_user_indexes")
        _, third = await _scrape(client)
    assert second["other"] == 1000
    assert len(set(second) - {"other"}) == 256
    assert all(second[t] == tables[t] for t in named & set(second))  # none of theirs moved
    assert third["other"] - indexes["other"] == 1
    assert len(set(third) - {"other"}) == 512


def _scanned(conn: psycopg.Connection[Any], index: str) -> bool:
    """Whether the statistics views show a scan of ``many.<index>``."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    found = conn.execute(
        "SELECT idx_scan FROM pg_stat_user_indexes WHERE schemaname = 'many' AND indexrelname = %s",
        (index,),
    ).fetchone()
    return found is not None and found[0] >= 1
