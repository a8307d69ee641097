"""The databases one exporter scrapes: the main one, named by the URL, and those
auto-discovery finds from it (which ones: ``discovery``), each a ``Server`` sharing
the options, the connection limit, the clock and the random source.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from exporter.collect.planning import REPEATS_MAIN, Plan
from exporter.collect.server import Server, ServerOptions
from exporter.config.definitions import Definitions
from exporter.config.discovery import select_databases
from exporter.config.settings import Settings
from exporter.pg.bulkheads import Bulkheads
from exporter.pg.connections import ConnectionLimit
from exporter.pg.loginrate import Random

log = logging.getLogger(__name__)


def server_options(settings: Settings) -> ServerOptions:
    """The per-database options derived from the settings."""
    return ServerOptions(
        url=settings.target.conninfo,
        connect_timeout=settings.connect_timeout,
        const_labels=settings.const_labels,
        tags=settings.tags,
        disable_cache=settings.disable_cache,
        max_series=settings.max_series,
        pgbouncer=settings.is_pgbouncer,
        backoff_ceiling=settings.backoff_ceiling,
    )


class Databases:
    """The main database first, then the discovered ones by name."""

    def __init__(
        self,
        settings: Settings,
        definitions: Definitions,
        *,
        clock: Callable[[], float],
        random: Random,
        servers: Bulkheads | None = None,
    ) -> None:
        self.settings = settings
        self.definitions = definitions
        self.clock = clock
        self.random = random  # jitter of back-offs and predicates (D15, D17)
        self.options = server_options(settings)
        # Every database's connection, the health probe's counted apart (issue 13).
        self.connections = ConnectionLimit(
            settings.max_connections, servers=servers or Bulkheads.for_settings(settings)
        )  # within the process's per-server bulkheads (issue 29)
        self.main = self._server(None)
        self.discovered: dict[str, Server] = {}
        self.noted: dict[str, Plan] = {}  # each discovered database's plan, once logged

    def _server(self, datname: str | None) -> Server:
        return Server(datname, self.options, self.definitions, is_main=datname is None,
                      clock=self.clock, random=self.random,
                      connections=self.connections)  # fmt: skip

    @property
    def servers(self) -> list[Server]:
        """The main database first, then discovered ones by name."""
        return [self.main, *(self.discovered[name] for name in sorted(self.discovered))]

    def use(self, definitions: Definitions) -> None:
        """Reloaded definitions for every database, and for those discovered later."""
        self.definitions = definitions
        for server in self.servers:
            server.use(definitions)

    def wanted(self) -> set[str]:
        """Databases to discover from the main one, per include/exclude names and patterns."""
        settings = self.settings
        if not settings.auto_discovery or settings.is_pgbouncer or self.main.facts is None:
            return set()
        return select_databases(
            self.main.databases,
            settings.include_databases,
            settings.exclude_databases,
            self.main.facts.datname,
        )

    async def sync(self) -> None:
        """Drop the databases that are no longer wanted, add those newly wanted."""
        wanted = self.wanted()
        for name in set(self.discovered) - wanted:
            log.info("database vanished, dropping it", extra={"datname": name})
            gone = self.discovered.pop(name)
            self.noted.pop(name, None)
            await gone.disconnect()
            self.connections.forget(gone.label)
        for name in wanted - set(self.discovered):
            log.info("database discovered", extra={"datname": name})
            self.discovered[name] = self._server(name)

    def note_plans(self) -> None:
        """Log once per plan made the branches that run on the main database only, as their
        series carry no ``datname`` label (issue 36): one line per branch, naming the
        databases it is left out of."""
        left_out: dict[str, list[str]] = {}
        for name, server in sorted(self.discovered.items()):
            plan = server.plan
            if plan is None or self.noted.get(name) is plan:
                continue
            self.noted[name] = plan
            for skipped in plan.skipped:
                if skipped.reason == REPEATS_MAIN:
                    left_out.setdefault(skipped.collector.key, []).append(name)
        for key, names in left_out.items():
            log.warning(
                "collector %s runs on the main database only, not on %s: %s",
                key, ", ".join(names), REPEATS_MAIN, extra={"collector": key},
            )  # fmt: skip
