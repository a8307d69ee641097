"""The cheaper SQL of the default library reports what the dearer one did (issue 22): sizes
added up from their parts, block I/O times read by name whatever the extension's version,
settings read by name.
"""

from __future__ import annotations

import math
import re
import uuid
from typing import Any

import psycopg
from psycopg.rows import dict_row

from exporter.config.loading import load_definitions
from rigs.localpg import LocalCluster
from tests.fixtures.helpers import COLLECTORS
from tests.fixtures.polling import wait_for

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
    """The branch's rows, its @extschema:NAME@ named as the planner names it."""
    sql = _named(conn, _sql(key))
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(sql).fetchall()


def _probed_rows(
    conn: psycopg.Connection[Any], key: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A branch with a ``top`` probe: the probe's row (its first group's), and the query's
    rows for every key the probe lists in any group (passed as ``$1``, as the exporter
    passes the keys it names); @extschema:NAME@ named as the planner names it."""
    collector = next(c for c in load_definitions(str(COLLECTORS)).collectors if c.key == key)
    assert collector.top is not None
    assert collector.top.probe is not None
    probe, query = _named(conn, collector.top.probe), _named(conn, collector.query)
    with conn.cursor(row_factory=dict_row) as cur:
        groups = cur.execute(probe).fetchall()
    assert groups
    keys = "{" + ",".join(str(k) for group in groups for k in group["keys"] or ()) + "}"
    with psycopg.RawCursor(conn, row_factory=dict_row) as raw:
        return groups[0], raw.execute(query, (keys,)).fetchall()


def _named(conn: psycopg.Connection[Any], sql: str) -> str:
    """``sql`` with each @extschema:NAME@ named as the planner names it."""
    schemas = dict(
        conn.execute(
            "SELECT e.extname, quote_ident(n.nspname) FROM pg_extension e"
            " JOIN pg_namespace n ON n.oid = e.extnamespace"
        ).fetchall()
    )
    return re.sub(r"@extschema:(\w+)@", lambda m: str(schemas[m.group(1)]), sql)


def _database(cluster: LocalCluster, name: str = DB) -> str:
    cluster.psql(f"SELECT 'CREATE DATABASE {name}' WHERE NOT EXISTS"
                 f" (SELECT FROM pg_database WHERE datname = '{name}') \\gexec")  # fmt: skip
    return cluster.dsn(name)


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


def test_query_reads_every_statement_for_the_ranking(pg: LocalCluster) -> None:
    """pg_query's probe lists every statement, one run once included and without a LIMIT:
    its ``top`` mapping bounds the series and sums the rest, so nothing is left out (issue
    38). Both run as ``postgres``, the bootstrap superuser (userid 10), whose statements the
    Go config leaves out and we keep."""
    marker = uuid.uuid4().hex[:8]
    with psycopg.connect(_database(pg), autocommit=True) as conn:
        for name in ("once", "often"):  # a table each: the query IDs differ
            conn.execute(f"CREATE TABLE {name}_{marker} (x int)")
        conn.execute(f"SELECT pg_sleep(0.3), count(*) FROM once_{marker}")
        for _ in range(5):
            conn.execute(f"SELECT pg_sleep(0.05), count(*) FROM often_{marker}")
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        ids = {
            name: str(conn.execute(
                "SELECT queryid FROM pg_stat_statements WHERE query LIKE %s",
                (f"%FROM {name}_{marker}%",),
            ).fetchone()[0])  # type: ignore[index]
            for name in ("once", "often")
        }  # fmt: skip
        collector = next(c for c in load_definitions(str(COLLECTORS)).collectors
                         if c.key == "pg_query")  # fmt: skip
        assert collector.top is not None
        assert collector.top.probe is not None
        with conn.cursor(row_factory=dict_row) as cur:
            groups = cur.execute(_named(conn, collector.top.probe)).fetchall()
        rows = [{"datname": g["datname"], "query": k} for g in groups for k in g["keys"]]
        entries = conn.execute(
            "SELECT count(DISTINCT (s.dbid, s.queryid)) FROM pg_stat_statements(false) AS s"
            " JOIN pg_database AS d ON d.oid = s.dbid WHERE s.queryid IS NOT NULL"
        ).fetchone()
    kept = {r["query"] for r in rows if r["datname"] == DB}
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        assert conn.execute("SELECT 'postgres'::regrole::oid").fetchone() == (10,)
    assert entries is not None
    assert len(rows) >= entries[0] - 1  # all of them but the reading's own, if it was new
    assert {ids["often"], ids["once"]} <= kept


def test_query_io_time_counts_every_statement_that_moved_blocks(pg: LocalCluster) -> None:
    """With track_io_timing on, statements that read and wrote blocks outside the buffer pool
    get the same io_time as summing every entry's block I/O times from the entry turned into
    JSON, under the extension's old names (PostgreSQL 15: blk_read_time) and new ones (18:
    shared_blk_read_time, local_blk_read_time): pg_query reads both by name, no JSON."""
    with psycopg.connect(_database(pg), autocommit=True) as conn:
        conn.execute("SET track_io_timing = on")
        # Bulk writes and reads go through a small ring of buffers: blocks leave the pool.
        for _ in range(5):
            conn.execute("DROP TABLE IF EXISTS bulky")
            conn.execute("CREATE TABLE bulky AS SELECT i, md5(i::text) AS v"
                         " FROM generate_series(1, 400000) AS i")  # fmt: skip
            conn.execute("SELECT count(*) FROM bulky WHERE v LIKE 'ab%'")
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        found = _probed_rows(conn, "pg_query")[1]
        rows = {(r["datname"], r["query"]): float(r["io_time"]) for r in found}
        reference = conn.execute(IO_TIME_OF_EVERY_ENTRY).fetchall()
    timed = {(db, q): t for db, q, t in reference if t > 0}
    assert any(key in rows for key in timed if key[0] == DB), "no statement of the test kept"
    for key, seconds in timed.items():
        if key in rows:
            assert rows[key] == seconds


INDEX_VIEWS = """
SELECT s.schemaname || '.' || s.indexrelname, s.schemaname || '.' || s.relname, s.idx_scan,
       s.idx_tup_read, s.idx_tup_fetch, io.idx_blks_read, io.idx_blks_hit, c.relpages, x.indisvalid
  FROM pg_stat_user_indexes AS s
  JOIN pg_statio_user_indexes AS io USING (indexrelid)
  JOIN pg_class AS c ON c.oid = s.indexrelid
  JOIN pg_index AS x ON x.indexrelid = s.indexrelid
 WHERE s.schemaname !~ '^pg_temp_'
