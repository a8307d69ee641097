"""The guards from the first byte (issue 36): a database owner who sets hostile defaults
for their database and plants functions named like the catalog's gets none of them into
our sessions, and a function of theirs that a collector of ours does call keeps no hold
on the session after it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest

from exporter.pg import guards
from exporter.web.appstate import STATE
from rigs.localbouncer import LocalPgBouncer
from rigs.localpg import LocalCluster
from tests.fixtures.helpers import tenant_database, value
from tests.fixtures.rawhttp import Start, get


@dataclass(frozen=True)
class Owned:
    """A database owned by an ordinary role, and a pg_monitor role for the exporter."""

    database: str
    tenant: str
    monitor: str
    marker: str  # what each function of the tenant's says in the server log when it runs


# Defaults an owner may give their database that would change our cost, isolation,
# waiting or name resolution (findings 2, 3 and 8 of issue 36).
_HOSTILE_DEFAULTS = {
    "default_transaction_isolation": "serializable",
    "default_transaction_deferrable": "on",
    "default_transaction_read_only": "off",
    "hash_mem_multiplier": "1000",
    "work_mem": "1GB",
    "plan_cache_mode": "force_generic_plan",
    "enable_indexscan": "off",
    "enable_hashjoin": "off",
    "jit": "on",
    "jit_above_cost": "0",
    "jit_inline_above_cost": "0",
    "jit_optimize_above_cost": "0",
    "max_parallel_workers_per_gather": "8",
    "parallel_setup_cost": "0",
    "parallel_tuple_cost": "0",
    "min_parallel_table_scan_size": "0",
    "statement_timeout": "0",
    "lock_timeout": "0",
    "search_path": "public, pg_catalog",
    "DateStyle": "SQL, DMY",
    "extra_float_digits": "-15",
}


def _version(pg: LocalCluster) -> int:
    return int(pg.psql("SHOW server_version_num"))


@pytest.fixture
def owned(every_pg: LocalCluster) -> Iterator[Owned]:
    """A tenant's database with every hostile default above and, in ``public`` (theirs),
    a better-matching overload of pg_wal_lsn_diff, which pg_primary-like SQL calls with an
    untyped literal, and a function that takes hold of whatever session runs it."""
    with tenant_database(every_pg, "g") as (database, tenant, monitor):
        yield _own(every_pg, database, tenant, monitor)


def _own(pg: LocalCluster, database: str, tenant: str, monitor: str) -> Owned:
    marker = f"hijack_{database}"
    forced = "debug_parallel_query" if _version(pg) >= 160000 else "force_parallel_mode"
    defaults = {**_HOSTILE_DEFAULTS, forced: "on"}
    settings = "\n".join(
        f"ALTER DATABASE {database} SET {name} = '{setting}';" for name, setting in defaults.items()
    )
    take_hold = """
        RAISE WARNING '%', {said};
        PERFORM pg_catalog.set_config('jit', 'on', false);
        PERFORM pg_catalog.set_config('work_mem', '1GB', false);
        PERFORM pg_catalog.set_config('max_parallel_workers_per_gather', '8', false);
        PERFORM pg_catalog.set_config('statement_timeout', '0', false);
        PERFORM pg_catalog.set_config('default_transaction_read_only', 'off', false);
        PERFORM pg_catalog.set_config('search_path', 'public, pg_catalog', false);
        PERFORM pg_catalog.set_config('application_name', 'leaked', false);
    """
    # A schema of our own first, as a tenant would: if public came first on our path, its
    # view would stand in for the catalog's (every count 0).
    pg.psql(
        f"""
        {settings}
        SET ROLE {tenant};
        CREATE FUNCTION public.pg_wal_lsn_diff(pg_lsn, text) RETURNS numeric
            LANGUAGE plpgsql AS $f$ BEGIN {take_hold.format(said=f"'{marker} impostor'")}
            RETURN 0; END $f$;
        CREATE FUNCTION public.hold() RETURNS int
            LANGUAGE plpgsql AS $f$ BEGIN {take_hold.format(said=f"'{marker} hold'")}
            RETURN 1; END $f$;
        CREATE VIEW public.pg_stat_activity AS SELECT * FROM pg_catalog.pg_stat_activity
            WHERE false;
        GRANT SELECT ON public.pg_stat_activity TO PUBLIC;
        """,
        dbname=database,
    )
    return Owned(database, tenant, monitor, marker)


# Each reads what our session runs under, as the server reports it at that moment.
_READ = ", ".join(
    f"pg_catalog.current_setting('{name}') AS {name.lower()}"
    for name in (
        "transaction_isolation",
        "transaction_deferrable",
        "transaction_read_only",
        "hash_mem_multiplier",
        "work_mem",
        "plan_cache_mode",
        "enable_indexscan",
        "jit",
        "max_parallel_workers_per_gather",
        "search_path",
        "DateStyle",
        "extra_float_digits",
        "application_name",
    )
)
_LABELS = "\n".join(
    f"    - {column.split(' AS ')[1]}: {{usage: LABEL, description: x}}"
    for column in _READ.split(", ")
)
_COLLECTORS = f"""
g1_primary:
  query: SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0') AS lsn
  priority: 1
  timeout: 2
  metrics:
    - lsn: {{usage: GAUGE, description: x}}
