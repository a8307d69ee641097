"""The whole default library on real servers: every planned collector, every role (issue 6),
on every major version the README claims, primary and replica (issue 23)."""

from __future__ import annotations

import math
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import psycopg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp.plugin import AiohttpClient

from exporter.collect.cache import Outcome
from exporter.collect.planning import make_plan
from exporter.config.definitions import Definitions
from exporter.config.loading import load_definitions
from exporter.expose.samples import SampleBuilder
from exporter.pg.preflight import ServerFacts
from exporter.web.app import create_app
from exporter.web.appstate import STATE
from rigs.localbouncer import LocalPgBouncer
from rigs.localpg import MAJORS, LocalCluster
from tests.fixtures.helpers import COLLECTORS, samples, settings_for, value
from tests.fixtures.polling import wait_for
from tests.fixtures.promtool import unexpected_problems

Client = TestClient[web.Request, web.Application]

DB = "libcov"
MONITOR = "libcov_monitor"
SUPERUSER = "postgres"
# Floors, not exact counts: the library may grow but must never silently shrink.
# Measured on 18 and 15 (primary, pg_monitor): 41 and 40 planned on the main database.
MIN_PLANNED = {"primary": 38, "replica": 40}
MIN_FAMILIES = 250
MIN_SERIES = 1500
FULL_PASS_BUDGET_MS = 5000  # a generous ceiling; the measured pass is printed

_CLUSTER_SETUP = f"""
CREATE EXTENSION IF NOT EXISTS pg_stat_statements;
DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{MONITOR}') THEN
    CREATE ROLE {MONITOR} LOGIN NOSUPERUSER CONNECTION LIMIT 10 IN ROLE pg_monitor;
  END IF;
END $$;
SELECT 'CREATE DATABASE {DB}' WHERE NOT EXISTS
  (SELECT FROM pg_database WHERE datname = '{DB}') \\gexec
"""

# Something for every per-database family: tables with dead rows, indexes, a tracked
# function, sequences, a partitioned table with a default partition, a materialized
# view, a publication and a subscription that never connects (no wal_level needed).
_DATABASE_SETUP = """
SET client_min_messages = error;
CREATE TABLE IF NOT EXISTS cov_orders (id bigserial PRIMARY KEY, customer int, total numeric);
CREATE INDEX IF NOT EXISTS cov_orders_customer ON cov_orders (customer);
CREATE SEQUENCE IF NOT EXISTS cov_tickets;
-- The whole bigint range: its used ratio overflows bigint arithmetic.
CREATE SEQUENCE IF NOT EXISTS cov_wide MINVALUE -9223372036854775808 START 0;
CREATE OR REPLACE FUNCTION cov_count(c int) RETURNS bigint LANGUAGE plpgsql AS
  $$ BEGIN RETURN (SELECT count(*) FROM cov_orders WHERE customer = c); END $$;
CREATE TABLE IF NOT EXISTS cov_events (at date NOT NULL, what text) PARTITION BY RANGE (at);
CREATE TABLE IF NOT EXISTS cov_events_2024 PARTITION OF cov_events
  FOR VALUES FROM ('2024-01-01') TO ('2025-01-01');
CREATE TABLE IF NOT EXISTS cov_events_other PARTITION OF cov_events DEFAULT;
INSERT INTO cov_events SELECT DATE '2024-01-01' + i % 700, 'e' FROM generate_series(1, 500) i;
INSERT INTO cov_orders (customer, total) SELECT i % 40, i * 1.5 FROM generate_series(1, 3000) i;
DELETE FROM cov_orders WHERE id % 7 = 0;
CREATE MATERIALIZED VIEW IF NOT EXISTS cov_totals AS
  SELECT customer, sum(total) AS total FROM cov_orders GROUP BY customer;
SET track_functions = 'all';
SELECT cov_count(3), nextval('cov_tickets'), nextval('cov_wide');
ANALYZE;
SELECT 'CREATE PUBLICATION cov_pub FOR TABLE cov_orders'
 WHERE NOT EXISTS (SELECT FROM pg_publication WHERE pubname = 'cov_pub') \\gexec
SELECT 'CREATE SUBSCRIPTION cov_sub CONNECTION ''host=127.0.0.1 dbname=nowhere'''
       ' PUBLICATION cov_pub WITH (connect = false)'
 WHERE NOT EXISTS (SELECT FROM pg_subscription WHERE subname = 'cov_sub') \\gexec
"""


@dataclass(frozen=True)
class Scrape:
    """What one scrape of the whole library produced."""

    body: str
    planned: int  # collectors planned on the main database
    families: int  # TYPE lines
    series: int  # sample lines
    failures: list[str]  # planned collectors whose outcome was neither ok nor skipped
    pass_ms: float  # wall time of an uncached pass, connections already open