"""


def test_index_reads_what_the_statistics_views_show(pg: LocalCluster) -> None:
    """pg_index reads the catalogs and statistics functions behind pg_stat_user_indexes and
    pg_statio_user_indexes: the same indexes (none of a temporary table or a system schema)
    with the same counters, a failed concurrent build shown invalid."""
    with psycopg.connect(_database(pg), autocommit=True) as conn:
        conn.execute(
            "DROP TABLE IF EXISTS indexed; DROP MATERIALIZED VIEW IF EXISTS indexed_mv;"
            "CREATE TABLE indexed (id int PRIMARY KEY, w int);"
            "INSERT INTO indexed SELECT i, i % 3 FROM generate_series(1, 1000) AS i;"
            "CREATE INDEX indexed_w ON indexed (w);"
            "CREATE MATERIALIZED VIEW indexed_mv AS SELECT id FROM indexed;"
            "CREATE UNIQUE INDEX indexed_mv_id ON indexed_mv (id);"
            "CREATE TEMP TABLE scratch (id int PRIMARY KEY);"
            "UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'indexed_w'::regclass"
        )
        conn.execute("SET enable_seqscan = off")
        for key in (1, 2, 3):
            conn.execute("SELECT w FROM indexed WHERE id = %s", (key,))
        conn.execute("SELECT pg_stat_force_next_flush()" if pg.version >= 150000 else "SELECT 1")
        branch = "pg_index_16" if pg.version >= 160000 else "pg_index_13"
        rows = {r["idxname"]: r for r in _probed_rows(conn, branch)[1]}
        truth = {r[0]: r for r in conn.execute(INDEX_VIEWS).fetchall()}
    assert set(rows) == set(truth)
    assert {"public.indexed_pkey", "public.indexed_w", "public.indexed_mv_id"} <= set(rows)
    for name, r in rows.items():
        got = (name, r["relname"], r["idx_scan"], r["idx_tup_read"], r["idx_tup_fetch"],
               r["idx_blks_read"], r["idx_blks_hit"], r["relpages"], r["valid"])  # fmt: skip
        assert got == truth[name]
    assert rows["public.indexed_pkey"]["idx_scan"] >= 3
    assert rows["public.indexed_w"]["valid"] is False


TABLE_VIEWS = """
SELECT quote_ident(s.schemaname) || '.' || s.relname, s.seq_scan, s.seq_tup_read, s.idx_scan,
       s.idx_tup_fetch, s.n_tup_ins, s.n_tup_upd, s.n_tup_del, s.n_live_tup, s.n_dead_tup,
       s.vacuum_count, s.analyze_count, io.heap_blks_read, io.heap_blks_hit, io.idx_blks_read,
       io.idx_blks_hit, io.toast_blks_read, io.toast_blks_hit, io.tidx_blks_read, io.tidx_blks_hit
  FROM pg_stat_user_tables AS s
  JOIN pg_statio_user_tables AS io USING (relid)
 WHERE s.schemaname !~ '^pg_temp_'
