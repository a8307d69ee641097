"""The databases one exporter scrapes: which are discovered, and how they come and go,
without a database (issue 13)."""

from __future__ import annotations

from exporter.collect.databases import Databases
from exporter.config.definitions import Definitions
from exporter.config.settings import Settings
from exporter.pg.preflight import ServerFacts
from tests.fixtures.clock import FakeClock

FACTS = ServerFacts(version=180000, in_recovery=False, datname="main", username="u")


def _databases(*, auto_discovery: bool = True, **fields: tuple[str, ...]) -> Databases:
    settings = Settings(url="postgresql://127.0.0.1:1/main", auto_discovery=auto_discovery,
                        **fields)  # type: ignore[arg-type]  # fmt: skip
    databases = Databases(settings, Definitions(()), clock=FakeClock(), random=lambda: 0.5)
    databases.main.facts = FACTS
    databases.main.databases = ("main", "app", "app_test", "reports")
    return databases


def test_nothing_is_discovered_before_the_preflight_or_without_auto_discovery() -> None:
    """The main database's preflight names the others; with discovery off, none."""
    assert _databases(auto_discovery=False).wanted() == set()
    unread = _databases()
    unread.main.facts = None
    assert unread.wanted() == set()


def test_the_main_database_and_excluded_ones_are_not_discovered() -> None:
    """Include and exclude patterns pick among the databases the preflight named."""
    assert _databases().wanted() == {"app", "app_test", "reports"}
    assert _databases(exclude_databases=("app_test",)).wanted() == {"app", "reports"}


async def test_databases_come_and_go_sharing_one_connection_limit() -> None:
    """A discovered database gets a server of its own on the shared connection limit, in
    name order after the main one; one that vanishes is dropped with its count."""
    databases = _databases()
    await databases.sync()
    assert [s.label for s in databases.servers] == ["main", "app", "app_test", "reports"]
    assert all(s.connections is databases.connections for s in databases.servers)
    assert not any(s.is_main for s in databases.servers[1:])
    databases.connections.opened_by["reports"] = 2
    databases.main.databases = ("main", "app")
    await databases.sync()
    assert sorted(databases.discovered) == ["app"]
    assert "reports" not in databases.connections.opened_by