def _prepare(cluster: LocalCluster) -> None:
    """The monitoring role, the database and its objects (idempotent: clusters are shared)."""
    cluster.psql(_CLUSTER_SETUP)
    cluster.psql(_DATABASE_SETUP, dbname=DB)
    _pgbench(cluster)


def _pgbench(cluster: LocalCluster) -> None:
    """Once per cluster, a little pgbench traffic in DB, so pg_stat_statements and the
    table statistics hold what an application leaves there."""
    tables = "SELECT count(*) FROM pg_tables WHERE tablename = 'pgbench_accounts'"
    if cluster.psql(tables, dbname=DB).strip() != "0":
        return
    pgbench, dsn = str(cluster.client_bindir / "pgbench"), cluster.dsn(dbname=DB)
    subprocess.run([pgbench, "-i", "-q", "-s", "1", dsn], capture_output=True, check=True)
    subprocess.run([pgbench, "-n", "-c", "2", "-t", "50", dsn], capture_output=True, check=True)


def _definitions(*, unskip: bool = False) -> Definitions:
    """The library as shipped, or with every `skip: true` branch switched on."""
    definitions = load_definitions(str(COLLECTORS))
    if not unskip:
        return definitions
    collectors = tuple(replace(c, skip=False) for c in definitions.collectors)
    return replace(definitions, collectors=collectors)


async def _scrape(
    aiohttp_client: AiohttpClient, cluster: LocalCluster, user: str, definitions: Definitions
) -> Scrape:
    """Scrape twice without cache; the second scrape times a full pass on open connections."""
    settings = replace(
        settings_for(cluster),
        url=cluster.dsn(user=user),
        include_databases=(DB,),
        disable_cache=True,
    )
    client: Client = await aiohttp_client(create_app(settings, definitions))
    assert (await client.get("/metrics")).status == 200
    started = time.perf_counter()
    response = await client.get("/metrics")
    pass_ms = (time.perf_counter() - started) * 1000
    assert response.status == 200
    body = await response.text()
    exporter = client.app[STATE].exporter
    assert exporter.main.plan is not None
    lines = body.splitlines()
    return Scrape(
        body=body,
        planned=len(exporter.main.plan.planned),
        families=sum(1 for line in lines if line.startswith("# TYPE ")),
        series=sum(1 for line in lines if line and not line.startswith("#")),
        failures=_failures(client),
        pass_ms=pass_ms,
    )


def _failures(client: Client) -> list[str]:
    """Every planned collector whose last outcome was not ok or skipped, with its error."""
    failures = []
    for server in client.app[STATE].exporter.servers:
        assert server.plan is not None, f"database {server.label} was never planned"
        for collector in server.plan.planned:
            runtime = server.runtimes.get(collector.key)
            entry = runtime.entry if runtime else None
            if entry is None or entry.outcome not in (Outcome.OK, Outcome.SKIPPED):
                failures.append(f"{server.label}/{collector.key}: {entry and entry.error}")
    return failures


def _report(what: str, scrape: Scrape) -> None:
    print(
        f"\n{what}: {scrape.planned} collectors planned on the main database, "
        f"{scrape.families} families, {scrape.series} series, "
        f"full uncached pass {scrape.pass_ms:.0f} ms"
    )


def _has(body: str, name: str, **labels: str) -> bool:
    """True when some sample of ``name`` carries ``labels``."""
    return any(
        n == name and all(dict(lbls).get(k) == v for k, v in labels.items())
        for n, lbls in samples(body)
    )


@pytest.mark.parametrize("user", [SUPERUSER, MONITOR])
async def test_whole_library_runs_clean_on_primary(
    aiohttp_client: AiohttpClient, every_pg: LocalCluster, user: str, promtool: str
) -> None:
    """On 13 to 18, every planned collector succeeds as superuser and as pg_monitor (D13)."""
    pg = every_pg
    _prepare(pg)
    scrape = await _scrape(aiohttp_client, pg, user, _definitions())
    _report(f"PostgreSQL {pg.version} primary as {user}", scrape)
    assert scrape.failures == []
    assert _repeated_series(scrape.body) == []
    assert scrape.planned >= MIN_PLANNED["primary"]
    assert scrape.families >= MIN_FAMILIES
    assert scrape.series >= MIN_SERIES
    assert scrape.pass_ms < FULL_PASS_BUDGET_MS
    assert unexpected_problems(promtool, scrape.body.encode()) == []