"""
TABLE_COLUMNS = ("relname", "seq_scan", "seq_tup_read", "idx_scan", "idx_tup_fetch", "n_tup_ins",
                 "n_tup_upd", "n_tup_del", "n_live_tup", "n_dead_tup", "vacuum_count",
                 "analyze_count", "heap_blks_read", "heap_blks_hit", "idx_blks_read",
                 "idx_blks_hit", "toast_blks_read", "toast_blks_hit", "tidx_blks_read",
                 "tidx_blks_hit")  # fmt: skip


def test_table_reads_what_the_statistics_views_show(pg: LocalCluster) -> None:
    """pg_table calls the statistics functions behind pg_stat_user_tables itself: the same
    tables (a materialized view included, a temporary table not) with the same counters, an
    index-less table's idx_scan and idx_tup_fetch empty as in the view."""
    with psycopg.connect(_database(pg), autocommit=True) as conn:
        conn.execute(
            "DROP MATERIALIZED VIEW IF EXISTS counted_mv; DROP TABLE IF EXISTS counted, bare;"
            "CREATE TABLE counted (id int PRIMARY KEY, w int);"
            "CREATE INDEX counted_w ON counted (w);"
            "INSERT INTO counted SELECT i, i % 3 FROM generate_series(1, 1000) AS i;"
            "UPDATE counted SET w = 5 WHERE id < 10; DELETE FROM counted WHERE id > 990;"
            "CREATE TABLE bare (v text); INSERT INTO bare VALUES ('a'), ('b');"
            "INSERT INTO bare SELECT string_agg(md5(j::text), '')"
            "  FROM generate_series(1, 500) AS j;"
            "CREATE MATERIALIZED VIEW counted_mv AS SELECT id FROM counted;"
            "CREATE TEMP TABLE scratch (id int PRIMARY KEY)"
        )
        conn.execute("VACUUM ANALYZE counted, bare")
        conn.execute("SET enable_seqscan = off")
        conn.execute("SELECT w FROM counted WHERE id IN (1, 2, 3)")
        conn.execute("SELECT length(v) FROM bare")  # reads the TOAST table and its index
        conn.execute("SELECT pg_stat_force_next_flush()" if pg.version >= 150000 else "SELECT 1")
        major = "13" if pg.version < 160000 else "16" if pg.version < 180000 else "18"
        branch = f"pg_table_{major}"
        probe, found = _probed_rows(conn, branch)
        rows = {r["relname"]: r for r in found}
        truth = {r[0]: r for r in conn.execute(TABLE_VIEWS).fetchall()}
    assert set(rows) == set(truth)
    assert {"public.counted", "public.bare", "public.counted_mv"} <= set(rows)
    for name, r in rows.items():
        assert tuple(r[c] for c in TABLE_COLUMNS)[1:] == truth[name][1:], name
    assert rows["public.bare"]["idx_scan"] is None
    assert rows["public.counted"]["n_tup_del"] == 10
    assert rows["public.bare"]["toast_blks_hit"] + rows["public.bare"]["toast_blks_read"] > 0
    assert sorted(probe["keys"]) == sorted(r["relid"] for r in found)


