"""Session limits only where they cannot leak (issue 22): not through a pooler, which
would hand our read-only default and statement timeout to an application, and sent
again after a collector whose SQL may change a setting."""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from exporter.collect.cache import Outcome
from exporter.collect.session import Session
from exporter.web.appstate import STATE
from rigs.localbouncer import LocalPgBouncer
from rigs.localpg import LocalCluster
from tests.fixtures.helpers import prepared_names, value
from tests.fixtures.rawhttp import Start, get

_SETTINGS = (
    "default_transaction_read_only",
    "statement_timeout",
    "lock_timeout",
    "idle_in_transaction_session_timeout",
    "transaction_timeout",
)

_LIMITS = """
pooled_limits:
  query: >-
    SELECT current_setting('transaction_read_only') AS read_only,
           current_setting('statement_timeout') AS statement_timeout, 1 AS v
  timeout: 1
  metrics:
    - read_only: {usage: LABEL, description: x}
    - statement_timeout: {usage: LABEL, description: x}
    - v: {usage: GAUGE, description: x}
"""


class _PoolingBouncer(LocalPgBouncer):
    """pgBouncer pooling ordinary databases in transaction mode on ONE server connection,
    so that a plain client surely gets the connection the exporter's statements ran on."""

    def _config(self) -> str:
        return super()._config().replace("pool_size=2", "user=postgres pool_size=1")


@pytest.fixture
def pooled(pg18: LocalCluster) -> Iterator[LocalPgBouncer]:
    """A database of its own on pg18, reached through a transaction-pooling pgBouncer."""
    database = f"pool_{uuid.uuid4().hex[:8]}"
    pg18.psql(f"CREATE DATABASE {database}")
    with _PoolingBouncer(pg18, databases=(database,)) as bouncer:
        yield bouncer


async def _plain_client_settings(bouncer: LocalPgBouncer) -> dict[str, str]:
    """What an application's session sees on the pool after the exporter's scrapes."""
    url = bouncer.dsn(bouncer.databases[0])
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", [list(_SETTINGS)]
        )
        return {str(name): str(setting) for name, setting in await cur.fetchall()}


async def test_through_a_transaction_pooler_no_setting_reaches_the_next_client(
    pg18: LocalCluster,
    pooled: LocalPgBouncer,
    start: Start,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Through pgBouncer in transaction pooling the exporter keeps a read-only transaction
    with limits local to it per collector, says why once, and a plain client of the same
    pool then sees the server's defaults: writable, no statement timeout (D1, D2)."""
    caplog.set_level(logging.INFO, logger="exporter.collect.server")
    url = pooled.dsn(pooled.databases[0])
    served = await start(pg18, _LIMITS, disable_cache=True, url=url)
    for _ in range(3):
        response = await get(served.port)
        assert response.status == 200
        assert value(response.text, "pooled_limits_v", read_only="on",
                     statement_timeout="1s") == 1, response.text  # fmt: skip
    seen = await _plain_client_settings(pooled)
    assert len(seen) == len(_SETTINGS), seen
    assert seen == dict.fromkeys(seen, "0") | {"default_transaction_read_only": "off"}, seen
    main = served.app[STATE].exporter.main
    assert main.facts is not None
    assert "a pooler answered the login" in main.facts.own_transaction
    told = [r.getMessage() for r in caplog.records if "transaction of its own" in r.getMessage()]
    assert len(told) == 1, told
    assert "a pooler answered the login" in told[0], told


async def test_collector_sql_that_changes_a_limit_does_not_lift_the_next_ones(
    pg: LocalCluster, start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A function of an ordinary role's that a collector calls, which turns the statement
    timeout off for the session, holds nothing after it (issue 36: the collector runs in
    a transaction of its own, rolled back): the next collector, of the same timeout, is
    still cancelled by the server (57014) when its client-side deadline is out of the way
    (D1). The collector's own set_config(..., false) is refused at load."""
    monkeypatch.setattr(Session, "client_deadline", lambda self, c: None)
    tag = uuid.uuid4().hex[:8]
    marker, owner = f"unset_{tag}", f"lifter_{tag}"
    pg.psql(
        f"CREATE ROLE {owner}; CREATE SCHEMA {owner} AUTHORIZATION {owner}; "
        f"GRANT USAGE ON SCHEMA {owner} TO PUBLIC; SET ROLE {owner}; "
        f"CREATE FUNCTION {owner}.lift() RETURNS text LANGUAGE sql "
        "AS $$ SELECT pg_catalog.set_config('statement_timeout', '0', false) $$"
    )
    config = f"""
rs_a_unset:
  query: SELECT {owner}.lift() AS s, 1 AS v
  timeout: 0.3
  metrics:
    - s: {{usage: LABEL, description: x}}
    - v: {{usage: GAUGE, description: x}}
rs_b_sleepy:
  query: SELECT 1 AS v, '{marker}' AS m FROM pg_sleep(5)
  timeout: 0.3
  metrics:
    - v: {{usage: GAUGE, description: x}}
    - m: {{usage: LABEL, description: x}}
"""
    served = await start(pg, config, disable_cache=True)
    for _ in range(2):  # the second pass starts on a session the first one left behind
        response = await asyncio.wait_for(get(served.port), 4)  # far below the 5 s sleep
        assert response.status == 200
        main = served.app[STATE].exporter.main
        assert main.runtimes["rs_a_unset"].outcome is Outcome.OK
        assert main.runtimes["rs_b_sleepy"].outcome is Outcome.TIMEOUT
    assert main.facts is not None
    assert main.facts.own_transaction == ""  # session limits
    # Its second run may be the EXECUTE of the query prepared from it (issue 22).
    texts = [marker, *(f"EXECUTE {name}" for name in prepared_names(pg, marker))]
    pairs = itertools.pairwise(pg.log_text().splitlines())
    cancelled = [q for e, q in pairs if "statement timeout" in e and any(t in q for t in texts)]
    assert len(cancelled) >= 2, "the server did not cancel the sleep on its own (57014)"


async def test_over_a_unix_socket_the_role_must_read_the_socket_directories(
    pg18: LocalCluster, start: Start
) -> None:
    """Over PostgreSQL's own Unix socket, a role that may not read unix_socket_directories
    cannot prove the connection direct: a transaction per collector, and the reason says
    what to grant; granted pg_monitor, the same role gets session limits."""
    role = f"ux_{uuid.uuid4().hex[:8]}"
    pg18.psql(f"CREATE ROLE {role} LOGIN")
    url = f"postgresql://{role}@/postgres?host={pg18.data_dir}&port={pg18.port}"
    served = await start(pg18, _LIMITS, disable_cache=True, url=url)
    response = await get(served.port)
    assert value(response.text, "pooled_limits_v", read_only="on") == 1, response.text
    main = served.app[STATE].exporter.main
    assert main.facts is not None
    assert "grant pg_read_all_settings or pg_monitor" in main.facts.own_transaction
    pg18.psql(f"GRANT pg_monitor TO {role}")
    await main.disconnect()  # a new session: role membership is read at login
    assert (await get(served.port)).status == 200
    assert main.facts.own_transaction == ""
