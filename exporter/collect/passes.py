"""One collection pass: every database walked under one request's budget (B4, B10).

The main database is walked first; once its preflight has named the others, they are
walked beside it, at most ``width`` at once (issue 13, issue 22). What the breaker
sheds is decided before the walk and the pass judged after it (D16), then what the
server-time budget stretches, and what the statements took is measured for it (issue 31);
a series two of them produced is served once (issue 36), and the series cap applies to
what all of them produced (issue 13).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from exporter.collect.breaker import Breaker, BreakerState, PassTally, Shedding, is_shed, judge
from exporter.collect.budget import Budget, Interruption
from exporter.collect.databases import Databases
from exporter.collect.seriescap import Part, SeriesCap
from exporter.collect.server import Server, ServerResult
from exporter.collect.servertime import ServerTimeBudget
from exporter.expose.exposition import Family
from exporter.expose.uniqueness import Repeat, without_repeats

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
    interrupted: Interruption | None = None
    shared: bool = False  # True when the request waited for another's pass
    waited: float = 0.0  # seconds spent waiting for the collection lock


class RepeatedSeries:
    """Series a pass would serve twice (issue 36, guarantee 8): the later source's are left
    out, and each collector on each database doing so is logged once while it lasts."""

    def __init__(self) -> None:
        self.reported: set[tuple[str, str]] = set()  # (collector key, database)

    def apply(self, parts: Sequence[Part], places: Sequence[str]) -> list[Part]:
        """``parts`` (each from the database in ``places``) without repeated series."""
        sources, repeats = without_repeats([part.families for part in parts])
        found: defaultdict[tuple[str, str], list[Repeat]] = defaultdict(list)
        for repeat in repeats:
            found[(parts[repeat.source].collector.key, places[repeat.source])].append(repeat)
        for key in sorted(found.keys() - self.reported):
            self._log(key, found[key], parts, places)
        self.reported = set(found)
        if not repeats:
            return list(parts)
        return [replace(p, families=f) for p, f in zip(parts, sources, strict=True)]

    @staticmethod
    def _log(
        key: tuple[str, str], repeats: list[Repeat], parts: Sequence[Part], places: Sequence[str]
    ) -> None:
        collector, datname = key
        first = repeats[0].first
        log.warning(
            "collector %s on database %s: %d series (%s) repeat those of collector %s on "
            "database %s and are left out, as a page serving a series twice is refused; "
            "give the series a label telling them apart (datname, for a collector of each "
            "database), or tag the collector cluster",
            collector, datname, sum(r.series for r in repeats),
            ", ".join(sorted({r.family for r in repeats})),
            parts[first].collector.key, places[first],
            extra={"collector": collector, "datname": datname},
        )  # fmt: skip


class CollectionPass:
    """One pass over the databases, with the breaker, the series cap and the counters it
    reports to."""

    def __init__(
        self,
        databases: Databases,
        breaker: Breaker,
        series_cap: SeriesCap,
        stats: PassStats,
        *,
        width: int,
        clock: Callable[[], float],
        recovery_seen: Callable[[bool], None] | None,
        server_time: ServerTimeBudget | None = None,
        repeated: RepeatedSeries | None = None,
    ) -> None:
        self.databases = databases
        self.breaker = breaker
        self.series_cap = series_cap
        self.stats = stats
        self.width = width  # databases walked at once, the main one too
        self.clock = clock
        self.recovery_seen = recovery_seen  # told the recovery state the preflight read
        self.server_time = server_time or ServerTimeBudget(0.0)  # the target's (issue 31)
        self.repeated = repeated or RepeatedSeries()  # the target's (issue 36)

    async def run(self, budget: Budget) -> Snapshot:
        """Walk every database, publish what fits the series cap, judge the pass (D16)."""
        start = self.clock()
        snapshot = Snapshot(families=[])
        tally = PassTally()
        shedding = self._shedding()
        self.server_time.begin(start, self.databases.servers, shedding)  # after the breaker
        parts: list[Part] = []
        places: list[str] = []  # the database of each part
        slots = asyncio.Semaphore(self.width)  # databases walked at once, the main one too
        ready = asyncio.Event()  # the main database's preflight is done
        async with asyncio.TaskGroup() as group:
            main = group.create_task(self._one(self.databases.main, slots, budget, shedding, ready))
            others = await self._discover_meanwhile(
                group, main, ready, slots=slots, budget=budget, shedding=shedding
            )
        failed = self._merge(main.result(), snapshot, tally, parts)
        places.extend([self.databases.main.label] * len(parts))
        # Other databases count only beside a main database that is up: a fatal collector
        # there makes the target down, whatever they produced meanwhile.
        for server, other in others if self.databases.main.up else ():
            failed |= self._merge(other.result(), snapshot, tally, parts)
            places.extend([server.label] * (len(parts) - len(places)))
        results = [main.result(), *(other.result() for _, other in others)]
        self.server_time.record(start, sum(r.server_time for r in results),
                                sum(r.preflight_time for r in results))  # fmt: skip
        self.databases.note_plans()
        unique = self.repeated.apply(parts, places)  # the main database's first (issue 36)
        snapshot.families = self.series_cap.apply(unique)  # whole collectors (issue 13)
        # A pass that outlived its request (a bounded collector ran past the budget) has
        # no one to answer: the request gets 503, the results stay cached (B21).
        snapshot.interrupted = snapshot.interrupted or budget.interruption()
        self._account(start, failed=failed, interrupted=snapshot.interrupted)
        self._judge(tally, snapshot.interrupted, ran_for=self.clock() - start)
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
    ) -> list[tuple[Server, asyncio.Task[ServerResult]]]:
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
        if self.recovery_seen is not None and self.databases.main.facts is not None:
            self.recovery_seen(self.databases.main.facts.in_recovery)  # read by this pass
        await self.databases.sync()
        # Other databases are cut in the main plan's run order (D16).
        reference = self.databases.main.plan.planned if self.databases.main.plan else None
        shedding = replace(shedding, reference=reference)
        return [
            (server, group.create_task(self._one(server, slots, budget, shedding)))
            for server in self.databases.servers[1:]
        ]

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

    def _judge(self, tally: PassTally, interrupted: Interruption | None, *, ran_for: float) -> None:
        """Tell the breaker what the pass showed; log a change of state once (D16)."""
        policy = self.breaker.policy
        verdict, reason = judge(tally, interrupted=interrupted, policy=policy, ran_for=ran_for)
        if self.breaker.observe(verdict, reason, self.clock()):
            self._log_breaker()

    def _log_breaker(self) -> None:
        breaker = self.breaker
        plan = self.databases.main.plan.planned if self.databases.main.plan else ()
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
