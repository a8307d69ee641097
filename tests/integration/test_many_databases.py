"""Many databases on a fixed connection budget, against a real PostgreSQL (issue 13).

Each test creates its own databases, with a name prefix of its own, and drops them
at the end; discovery is limited to them with ``--include-database``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp.plugin import AiohttpClient

from exporter.collect.cache import Outcome
from exporter.web.app import create_app
from exporter.web.appstate import STATE
from rigs.localpg import LocalCluster, LocalPgError
from tests.fixtures.helpers import (
    exporter_backends,
    exporter_running,
    samples,
    settings_for,
    statement_calls,
    value,
    write_collectors,
)
from tests.fixtures.polling import poll, poll_async
from tests.fixtures.rawhttp import RawClient, Served, Start, get

Client = TestClient[web.Request, web.Application]

PERDB = """
perdb:
  query: SELECT current_database() AS datname, 1 AS one
  ttl: {ttl}
  timeout: 5
  metrics:
    - datname: {{usage: LABEL, description: database}}
    - one: {{usage: GAUGE, description: one}}
"""


@pytest.fixture(scope="module")
def databases(pg18: LocalCluster) -> Iterator[list[str]]:
    """Thirty databases for this module, dropped (with any session left on them) at its end;
    each test has an exporter, so caches and counts, of its own."""
    prefix = f"many_{uuid.uuid4().hex[:6]}"
    names = [f"{prefix}_{n:02d}" for n in range(30)]
    pg18.psql("\n".join(f"CREATE DATABASE {name};" for name in names))
    yield names
    pg18.psql("\n".join(f"DROP DATABASE IF EXISTS {name} WITH (FORCE);" for name in names))


async def _client(
    aiohttp_client: AiohttpClient,
    cluster: LocalCluster,
    tmp_path: Path,
    names: list[str],
    *,
    ttl: float,
    max_connections: int,
    parallel: int = 1,
) -> Client:
    definitions = write_collectors(tmp_path, PERDB.format(ttl=ttl))
    settings = settings_for(
        cluster,
        auto_discovery=True,
        include_databases=tuple(names),
        max_connections=max_connections,
        parallel_databases=parallel,
    )
    client: Client = await aiohttp_client(create_app(settings, definitions))
    return client


class BackendSampler:
    """Counts the exporter's backends, the probe's included, as often as it can."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.dsn = cluster.dsn()
        self.peak = 0
        self.samples = 0
        self._stop = asyncio.Event()

    async def run(self) -> None:
        sql = (
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE application_name = 'pg_exporter' AND pid <> pg_backend_pid()"
        )
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                row = await (await conn.execute(sql)).fetchone()
                assert row is not None
                self.peak = max(self.peak, int(row[0]))
                self.samples += 1
                await asyncio.sleep(0.002)  # a sampling period, not a synchronisation

    def stop(self) -> None:
        self._stop.set()


async def test_budget_never_exceeded_under_twenty_concurrent_requests(
    aiohttp_client: AiohttpClient, pg18: LocalCluster, tmp_path: Path, databases: list[str]
) -> None:
    """30 databases walked three at a time, a budget of 4 and 20 requests at once:
    PostgreSQL never sees more than 4 exporter backends (the probe's included), and every
    answered scrape has every database's series."""
    client = await _client(
        aiohttp_client, pg18, tmp_path, databases, ttl=0, max_connections=4, parallel=3
    )
    sampler = BackendSampler(pg18)
    sampling = asyncio.create_task(sampler.run())
    try:
        for _ in range(3):
            responses = await asyncio.gather(*(client.get("/metrics") for _ in range(20)))
            statuses = [r.status for r in responses]
            assert 200 in statuses
            assert set(statuses) <= {200, 503}
            for response in responses:
                if response.status == 200:
                    body = await response.text()
                    assert all(value(body, "perdb_one", datname=n) == 1 for n in databases)
    finally:
        sampler.stop()
        await sampling
    assert sampler.samples > 10
    assert 1 <= sampler.peak <= 4
    budget = client.app[STATE].exporter.connections
    assert budget.peak <= 3  # the databases' share: the budget less the probe's
    assert budget.evictions > 0