async def test_per_database_families_describe_the_objects(
    aiohttp_client: AiohttpClient, every_pg: LocalCluster
) -> None:
    """The discovered database's function, sequence, partition and publication all show up."""
    pg = every_pg
    _prepare(pg)
    # Statistics of the set-up session reach shared memory when that backend exits.
    flushed = (
        "SELECT (SELECT count(*) FROM pg_stat_user_functions WHERE funcname = 'cov_count')"
        " + (SELECT count(*) FROM pg_stat_user_tables"
        "     WHERE relname = 'cov_events_other' AND n_live_tup > 0)"
    )
    wait_for(lambda: pg.psql(flushed, dbname=DB).strip() == "2", "the set-up statistics")
    body = (await _scrape(aiohttp_client, pg, SUPERUSER, _definitions())).body
    calls = value(body, "pg_func_calls", datname=DB, funcname="public.cov_count", args="c integer")
    assert calls >= 1
    assert value(body, "pg_seq_last_value", datname=DB, seqname="public.cov_tickets") >= 1
    assert value(body, "pg_seq_used_ratio", datname=DB, seqname="public.cov_wide") == 0.5
    assert value(body, "pg_defpart_tuples", datname=DB, relname="public.cov_events_other") > 0
    assert value(body, "pg_table_n_tup_mod", datname=DB, relname="public.cov_orders") >= 3000
    assert _has(body, "pg_index_relpages", datname=DB, idxname="public.cov_orders_pkey")
    assert value(body, "pg_pubrel_count", datname=DB, pubname="cov_pub") == 1
    assert value(body, "pg_relkind_count", datname=DB, relkind="m") >= 1
    assert _has(body, "pg_table_size_bytes", datname=DB, relname="public.cov_orders")
    assert _has(body, "pg_sub_enabled", datname=DB, subname="cov_sub")  # Go 1.5.0's label
    assert value(body, "pg_xact_age_seconds_bucket", datname=DB, le="+Inf") >= 0
    assert _table_values_are_zero_not_nan(body) == []


def _table_values_are_zero_not_nan(body: str) -> list[str]:
    """pg_table as Go 1.6.1 gives it: no NaN, and age 0 where relfrozenxid is 0
    (the partitioned parent cov_events, on the majors whose statistics list it)."""
    problems = []
    for (name, labels), number in samples(body).items():
        if not name.startswith("pg_table_"):
            continue
        relname = dict(labels).get("relname")
        parent_age = name == "pg_table_age" and relname == "public.cov_events"
        if math.isnan(number) or (parent_age and number != 0):
            problems.append(f"{name}{{relname={relname}}} = {number}")
    return problems


@pytest.mark.parametrize("user", [SUPERUSER, MONITOR])
@pytest.mark.parametrize("major", sorted(MAJORS, reverse=True))
async def test_whole_library_runs_clean_on_replica(
    aiohttp_client: AiohttpClient,
    request: pytest.FixtureRequest,
    major: int,
    user: str,
    promtool: str,
) -> None:
    """On a streaming replica of 13 to 18 the replica branches run too, all without errors."""
    primary: LocalCluster = request.getfixturevalue(f"pg{major}")
    replica: LocalCluster = request.getfixturevalue(f"pg{major}_replica")
    _prepare(primary)
    query = f"SELECT count(*) FROM pg_roles WHERE rolname = '{MONITOR}'"
    wait_for(lambda: replica.psql(query).strip() == "1", "the replica to replay the role")
    query = "SELECT pg_last_wal_replay_lsn() >= '" + primary.psql("SELECT pg_current_wal_lsn()")
    wait_for(lambda: replica.psql(query + "'").strip() == "t", "the replica to replay set-up")
    scrape = await _scrape(aiohttp_client, replica, user, _definitions())
    _report(f"PostgreSQL {replica.version} replica as {user}", scrape)
    assert scrape.failures == []
    assert _repeated_series(scrape.body) == []
    assert value(scrape.body, "pg_in_recovery") == 1
    assert _has(scrape.body, "pg_recv_flush_lsn")
    assert _has(scrape.body, "pg_recovery_replay_pending_bytes")
    assert scrape.planned >= MIN_PLANNED["replica"]
    assert scrape.families >= MIN_FAMILIES
    assert unexpected_problems(promtool, scrape.body.encode()) == []


TWIN = "libcov_twin"
_TWIN_SUBSCRIPTION = """
CREATE SUBSCRIPTION cov_sub CONNECTION 'host=127.0.0.1 dbname=nowhere'
  PUBLICATION cov_pub WITH (connect = false);
"""
# A subscription created without connecting still names a slot; drop it without one.
_TWIN_CLEANUP = """
ALTER SUBSCRIPTION cov_sub SET (slot_name = NONE);
DROP SUBSCRIPTION cov_sub;
"""


