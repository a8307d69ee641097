"""Hostile neighbours (issue 29): a tenant who owns a database and its ``search_path``, an
application sharing our pgBouncer pool, and a pooler we cannot see. Whatever they do,
our sessions stay read only and limited (D1, D2), nothing of theirs runs in place of
what our statements call, and nothing of ours is left on a server connection they get.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import psycopg
import pytest

from exporter.collect.cache import Outcome
from exporter.config.definitions import Predicate
from exporter.web.appstate import STATE
from rigs.localbouncer import LocalPgBouncer
from rigs.localpg import SERVER_ACCOUNT, LocalCluster, bindir_for
from tests.fixtures.helpers import (
    samples,
    settings_for,
    tenant_database,
    value,
    write_collectors,
)
from tests.fixtures.rawhttp import Served, Start, get, serving

# ---------------------------------------------------------------------------------------
# A database owner who controls search_path


@dataclass(frozen=True)
class Tenancy:
    """A database owned by an ordinary role that put a schema of its own first in the
    database's search_path, and a pg_monitor role for the exporter."""

    database: str
    monitor: str
    marker: str  # what every function of the tenant's says in the server log when run


# Every function our own SQL calls (set-up, preflight, limits), and one catalog function
# with an overload that beats pg_catalog's by an exact argument type (pg_sleep(integer)
# against pg_sleep(double precision)): each logs the marker when it runs.
_IMPOSTORS = (
    ("set_config(text, text, boolean)", "text", "$2"),
    ("current_setting(text)", "text", "'0'"),
    ("current_setting(text, boolean)", "text", "'0'"),
    ("current_database()", "name", "'postgres'::name"),
    ("current_schemas(boolean)", "name[]", "ARRAY['evil']::name[]"),
    ("pg_is_in_recovery()", "boolean", "false"),
    ("pg_backend_pid()", "integer", "0"),
    ("inet_server_addr()", "inet", "'127.0.0.1'::inet"),
    ("inet_server_port()", "integer", "5432"),
    ("pg_has_role(name, text)", "boolean", "true"),
    ("pg_has_role(text, text)", "boolean", "true"),
    ("quote_ident(text)", "text", "$1"),
    ("array_to_string(anyarray, text)", "text", "''"),
    ("pg_sleep(integer)", "void", ""),
)


def _impostor(signature: str, returns: str, result: str, marker: str) -> str:
    name = signature.split("(", maxsplit=1)[0]
    return (
        f"CREATE FUNCTION evil.{signature} RETURNS {returns} LANGUAGE plpgsql AS $f$ "
        f"BEGIN RAISE WARNING '{marker} {name}'; RETURN {result}; END $f$;"
    )


@pytest.fixture
def tenancy(pg: LocalCluster) -> Iterator[Tenancy]:
    """The tenant's database: evil first on its search_path, a sequence and tables."""
    with tenant_database(pg, "hn") as (database, tenant, monitor):
        marker = f"impostor_{database}"
        yield _tenancy(pg, database, tenant, monitor, marker)


def _tenancy(pg: LocalCluster, database: str, tenant: str, monitor: str, marker: str) -> Tenancy:
    functions = "\n".join(_impostor(*row, marker) for row in _IMPOSTORS)
    as_tenant = f"""
        SET ROLE {tenant};
        CREATE SCHEMA evil; CREATE SCHEMA app;
        GRANT USAGE ON SCHEMA evil, app TO PUBLIC;
        {functions}
        CREATE SEQUENCE app.seq; GRANT USAGE, SELECT ON SEQUENCE app.seq TO {monitor};
        CREATE TABLE app.queue (id int); INSERT INTO app.queue VALUES (1), (2);
        CREATE TABLE public.jobs (id int); INSERT INTO public.jobs VALUES (1), (2), (3);
        GRANT SELECT ON app.queue, public.jobs TO {monitor};
        ALTER DATABASE {database} SET search_path = evil, pg_catalog, public;
    """
    pg.psql(as_tenant, dbname=database)
    return Tenancy(database, monitor, marker)