async def test_fresh_databases_are_not_connected_and_churn_is_counted(
    aiohttp_client: AiohttpClient, pg18: LocalCluster, tmp_path: Path, databases: list[str]
) -> None:
    """With long TTLs, the first pass opens one connection per database (main included),
    closing the least recently used; the next pass, every discovered database fresh in
    its cache, opens only the main database's again."""
    client = await _client(aiohttp_client, pg18, tmp_path, databases, ttl=300, max_connections=4)
    first = await (await client.get("/metrics")).text()
    assert value(first, "pg_exporter_connections_opened_total") == 31
    assert value(first, "pg_exporter_connections_evicted_total") == 28
    assert value(first, "pg_exporter_connections_max") == 4
    second = await (await client.get("/metrics")).text()
    assert value(second, "pg_exporter_connections_opened_total") == 32  # main, evicted
    assert value(second, "pg_exporter_connections_open") <= 3
    assert all(value(second, "perdb_one", datname=n) == 1 for n in databases)
    stat = (await (await client.get("/stat")).text()).splitlines()
    header = stat[0].split()
    rows = [dict(zip(header, line.split(), strict=True)) for line in stat[1:]]
    assert {row["conns"] for row in rows if row["datname"] in databases} == {"1"}
    assert next(row["conns"] for row in rows if row["datname"] == "postgres") == "2"


async def test_one_connection_per_database_when_the_budget_allows(
    aiohttp_client: AiohttpClient, pg18: LocalCluster, tmp_path: Path, databases: list[str]
) -> None:
    """A budget above the number of databases closes nothing: D5 as before."""
    client = await _client(aiohttp_client, pg18, tmp_path, databases, ttl=0, max_connections=40)
    for _ in range(3):
        body = await (await client.get("/metrics")).text()
    assert value(body, "pg_exporter_connections_opened_total") == 31
    assert value(body, "pg_exporter_connections_evicted_total") == 0
    assert len([k for k in samples(body) if k[0] == "perdb_one"]) == 31


async def _scrape_until(client: Client, done: Callable[[str], bool], what: str) -> str:
    """Scrape, one pass after another, until ``done(body)``; fail after 60 s."""
    async with asyncio.timeout(60):
        while True:
            response = await client.get("/metrics")
            body = await response.text()
            if response.status == 200 and done(body):
                return body
    raise AssertionError(what)  # pragma: no cover - the timeout raises first


def _dropped(cluster: LocalCluster, name: str) -> bool:
    """Drop ``name`` (terminating its sessions); False when a new session got in first."""
    try:
        cluster.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    except LocalPgError:
        return False
    return True


async def test_databases_created_and_dropped_in_bulk_leave_nothing_behind(
    aiohttp_client: AiohttpClient, pg18: LocalCluster, tmp_path: Path
) -> None:
    """Twenty databases created at once, matched by a pattern, are picked up while scrapes
    run; dropped at once, they are let go: no connection, no figure, no budget kept."""
    prefix = f"churn_{uuid.uuid4().hex[:6]}"
    names = [f"{prefix}_{n:02d}" for n in range(20)]
    definitions = write_collectors(tmp_path, PERDB.format(ttl=0))
    cluster = pg18
    settings = settings_for(
        cluster, auto_discovery=True, include_databases=(f"{prefix}_*",), max_connections=4
    )
    client: Client = await aiohttp_client(create_app(settings, definitions))
    exporter = client.app[STATE].exporter

    def present(body: str) -> set[str]:
        return {dict(k[1])["datname"] for k in samples(body) if k[0] == "perdb_one"}

    scraping = asyncio.create_task(_scrape_until(client, lambda _: False, "never"))
    try:
        await asyncio.to_thread(cluster.psql, "\n".join(f"CREATE DATABASE {n};" for n in names))
        await _scrape_until(client, lambda b: set(names) <= present(b), "all discovered")
        for name in names:  # a scrape may connect between FORCE's kill and its check
            await poll_async(functools.partial(_dropped, cluster, name), f"{name} dropped")
        body = await _scrape_until(client, lambda b: not set(names) & present(b), "all gone")
    finally:
        scraping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await scraping
        cluster.psql("\n".join(f"DROP DATABASE IF EXISTS {n} WITH (FORCE);" for n in names))
    assert present(body) == {"postgres"}
    assert list(exporter.discovered) == []
    assert set(exporter.connections.opened_by) <= {"postgres"}
    held = [s for s in exporter.servers if s.conn is not None]
    assert exporter.connections.open == len(held) <= 1
    assert value(body, "pg_exporter_connections_open") <= 1
    backends = cluster.psql(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg_exporter' "
        f"AND datname LIKE '{prefix}%'"
    )
    assert backends == "0"


