"""The cheaper SQL of the default library reports what the dearer one did (issue 22): sizes
added up from their parts, block I/O time read only where blocks moved, settings read by name.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from exporter.loading import load_definitions
from rigs.localpg import LocalCluster
from tests.integration.helpers import COLLECTORS

DB = "libsql"
TIMEOUTS = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")
SET_LIMITS = (
    "SELECT set_config('statement_timeout', '1000', false), set_config('lock_timeout', '250',"
    " false), set_config('idle_in_transaction_session_timeout', '5000', false)"
)
# The slow way pg_query used to take: every entry turned into JSON, its block times summed.
IO_TIME_OF_EVERY_ENTRY = """
SELECT d.datname, s.queryid::text,
       sum(coalesce((j ->> 'shared_blk_read_time')::float8, (j ->> 'blk_read_time')::float8, 0)
           + coalesce((j ->> 'shared_blk_write_time')::float8, (j ->> 'blk_write_time')::float8, 0)
           + coalesce((j ->> 'local_blk_read_time')::float8, 0)
           + coalesce((j ->> 'local_blk_write_time')::float8, 0))
  FROM pg_stat_statements(false) AS s
  JOIN pg_database AS d ON d.oid = s.dbid
 CROSS JOIN LATERAL to_jsonb(s) AS j
 WHERE s.queryid IS NOT NULL
 GROUP BY 1, 2
"""


def _sql(key: str) -> str:
    return next(c.query for c in load_definitions(str(COLLECTORS)).collectors if c.key == key)


def _rows(conn: psycopg.Connection[Any], key: str) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(_sql(key)).fetchall()


def _database(cluster: LocalCluster) -> str:
    cluster.psql(f"SELECT 'CREATE DATABASE {DB}' WHERE NOT EXISTS"
                 f" (SELECT FROM pg_database WHERE datname = '{DB}') \\gexec")  # fmt: skip
    return cluster.dsn(DB)


def test_setting_timeouts_are_the_servers_not_the_exporters_session(pg: LocalCluster) -> None:
    """The exporter sets its own limits on its session; pg_setting still reports the
    timeouts any other session gets (before: the exporter's own, 1 s and 0.25 s)."""
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        server = ", ".join(
            f"extract(epoch FROM current_setting('{t}')::interval)" for t in TIMEOUTS
        )
        expected = conn.execute(f"SELECT {server}").fetchone()
        conn.execute(SET_LIMITS)
        (row,) = _rows(conn, "pg_setting")
    assert expected is not None
    assert tuple(float(row[t]) for t in TIMEOUTS) == tuple(float(v) for v in expected)


def test_setting_converts_units_as_the_server_counts_them(pg: LocalCluster) -> None:
    """Sizes in bytes and times in seconds, from settings shown in their largest unit."""
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute("SET work_mem = '1000kB'; SET maintenance_work_mem = '2GB'")
        (row,) = _rows(conn, "pg_setting")
        naptime = conn.execute(
            "SELECT setting::float8 FROM pg_settings WHERE name = 'autovacuum_naptime'"
        ).fetchone()
    assert (row["work_mem"], row["maintenance_work_mem"]) == (1000 * 1024, 2 * 1024**3)
    assert naptime is not None
    assert float(row["autovacuum_naptime"]) == naptime[0]


def test_table_size_parts_add_up_to_the_servers_total(pg18: LocalCluster) -> None:
    """bytes, relsize, indexsize and toastsize equal the server's own size functions, for a
    table with TOAST and two indexes and for an unlogged one (which has an init fork)."""
    with psycopg.connect(_database(pg18), autocommit=True) as conn:
        conn.execute(
            "DROP TABLE IF EXISTS sized, sized_unlogged;"
            "CREATE TABLE sized (id int PRIMARY KEY, v text);"
            "CREATE INDEX ON sized (length(v));"
            "INSERT INTO sized SELECT i, (SELECT string_agg(md5(i::text || j::text), '')"
            "  FROM generate_series(1, 200) AS j) FROM generate_series(1, 200) AS i;"
            "CREATE UNLOGGED TABLE sized_unlogged (id int PRIMARY KEY);"
            "INSERT INTO sized_unlogged SELECT generate_series(1, 5000)"
        )
        conn.execute("VACUUM ANALYZE sized, sized_unlogged")
        rows = {r["relname"]: r for r in _rows(conn, "pg_table_size")}
        for name in ("public.sized", "public.sized_unlogged"):
            truth = conn.execute(
                "SELECT pg_total_relation_size(%(t)s::regclass), pg_relation_size(%(t)s::regclass),"
                " pg_indexes_size(%(t)s::regclass), coalesce(pg_total_relation_size("
                "  (SELECT reltoastrelid FROM pg_class WHERE oid = %(t)s::regclass)), 0)",
                {"t": name},
            ).fetchone()
            got = rows[name]
            assert (got["bytes"], got["relsize"], got["indexsize"], got["toastsize"]) == truth
    assert rows["public.sized"]["toastsize"] > 0


def test_query_io_time_counts_every_statement_that_moved_blocks(pg18: LocalCluster) -> None:
    """With track_io_timing on, statements that read and wrote blocks outside the buffer pool
    get the same io_time as summing every entry's block I/O times (the JSON is skipped only
    for entries that moved no block)."""
    with psycopg.connect(_database(pg18), autocommit=True) as conn:
        conn.execute("SET track_io_timing = on")
        # Bulk writes and reads go through a small ring of buffers: blocks leave the pool.
        conn.execute("DROP TABLE IF EXISTS bulky")
        conn.execute("CREATE TABLE bulky AS SELECT i, md5(i::text) AS v"
                     " FROM generate_series(1, 400000) AS i")  # fmt: skip
        conn.execute("SELECT count(*) FROM bulky WHERE v LIKE 'ab%'")
    with psycopg.connect(pg18.dsn(), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        rows = {(r["datname"], r["query"]): float(r["io_time"]) for r in _rows(conn, "pg_query")}
        reference = conn.execute(IO_TIME_OF_EVERY_ENTRY).fetchall()
    timed = {(db, q): t for db, q, t in reference if t > 0}
    assert any(db == DB for db, _ in timed), "no statement of the test spent time on block I/O"
    for key, seconds in timed.items():
        if key in rows:
            assert rows[key] == seconds