_TENANT_COLLECTORS = """
hn_limits:
  query: >-
    SELECT pg_catalog.current_setting('transaction_read_only') AS read_only,
           pg_catalog.current_setting('statement_timeout') AS statement_timeout, 1 AS v
  timeout: 1
  metrics:
    - read_only: {usage: LABEL, description: x}
    - statement_timeout: {usage: LABEL, description: x}
    - v: {usage: GAUGE, description: x}
hn_write:
  query: SELECT pg_catalog.nextval('app.seq') AS v
  timeout: 5
  metrics:
    - v: {usage: GAUGE, description: x}
hn_sleep:
  query: SELECT 1 AS v FROM pg_sleep(0)
  timeout: 5
  metrics:
    - v: {usage: GAUGE, description: x}
hn_jobs:
  query: SELECT count(*) AS n FROM public.jobs
  timeout: 5
  metrics:
    - n: {usage: GAUGE, description: rows of a table in public, the tenant's, named so}
hn_queue:
  query: SELECT count(*) AS n FROM app.queue
  timeout: 5
  metrics:
    - n: {usage: GAUGE, description: rows of a table in a schema of the tenant's own}
"""


async def test_a_database_owner_cannot_stand_in_for_what_our_statements_call(
    pg: LocalCluster, tenancy: Tenancy, start: Start
) -> None:
    """A database owner who puts a schema of their own before pg_catalog in the database's
    search_path, with functions of the names our statements call, runs none of them: the
    collectors stay read only (a nextval fails) and limited, the exact-type overload of a
    catalog function is not chosen either, and collectors reading the tenant's objects,
    named with their schema, keep working, fenced (D1, D2, issue 36)."""
    url = pg.dsn(tenancy.database, user=tenancy.monitor)
    log_before = len(pg.log_text())
    served = await start(pg, _TENANT_COLLECTORS, disable_cache=True, url=url)
    for _ in range(3):  # the first run as text, then PREPARE, then EXECUTE
        response = await get(served.port)
        assert response.status == 200, response.text
        runtimes = served.app[STATE].exporter.main.runtimes
        assert runtimes["hn_write"].outcome is Outcome.ERROR
        entry = runtimes["hn_write"].entry
        assert entry is not None
        assert "read-only transaction" in entry.error
        assert value(response.text, "hn_limits_v", read_only="on", statement_timeout="1s") == 1
        assert value(response.text, "hn_sleep_v") == 1
        assert value(response.text, "hn_jobs_n") == 3
        assert value(response.text, "hn_queue_n") == 2
    assert tenancy.marker not in pg.log_text()[log_before:]
    assert int(pg.psql("SELECT last_value FROM app.seq", dbname=tenancy.database) or 0) == 1
    explained = await get(served.port, "/explain")
    assert 'search_path: "pg_catalog", "pg_temp"' in explained.text, explained.text
    for key in ("hn_jobs", "hn_queue", "hn_write"):  # name a schema the tenant writes
        line = next(x for x in explained.text.splitlines() if x.startswith(f"  {key} "))
        assert "rolled back" in line, line


# ---------------------------------------------------------------------------------------
# An application sharing our pgBouncer pool


class _OnePoolBouncer(LocalPgBouncer):
    """Transaction pooling on ONE server connection shared by every client (forced user),
    so the application surely gets the server connection our statements ran on."""

    def _config(self) -> str:
        return super()._config().replace("pool_size=2", "user=postgres pool_size=1")


@pytest.fixture
def shared_pool(pg18: LocalCluster) -> Iterator[LocalPgBouncer]:
    database = f"shared_{uuid.uuid4().hex[:8]}"
    pg18.psql(f"CREATE DATABASE {database}")
    with _OnePoolBouncer(pg18, databases=(database,)) as bouncer:
        yield bouncer
    with contextlib.suppress(Exception):
        pg18.psql(f"DROP DATABASE {database} WITH (FORCE)")


_POOLED = """
sp_ok:
  query: SELECT 1 AS v
  timeout: 5
  metrics:
    - v: {usage: GAUGE, description: x}
sp_fails:
  query: SELECT 1 / (SELECT 0) AS v
  timeout: 5
  metrics:
    - v: {usage: GAUGE, description: x}
"""


@dataclass
class _App:
    """A psycopg 3 application on the pool, with psycopg's own prepared statements."""

    statements: int = 0
    errors: list[str] | None = None
    foreign: set[str] | None = None  # statements prepared on its connection, not by it


