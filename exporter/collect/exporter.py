"""The exporter of one target: its databases, breaker and series cap, and the
collection lock that lets one pass run at a time (B4).

``Exporter.collect`` takes the collection lock, runs a pass (``passes``) over the
databases under the request's budget, and returns a snapshot of families. Encoding
happens after the lock is released (B20), in the web layer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random as _random
import time
from collections.abc import AsyncIterator, Callable

from exporter.collect.breaker import (
    Breaker,
    BreakerPolicy,
)
from exporter.collect.budget import Budget, Interruption, RequestEnded, until_request_ends
from exporter.collect.databases import Databases
from exporter.collect.gate import Gate
from exporter.collect.passes import CollectionPass, PassStats, RepeatedSeries, Snapshot
from exporter.collect.seriescap import SeriesCap
from exporter.collect.server import Server
from exporter.collect.servertime import ServerTimeBudget
from exporter.config.definitions import Definitions
from exporter.config.settings import Settings
from exporter.pg.bulkheads import Bulkheads
from exporter.pg.loginrate import Random

log = logging.getLogger(__name__)

#: How long shutdown waits for a pass in flight before cancelling it (seconds).
SHUTDOWN_GRACE = 10.0


async def _acquire_within(lock: asyncio.Lock, seconds: float) -> bool:
    """Take ``lock`` if it comes free within ``seconds``; False when the time ran out."""
    try:
        async with asyncio.timeout(seconds):
            await lock.acquire()
    except TimeoutError:
        return False
    return True


def _budget_off(settings: Settings) -> str:
    """Why there is no server-time budget, as ``/explain`` says it."""
    if settings.server_time_budget is None and settings.disable_cache:
        return "--disable-cache, and no --server.time-budget given"
    return "--server.time-budget 0"


def _report_orphan_failure(task: asyncio.Task[Snapshot]) -> None:
    """Log a pass that failed after its request had gone, so the error is not lost."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("collection pass failed: %s", exc, exc_info=exc)