def test_table_and_index_probes_total_what_their_queries_read(every_pg: LocalCluster) -> None:
    """pg_table's and pg_index's probes (each branch) list every table or index their
    query would read, with the blocks each touched, and the total over all of them of
    every counter the query reads (pg_table's also of the live and dead rows): the
    remainder is these totals less the named keys', so each must be exactly the sum of
    the rows, or the series would not add up."""
    pg = every_pg
    with psycopg.connect(_database(pg, "libsql_probe"), autocommit=True) as conn:
        conn.execute(
            "DROP TABLE IF EXISTS pa, pb, pc; CREATE TABLE pa (id int PRIMARY KEY, v text);"
            "CREATE TABLE pb (v int); CREATE TABLE pc (id int PRIMARY KEY, w int UNIQUE);"
            "INSERT INTO pa SELECT i, (SELECT string_agg(md5((i * j)::text), '')"
            "  FROM generate_series(1, 300) AS j) FROM generate_series(1, 50) AS i;"
            "INSERT INTO pb SELECT generate_series(1, 300); UPDATE pb SET v = v + 1 WHERE v < 9;"
            "DELETE FROM pb WHERE v > 290; INSERT INTO pc SELECT i, i FROM generate_series(1, 20) i"
        )
        conn.execute("VACUUM ANALYZE pa, pb, pc")
        conn.execute("SET enable_seqscan = off")
        conn.execute("SELECT w FROM pc WHERE id = 3")
        conn.execute("SELECT length(v) FROM pa WHERE id < 5")  # the TOAST table and its index
        conn.execute("SELECT pg_stat_force_next_flush()" if pg.version >= 150000 else "SELECT 1")
        wait_for(lambda: _counted(conn, "pb", "n_tup_del", 10) and _toasted(conn, "pa"),
                 "the deletes and the TOAST reads in the statistics views")  # fmt: skip
        table = (
            "pg_table_13"
            if pg.version < 160000
            else "pg_table_16"
            if pg.version < 180000
            else "pg_table_18"
        )
        index = "pg_index_13" if pg.version < 160000 else "pg_index_16"
        found = {key: _probed_rows(conn, key) for key in (table, index)}
    collectors = {c.key: c for c in load_definitions(str(COLLECTORS)).collectors}
    gauges = {table: {"n_live_tup", "n_dead_tup"}, index: set()}
    for key, (probe, rows) in found.items():
        collector = collectors[key]
        assert collector.top is not None
        counters = {c.name for c in collector.value_columns if c.usage.value == "COUNTER"}
        totals = [name for name in probe if name not in ("datname", "keys", collector.top.by)]
        assert set(totals) == counters | gauges[key], key
        for name in totals:  # times are float8: summed in another order, to the last bit
            total = sum(r[name] or 0 for r in rows)
            assert math.isclose(probe[name], total, rel_tol=1e-12), (key, name)
        assert sorted(probe["keys"]) == sorted(r["relid"] for r in rows)
        by_relid = {r["relid"]: r for r in rows}
        for relid, blocks in zip(probe["keys"], probe[collector.top.by], strict=True):
            row = by_relid[relid]
            name = "heap" if key == table else "idx"
            assert blocks == row[f"{name}_blks_read"] + row[f"{name}_blks_hit"], (key, relid)
    table_probe, index_probe = found[table][0], found[index][0]
    assert table_probe["n_tup_del"] >= 10
    assert table_probe["toast_blks_hit"] + table_probe["toast_blks_read"] > 0
    assert index_probe["idx_scan"] >= 1
    assert len(index_probe["keys"]) >= 3  # pa's and pc's two, the TOAST index left out


def _toasted(conn: psycopg.Connection[Any], table: str) -> bool:
    """Whether the statistics views show TOAST blocks of ``table`` read."""
    row = conn.execute(
        "SELECT coalesce(toast_blks_hit + toast_blks_read, 0) FROM pg_statio_user_tables"
        " WHERE relname = %s",
        (table,),
    ).fetchone()
    return row is not None and row[0] > 0


def _counted(conn: psycopg.Connection[Any], table: str, column: str, at_least: int) -> bool:
    """Whether the statistics views show ``column`` of ``table`` at ``at_least`` (before
    15 the statistics collector reports a moment after the change)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        f"SELECT {column} FROM pg_stat_user_tables WHERE relname = %s", (table,)
    ).fetchone()
    return row is not None and row[0] >= at_least


def test_table_size_keeps_the_256_largest_as_the_go_config_keeps_256(
    every_pg: LocalCluster,
) -> None:
    """Beyond 256 tables, the Go config's number, pg_table_size keeps the largest: the
    same series count a Go dashboard expects. The large tables are the last four by name,
    the ones a ranking by name alone would cut. (pg_table ranks its tables in the
    exporter: tests/integration/test_table_top.py.)"""
    pg = every_pg
    with psycopg.connect(_database(pg, "libsql_tables"), autocommit=True) as conn:
        conn.execute(
            "DROP SCHEMA IF EXISTS many CASCADE; CREATE SCHEMA many;"
            "DO $$ BEGIN FOR n IN 1..260 LOOP"
            " EXECUTE format('CREATE TABLE many.t%s (v int)', n); END LOOP; END $$"
        )
        large = [f"many.t{n}" for n in (96, 97, 98, 99)]  # t1 < t10 < t100 < ... < t99
        for n, table in enumerate(large, start=1):
            conn.execute(f"INSERT INTO {table} SELECT generate_series(1, {100 * n})")
        conn.execute(f"VACUUM ANALYZE {', '.join(large)}")
        sized = [r["relname"] for r in _rows(conn, "pg_table_size")]
    assert len(sized) == len(set(sized)) == 256
    assert set(large) <= set(sized)