async def _application(url: str, stop: asyncio.Event, app: _App) -> None:
    app.errors, app.foreign = [], set()
    mine = {"SELECT $1::int + 1", "SELECT $1::text || 'x'"}
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while not stop.is_set():
            for query, arg in (("SELECT %s::int + 1", 1), ("SELECT %s::text || 'x'", "a")):
                try:
                    await conn.execute(query, [arg])
                    cur = await conn.execute(
                        "SELECT statement FROM pg_prepared_statements", prepare=False
                    )
                    app.foreign |= {str(s) for (s,) in await cur.fetchall()} - mine
                except psycopg.Error as exc:
                    app.errors.append(f"{type(exc).__name__}: {exc}")
                app.statements += 1
            await asyncio.sleep(0)


async def test_nothing_we_prepare_reaches_an_application_sharing_the_pool(
    pg18: LocalCluster, shared_pool: LocalPgBouncer, start: Start
) -> None:
    """Behind pgBouncer in transaction pooling, none of our statements (COMMIT, ROLLBACK,
    the preflight) is prepared on the shared server connection, so a psycopg 3
    application there never meets a statement of ours nor loses its own to our
    ROLLBACK; our scrapes keep working (issue 29)."""
    url = shared_pool.dsn(shared_pool.databases[0])
    served = await start(pg18, _POOLED, disable_cache=True, url=url)
    stop, app = asyncio.Event(), _App()
    loop = asyncio.create_task(_application(url, stop, app))
    deadline = asyncio.get_running_loop().time() + 60
    scrapes = 0
    try:  # psycopg prepares what it has run five times: well past that on both sides
        while scrapes < 12 or app.statements < 40:
            assert asyncio.get_running_loop().time() < deadline, (scrapes, app.statements)
            response = await get(served.port)
            assert response.status == 200
            assert value(response.text, "pg_up") == 1, response.text
            assert value(response.text, "sp_ok_v") == 1
            scrapes += 1
    finally:
        stop.set()
        await loop
    assert app.errors == [], (app.errors or [])[:5]
    assert app.foreign == set(), app.foreign


async def test_a_function_we_call_leaves_nothing_on_a_pooled_server_connection(
    pg18: LocalCluster, shared_pool: LocalPgBouncer, start: Start
) -> None:
    """Issue 36, finding 4: through pgBouncer on one shared server connection, a function
    of an ordinary role's that a collector calls sets a 1 ms statement timeout and an
    evil search_path for the session and takes a session advisory lock; the collector's
    transaction is rolled back and the lock let go in the same round trip, so the
    application that gets the server connection next finds the server's defaults and no
    lock held."""
    database = shared_pool.databases[0]
    tag = uuid.uuid4().hex[:8]
    owner = f"sticky_{tag}"
    pg18.psql(
        f"CREATE ROLE {owner}; CREATE SCHEMA {owner} AUTHORIZATION {owner}; "
        f"GRANT USAGE ON SCHEMA {owner} TO PUBLIC; SET ROLE {owner}; "
        f"CREATE FUNCTION {owner}.stick() RETURNS int LANGUAGE plpgsql AS $f$ BEGIN "
        "PERFORM pg_catalog.set_config('statement_timeout', '1', false); "
        "PERFORM pg_catalog.set_config('search_path', 'evil', false); "
        "PERFORM pg_catalog.pg_advisory_lock(4242); RETURN 1; END $f$",
        dbname=database,
    )
    config = f"""
st_stick:
  query: SELECT {owner}.stick() AS v
  timeout: 5
  metrics:
    - v: {{usage: GAUGE, description: x}}
"""
    served = await start(pg18, config, disable_cache=True, url=shared_pool.dsn(database))
    for _ in range(3):
        response = await get(served.port)
        assert response.status == 200
        assert value(response.text, "st_stick_v") == 1, response.text
    async with await psycopg.AsyncConnection.connect(
        shared_pool.dsn(database), autocommit=True
    ) as conn:
        cur = await conn.execute(
            "SELECT current_setting('statement_timeout'), current_setting('search_path'),"
            " (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242)",
            prepare=False,
        )
        assert await cur.fetchone() == ("0", '"$user", public', 0)


# ---------------------------------------------------------------------------------------
# A pooler that looks direct


