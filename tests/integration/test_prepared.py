"""Collector queries prepared once per connection (issue 22), against real PostgreSQL
servers: counted in the statement log, with D1–D3 enforced on the prepared form too."""

from __future__ import annotations

import itertools
import uuid

import psycopg
import pytest

from exporter.collect.cache import Outcome
from exporter.collect.server import Server
from exporter.collect.session import Session
from exporter.web.appstate import STATE
from rigs.localpg import LocalCluster
from tests.fixtures.helpers import statements_since, value
from tests.fixtures.rawhttp import Served, Start, get


def _collector(key: str, query: str, timeout: float = 2) -> str:
    return f"""
{key}:
  query: {query}
  timeout: {timeout}
  metrics:
    - v: {{usage: GAUGE, description: x}}
"""


def _main(served: Served) -> Server:
    return served.app[STATE].exporter.main


async def _pass(cluster: LocalCluster, served: Served) -> list[str]:
    """One uncached pass; the statements the main database's connection ran in it."""
    before = len(cluster.log_text())
    assert (await get(served.port)).status == 200
    conn = _main(served).conn
    assert conn is not None
    return statements_since(cluster, before, conn.info.backend_pid)


def _outcome(served: Served, key: str) -> Outcome | None:
    return _main(served).runtimes[key].outcome


async def test_a_query_runs_as_text_then_is_prepared_then_executed(
    pg: LocalCluster, start: Start
) -> None:
    """First run on a connection: text, no extra round trip; second: PREPARE, then
    EXECUTE; from then on one EXECUTE a run, under the same limits (D1)."""
    served = await start(pg, _collector("pp_one", "SELECT 1 AS v /* pp_one */"),
                         disable_cache=True)  # fmt: skip
    first = await _pass(pg, served)
    assert [s for s in first if "pp_one" in s] == ["SELECT 1 AS v /* pp_one */"], first
    second = await _pass(pg, served)
    prepared = _main(served).session.prepared
    assert prepared is not None
    (name,) = prepared.names
    assert f"PREPARE {name} AS SELECT 1 AS v /* pp_one */" in second, second
    assert f"EXECUTE {name}" in second, second
    third = await _pass(pg, served)
    assert [s for s in third if "pp_one" in s or name in s] == [f"EXECUTE {name}"], third


