"""Database safety (D1–D14) on real PostgreSQL: the exporter must never hurt its database."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from exporter.collect.cache import Outcome
from exporter.collect.session import Session
from exporter.web.appstate import STATE
from rigs.localpg import VERBOSE_LOG_SETTINGS, LocalCluster, pg18_bindir
from tests.fixtures.helpers import exporter_backends, value
from tests.fixtures.polling import poll_async
from tests.fixtures.rawhttp import Served, Start, get


def _outcome(served: Served, key: str, datname: str | None = None) -> Outcome | None:
    exporter = served.app[STATE].exporter
    server = exporter.main if datname is None else exporter.discovered[datname]
    runtime = server.runtimes.get(key)
    return runtime.outcome if runtime else None


def _error(served: Served, key: str) -> str:
    entry = served.app[STATE].exporter.main.runtimes[key].entry
    assert entry is not None
    return entry.error


def _one(key: str, sql: str, timeout: float = 5, extra: str = "") -> str:
    return f"""
    {key}:
      query: {sql}
      timeout: {timeout}
      {extra}
      metrics:
        - v: {{usage: GAUGE, description: value}}
    """


_OWN_LIMITS = """
limits:
  query: >-
    SELECT current_setting('transaction_read_only') AS read_only,
           current_setting('statement_timeout') AS statement_timeout,
           current_setting('lock_timeout') AS lock_timeout,
           current_setting('idle_in_transaction_session_timeout') AS idle_timeout,
           coalesce(current_setting('transaction_timeout', true), 'absent') AS txn_timeout,
           1 AS v
  timeout: {timeout}
  metrics:
    - read_only: {{usage: LABEL, description: x}}
    - statement_timeout: {{usage: LABEL, description: x}}
    - lock_timeout: {{usage: LABEL, description: x}}
    - idle_timeout: {{usage: LABEL, description: x}}
    - txn_timeout: {{usage: LABEL, description: x}}
    - v: {{usage: GAUGE, description: the collector's own limits as labels}}
"""


@pytest.mark.parametrize(
    ("seconds", "limits", "transaction_timeout"),
    [
        # statement = the timeout, lock = a quarter of it (at most 1 s), idle ≥ 1 s,
        # transaction = 2 × statement + 1 s as a backstop.
        (2, ("2s", "500ms", "2s"), "5s"),
        (0.2, ("200ms", "50ms", "1s"), "1400ms"),
        # Unbounded: no statement or transaction limit, but never an unbounded lock wait.
        (-1, ("0", "1s", "1s"), "0"),
    ],
)
async def test_each_collector_runs_read_only_within_its_own_limits(
    pg: LocalCluster,
    start: Start,
    seconds: float,
    limits: tuple[str, str, str],
    transaction_timeout: str,
) -> None:
    """The collector sees its transaction read only, with statement, lock and idle limits
    from its timeout (D1, D2), and transaction_timeout exactly where the server has it
    (17+, detected from the server, not assumed) (D3)."""
    served = await start(pg, _OWN_LIMITS.format(timeout=seconds))
    body = (await get(served.port)).text
    version = int(pg.psql("SHOW server_version_num"))
    expected_txn = transaction_timeout if version >= 170000 else "absent"
    statement, lock, idle = limits
    labels = {"read_only": "on", "statement_timeout": statement, "lock_timeout": lock,
              "idle_timeout": idle, "txn_timeout": expected_txn}  # fmt: skip
    assert value(body, "limits_v", **labels) == 1, body


@pytest.mark.parametrize(
    ("kind", "sql"),
    [
        ("ddl", "CREATE TABLE {t}_new AS SELECT 1 AS v"),
        ("dml", "WITH w AS (INSERT INTO {t} VALUES (1) RETURNING x) SELECT x AS v FROM w"),
        ("nextval", "SELECT nextval('{t}_seq') AS v"),
    ],
)
async def test_writing_collectors_fail_and_write_nothing(
    pg: LocalCluster, start: Start, kind: str, sql: str
) -> None:
    """DDL, DML and nextval fail inside the read-only transaction, naming the collector;
    nothing is written (D2)."""
    t = f"w_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE TABLE {t} (x int); CREATE SEQUENCE {t}_seq")
    served = await start(pg, _one(f"writer_{kind}", sql.format(t=t)))
    response = await get(served.port)
    assert response.status == 200
    assert _outcome(served, f"writer_{kind}") is Outcome.ERROR
    assert f"writer_{kind}" in _error(served, f"writer_{kind}")
    assert "read-only" in _error(served, f"writer_{kind}")
    assert pg.psql(f"SELECT count(*) FROM {t}").strip() == "0"
    assert pg.psql(f"SELECT last_value, is_called FROM {t}_seq").strip() == "1|f"
    assert pg.psql(f"SELECT to_regclass('{t}_new') IS NULL").strip() == "t"


@contextlib.contextmanager
def _migration_lock(cluster: LocalCluster, table: str) -> Iterator[None]:
    """Another session holds ACCESS EXCLUSIVE on ``table`` until the block ends."""
    with psycopg.connect(cluster.dsn()) as conn:
        conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        yield
        conn.rollback()


async def test_locked_table_fails_fast_and_leaves_no_waiting_backend(
    pg: LocalCluster, start: Start
) -> None:
    """A collector reading a table locked by a migration fails within its lock limit, the
    rest of the pass succeeds, and no exporter backend waits or runs afterwards (D3)."""
    t = f"l_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE TABLE {t} (x int)")
    text = _one("blocked", f"SELECT count(*) AS v FROM {t}", timeout=2) + _one(
        "free", "SELECT 1 AS v", extra="priority: 200"
    )
    served = await start(pg, text)
    with _migration_lock(pg, t):
        response = await asyncio.wait_for(get(served.port), 10)
        assert response.status == 200
        assert _outcome(served, "blocked") is Outcome.TIMEOUT
        assert "lock" in _error(served, "blocked")
        assert value(response.text, "free_v") == 1
        stats = served.app[STATE].exporter.main.runtimes["blocked"].stats
        assert stats.last_duration < 1.5  # lock_timeout = min(2 / 4, 1) s, not the 2 s timeout
        busy = "state <> 'idle' OR wait_event_type = 'Lock'"
        assert await asyncio.to_thread(exporter_backends, pg, busy) == 0


async def test_server_side_limit_stops_query_without_client_deadline(
    pg: LocalCluster, start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the client-side deadline disabled, statement_timeout still stops the query
    (D1), as the server log shows."""
    monkeypatch.setattr(Session, "client_deadline", lambda self, c: None)
    marker = f"srv_{uuid.uuid4().hex[:8]}"
    served = await start(pg, _one("sleepy", f"SELECT 1 AS v, '{marker}' FROM pg_sleep(5)",
                                  timeout=0.3))  # fmt: skip
    response = await asyncio.wait_for(get(served.port), 4)  # far below the 5 s sleep
    assert response.status == 200
    assert _outcome(served, "sleepy") is Outcome.TIMEOUT
    # The ERROR line and the STATEMENT line after it: this query's timeout, not another's.
    pairs = itertools.pairwise(pg.log_text().splitlines())
    assert any("statement timeout" in error and marker in query for error, query in pairs), (
        "the server did not report this query's statement timeout"
    )


async def test_connections_stay_within_budget_under_a_burst(
    pg18: LocalCluster, start: Start
) -> None:
    """With three discovered databases and 20 concurrent requests (most refused), the
    exporter never holds more than one backend per database, none idle in transaction
    after the pass (D5, D7, D12)."""
    names = [f"cb_{uuid.uuid4().hex[:6]}_{i}" for i in range(3)]
    for name in names:
        pg18.psql(f"CREATE DATABASE {name}")
    text = _one("perdb", "SELECT 1 AS v, pg_sleep(0.2)::text AS s")
    served = await start(pg18, text, auto_discovery=True, include_databases=tuple(names))
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, exporter_backends(pg18, probe=True))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        responses = await asyncio.gather(*(get(served.port) for _ in range(20)))
    finally:
        stop.set()
        sampler.join()
    statuses = sorted(r.status for r in responses)
    assert statuses.count(200) >= 2
    assert set(statuses) <= {200, 503}
    print(f"statuses {statuses.count(200)}x200 {statuses.count(503)}x503, peak backends {peak}")
    # One per scraped database (main + 3 discovered) plus the health probe's (D5).
    assert 1 <= peak <= 1 + len(names) + 1
    assert (
        await asyncio.to_thread(
            exporter_backends, pg18, "state LIKE 'idle in transaction%' OR state = 'active'"
        )
        == 0
    )


async def test_over_series_cap_fails_cleanly_and_stops_the_query(
    pg18: LocalCluster, start: Start
) -> None:
    """A collector over its series cap publishes nothing and is stopped early, while the
    others publish (D9)."""
    text = """
    huge:
      # Nine million rows streamed from two small sets, not one set of five million held
      # whole by its function scan, which would fill temporary files instead (issue 31).
      query: >-
        SELECT a * 3000 + b AS k, b AS v
        FROM generate_series(0, 2999) a, generate_series(1, 3000) b
      timeout: 20
      max_series: 1000
      metrics:
        - k: {usage: LABEL, description: key}
        - v: {usage: GAUGE, description: value}
    """ + _one("small", "SELECT 1 AS v", extra="priority: 200")
    served = await start(pg18, text)
    response = await asyncio.wait_for(get(served.port), 15)
    assert response.status == 200
    assert _outcome(served, "huge") is Outcome.TOO_MANY_SERIES
    assert "huge_v" not in response.text
    assert value(response.text, "small_v") == 1
    stats = served.app[STATE].exporter.main.runtimes["huge"].stats
    assert stats.last_duration < 3  # stopped early, not after producing 5 million rows
    assert value(response.text, "pg_exporter_query_outcome_total", query="huge",
                 outcome="too_many_series") == 1  # fmt: skip


@pytest.fixture
def own_cluster() -> Iterator[LocalCluster]:
    """A cluster of this test's own, to stop and restart without disturbing others."""
    with LocalCluster(pg18_bindir(), settings=VERBOSE_LOG_SETTINGS) as cluster:
        yield cluster


async def test_restart_and_terminated_backends_recover(
    own_cluster: LocalCluster, start: Start
) -> None:
    """Scrapes keep answering while the server is down (pg_up 0), recover within two passes
    after it returns or after pg_terminate_backend, and leak no connection (D8)."""
    served = await start(own_cluster, _one("simple", "SELECT 1 AS v"), connect_timeout=2.0)
    assert value((await get(served.port)).text, "pg_up") == 1
    await asyncio.to_thread(own_cluster.stop)
    down = await get(served.port)
    assert down.status == 200
    assert value(down.text, "pg_up") == 0
    await asyncio.to_thread(own_cluster.start)
    passes = [await get(served.port) for _ in range(2)]
    assert value(passes[-1].text, "pg_up") == 1
    assert value(passes[-1].text, "simple_v") == 1
    killed = await asyncio.to_thread(
        own_cluster.psql,
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE application_name = 'pg_exporter'",
    )
    assert int(killed) >= 1, "nothing was terminated: the test would prove nothing"
    passes = [await get(served.port) for _ in range(2)]
    assert value(passes[-1].text, "pg_up") == 1
    await poll_async(lambda: exporter_backends(own_cluster) == 1, "one connection for the pass")
    await poll_async(  # and one for the health probe, which reconnects on its next tick
        lambda: exporter_backends(own_cluster, probe=True) == 2, "the probe's connection"
    )


async def test_password_never_shown(
    pg18: LocalCluster, start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    """A password in the URL appears in no log line, page, error or label (D14)."""
    caplog.set_level(logging.DEBUG)
    secret = f"pw{uuid.uuid4().hex[:12]}"
    url = f"postgresql://postgres:{secret}@127.0.0.1:{pg18.port}/postgres?sslmode=disable"
    text = _one("ok", "SELECT 1 AS v") + _one("broken", "SELECT 1/0 AS v")
    served = await start(pg18, text, url=url)
    bodies = [(await get(served.port, path)).text for path in ("/metrics", "/explain", "/stat")]
    assert value(bodies[0], "ok_v") == 1
    errors = [r.entry.error for r in served.app[STATE].exporter.main.runtimes.values() if r.entry]
    everything = "\n".join([*bodies, *errors, caplog.text])
    assert secret not in everything


async def test_connecting_is_bounded_by_connect_timeout(pg18: LocalCluster, start: Start) -> None:
    """Against a server that accepts and never answers, connecting gives up after
    --connect-timeout: the scrape answers pg_up 0 long before its 30 s budget (D6)."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        served = await start(
            pg18, _one("simple", "SELECT 1 AS v"), connect_timeout=0.5,
            url=f"postgresql://postgres@127.0.0.1:{port}/postgres?sslmode=disable",
        )  # fmt: skip
        began = time.monotonic()
        response = await get(served.port)
        assert response.status == 200
        assert value(response.text, "pg_up") == 0
        assert time.monotonic() - began < 5  # the 0.5 s connect timeout, with margin
    finally:
        server.close()