@dataclass(frozen=True)
class Redirected:
    """A PostgreSQL whose address every local client but pgBouncer reaches pgBouncer at."""

    cluster: LocalCluster
    bouncer: LocalPgBouncer


class _TransparentBouncer(LocalPgBouncer):
    def _config(self) -> str:
        return super()._config().replace("pool_size=2", "user=postgres pool_size=2")


def _iptables(action: str, cluster_port: int, bouncer_port: int) -> None:
    rule = (
        f"-t nat {action} OUTPUT -p tcp -d 127.0.0.1 --dport {cluster_port} "
        f"-m owner ! --uid-owner {SERVER_ACCOUNT} -j REDIRECT --to-ports {bouncer_port}"
    )
    subprocess.run(["iptables", *rule.split()], check=True, capture_output=True)


@pytest.fixture
async def redirected() -> AsyncIterator[Redirected]:
    """An iptables REDIRECT of a throw-away PostgreSQL's address to a transaction-pooling
    pgBouncer, whose own account is exempt, as some sidecar meshes set it up: libpq
    dials PostgreSQL's address and port, and the server sees that very endpoint."""
    with LocalCluster(bindir_for(18)) as cluster:
        cluster.psql("CREATE SEQUENCE seq")
        with _TransparentBouncer(cluster) as bouncer:
            _iptables("-A", cluster.port, bouncer.port)
            try:
                yield Redirected(cluster, bouncer)
            finally:
                _iptables("-D", cluster.port, bouncer.port)


_LOOKS_DIRECT = """
ld_write:
  query: SELECT nextval('seq') AS v
  timeout: 5
  metrics:
    - v: {usage: GAUGE, description: x}
ld_limits:
  query: SELECT current_setting('statement_timeout') AS statement_timeout, 1 AS v
  timeout: 1
  metrics:
    - statement_timeout: {usage: LABEL, description: x}
    - v: {usage: GAUGE, description: x}
"""


async def test_a_pooler_behind_a_redirect_is_not_taken_for_postgres(
    redirected: Redirected, start: Start
) -> None:
    """pgBouncer behind a transparent redirect shows the server the endpoint libpq
    dialed, but not the backend libpq logged in to: the exporter sees that the backend
    pid it got at login is not the server's, keeps a read-only transaction per collector,
    and a collector's nextval fails at every pass (D1, D2)."""
    cluster = redirected.cluster
    served = await start(cluster, _LOOKS_DIRECT, disable_cache=True, url=cluster.dsn())
    for _ in range(4):
        response = await get(served.port)
        assert response.status == 200
        assert value(response.text, "ld_limits_v", statement_timeout="1s") == 1, response.text
        main = served.app[STATE].exporter.main
        assert main.runtimes["ld_write"].outcome is Outcome.ERROR
    assert main.facts is not None
    assert "backend" in main.facts.own_transaction, main.facts.own_transaction
    # Straight to PostgreSQL (as the server's account, exempt from the redirect).
    assert cluster.psql("SELECT last_value, is_called FROM seq") == "1|f"
    seen = samples(response.text)
    assert not any(name == "ld_write_v" for name, _ in seen), seen


# ---------------------------------------------------------------------------------------
# A collector that tries to leave its read-only transaction (a careless config author)


@contextlib.asynccontextmanager
async def _serve_with_predicate(
    cluster: LocalCluster, tmp_path: Path, predicate_sql: str, query: str
) -> AsyncIterator[Served]:
    """Serve one collector whose predicate is ``predicate_sql``, set on the loaded
    definitions, so the run-time rule is tested whatever loading would refuse."""
    loaded = write_collectors(
        tmp_path,
        f"""
        esc_write:
          query: {query}
          predicate_queries: [{{name: p, predicate_query: SELECT true}}]
          timeout: 5
          metrics:
            - v: {{usage: GAUGE, description: x}}
        """,
    )
    (collector,) = loaded.collectors
    hostile = replace(collector, predicates=(Predicate("p", predicate_sql),))
    definitions = replace(loaded, collectors=(hostile,))
    settings = replace(settings_for(cluster), auto_discovery=False, disable_cache=True)
    async with serving(settings, definitions) as served:
        yield served