g2_hold:
  query: SELECT public.hold() AS v
  priority: 2
  timeout: 2
  metrics:
    - v: {{usage: GAUGE, description: a tenant's function, called on purpose}}
g3_read:
  query: SELECT {_READ}, 1 AS v
  priority: 3
  timeout: 2
  metrics:
{_LABELS}
    - v: {{usage: GAUGE, description: x}}
g4_activity:
  query: SELECT count(*) AS n FROM pg_stat_activity WHERE backend_type = 'client backend'
  priority: 4
  timeout: 2
  metrics:
    - n: {{usage: GAUGE, description: x}}
"""

_PINNED = {
    "transaction_isolation": "read committed",
    "transaction_deferrable": "off",
    "transaction_read_only": "on",
    "hash_mem_multiplier": "1",
    "work_mem": "4MB",
    "plan_cache_mode": "auto",
    "enable_indexscan": "on",
    "jit": "off",
    "max_parallel_workers_per_gather": "0",
    "search_path": '"pg_catalog", "pg_temp"',
    "datestyle": "ISO, MDY",
    "extra_float_digits": "2",
    "application_name": "pg_exporter",
}


async def test_an_owner_gets_nothing_into_our_session(
    every_pg: LocalCluster, owned: Owned, start: Start
) -> None:
    """Findings 1 and 3 (D1, D2): whatever the owner set for the database, every statement of ours
    runs read only, read committed and not deferrable, without JIT or parallel workers,
    with bounded memory, our search_path and our text formats; the owner's overload of
    pg_wal_lsn_diff is not chosen (it never runs), the view shadowing pg_stat_activity is
    not read, and a function of theirs that a collector does call, which sets all of
    that for the session, holds nothing after it: over three passes the collector after
    it sees the guards, our application_name never changes, and /explain shows what the
    server reports."""
    pg = every_pg
    url = pg.dsn(owned.database, user=owned.monitor)
    served = await start(pg, _COLLECTORS, disable_cache=True, url=url)
    log_before = len(pg.log_text())
    for _ in range(3):
        response = await get(served.port)
        assert response.status == 200, response.text
        assert value(response.text, "g3_read_v", **_PINNED) == 1, response.text
        assert value(response.text, "g2_hold_v") == 1  # the tenant's function did run
        assert (value(response.text, "g4_activity_n") or 0) >= 1
        names = pg.psql(
            "SELECT DISTINCT application_name FROM pg_stat_activity "
            f"WHERE usename = '{owned.monitor}'"
        )
        assert names.split() == ["pg_exporter"], names
    logged = pg.log_text()[log_before:]
    assert logged.count(f"{owned.marker} hold") >= 3  # it ran each pass, on purpose
    assert f"{owned.marker} impostor" not in logged
    explained = (await get(served.port, "/explain")).text
    assert "guards as the server reports them: default_transaction_read_only=on, " in explained
    assert "jit=off" in explained
    assert "hash_mem_multiplier=1" in explained
    line = next(x for x in explained.splitlines() if x.startswith("  g2_hold "))
    assert "rolled back" in line, line


async def test_our_statements_get_no_jit_and_no_parallel_workers(
    every_pg: LocalCluster, owned: Owned, start: Start
) -> None:
    """Finding 8 (D1): on a database whose owner made JIT and parallel plans as tempting as
    they can be, no statement of ours, the preflight's and the first limits' included, is
    JIT-compiled or launches a parallel worker, by pg_stat_statements' count (JIT counted
    from PostgreSQL 15, workers from 18)."""
    pg = every_pg
    version = _version(pg)
    pg.psql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    oid = pg.psql(f"SELECT oid FROM pg_roles WHERE rolname = '{owned.monitor}'")
    pg.psql(f"SELECT pg_stat_statements_reset({oid})")
    url = pg.dsn(owned.database, user=owned.monitor)
    served = await start(pg, _COLLECTORS, disable_cache=True, url=url)
    for _ in range(3):
        assert (await get(served.port)).status == 200
    columns = ["count(*)"]
    if version >= 150000:
        columns.append("coalesce(sum(jit_functions), 0)")
    if version >= 180000:
        columns.append("coalesce(sum(parallel_workers_launched), 0)")
    row = pg.psql(f"SELECT {', '.join(columns)} FROM pg_stat_statements WHERE userid = {oid}")
    counts = [int(x) for x in row.split("|")]
    assert counts[0] > 5, row  # the statements were counted
    assert counts[1:] == [0] * (len(counts) - 1), row
    if version >= 150000 and pg.psql("SELECT pg_jit_available()") == "t":
        # The same statement, run as the owner's defaults have it, is JIT-compiled: the
        # zero above is the guards', not a server that cannot compile.
        tempted = pg.psql(
            f"SET ROLE {owned.tenant}; SET jit_above_cost = 0; "
            "EXPLAIN (ANALYZE, FORMAT TEXT) SELECT count(*) FROM pg_class",
            dbname=owned.database,
        )
        assert "JIT:" in tempted, tempted


def test_every_setting_an_owner_may_set_is_pinned_or_said_not_to_be(
    every_pg: LocalCluster,
) -> None:
    """Guarantee 4: each setting a database's or role's owner may set (context user, and
    superuser for a superuser owner) on this major is in the guards' table or named in
    NOT_PINNED with why, and every guard the table gives this major exists there."""
    version = _version(every_pg)
    rows = every_pg.psql(
        "SELECT name FROM pg_settings WHERE context IN ('user', 'superuser') ORDER BY 1"
    ).split()
    missing = [name for name in rows if not guards.accounted(name, version)]
    assert missing == [], missing
    known = set(every_pg.psql("SELECT name FROM pg_settings").split())
    lower = {name.lower() for name in known}
    assert [n for n in guards.names(version) if n.lower() not in lower] == []


_WAITING = """
w_read:
  query: >-
    SELECT pg_catalog.current_setting('transaction_isolation') AS isolation,
           pg_catalog.current_setting('transaction_deferrable') AS deferrable, 1 AS v
  timeout: 2
  metrics:
    - isolation: {usage: LABEL, description: x}
    - deferrable: {usage: LABEL, description: x}
    - v: {usage: GAUGE, description: x}
"""


async def test_an_owners_serializable_defaults_never_make_us_wait(
    pg: LocalCluster, start: Start
) -> None:
    """Finding 2 (D1, D3): a database whose owner made every transaction serializable, deferrable
    and read only, while one of their serializable read-write transactions stays open:
    a deferrable read-only transaction would wait for a safe snapshot until it ends. Ours
    are read committed and not deferrable from login, so every scrape is answered at once
    with the collector's rows."""
    with tenant_database(pg, "ser") as (database, tenant, monitor):
        for name, setting in (("default_transaction_isolation", "serializable"),
                              ("default_transaction_deferrable", "on"),
                              ("default_transaction_read_only", "on")):  # fmt: skip
            pg.psql(f"ALTER DATABASE {database} SET {name} = '{setting}'")
        await _scrape_beside(pg, database, tenant, monitor, start)


async def _scrape_beside(
    pg: LocalCluster, database: str, tenant: str, monitor: str, start: Start
) -> None:
    """Three scrapes while the tenant holds a serializable read-write transaction open."""
    holder = await psycopg.AsyncConnection.connect(pg.dsn(database, user=tenant))
    try:
        await holder.execute("BEGIN ISOLATION LEVEL SERIALIZABLE READ WRITE")
        await holder.execute("SELECT count(*) FROM pg_catalog.pg_class")
        served = await start(pg, _WAITING, disable_cache=True,
                             url=pg.dsn(database, user=monitor))  # fmt: skip
        for _ in range(3):
            response = await get(served.port)
            assert response.status == 200, response.text
            assert value(response.text, "w_read_v", isolation="read committed",
                         deferrable="off") == 1, response.text  # fmt: skip
    finally:
        await holder.close()


class _AsRole(LocalPgBouncer):
    """pgBouncer pooling one database, logging in to it as one role (a forced user)."""

    def __init__(self, cluster: LocalCluster, role: str, database: str) -> None:
        super().__init__(cluster, databases=(database,))
        self.role = role

    def _config(self) -> str:
        return super()._config().replace("pool_size=2", f"user={self.role} pool_size=2")


async def test_through_a_pooler_our_statements_launch_no_parallel_worker(
    pg18: LocalCluster, start: Start
) -> None:
    """Finding 8 behind pgBouncer, which refuses login options: on a database whose owner
    forces parallel plans, none of our statements (the preflight, the limits, the
    collectors, the end of our transactions, the health probe's) launches a worker; the
    owner's own statement under the same defaults does."""
    tempting = {
        "debug_parallel_query": "on",
        "max_parallel_workers_per_gather": "8",
        "parallel_setup_cost": "0",
        "parallel_tuple_cost": "0",
        "min_parallel_table_scan_size": "0",
    }
    with tenant_database(pg18, "pw") as (database, tenant, monitor):
        for name, setting in tempting.items():
            pg18.psql(f"ALTER DATABASE {database} SET {name} = '{setting}'")
        pg18.psql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        oid = pg18.psql(f"SELECT oid FROM pg_roles WHERE rolname = '{monitor}'")
        with _AsRole(pg18, monitor, database) as bouncer:
            url = bouncer.dsn(database)
            collectors = _COLLECTORS.split("g2_hold:", maxsplit=1)[0]
            served = await start(pg18, collectors, disable_cache=True, url=url)
            for _ in range(3):
                response = await get(served.port)
                assert response.status == 200, response.text
                assert value(response.text, "pg_up") == 1
            main = served.app[STATE].exporter.main
            assert main.facts is not None
            assert main.facts.own_transaction, "through pgBouncer: a transaction per collector"
        row = pg18.psql(
            "SELECT count(*), coalesce(sum(parallel_workers_launched), 0)"
            f" FROM pg_stat_statements WHERE userid = {oid}"
        )
        statements, workers = (int(x) for x in row.split("|"))
        assert statements > 5, row
        assert workers == 0, row
        tempted = pg18.psql(
            f"SET ROLE {tenant}; EXPLAIN (ANALYZE, COSTS OFF) SELECT count(*) FROM pg_class",
            dbname=database,
        )
        assert "Workers Launched: " in tempted, tempted
