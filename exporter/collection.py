"""The collection pass: one walk over the main and discovered databases (B4).

``Exporter.collect`` takes the collection lock, walks the databases under the
request's budget, and returns a snapshot of families. Encoding happens after
the lock is released (B20), in the web layer.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from exporter.budget import Budget
from exporter.definitions import Definitions
from exporter.exposition import Family
from exporter.planning import explain_text
from exporter.server import Server, ServerOptions
from exporter.settings import Settings

log = logging.getLogger(__name__)


@dataclass(slots=True)
class PassStats:
    """Exporter-wide counters behind the compatible ``*_exporter_*`` self-metrics."""

    started_at: float = field(default_factory=time.time)
    scrapes: int = 0
    errors: int = 0
    last_scrape_time: float = 0.0
    last_duration: float = 0.0


@dataclass(slots=True)
class Snapshot:
    """The families of one pass, ready to encode outside the lock."""

    families: list[Family]
    interrupted: str | None = None  # "budget" or "client"
    shared: bool = False  # True when the request waited for another's pass


def server_options(settings: Settings) -> ServerOptions:
    """The per-database options derived from the settings."""
    return ServerOptions(
        url=settings.url,
        connect_timeout=settings.connect_timeout,
        const_labels=settings.const_labels,
        tags=settings.tags,
        disable_cache=settings.disable_cache,
        max_series=settings.max_series,
    )


class Exporter:
    """The main database plus the databases discovered from it."""

    def __init__(
        self,
        settings: Settings,
        definitions: Definitions,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.definitions = definitions
        self.clock = clock
        self.options = server_options(settings)
        self.main = Server(None, self.options, definitions, is_main=True, clock=clock)
        self.discovered: dict[str, Server] = {}
        self.lock = asyncio.Lock()
        self.stats = PassStats()

    @property
    def servers(self) -> list[Server]:
        """The main database first, then discovered ones by name."""
        return [self.main, *(self.discovered[name] for name in sorted(self.discovered))]

    async def collect(self, budget: Budget) -> Snapshot:
        """Run one pass under the collection lock and return its families (B4, B20)."""
        async with self.lock:
            return await self._pass(budget)

    async def _pass(self, budget: Budget) -> Snapshot:
        start = time.time()
        snapshot = Snapshot(families=[])
        failed = await self._scrape_into(self.main, budget, snapshot)
        if self.main.up and snapshot.interrupted is None:
            await self._sync_discovered()
            for server in self.servers[1:]:
                failed |= await self._scrape_into(server, budget, snapshot)
        self._account(start, failed=failed, interrupted=snapshot.interrupted)
        return snapshot

    @staticmethod
    async def _scrape_into(server: Server, budget: Budget, snapshot: Snapshot) -> bool:
        """Add one database's families to the snapshot; True when it failed."""
        result = await server.scrape(budget)
        snapshot.families.extend(result.families)
        snapshot.interrupted = snapshot.interrupted or result.interrupted
        return bool(result.error)

    def _account(self, start: float, *, failed: bool, interrupted: str | None) -> None:
        self.stats.scrapes += 1
        self.stats.last_scrape_time = time.time()
        self.stats.last_duration = self.stats.last_scrape_time - start
        if interrupted is not None:
            log.info(
                "collection round interrupted (%s)", interrupted, extra={"reason": interrupted}
            )
        elif failed:
            self.stats.errors += 1
        log.debug("collection round done", extra={"duration": round(self.stats.last_duration, 4)})

    def wanted_databases(self) -> set[str]:
        """Databases to discover from the main one, per include/exclude lists."""
        settings = self.settings
        if not settings.auto_discovery or settings.is_pgbouncer or self.main.facts is None:
            return set()
        names = set(self.main.databases) - set(settings.exclude_databases)
        if settings.include_databases:
            names &= set(settings.include_databases)
        names.discard(self.main.facts.datname)
        return names

    async def _sync_discovered(self) -> None:
        wanted = self.wanted_databases()
        for name in set(self.discovered) - wanted:
            log.info("database vanished, dropping it", extra={"datname": name})
            await self.discovered.pop(name).disconnect()
        for name in wanted - set(self.discovered):
            log.info("database discovered", extra={"datname": name})
            self.discovered[name] = Server(
                name, self.options, self.definitions, is_main=False, clock=self.clock
            )

    async def close(self) -> None:
        """Close every connection."""
        for server in self.servers:
            await server.disconnect()

    async def explain(self, budget: Budget) -> str:
        """The plan of every database, refreshing facts first."""
        async with self.lock:
            parts: list[str] = []
            try:
                await self.main.prepare()
                await self._sync_discovered()
            except Exception as exc:  # any failure becomes text for the operator
                return f"cannot reach the target database: {exc}\n"
            for server in self.servers:
                if budget.interruption():
                    break
                try:
                    await server.prepare()
                except Exception as exc:
                    parts.append(f"database {server.label}: cannot plan: {exc}\n")
                    continue
                if server.plan is not None:
                    parts.append(explain_text(server.plan))
            return "\n".join(parts)


async def explain_main(settings: Settings, definitions: Definitions) -> int:
    """``--explain``: connect, plan every database, print the plan, and exit."""
    exporter = Exporter(settings, definitions)
    try:
        await exporter.main.prepare()
    except Exception as exc:
        print(f"pg_exporter: cannot connect to {settings.masked_url}: {exc}", file=sys.stderr)
        return 1
    try:
        text = await exporter.explain(Budget.starting_now(max(settings.connect_timeout * 10, 30)))
    finally:
        await exporter.close()
    print(text, end="")
    return 0
