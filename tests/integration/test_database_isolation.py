"""One database's trouble is its own (issue 36, guarantee 6), against a real PostgreSQL.

A discovered database whose statements cannot start: a test transaction holds an
``ACCESS EXCLUSIVE`` lock on that database's own ``pg_extension``, which the preflight
reads, so every statement of ours that reads it waits (whatever our session's settings
make of the wait: a stall, or a lock timeout). The main database, ``postgres``, and its
collectors are untouched. Each test creates a database of its own and drops it.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp.plugin import AiohttpClient

from exporter.collect.breaker import BreakerState
from exporter.collect.budget import SCRAPE_TIMEOUT_HEADER, Budget
from exporter.collect.cache import Outcome
from exporter.collect.exporter import Exporter
from exporter.web.app import create_app
from rigs.localpg import LocalCluster
from tests.fixtures.helpers import samples, settings_for, value, write_collectors
from tests.fixtures.polling import poll_async

Client = TestClient[web.Request, web.Application]

COLLECTORS = """
primary:
  query: SELECT 1 AS primary_one
  ttl: 1
  timeout: 5
  priority: 1
  metrics:
    - primary_one: {usage: GAUGE, description: like pg_primary, ttl 1 s}
perdb:
  query: SELECT current_database() AS datname, 1 AS one
  ttl: 0
  timeout: 5
  priority: 50
  metrics:
    - datname: {usage: LABEL, description: database}
    - one: {usage: GAUGE, description: one}
"""

BUDGET = 6.0  # seconds a scrape may take (the header): the stalled database waits for it


@pytest.fixture
def stalled(pg18: LocalCluster) -> Iterator[str]:
    """A database of its own, dropped (with any session left on it) at the end."""
    name = f"stall_{uuid.uuid4().hex[:8]}"
    pg18.psql(f"CREATE DATABASE {name}")
    yield name
    pg18.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextlib.asynccontextmanager
async def catalog_locked(cluster: LocalCluster, dbname: str) -> AsyncIterator[None]:
    """``pg_extension`` of ``dbname`` locked ACCESS EXCLUSIVE by a transaction of ours until
    the block ends: the preflight there cannot read it, nothing else is touched."""
    async with await psycopg.AsyncConnection.connect(cluster.dsn(dbname)) as conn:
        await conn.execute("LOCK TABLE pg_catalog.pg_extension IN ACCESS EXCLUSIVE MODE")
        try:
            yield
        finally:
            await conn.rollback()


def _waiting_on_lock(cluster: LocalCluster, dbname: str) -> bool:
    """True while one of the exporter's statements in ``dbname`` waits for a lock."""
    return cluster.psql(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg_exporter' "
        f"AND datname = '{dbname}' AND wait_event_type = 'Lock'"
    ) not in ("", "0")


def _databases(body: str) -> set[str]:
    return {dict(labels)["datname"] for name, labels in samples(body) if name == "perdb_one"}


async def test_a_stalled_database_leaves_the_others_answered_within_the_budget(
    aiohttp_client: AiohttpClient, pg18: LocalCluster, tmp_path: Path, stalled: str
) -> None:
    """Guarantee 6: while a discovered database's statements cannot start, each scrape
    answers 200 within its budget with the main database's series and pg_up 1, the
    stalled database's left out; once the lock goes, it is back at the next scrape."""
    settings = settings_for(pg18, auto_discovery=True, include_databases=(stalled,))
    client: Client = await aiohttp_client(
        create_app(settings, write_collectors(tmp_path, COLLECTORS))
    )
    headers = {SCRAPE_TIMEOUT_HEADER: f"{BUDGET:g}"}
    healthy = await client.get("/metrics", headers=headers)
    assert _databases(await healthy.text()) == {"postgres", stalled}
    async with catalog_locked(pg18, stalled):
        for _ in range(3):
            started = time.monotonic()
            response = await client.get("/metrics", headers=headers)
            took = time.monotonic() - started
            body = await response.text()
            assert response.status == 200, (took, body[:200])
            assert took < BUDGET
            assert _databases(body) == {"postgres"}
            assert value(body, "primary_primary_one") == 1
            assert value(body, "pg_up") == 1
        # The stalled statement was given up on, not left waiting in the server.
        await poll_async(lambda: not _waiting_on_lock(pg18, stalled), "the wait to be cancelled")
    after = await client.get("/metrics", headers=headers)
    assert after.status == 200
    assert _databases(await after.text()) == {"postgres", stalled}


