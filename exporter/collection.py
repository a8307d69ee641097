"""The collection pass: one walk over the main and discovered databases (B4).

``Exporter.collect`` takes the collection lock, walks the databases under the
request's budget, and returns a snapshot of families. Encoding happens after
the lock is released (B20), in the web layer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random as _random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace

from exporter.backoff import Random
from exporter.breaker import (
    Breaker,
    BreakerPolicy,
    BreakerState,
    PassTally,
    Shedding,
    is_shed,
    judge,
)
from exporter.budget import Budget, Interruption, RequestEnded, until_request_ends
from exporter.databases import Databases
from exporter.definitions import Definitions
from exporter.exposition import Family
from exporter.gate import Gate
from exporter.seriescap import Part, SeriesCap
from exporter.server import Server, ServerResult
from exporter.settings import Settings

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


def _report_orphan_failure(task: asyncio.Task[Snapshot]) -> None:
    """Log a pass that failed after its request had gone, so the error is not lost."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("collection pass failed: %s", exc, exc_info=exc)


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
    interrupted: Interruption | None = None
    shared: bool = False  # True when the request waited for another's pass
    waited: float = 0.0  # seconds spent waiting for the collection lock


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
    ) -> None:
        self.settings = settings
        self.gate = gate  # a fleet's ceiling on targets collected at once, shared
        self.clock = clock
        self.databases = Databases(settings, definitions, clock=clock, random=random)
        self.connections = self.databases.connections  # shared by every database (issue 13)
        self.main = self.databases.main
        self.breaker = Breaker(policy or BreakerPolicy(), random)  # the target's (D16)
        self.series_cap = SeriesCap(settings.max_total_series)  # exposition-wide
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
        start = self.clock()
        snapshot = Snapshot(families=[])
        tally = PassTally()
        shedding = self._shedding()
        parts: list[Part] = []
        slots = asyncio.Semaphore(self.width)  # databases walked at once, the main one too
        ready = asyncio.Event()  # the main database's preflight is done
        async with asyncio.TaskGroup() as group:
            main = group.create_task(self._one(self.main, slots, budget, shedding, ready))
            others = await self._discover_meanwhile(
                group, main, ready, slots=slots, budget=budget, shedding=shedding
            )
        failed = self._merge(main.result(), snapshot, tally, parts)
        # Other databases count only beside a main database that is up: a fatal collector
        # there makes the target down, whatever they produced meanwhile.
        for other in others if self.main.up else ():
            failed |= self._merge(other.result(), snapshot, tally, parts)
        snapshot.families = self.series_cap.apply(parts)  # whole collectors (issue 13)
        # A pass that outlived its request (a bounded collector ran past the budget) has
        # no one to answer: the request gets 503, the results stay cached (B21).
        snapshot.interrupted = snapshot.interrupted or budget.interruption()
        self._account(start, failed=failed, interrupted=snapshot.interrupted)
        self._judge(tally, snapshot.interrupted)
        return snapshot

    async def _discover_meanwhile(
        self,
        group: asyncio.TaskGroup,
        main: asyncio.Task[ServerResult],
        ready: asyncio.Event,
        *,
        slots: asyncio.Semaphore,
        budget: Budget,
        shedding: Shedding,
    ) -> list[asyncio.Task[ServerResult]]:
        """Once the main database's preflight has named the databases, start walking the
        others beside its collectors (issue 22), within the same ``slots``; none when the
        main database could not be reached or the request ended first."""
        waiting = asyncio.ensure_future(ready.wait())
        try:
            await asyncio.wait((main, waiting), return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()
        if not ready.is_set() or budget.interruption() is not None:
            return []
        if self.recovery_seen is not None and self.main.facts is not None:
            self.recovery_seen(self.main.facts.in_recovery)  # read by this pass
        await self.databases.sync()
        # Other databases are cut in the main plan's run order (D16).
        reference = self.main.plan.planned if self.main.plan else None
        shedding = replace(shedding, reference=reference)
        return [
            group.create_task(self._one(server, slots, budget, shedding))
            for server in self.servers[1:]
        ]

    @property
    def width(self) -> int:
        """Databases walked at once: the setting, never above the databases' connections."""
        capacity = self.connections.capacity
        wanted = self.settings.parallel_databases
        return wanted if capacity is None else max(1, min(wanted, capacity))

    @staticmethod
    async def _one(
        server: Server,
        slots: asyncio.Semaphore,
        budget: Budget,
        shedding: Shedding,
        ready: asyncio.Event | None = None,
    ) -> ServerResult:
        """One database's part of the pass, once a slot is free. Each checks the request
        before it connects and before each collector (B10), so once the budget is spent or
        the client gone, the walks still waiting start nothing."""
        async with slots:
            return await server.scrape(budget, shedding, ready)

    @staticmethod
    def _merge(
        result: ServerResult, snapshot: Snapshot, tally: PassTally, parts: list[Part]
    ) -> bool:
        """Add one database's collector results to ``parts``; True when it failed."""
        parts.extend(result.parts)
        snapshot.interrupted = snapshot.interrupted or result.interrupted
        tally.add(result.tally)
        return bool(result.error)

    def _shedding(self) -> Shedding:
        """What this pass sheds; a degraded breaker whose cool-down is over probes (D16)."""
        if self.breaker.begin(self.clock()):
            self._log_breaker()
        return Shedding(self.breaker.level, self.breaker.policy.levels)

    def _judge(self, tally: PassTally, interrupted: Interruption | None) -> None:
        """Tell the breaker what the pass showed; log a change of state once (D16)."""
        verdict, reason = judge(tally, interrupted=interrupted, policy=self.breaker.policy)
        if self.breaker.observe(verdict, reason, self.clock()):
            self._log_breaker()

    def _log_breaker(self) -> None:
        breaker = self.breaker
        plan = self.main.plan.planned if self.main.plan else ()
        cut = Shedding(breaker.level, breaker.policy.levels).cut(plan)
        shed = [c.key for c in plan if is_shed(c, cut)]
        level = logging.WARNING if breaker.state is BreakerState.DEGRADED else logging.INFO
        log.log(
            level,
            "target breaker %s",
            breaker.describe(self.clock()),
            extra={"state": breaker.state.value, "shed_level": breaker.level,
                   "shed": ",".join(shed) or "-"},
        )  # fmt: skip

    def _account(self, start: float, *, failed: bool, interrupted: Interruption | None) -> None:
        self.stats.scrapes += 1
        self.stats.last_scrape_time = time.time()  # wall clock: a timestamp for people
        self.stats.last_duration = self.clock() - start
        if interrupted is not None:  # B18: once, at INFO, and not an error
            log.info(
                "collection round interrupted: %s",
                interrupted.description,
                extra={"reason": interrupted.value},
            )
        elif failed:
            self.stats.errors += 1
        log.debug("collection round done", extra={"duration": round(self.stats.last_duration, 4)})

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