async def test_subscriptions_of_one_name_in_two_databases_stay_apart(
    aiohttp_client: AiohttpClient, every_pg: LocalCluster
) -> None:
    """Two databases each own a subscription cov_sub: as pg_monitor, pg_sub gives one
    series set per database (Go 1.5.0's datname label), without a repeated label set."""
    pg = every_pg
    _prepare(pg)
    pg.psql(f"DROP DATABASE IF EXISTS {TWIN}")
    pg.psql(f"CREATE DATABASE {TWIN}")
    try:
        pg.psql(_TWIN_SUBSCRIPTION, dbname=TWIN)
        scrape = await _scrape(aiohttp_client, pg, MONITOR, _definitions())
    finally:
        pg.psql(_TWIN_CLEANUP, dbname=TWIN)
        pg.psql(f"DROP DATABASE {TWIN}")
    assert scrape.failures == []
    assert _repeated_series(scrape.body) == []
    for datname in (DB, TWIN):
        assert value(scrape.body, "pg_sub_enabled", datname=datname, subname="cov_sub") == 0


def _repeated_series(body: str) -> list[str]:
    """Sample lines whose name and labels appear more than once."""
    seen: set[str] = set()
    repeated = []
    for line in body.splitlines():
        if line and not line.startswith("#"):
            series = line.rsplit(" ", 1)[0]
            if series in seen:
                repeated.append(series)
            seen.add(series)
    return repeated


async def test_branches_skipped_by_default_still_run_for_a_superuser(
    aiohttp_client: AiohttpClient, every_pg: LocalCluster
) -> None:
    """pg_origin, pg_shmem and the bloat estimates work when a superuser switches them on."""
    pg = every_pg
    _prepare(pg)
    scrape = await _scrape(aiohttp_client, pg, SUPERUSER, _definitions(unskip=True))
    assert scrape.failures == []
    assert _has(scrape.body, "pg_shmem_size")
    assert _has(scrape.body, "pg_table_bloat_ratio", datname=DB, relname="public.cov_orders")
    assert _has(scrape.body, "pg_index_bloat_ratio", datname=DB, relname="public.cov_orders_pkey")


# --- pgBouncer: the SHOW commands of the 09xx files against a real pgBouncer ----------


@pytest.fixture(scope="module")
def pgbouncer(pg18: LocalCluster) -> Iterator[int]:
    """A pgBouncer pooling pg18's application database; its port."""
    _prepare(pg18)
    with LocalPgBouncer(pg18, databases=(DB,)) as bouncer:
        yield bouncer.port


def _console(port: int) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(
        f"host=127.0.0.1 port={port} user=postgres dbname=pgbouncer sslmode=disable",
        autocommit=True,
        connect_timeout=5,
    )


Row = list[str | None]


def _show(
    conn: psycopg.Connection[tuple[object, ...]], command: str
) -> tuple[list[str], list[Row]]:
    """Run an admin console command with the simple query protocol: (columns, text rows)."""
    result = conn.pgconn.exec_(command.encode())
    assert result.error_message == b"", result.error_message
    columns = [(result.fname(i) or b"").decode() for i in range(result.nfields)]
    rows = [
        [_text(result.get_value(r, i)) for i in range(result.nfields)]
        for r in range(result.ntuples)
    ]
    return columns, rows


def _text(cell: bytes | None) -> str | None:
    return None if cell is None else cell.decode()


def test_pgbouncer_collectors_match_a_real_console(pgbouncer: int) -> None:
    """Each planned pgbouncer_* branch finds all its columns in the real SHOW output."""
    with _console(pgbouncer) as conn:
        _, version_rows = _show(conn, "SHOW VERSION")
        found = re.search(r"(\d+)\.(\d+)\.(\d+)", str(version_rows[0][0]))
        assert found, version_rows
        major, minor, patch = (int(part) for part in found.groups())
        facts = ServerFacts(
            version=major * 10000 + minor * 100 + patch,
            in_recovery=False,
            datname="pgbouncer",
            username="postgres",
            pgbouncer=True,
        )
        plan = make_plan(_definitions(), facts, [])
        assert {c.name for c in plan.planned} == {
            "pgbouncer_list", "pgbouncer_database", "pgbouncer_stat", "pgbouncer_pool"
        }  # fmt: skip
        for collector in plan.planned:
            columns, rows = _show(conn, collector.query)
            builder = SampleBuilder(collector, columns, (), None)
            builder.add_rows(rows)
            families = builder.finish()
            assert builder.warnings == [], collector.key
            assert {f.name for f in families} == {
                collector.metric_name(column) for column in collector.value_columns
            }, collector.key
            assert builder.series > 0, collector.key