class SteppedClock:
    """Monotonic seconds: the real clock, plus what the test added between passes."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


async def test_a_stalled_database_neither_trips_the_breaker_nor_stretches_the_others(
    pg18: LocalCluster, tmp_path: Path, stalled: str
) -> None:
    """Guarantee 6: passes a few simulated seconds apart for more than the server-time
    budget's settling time, each waiting on the stalled database until its part of a 2 s
    budget is over: the target's breaker stays normal, and the default budget counts no
    wait, so it stretches nothing: the ttl 1 s collector runs at every pass."""
    settings = settings_for(pg18, auto_discovery=True, include_databases=(stalled,))
    clock = SteppedClock()
    exporter = Exporter(settings, write_collectors(tmp_path, COLLECTORS), clock=clock)
    primary_runs, interrupted = 0, []
    async with catalog_locked(pg18, stalled):
        while exporter.server_time.meter.seen(clock()) < 40.0:  # SETTLE is 30 s
            before = exporter.main.runtimes.get("primary")
            entry = before.entry if before is not None else None
            snapshot = await exporter.collect(Budget.starting_now(2.0, clock=clock))
            interrupted.append(snapshot.interrupted)
            primary = exporter.main.runtimes["primary"]
            primary_runs += primary.entry is not entry
            clock.offset += 2.0
        passes = exporter.stats.scrapes
    assert (exporter.breaker.state, exporter.breaker.trips) == (BreakerState.NORMAL, 0)
    assert exporter.server_time.decided
    assert not exporter.server_time.stretched
    assert primary_runs == passes
    assert interrupted == [None] * passes
    assert exporter.main.up
    assert exporter.discovered[stalled].error_count == passes
    await exporter.close()


SLOW = """
slow{n}:
  query: SELECT count(*)::int AS rows FROM public.locked_rel
  tags: [dbname:{datname}]
  ttl: 0
  timeout: 0.2
  priority: {priority}
  metrics:
    - rows: {{usage: GAUGE, description: rows of a table locked in one database}}
"""


async def test_one_database_whose_collectors_time_out_does_not_shed_the_others(
    pg18: LocalCluster, tmp_path: Path, stalled: str
) -> None:
    """Guarantee 6, D16: five collectors that run only on the discovered database read
    a table locked there and time out at every pass, more than half of what the pass
    ran: the target's breaker does not trip, nothing is shed, every collector of the main
    database runs at every pass; the timed-out ones back off on their own (D15)."""
    pg18.psql("CREATE TABLE public.locked_rel (id int)", dbname=stalled)
    slow = "".join(SLOW.format(n=n, datname=stalled, priority=60 + n) for n in range(5))
    settings = settings_for(pg18, auto_discovery=True, include_databases=(stalled,))
    clock = SteppedClock()
    exporter = Exporter(settings, write_collectors(tmp_path, COLLECTORS + slow), clock=clock)
    async with await psycopg.AsyncConnection.connect(pg18.dsn(stalled)) as conn:
        await conn.execute("LOCK TABLE public.locked_rel IN ACCESS EXCLUSIVE MODE")
        for _ in range(6):
            snapshot = await exporter.collect(Budget.starting_now(10.0, clock=clock))
            assert snapshot.interrupted is None
            assert exporter.breaker.state is BreakerState.NORMAL
            assert not exporter.main.shed
            assert exporter.discovered[stalled].shed == ()
            clock.offset += 2.0
        await conn.rollback()
    runtimes = exporter.discovered[stalled].runtimes
    assert all(runtimes[f"slow{n}"].stats.outcomes[Outcome.TIMEOUT] >= 2 for n in range(5))
    assert exporter.main.runtimes["primary"].stats.outcomes[Outcome.OK] == 6
    assert exporter.breaker.trips == 0
    await exporter.close()