SERIES = """
core:
  query: SELECT current_database() AS datname, 1 AS one
  priority: 1
  ttl: 0
  timeout: 5
  metrics:
    - datname: {usage: LABEL, description: database}
    - one: {usage: GAUGE, description: one}
pertable:
  query: SELECT current_database() AS datname, n::text AS relname, n AS size
         FROM generate_series(1, 50) AS n
  priority: 200
  ttl: 0
  timeout: 5
  metrics:
    - datname: {usage: LABEL, description: database}
    - relname: {usage: LABEL, description: table}
    - size: {usage: GAUGE, description: size}
"""


async def test_the_series_budget_leaves_out_whole_collectors_and_says_so(
    aiohttp_client: AiohttpClient,
    pg18: LocalCluster,
    tmp_path: Path,
    databases: list[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """31 databases × (1 + 50) series over a budget of 1000: the least important collector
    is left out on every database, the rest published whole; the exposition names it and
    the log says so once."""
    settings = settings_for(
        pg18,
        auto_discovery=True,
        include_databases=tuple(databases),
        max_connections=40,
        max_total_series=1000,
    )
    client: Client = await aiohttp_client(create_app(settings, write_collectors(tmp_path, SERIES)))
    with caplog.at_level(logging.INFO, logger="exporter.collect.seriescap"):
        for _ in range(2):
            body = await (await client.get("/metrics")).text()
    found = samples(body)
    assert len([k for k in found if k[0] == "core_one"]) == 31
    assert [k for k in found if k[0] == "pertable_size"] == []
    assert value(body, "pg_exporter_series_left_out", query="pertable") == 31 * 50
    assert value(body, "pg_exporter_series_published") == 31
    assert value(body, "pg_exporter_series_limit") == 1000
    warnings = [r for r in caplog.records if "series budget of 1000 reached" in r.getMessage()]
    assert len(warnings) == 1


# --- the bounded-scrape contract with databases walked in parallel -----------------------


def _marker() -> str:
    return f"m{uuid.uuid4().hex[:10]}"


def _sleepy(marker: str, seconds: str, *, timeout: float) -> str:
    """One collector on every database, sleeping ``seconds`` (an SQL expression); its
    ``datname`` label lets it run on the discovered databases too (issue 36)."""
    return f"""
    sleepy:
      query: SELECT current_database() AS datname, 1 AS {marker} FROM pg_sleep({seconds})
      ttl: 60
      timeout: {timeout}
      metrics:
        - datname: {{usage: LABEL, description: database}}
        - {marker}: {{usage: GAUGE, description: probe}}
    """


def _cached_ok(served: Served) -> int:
    """Databases whose ``sleepy`` result is cached and good."""
    exporter = served.app[STATE].exporter
    runtimes = [server.runtimes.get("sleepy") for server in exporter.servers]
    return sum(1 for r in runtimes if r is not None and r.outcome is Outcome.OK)


async def _parallel(start: Start, cluster: LocalCluster, text: str, names: list[str]) -> Served:
    return await start(
        cluster, text, auto_discovery=True, include_databases=tuple(names),
        max_connections=4, parallel_databases=3,
    )  # fmt: skip


async def test_parallel_walks_start_nothing_once_the_budget_is_spent(
    pg18: LocalCluster, start: Start, databases: list[str]
) -> None:
    """With three databases at a time, a budget spent mid-pass answers 503 and starts no
    further collector (B10); those started finish and are cached (B11)."""
    m = _marker()
    served = await _parallel(start, pg18, _sleepy(m, "0.3", timeout=5), databases)
    short = await get(served.port, **{"X-Prometheus-Scrape-Timeout-Seconds": "0.5"})
    assert short.status == 503
    await poll(lambda: not served.app[STATE].exporter.lock.locked(), "the pass to end")
    cached = _cached_ok(served)
    await poll_async(lambda: statement_calls(pg18, m) == cached, "every run in the log")
    assert 1 <= cached <= 1 + 2 * 3  # main, then one or two waves of three at most


async def test_parallel_walks_stop_when_the_client_leaves(
    pg18: LocalCluster, start: Start, databases: list[str]
) -> None:
    """A client that hangs up while three databases run: those collectors finish and are
    cached (B11), no further one starts (B10), and the next scrape is served whole."""
    m = _marker()
    served = await _parallel(start, pg18, _sleepy(m, "0.5", timeout=5), databases)
    leaver = await RawClient.send(served.port)
    await poll(lambda: _cached_ok(served) >= 1, "the main database's collector")
    await poll_async(lambda: exporter_running(pg18, m), "discovered databases to run")
    leaver.hang_up()
    await poll(lambda: not served.app[STATE].exporter.lock.locked(), "the pass to end")
    cached = _cached_ok(served)
    await poll_async(lambda: statement_calls(pg18, m) == cached, "every run in the log")
    assert cached < 31


async def test_the_main_database_runs_beside_the_discovered_ones(
    pg18: LocalCluster, start: Start, databases: list[str]
) -> None:
    """Once the main database's preflight has named the others, a discovered database is
    walked beside the main one's collectors, within --parallel-databases (issue 22): the
    same slow collector is seen running in both at once."""
    m = _marker()
    served = await _parallel(start, pg18, _sleepy(m, "1", timeout=5), databases[:1])
    scrape = asyncio.create_task(get(served.port))
    both = f"state = 'active' AND query LIKE '%{m}%'"
    await poll_async(lambda: exporter_backends(pg18, both) == 2, "both databases at once")
    assert (await scrape).status == 200
    assert _cached_ok(served) == 2


async def test_one_database_at_a_time_keeps_the_main_one_first(
    pg18: LocalCluster, start: Start, databases: list[str]
) -> None:
    """With --parallel-databases 1 the main database's collectors all run before another
    database's start: the discovered one's statement begins after the main one's ended."""
    text = """
    started:
      query: >-
        SELECT current_database() AS datname, extract(epoch FROM statement_timestamp()) AS at
        FROM pg_sleep(0.3)
      timeout: 5
      metrics:
        - datname: {usage: LABEL, description: database}
        - at: {usage: GAUGE, description: when the statement started}
    """
    served = await start(
        pg18, text, auto_discovery=True, include_databases=(databases[0],),
        max_connections=4, parallel_databases=1,
    )  # fmt: skip
    body = (await get(served.port)).text
    main_at = value(body, "started_at", datname="postgres")
    other_at = value(body, "started_at", datname=databases[0])
    assert other_at >= main_at + 0.3, body


async def test_a_fatal_failure_on_the_main_database_publishes_no_other(
    pg18: LocalCluster, start: Start, databases: list[str]
) -> None:
    """A fatal collector failing on the main database makes the target down, and whatever
    the discovered databases produced beside it is left out (B19)."""
    text = """
guard:
  query: SELECT CASE WHEN current_database() = 'postgres' THEN 1/0 ELSE 1 END AS v
  fatal: true
  timeout: 5
  metrics:
    - v: {usage: GAUGE, description: fails on the main database only}
""" + PERDB.format(ttl=0)
    served = await _parallel(start, pg18, text, databases[:2])
    body = (await get(served.port)).text
    assert value(body, "pg_up") == 0, body
    assert [k for k in samples(body) if k[0] in {"perdb_one", "guard_v"}] == [], body


async def test_unbounded_collector_in_a_discovered_database_is_cancelled_in_postgres(
    pg18: LocalCluster, start: Start, databases: list[str]
) -> None:
    """An unbounded collector running in a discovered database, beside others walked in
    parallel, is cancelled in PostgreSQL (57014) when its client leaves (B12)."""
    m, target = _marker(), databases[4]
    seconds = f"CASE WHEN current_database() = '{target}' THEN 30 ELSE 0 END"
    served = await _parallel(start, pg18, _sleepy(m, seconds, timeout=-1), databases[:8])
    leaver = await RawClient.send(served.port)
    # In the target database itself: the others run the same (instant) query, and one of
    # them seen running would let the client leave before the target's collector starts.
    running = f"state = 'active' AND datname = '{target}' AND query LIKE '%{m}%'"
    await poll_async(
        lambda: exporter_backends(pg18, running) > 0, f"the unbounded collector in {target}"
    )
    leaver.hang_up()
    await poll(lambda: not served.app[STATE].exporter.lock.locked(), "the pass to end")
    busy = "state IN ('active', 'idle in transaction', 'idle in transaction (aborted)')"
    await poll_async(lambda: exporter_backends(pg18, busy) == 0, "no busy backend", within=10)
    await poll_async(
        lambda: any("57014" in line and m in line for line in pg18.log_text().splitlines()),
        "the server to log the cancellation (57014)",
        within=10,
    )
    runtime = served.app[STATE].exporter.discovered[target].runtimes["sleepy"]
    assert runtime.outcome is Outcome.CANCELLED