@pytest.mark.parametrize(
    "predicate_sql",
    [
        "BEGIN READ WRITE; CREATE TABLE public.{table} (); COMMIT; SELECT true",
        "SELECT pg_catalog.set_config('default_transaction_read_only', 'off', false) IS NOT NULL",
        "SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE",
    ],
    ids=["several-statements", "set-config", "session-characteristics"],
)
async def test_a_predicate_cannot_open_the_way_to_a_write(
    every_pg: LocalCluster, tmp_path: Path, predicate_sql: str
) -> None:
    """Whatever a predicate contains, nothing is written: it goes as one statement by the
    extended protocol, and on a session with limits the read-only default is checked
    again after the predicates, as the server reports it (D2)."""
    table = f"esc_{uuid.uuid4().hex[:8]}"
    every_pg.psql(f"CREATE SEQUENCE {table}_seq")
    query = f"SELECT nextval('{table}_seq') AS v"
    hostile = predicate_sql.format(table=table)
    async with _serve_with_predicate(every_pg, tmp_path, hostile, query) as served:
        for _ in range(3):
            response = await get(served.port)
            assert response.status == 200
            runtime = served.app[STATE].exporter.main.runtimes["esc_write"]
            assert runtime.outcome is Outcome.ERROR, runtime.entry
    assert every_pg.psql(f"SELECT to_regclass('public.{table}') IS NULL") == "t"
    assert every_pg.psql(f"SELECT is_called FROM {table}_seq") == "f"


async def test_a_top_probe_cannot_open_the_way_to_a_write(
    every_pg: LocalCluster, tmp_path: Path
) -> None:
    """A ``top`` probe goes as one statement by the extended protocol, as the query and
    the predicates do (D2): several statements set on the loaded definitions, which
    loading would refuse, fail the run and write nothing (issue 38)."""
    table = f"esc_{uuid.uuid4().hex[:8]}"
    loaded = write_collectors(
        tmp_path,
        """
        esc_probe:
          query: SELECT k AS key, 1 AS calls FROM unnest($1::text[]) AS k
          timeout: 5
          top:
            by: ranked
            limit: 1
            id: key
            probe: SELECT ARRAY['a'] AS keys, ARRAY[1] AS ranked
          metrics:
            - key: {usage: LABEL, description: x}
            - calls: {usage: COUNTER, description: x}
        """,
    )
    (collector,) = loaded.collectors
    assert collector.top is not None
    hostile_sql = (
        f"COMMIT; BEGIN READ WRITE; CREATE TABLE public.{table} (); COMMIT; "
        "SELECT ARRAY['a'] AS keys, ARRAY[1] AS ranked"
    )
    hostile = replace(collector, top=replace(collector.top, probe=hostile_sql))
    definitions = replace(loaded, collectors=(hostile,))
    settings = replace(settings_for(every_pg), auto_discovery=False, disable_cache=True)
    async with serving(settings, definitions) as served:
        for _ in range(2):
            response = await get(served.port)
            assert response.status == 200
            runtime = served.app[STATE].exporter.main.runtimes["esc_probe"]
            assert runtime.outcome is Outcome.ERROR, runtime.entry
            assert "multiple commands" in (runtime.entry.error if runtime.entry else "")
    assert every_pg.psql(f"SELECT to_regclass('public.{table}') IS NULL") == "t"


async def test_a_database_owner_cannot_change_the_text_of_our_labels_and_values(
    pg: LocalCluster, tenancy: Tenancy, start: Start
) -> None:
    """A database whose owner set another DateStyle and fewer float digits gives the
    same label text and values as any other: ours are set as the Go exporter's driver
    sets them at login (issue 30)."""
    pg.psql(f"ALTER DATABASE {tenancy.database} SET DateStyle = 'SQL, DMY'; "
            f"ALTER DATABASE {tenancy.database} SET extra_float_digits = -3")  # fmt: skip
    config = """
    tx_text:
      query: SELECT ARRAY['2024-01-02'::date] AS days, 0.1::float8 + 0.2::float8 AS v
      timeout: 5
      metrics:
        - days: {usage: LABEL, description: x}
        - v: {usage: GAUGE, description: x}
    """
    url = pg.dsn(tenancy.database, user=tenancy.monitor)
    served = await start(pg, config, disable_cache=True, url=url)
    for _ in range(3):
        response = await get(served.port)
        assert 'tx_text_v{days="{2024-01-02}"} 0.30000000000000004' in response.text, response.text
