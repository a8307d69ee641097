"""One round trip per collector in steady state, with D1–D3 still enforced by the server
(issue 22): counted in the statement log of real PostgreSQL servers."""

from __future__ import annotations

import uuid

import pytest

from exporter.errors import ConfigError
from exporter.web.appstate import STATE
from rigs.localpg import LocalCluster
from tests.fixtures.helpers import statements_since, value
from tests.fixtures.rawhttp import Served, Start, get


def _limits(key: str, timeout: float) -> str:
    """A collector that reports the limits it runs under, as labels."""
    return f"""
{key}:
  query: >-
    SELECT current_setting('transaction_read_only') AS read_only,
           current_setting('statement_timeout') AS statement_timeout,
           current_setting('lock_timeout') AS lock_timeout, 1 AS v
  timeout: {timeout}
  metrics:
    - read_only: {{usage: LABEL, description: x}}
    - statement_timeout: {{usage: LABEL, description: x}}
    - lock_timeout: {{usage: LABEL, description: x}}
    - v: {{usage: GAUGE, description: x}}
"""


def _marked(key: str, timeout: float = 1) -> str:
    """A trivial collector whose SQL names it, so its statements can be told apart."""
    return f"""
{key}:
  query: SELECT 1 AS v /* {key} */
  timeout: {timeout}
  metrics:
    - v: {{usage: GAUGE, description: x}}
"""


async def _steady_pass(cluster: LocalCluster, served: Served) -> list[str]:
    """Statements of the third uncached pass (the first one sets the session up, the
    second prepares each query), on the main database's connection: not the health
    probe's, which may ask meanwhile."""
    for _ in range(2):
        assert (await get(served.port)).status == 200
    conn = served.app[STATE].exporter.main.conn
    assert conn is not None
    before = len(cluster.log_text())
    assert (await get(served.port)).status == 200
    return statements_since(cluster, before, conn.info.backend_pid)


async def test_each_collector_costs_one_round_trip_in_steady_state(
    pg: LocalCluster, start: Start
) -> None:
    """With equal timeouts, an uncached pass sends the preflight and one statement per
    collector: no BEGIN, SET or COMMIT around each (issue 22)."""
    keys = ("rt_alpha", "rt_beta", "rt_gamma")
    served = await start(pg, "".join(_marked(k) for k in keys), disable_cache=True)
    statements = await _steady_pass(pg, served)
    prepared = served.app[STATE].exporter.main.session.prepared
    assert prepared is not None
    assert len(prepared.names) == len(keys)
    # Each collector is one EXECUTE of its prepared query (issue 22).
    assert sorted(statements[1:]) == sorted(f"EXECUTE {n}" for n in prepared.names), statements
    assert len(statements) == len(keys) + 1, statements  # + the preflight
    facts = served.app[STATE].exporter.main.facts
    assert facts is not None
    assert facts.own_transaction == ""  # over TCP, the server sees the address we dialed


async def test_limits_change_only_when_the_next_collector_differs(
    pg: LocalCluster, start: Start
) -> None:
    """Collectors of different timeouts, one after another, each see their own limits, read
    only; the pass sends one statement of limits where the timeout changes, none where it
    does not."""
    config = _limits("lim_short", 0.2) + _marked("rt_same", 0.2) + _limits("lim_long", 2)
    served = await start(pg, config, disable_cache=True)
    statements = await _steady_pass(pg, served)
    body = (await get(served.port)).text
    assert value(body, "lim_short_v", read_only="on", statement_timeout="200ms",
                 lock_timeout="50ms") == 1, body  # fmt: skip
    assert value(body, "lim_long_v", read_only="on", statement_timeout="2s",
                 lock_timeout="500ms") == 1, body  # fmt: skip
    sets = [s for s in statements if "set_config(" in s and "AS read_only" not in s]
    # Into lim_long's limits, and back to lim_short's at the start of the next pass.
    assert len(sets) == 2, statements
    # The collectors, two limit changes and the preflight: no BEGIN, SET or COMMIT.
    assert len(statements) == 3 + 2 + 1, statements


async def test_a_collector_turning_read_only_off_is_refused_at_load(
    pg: LocalCluster, start: Start
) -> None:
    """A collector whose own SQL would turn the session's read-only default off is refused
    when the file loads, naming the call (issue 36); turned off by a function it calls,
    the change is rolled back with the collector's own transaction (test_guards)."""
    config = """
rt_unlock:
  query: SELECT set_config('default_transaction_read_only', 'off', false) AS s, 1 AS v
  metrics:
    - s: {usage: LABEL, description: x}
    - v: {usage: GAUGE, description: x}
"""
    with pytest.raises(ConfigError, match=r"rt_unlock\.query: a session side effect"):
        await start(pg, config, disable_cache=True)


async def test_servers_that_do_not_report_read_only_keep_a_transaction_per_collector(
    pg13: LocalCluster, start: Start
) -> None:
    """PostgreSQL 13 does not report its read-only default, so each collector keeps its
    own read-only transaction with limits local to it there (D1)."""
    served = await start(pg13, _limits("lim_old", 2), disable_cache=True)
    statements = await _steady_pass(pg13, served)
    body = (await get(served.port)).text
    assert value(body, "lim_old_v", read_only="on", statement_timeout="2s",
                 lock_timeout="500ms") == 1, body  # fmt: skip
    assert (
        sum(s.startswith("BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY") for s in statements) == 1
    ), statements
    # Nothing lives in the session there: no statement is prepared (issue 22).
    assert not any(s.startswith(("PREPARE", "EXECUTE")) for s in statements), statements


async def test_an_unbounded_collector_after_a_bounded_one_has_no_server_limit(
    pg: LocalCluster, start: Start
) -> None:
    """An unbounded collector has no statement limit on the server, whatever the database
    gives (its request's end cancels it, B12; issue 36 pins our limits at login); a
    bounded one before it keeps its own (D1)."""
    database = f"rt_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE DATABASE {database}")
    pg.psql(f"ALTER DATABASE {database} SET statement_timeout = '7s'")
    config = _limits("lim_bounded", 2) + _limits("lim_unbounded", -1)
    served = await start(pg, config, disable_cache=True, url=pg.dsn(database))
    await _steady_pass(pg, served)
    body = (await get(served.port)).text
    assert value(body, "lim_bounded_v", read_only="on", statement_timeout="2s",
                 lock_timeout="500ms") == 1, body  # fmt: skip
    assert value(body, "lim_unbounded_v", read_only="on", statement_timeout="0",
                 lock_timeout="1s") == 1, body  # fmt: skip


async def test_a_direct_unix_socket_keeps_one_round_trip(pg18: LocalCluster, start: Start) -> None:
    """Over PostgreSQL's own Unix socket the server sees the directory and port we dialed:
    proven direct, so session limits, one statement per collector (issue 22)."""
    url = f"postgresql://postgres@/postgres?host={pg18.data_dir}&port={pg18.port}"
    keys = ("ux_alpha", "ux_beta")
    served = await start(pg18, "".join(_marked(k) for k in keys), disable_cache=True, url=url)
    statements = await _steady_pass(pg18, served)
    main = served.app[STATE].exporter.main
    assert main.facts is not None
    assert main.facts.own_transaction == ""
    assert len(statements) == len(keys) + 1, statements  # + the preflight
