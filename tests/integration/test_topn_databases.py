"""pg_db ranked on a real PostgreSQL 18 with more databases than its limit (issue 38):
the remainder's counters add up with the named databases' to every database's, its
age is the oldest of the databases it holds (the wraparound alert still sees a quiet
database), numbackends is summed, and per-database facts have no remainder series."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import yaml

from rigs.localpg import LocalCluster, pg18_bindir
from tests.fixtures.helpers import samples
from tests.fixtures.rawhttp import Start, get

LIBRARY = Path(__file__).parents[2] / "collectors" / "0310-pg-db.yml"
LIMIT = 3


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    """A PostgreSQL 18 of its own: the test counts every database of the server."""
    with LocalCluster(pg18_bindir()) as fresh:
        yield fresh


def _pg_db(limit: int) -> str:
    """The library's pg_db, run at every scrape, naming ``limit`` databases."""
    branches = yaml.safe_load(LIBRARY.read_text())
    for body in branches.values():
        body |= {"ttl": 0}
        body["top"] |= {"limit": limit}
    return yaml.safe_dump(branches)


def _by_database(body: str, metric: str) -> dict[str, float]:
    return {
        dict(labels)["datname"]: value
        for (name, labels), value in samples(body).items()
        if name == metric
    }


def _truth(admin: psycopg.Connection[tuple[object, ...]]) -> dict[str, tuple[float, ...]]:
    """Per database: xact_commit + xact_rollback, age, numbackends."""
    admin.execute("SELECT pg_stat_clear_snapshot()")
    rows = admin.execute(
        "SELECT d.datname, (s.xact_commit + s.xact_rollback)::float8, age(d.datfrozenxid),"
        " s.numbackends FROM pg_stat_database s JOIN pg_database d ON d.oid = s.datid"
    ).fetchall()
    return {str(name): (float(x), float(a), float(n)) for name, x, a, n in rows}  # type: ignore[arg-type]


def _work(cluster: LocalCluster, transactions: dict[str, int]) -> None:
    """Transactions in each database, one XID each (so that ages move too)."""
    for name, count in transactions.items():
        with psycopg.connect(cluster.dsn(name), autocommit=True) as work:
            for _ in range(count):
                work.execute("SELECT txid_current()")


async def test_a_database_beyond_the_limit_is_in_a_remainder_that_adds_up(
    cluster: LocalCluster, start: Start
) -> None:
    """Seven databases, three named: other's age is the oldest of its databases', its
    numbackends their sum; datid and is_template have no remainder series; and the
    increases of the named series and of other add up to every database's."""
    names = [f"db_{uuid.uuid4().hex[:6]}_{n}" for n in range(4)]
    for name in names:
        cluster.psql(f"CREATE DATABASE {name}")
    served = await start(cluster, _pg_db(LIMIT))
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        first = (await get(served.port)).text
        assert set(_by_database(first, "pg_db_xact_total")) == {"other"}  # 7 > 3: no rates yet
        busy = {names[0]: 60, names[1]: 30, names[2]: 10}
        _work(cluster, busy)
        second = (await get(served.port)).text
        truth = _truth(admin)
        _work(cluster, {names[3]: 200, names[0]: 50})  # a database not named wakes up
        third = (await get(served.port)).text
        truth_after = _truth(admin)
    xacts = _by_database(second, "pg_db_xact_total")
    named = set(xacts) - {"other"}
    assert named == set(busy)
    unnamed = set(truth) - named
    assert len(unnamed) == 4
    ages = _by_database(second, "pg_db_age")
    oldest = max(truth[d][1] for d in unnamed)
    assert oldest - 2 <= ages["other"] <= oldest + 2
    assert all(abs(ages[d] - truth[d][1]) <= 2 for d in named)
    backends = _by_database(second, "pg_db_numbackends")
    assert backends["other"] == sum(truth[d][2] for d in unnamed)
    assert "other" not in _by_database(second, "pg_db_datid")
    assert "other" not in _by_database(second, "pg_db_is_template")
    assert set(_by_database(second, "pg_db_datid")) == named
    # Between the second and third scrapes: what the served series grew by is what
    # every database did (our own sessions' few transactions aside), 200 of it other's.
    later = _by_database(third, "pg_db_xact_total")
    served_increase = sum(later[d] - xacts.get(d, later[d]) for d in later)
    true_increase = sum(truth_after[d][0] - truth[d][0] for d in truth)
    assert true_increase >= 250
    assert abs(served_increase - true_increase) <= 10, (served_increase, true_increase)
    assert later["other"] - xacts["other"] >= 200
