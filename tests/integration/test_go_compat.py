"""The default library speaks the Go exporter's dialect on real servers (issue 11).

For every row of the Go exporter's metric facts (1.4.1 with the changes up to
1.6.1) whose branch applies to a real server (PostgreSQL 13 to 18, primary and
replica, as a pg_monitor role; pgBouncer),
our library planned on that server must produce the metric with that type and at
least those labels; and what a real scrape shows of those metrics must agree.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp.plugin import AiohttpClient

from exporter.config.definitions import Definitions
from exporter.pg.preflight import ServerFacts
from exporter.web.app import create_app
from exporter.web.appstate import STATE
from rigs.localbouncer import LocalPgBouncer
from rigs.localpg import MAJORS, LocalCluster
from tests.fixtures.gocompat import (
    CHANGES_FILE,
    WITH_STATEMENTS,
    Row,
    applicable,
    coverage,
    gaps,
    load_rows,
    offers,
    read_rows,
)
from tests.fixtures.helpers import COLLECTORS, samples, settings_for
from tests.fixtures.polling import wait_for
from tests.integration.test_library_coverage import DB, MONITOR, _definitions, _prepare

Client = TestClient[web.Request, web.Application]


async def _scrape(
    aiohttp_client: AiohttpClient, url: str, definitions: Definitions, base: LocalCluster
) -> tuple[ServerFacts, str]:
    """The real facts of the target and one full scrape of the library."""
    settings = replace(settings_for(base), url=url, include_databases=(DB,), disable_cache=True)
    client: Client = await aiohttp_client(create_app(settings, definitions))
    response = await client.get("/metrics")
    assert response.status == 200
    facts = client.app[STATE].exporter.main.facts
    assert facts is not None
    return facts, await response.text()


def _disagreements(rows: Iterable[Row], body: str) -> list[str]:
    """Rows whose metric the scrape shows with another type or without a Go label."""
    types = {
        line.split()[2]: line.split()[3].upper()
        for line in body.splitlines()
        if line.startswith("# TYPE ")
    }
    labels_seen: dict[str, list[set[str]]] = {}
    for name, labels in samples(body):
        labels_seen.setdefault(name, []).append({k for k, _ in labels})
    problems = []
    for row in rows:
        if row.type == "HISTOGRAM" or row.metric not in types:
            continue  # histograms are gauge families of their own; absent: no rows today
        if types[row.metric] != row.type:
            problems.append(f"exposed as {types[row.metric]}: {row}")
        short = [sorted(row.labels - seen) for seen in labels_seen.get(row.metric, [])]
        if any(short):
            problems.append(f"a sample lacks {next(s for s in short if s)}: {row}")
    return problems


def _check(what: str, facts: ServerFacts, body: str, definitions: Definitions) -> None:
    rows = applicable(load_rows(), facts)
    ours = offers(definitions, facts)
    done, total = coverage(rows, ours)
    exposed = {r.metric for r in rows} & {name for name, _ in samples(body)}
    print(f"\n{what}: {done}/{total} applicable Go metric names covered, "
          f"{len(exposed)} of them with samples in this scrape")  # fmt: skip
    assert gaps(rows, ours) == []
    assert _disagreements(rows, body) == []


@pytest.mark.parametrize("role", ["primary", "replica"])
@pytest.mark.parametrize("major", sorted(MAJORS, reverse=True))
async def test_go_metrics_exist_on_postgres(
    aiohttp_client: AiohttpClient, request: pytest.FixtureRequest, major: int, role: str
) -> None:
    """Every applicable Go row, on 13 to 18, primary and replica, as pg_monitor."""
    version = f"pg{major}"
    primary: LocalCluster = request.getfixturevalue(version)
    _prepare(primary)
    target = primary
    if role == "replica":
        target = request.getfixturevalue(f"{version}_replica")
        query = f"SELECT count(*) FROM pg_roles WHERE rolname = '{MONITOR}'"
        wait_for(lambda: target.psql(query).strip() == "1", "the replica to replay the role")
    definitions = _definitions()
    facts, body = await _scrape(aiohttp_client, target.dsn(user=MONITOR), definitions, target)
    assert facts.in_recovery is (role == "replica")
    _check(f"PostgreSQL {facts.version} {role}", facts, body, definitions)


async def test_go_metrics_exist_on_pgbouncer(
    aiohttp_client: AiohttpClient, pg18: LocalCluster, pgbouncer18: LocalPgBouncer
) -> None:
    """Every applicable Go pgbouncer_* row on a real pgBouncer (Debian's, 1.18)."""
    definitions = _definitions()
    facts, body = await _scrape(aiohttp_client, pgbouncer18.dsn(), definitions, pg18)
    assert facts.pgbouncer
    _check(f"pgBouncer {facts.version}", facts, body, definitions)


@pytest.mark.parametrize("version", [130000, 140000, 150000, 160000, 170000, 180000])
@pytest.mark.parametrize("in_recovery", [False, True])
def test_go_metrics_planned_at_version_bounds(version: int, in_recovery: bool) -> None:
    """Planning alone on each major's first release (x.0; the servers above run the latest
    minor) covers every applicable Go row."""
    facts = ServerFacts(version, in_recovery, "postgres", MONITOR,
                        extensions=frozenset({"pg_stat_statements"}),
                        search_path=WITH_STATEMENTS)  # fmt: skip
    rows = applicable(load_rows(), facts)
    assert gaps(rows, offers(_definitions(), facts)) == []


@pytest.mark.parametrize("version", [10800, 11600, 11800, 12100, 12300, 12400])
def test_go_metrics_planned_for_pgbouncer_versions(version: int) -> None:
    """pgBouncer branches from 1.8 to 1.24+ cover every applicable Go row by plan."""
    facts = ServerFacts(version, False, "pgbouncer", "postgres", pgbouncer=True)
    rows = applicable(load_rows(), facts)
    assert gaps(rows, offers(_definitions(), facts)) == []


def test_the_facts_file_is_whole() -> None:
    """The facts file loads completely (a truncated copy would make every check pass)."""
    rows = load_rows()
    assert len(rows) > 900
    assert {r.family for r in rows} >= {"pg_db", "pg_table", "pgbouncer_pool", "pg_repl"}
    assert COLLECTORS.is_dir()


def test_the_go_1_6_changes_replace_their_rows() -> None:
    """Each row of the 1.6 changes file takes the place of its 1.4.1 row: every pg_sub_*
    metric carries the owning database's label, and no row appears twice."""
    changes = read_rows(CHANGES_FILE)
    assert len(changes) >= 40
    rows = load_rows()
    assert len(rows) == len(load_rows(changes=None))
    assert len({(r.branch, r.metric) for r in rows}) == len(rows)
    subs = [r for r in rows if r.family == "pg_sub"]
    assert subs
    assert all(r.labels == {"datname", "subname"} for r in subs)
