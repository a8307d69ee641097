"""pg_query ranked on a real PostgreSQL 18 (issue 38): while the busy statements move,
the named series and the remainder account for every call, scraped over HTTP."""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import yaml

from rigs.localpg import LocalCluster
from tests.fixtures.helpers import samples
from tests.fixtures.rawhttp import Start, get

LIBRARY = Path(__file__).parents[2] / "collectors" / "0340-pg-query.yml"
SHAPES, LIMIT, PASSES = 24, 5, 6


def _pg_query(limit: int) -> str:
    """The library's pg_query, run at every scrape (ttl 0) and naming ``limit`` keys."""
    branches = yaml.safe_load(LIBRARY.read_text())
    branches["pg_query"] |= {"ttl": 0, "timeout": 10}
    branches["pg_query"]["top"] |= {"limit": limit}
    return yaml.safe_dump(branches)


def _calls(body: str, datname: str) -> dict[str, float]:
    """pg_query_calls of one database, by query label."""
    return {
        dict(labels)["query"]: value
        for (name, labels), value in samples(body).items()
        if name == "pg_query_calls" and dict(labels).get("datname") == datname
    }


async def test_named_and_remainder_calls_add_up_while_the_statements_move(
    pg18: LocalCluster, start: Start
) -> None:
    """24 statement shapes, 5 named, the busy ones moving at every pass: the increases
    the served pg_query_calls show (named and query="other") equal the calls
    pg_stat_statements counted in the database, within 2 %, and at most 5 are named."""
    database = f"topn_{uuid.uuid4().hex[:8]}"
    pg18.psql(f"CREATE DATABASE {database}")
    with psycopg.connect(pg18.dsn(), autocommit=True) as admin:
        admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        served = await start(pg18, _pg_query(LIMIT))
        with psycopg.connect(pg18.dsn(database), autocommit=True) as work:
            for n in range(SHAPES):  # a table each: one query ID each
                work.execute(f"CREATE TABLE t{n} (x int)")
            counted, true, named_most = 0.0, 0.0, 0
            last: dict[str, float] = {}
            truth_before = 0.0
            for run in range(PASSES + 1):
                if run:
                    hot = {(run * 4 + n) % SHAPES for n in range(4)}
                    for n in range(SHAPES):
                        for _ in range(30 if n in hot else 2):
                            work.execute(f"SELECT count(*) FROM t{n}")
                response = await get(served.port)
                assert response.status == 200
                calls = _calls(response.text, database)
                truth = admin.execute(
                    "SELECT coalesce(sum(calls), 0)::float8 FROM pg_stat_statements(false)"
                    " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s)",
                    (database,),
                ).fetchone()[0]  # type: ignore[index]
                assert "other" in calls
                named_most = max(named_most, len(calls) - 1)
                for query, value in calls.items():
                    if query in last:
                        before = last[query]
                        counted += value - before if value >= before else value
                    last[query] = value
                if run:
                    true += truth - truth_before
                truth_before = truth
    pg18.psql(f"DROP DATABASE {database} WITH (FORCE)")
    assert true > SHAPES * PASSES * 2
    assert abs(counted - true) <= 0.02 * true, (counted, true)
    assert 0 < named_most <= LIMIT