async def test_prepared_queries_keep_the_limits_of_d1_to_d3(
    pg: LocalCluster, start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once prepared, a collector that writes is refused (D2), one that outlives its
    timeout is cancelled by the server, with no client deadline to help (D1), and one
    behind a lock gives up (D3)."""
    monkeypatch.setattr(Session, "client_deadline", lambda self, c: None)
    suffix = uuid.uuid4().hex[:8]
    control, table, sequence = f"pp_ctl_{suffix}", f"pp_tbl_{suffix}", f"pp_seq_{suffix}"
    pg.psql(f"CREATE TABLE {control} (armed int); CREATE TABLE {table} (x int);"
            f"CREATE SEQUENCE {sequence}")  # fmt: skip
    armed = f"EXISTS (SELECT FROM {control})"
    write = f"SELECT CASE WHEN {armed} THEN nextval('{sequence}') ELSE 0 END AS v"
    sleep = f"SELECT CASE WHEN {armed} THEN pg_sleep(30)::text ELSE '' END AS s, 1 AS v"
    config = (
        _collector("pp_write", write)
        + _collector("pp_sleep", sleep, timeout=0.5)
        + _collector("pp_lock", f"SELECT count(*) AS v FROM {table}", timeout=0.5)
    )
    served = await start(pg, config, disable_cache=True)
    for _ in range(2):
        await _pass(pg, served)
    prepared = _main(served).session.prepared
    assert prepared is not None
    assert len(prepared.names) == 3
    pg.psql(f"INSERT INTO {control} VALUES (1)")
    async with await psycopg.AsyncConnection.connect(pg.dsn()) as locker:
        await locker.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        statements = await _pass(pg, served)
        await locker.rollback()
    # All three ran prepared (none fell back to text), and failed as they must.
    assert len(prepared.names) == 3
    assert not any(s.startswith(("SELECT CASE", "SELECT count")) for s in statements), statements
    entry = _main(served).runtimes["pp_write"].entry
    assert entry is not None
    assert entry.outcome is Outcome.ERROR
    assert "read-only transaction" in entry.error
    assert _outcome(served, "pp_sleep") is Outcome.TIMEOUT
    sleeping = {f"EXECUTE {n}" for n in prepared.names}
    pairs = itertools.pairwise(pg.log_text().splitlines())
    cancelled = [q for e, q in pairs if "statement timeout" in e and q.split(":  ")[-1] in sleeping]
    assert cancelled, "the server did not cancel the prepared query"
    assert _outcome(served, "pp_lock") is Outcome.TIMEOUT
    locked = _main(served).runtimes["pp_lock"].entry
    assert locked is not None
    assert "lock" in locked.error
    assert pg.psql(f"SELECT last_value FROM {sequence}") == "1"  # never advanced
    activity = pg.psql(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg_exporter'"
        " AND state <> 'idle'"
    )
    assert activity == "0"


async def test_a_view_that_changes_its_columns_runs_as_text(pg: LocalCluster, start: Start) -> None:
    """A prepared query whose result no longer fits its plan (0A000, a view's columns
    changed) is run again as text in the same pass, and as text from then on."""
    view = f"pp_view_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE VIEW {view} AS SELECT 1 AS v")
    served = await start(pg, _collector("pp_view", f"SELECT * FROM {view}"), disable_cache=True)
    for _ in range(2):
        await _pass(pg, served)
    prepared = _main(served).session.prepared
    assert prepared is not None
    (name,) = prepared.names
    pg.psql(f"CREATE OR REPLACE VIEW {view} AS SELECT 2 AS v, 'x'::text AS extra")
    statements = await _pass(pg, served)
    assert statements[-1] == f"SELECT * FROM {view}", statements
    assert "cached plan must not change result type" in pg.log_text()
    assert _outcome(served, "pp_view") is Outcome.OK
    assert name in prepared.refused
    body = (await get(served.port)).text
    assert "pp_view_v 2" in body, body


async def test_a_statement_gone_from_the_session_is_prepared_again(
    pg: LocalCluster, start: Start
) -> None:
    """Prepared statements dropped under the exporter (26000): the collector runs as text
    in the same pass, and is prepared again later."""
    served = await start(pg, _collector("pp_gone", "SELECT 3 AS v"), disable_cache=True)
    for _ in range(2):
        await _pass(pg, served)
    conn = _main(served).conn
    assert conn is not None
    await conn.execute("DEALLOCATE ALL")
    await _pass(pg, served)
    assert _outcome(served, "pp_gone") is Outcome.OK
    await _pass(pg, served)  # runs as text once more on a fresh record, then prepares
    statements = await _pass(pg, served)
    assert any(s.startswith("PREPARE pgx_") for s in statements), statements


async def test_a_reload_drops_the_old_statements_once(pg: LocalCluster, start: Start) -> None:
    """After a reload, the first collector that would use a prepared statement drops them
    all (DEALLOCATE ALL), so statements of collectors that changed do not pile up."""
    served = await start(pg, _collector("pp_reload", "SELECT 4 AS v"), disable_cache=True)
    for _ in range(2):
        await _pass(pg, served)
    exporter = served.app[STATE].exporter
    exporter.schedule(exporter.definitions)
    statements = await _pass(pg, served)
    assert statements.count("DEALLOCATE ALL") == 1, statements
    statements = await _pass(pg, served)
    assert "DEALLOCATE ALL" not in statements, statements
    assert any(s.startswith("PREPARE pgx_") for s in statements), statements
    count = await _count_prepared(_main(served))
    assert count == 1


async def _count_prepared(server: Server) -> int:
    conn = server.conn
    assert conn is not None
    cur = await conn.execute("SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'pgx_%'")
    row = await cur.fetchone()
    assert row is not None
    return int(str(row[0]))


async def test_text_that_is_not_one_plain_query_is_never_prepared(
    pg: LocalCluster, start: Start
) -> None:
    """SHOW, or two statements, stay text: the test reads the SQL, PostgreSQL is not asked."""
    config = _collector("pp_show", "SHOW server_version_num").replace("v:", "server_version_num:")
    served = await start(pg, config, disable_cache=True)
    for _ in range(3):
        statements = await _pass(pg, served)
        assert not any(s.startswith(("PREPARE", "EXECUTE")) for s in statements), statements
    assert _outcome(served, "pp_show") is Outcome.OK


async def test_prepared_plans_are_capped_and_their_memory_is_shown(
    pg: LocalCluster, start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At most MAX_PREPARED queries are prepared on a connection (the rest run as text),
    and the self-metrics show how many and, read from the backend's memory contexts when
    the path is searched again, what their plans hold (issue 31)."""
    monkeypatch.setattr("exporter.pg.prepared.MAX_PREPARED", 2)
    monkeypatch.setattr("exporter.collect.server.PLAN_MEMORY_PERIOD", 0.0)  # at every pass
    text = "".join(_collector(f"pc_{i}", f"SELECT {i} AS v /* pc_{i} */") for i in range(4))
    served = await start(pg, text, disable_cache=True)
    for _ in range(4):
        response = await get(served.port)
        assert response.status == 200
    assert value(response.text, "pg_exporter_server_prepared_statements", datname="postgres") == 2
    held = value(response.text, "pg_exporter_server_prepared_plan_bytes", datname="postgres")
    assert held > 1024, response.text  # two plans of a SELECT: kilobytes, never nothing
    last = await _pass(pg, served)
    executed = sorted(s for s in last if "pc_" in s or s.startswith("EXECUTE"))
    assert sum(s.startswith("EXECUTE") for s in executed) == 2, executed
    assert sum(s.startswith("SELECT") for s in executed) == 2, executed