class Exporter:
    """The main database plus the databases discovered from it."""

    def __init__(
        self,
        settings: Settings,
        definitions: Definitions,
        *,
        clock: Callable[[], float] = time.monotonic,
        random: Random = _random.random,
        policy: BreakerPolicy | None = None,
        gate: Gate | None = None,
        servers: Bulkheads | None = None,
    ) -> None:
        self.settings = settings
        self.gate = gate  # a fleet's ceiling on targets collected at once, shared
        self.clock = clock
        # A fleet's per-server bulkheads are shared by every target (issue 29).
        self.databases = Databases(settings, definitions, clock=clock, random=random,
                                   servers=servers)  # fmt: skip
        self.connections = self.databases.connections  # shared by every database (issue 13)
        self.main = self.databases.main
        self.breaker = Breaker(policy or BreakerPolicy(), random)  # the target's (D16)
        self.series_cap = SeriesCap(settings.max_total_series)  # exposition-wide
        self.server_time = ServerTimeBudget(settings.effective_server_time_budget(),
                                            random=random, off=_budget_off(settings))  # fmt: skip
        self.repeated = RepeatedSeries()  # what passes left out and said so (issue 36)
        self.lock = asyncio.Lock()
        self.stats = PassStats()
        self.pending: Definitions | None = None  # reloaded, waiting for the next pass
        self._passes: set[asyncio.Task[Snapshot]] = set()  # at most one; kept for shutdown
        self._closing = False
        # Told the recovery state each pass's preflight read (the health probe listens).
        self.recovery_seen: Callable[[bool], None] | None = None

    @property
    def servers(self) -> list[Server]:
        """The main database first, then discovered ones by name."""
        return self.databases.servers

    @property
    def discovered(self) -> dict[str, Server]:
        """The databases auto-discovery found, by name."""
        return self.databases.discovered

    @property
    def definitions(self) -> Definitions:
        """The collector definitions in force (a reload waits in ``pending``)."""
        return self.databases.definitions

    async def collect(self, budget: Budget) -> Snapshot:
        """Wait for the collection lock within the budget, then run one pass (B4–B8).

        The pass runs in a task of its own that owns the lock. If this request is
        cancelled (its client hung up), only the waiting stops: a bounded collector in
        flight finishes and caches its result (B11), and ``budget.ended`` tells the
        pass to start nothing new and to cancel unbounded work (B10, B12).
        """
        shared = self.lock.locked()
        waited_from = self.clock()
        acquired = await _acquire_within(self.lock, budget.remaining())  # B5, B8
        waited = self.clock() - waited_from
        if not acquired:
            return Snapshot([], interrupted=Interruption.BUDGET, shared=shared, waited=waited)
        # No await between acquiring and handing over: the task owns the lock from here.
        task = asyncio.create_task(self._locked_pass(budget))
        self._passes.add(task)
        task.add_done_callback(self._passes.discard)
        try:
            snapshot = await asyncio.shield(task)
        except asyncio.CancelledError:
            budget.ended.set()
            # Nobody awaits the pass from here on: its failure would go unseen.
            task.add_done_callback(_report_orphan_failure)
            raise
        snapshot.shared = shared
        snapshot.waited = waited
        return snapshot

    async def _locked_pass(self, budget: Budget) -> Snapshot:
        try:
            if self.gate is None:
                return await self._pass(budget)
            return await self._gated_pass(self.gate, budget)
        finally:
            self.lock.release()

    async def _gated_pass(self, gate: Gate, budget: Budget) -> Snapshot:
        """The pass, once the fleet's ceiling has a place for it within the budget."""
        try:
            entered = await until_request_ends(gate.enter(budget.remaining()), budget)
        except RequestEnded as ended:
            return Snapshot([], interrupted=ended.reason)
        if not entered:
            return Snapshot([], interrupted=Interruption.BUDGET)
        try:
            return await self._pass(budget)
        finally:
            gate.leave()

    def schedule(self, definitions: Definitions) -> None:
        """Use ``definitions`` from the next pass on; a pass in flight keeps the old ones."""
        self.pending = definitions

    def _apply_pending(self) -> None:
        """Swap in reloaded definitions (under the lock): replan, forget caches and stats."""
        definitions, self.pending = self.pending, None
        if definitions is not None:
            self.databases.use(definitions)

    async def _pass(self, budget: Budget) -> Snapshot:
        self._apply_pending()
        walk = CollectionPass(self.databases, self.breaker, self.series_cap, self.stats,
                              width=self.width, clock=self.clock,
                              recovery_seen=self.recovery_seen,
                              server_time=self.server_time,
                              repeated=self.repeated)  # fmt: skip
        return await walk.run(budget)

    @property
    def width(self) -> int:
        """Databases walked at once: the setting, never above the databases' connections."""
        capacity = self.connections.capacity
        wanted = self.settings.parallel_databases
        return wanted if capacity is None else max(1, min(wanted, capacity))

    async def close(self, grace: float = SHUTDOWN_GRACE) -> None:
        """Let a pass in flight end (within ``grace`` seconds), then close every connection.

        A pass still running after that is cancelled: its queries are cancelled in the
        server, so no backend is left working for an exporter that has gone. Closing
        twice is harmless: the lock stays taken, so no pass starts after the first.
        """
        if self._closing:
            return
        self._closing = True
        if not await _acquire_within(self.lock, grace):
            log.warning("a collection pass outlived the shutdown grace; cancelling it")
            for task in self._passes:
                task.cancel()
            await asyncio.gather(*self._passes, return_exceptions=True)
            await self.lock.acquire()  # released by the cancelled pass: keep it taken
        for server in self.servers:
            await server.disconnect()

    async def release(self) -> bool:
        """Close every connection unless a pass is running (fleet mode: a target nobody
        collects any more); True when any was open. The next pass connects again."""
        if self.lock.locked() or self._closing:
            return False
        async with self.lock:  # free: taken at once, so no pass starts meanwhile
            opened = [server for server in self.servers if server.conn is not None]
            for server in opened:
                await server.disconnect()
        return bool(opened)

    @contextlib.asynccontextmanager
    async def exclusive(self, budget: Budget) -> AsyncIterator[bool]:
        """The collection lock, if it comes free within ``budget`` (False when the time ran
        out), with reloaded definitions applied: no pass runs until the block ends."""
        if not await _acquire_within(self.lock, budget.remaining()):
            yield False
            return
        try:
            self._apply_pending()
            yield True
        finally:
            self.lock.release()
