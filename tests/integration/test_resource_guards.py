"""What our statements may consume beyond time (issue 31): no JIT, no parallel workers,
a bounded work_mem and temp_file_limit, whatever the server's or the database's
defaults say, on a direct session and through a transaction per collector (D1)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest

from exporter.pg.limits import TEMP_FILE_CAP_KB, WORK_MEM_CAP_KB
from exporter.web.appstate import STATE
from rigs.localpg import LocalCluster
from tests.fixtures.helpers import value
from tests.fixtures.rawhttp import Start, get

# Settings a careless or hostile database could carry: JIT for everything, parallel
# workers for every scan, a gigabyte per sort.
_GREEDY = {
    "jit": "on",
    "jit_above_cost": "0",
    "jit_inline_above_cost": "0",
    "jit_optimize_above_cost": "0",
    "max_parallel_workers_per_gather": "4",
    "parallel_setup_cost": "0",
    "parallel_tuple_cost": "0",
    "min_parallel_table_scan_size": "0",
    "work_mem": "1GB",
}


@pytest.fixture
def greedy(pg: LocalCluster) -> Iterator[str]:
    """A database whose defaults invite JIT, workers and big sorts, with a table to scan."""
    database = f"greedy_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE DATABASE {database}")
    sets = "; ".join(f"ALTER DATABASE {database} SET {k} = '{v}'" for k, v in _GREEDY.items())
    pg.psql(sets)
    pg.psql(
        "CREATE EXTENSION pg_stat_statements; "
        "CREATE TABLE wide AS SELECT i, md5(i::text) AS t FROM generate_series(1, 200000) i; "
        "ANALYZE wide",
        dbname=database,
    )
    yield database
    with contextlib.suppress(Exception):
        pg.psql(f"DROP DATABASE {database} WITH (FORCE)")


_COLLECTORS = """
rg_settings:
  query: >-
    SELECT current_setting('jit') AS jit,
           current_setting('max_parallel_workers_per_gather') AS workers,
           current_setting('work_mem') AS work_mem,
           current_setting('temp_file_limit') AS temp_file_limit, 1 AS v
  timeout: 5
  metrics:
    - jit: {usage: LABEL, description: x}
    - workers: {usage: LABEL, description: x}
    - work_mem: {usage: LABEL, description: x}
    - temp_file_limit: {usage: LABEL, description: x}
    - v: {usage: GAUGE, description: x}
rg_scan:
  query: SELECT count(*) AS n, sum(length(t)) AS marker_rg_scan FROM wide WHERE i % 7 = 3
  timeout: 10
  metrics:
    - n: {usage: GAUGE, description: x}
    - marker_rg_scan: {usage: GAUGE, description: x}
"""


def _statement_stats(pg: LocalCluster, database: str, columns: str) -> list[str]:
    """pg_stat_statements' ``columns`` for the scan collector's query, per role."""
    return pg.psql(
        f"SELECT {columns} FROM pg_stat_statements WHERE query LIKE '%marker_rg_scan%' "
        "AND query NOT LIKE '%pg_stat_statements%' ORDER BY 1",
        dbname=database,
    ).splitlines()


async def test_our_statements_get_no_jit_no_workers_and_bounded_memory(
    pg: LocalCluster, greedy: str, start: Start
) -> None:
    """Under a database that asks for JIT, four workers per scan and 1 GB per sort, the
    collectors run with JIT off, no workers, work_mem at most 4 MB and (as a superuser,
    who may set it) a bounded temp_file_limit; the same query run by psql under those
    defaults does get what they ask for, so the test can tell (issue 31)."""
    served = await start(pg, _COLLECTORS, disable_cache=True, url=pg.dsn(greedy))
    for _ in range(3):  # as text, then PREPARE, then EXECUTE (issue 22)
        response = await get(served.port)
        assert response.status == 200
        work_mem, temp = f"{WORK_MEM_CAP_KB // 1024}MB", f"{TEMP_FILE_CAP_KB // 1024}MB"
        assert value(response.text, "rg_settings_v", jit="off", workers="0", work_mem=work_mem,
                     temp_file_limit=temp) == 1, response.text  # fmt: skip
    # The same query by another role under the database's defaults, for comparison.
    other = f"rg_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE ROLE {other}; GRANT SELECT ON wide TO {other}; SET ROLE {other}; "
            "SELECT count(*) AS n, sum(length(t)) AS marker_rg_scan FROM wide WHERE i % 7 = 3",
            dbname=greedy)  # fmt: skip
    ours_first = "userid::regrole::text <> 'postgres', {}"
    if pg.version >= 180000:
        workers = _statement_stats(pg, greedy, ours_first.format("parallel_workers_launched"))
        assert workers == ["f|0", "t|4"], workers  # ours none, the other role's four
    if pg.psql("SELECT pg_jit_available()") == "t":  # Debian's 15 is built with LLVM
        jit = _statement_stats(pg, greedy, ours_first.format("jit_functions > 0"))
        assert jit == ["f|f", "t|t"], jit  # ours none, the other role's some
    pg.psql(f"DROP OWNED BY {other}; DROP ROLE {other}", dbname=greedy)
    main = served.app[STATE].exporter.main
    assert main.facts is not None
    assert main.facts.guards.temp_file_limit_kb == TEMP_FILE_CAP_KB


async def test_a_role_that_may_not_bound_temporary_files_is_told_how(
    pg: LocalCluster, greedy: str, start: Start
) -> None:
    """A pg_monitor role may not set temp_file_limit: the server's applies, and /explain
    says so with the statement that bounds it (issue 31)."""
    role = f"mon_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE ROLE {role} LOGIN IN ROLE pg_monitor; GRANT SELECT ON wide TO {role}",
            dbname=greedy)  # fmt: skip
    served = await start(pg, _COLLECTORS, disable_cache=True, url=pg.dsn(greedy, user=role))
    response = await get(served.port)
    assert value(response.text, "rg_settings_v", jit="off", workers="0", work_mem="4MB",
                 temp_file_limit="-1") == 1, response.text  # fmt: skip
    explained = (await get(served.port, "/explain")).text
    assert f"ALTER ROLE {role} SET temp_file_limit = '{TEMP_FILE_CAP_KB}kB'" in explained
    pg.psql(f"DROP OWNED BY {role}; DROP ROLE {role}", dbname=greedy)
