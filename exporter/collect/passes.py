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

from exporter.collect.breaker import Breaker, BreakerState, Shedding, is_shed, judge_pass
from exporter.collect.budget import Budget, Interruption
from exporter.collect.databases import Databases
from exporter.collect.seriescap import Part, SeriesCap
from exporter.collect.server import Server, ServerResult
from exporter.collect.servertime import ServerTimeBudget
from exporter.expose.exposition import Family
from exporter.expose.uniqueness import Repeat, without_repeats

log = logging.getLogger(__name__)

#: The share of a request's budget, as the pass found it, kept back from the discovered
#: databases: a database that has not answered when the rest is gone is left out, and
#: the others are answered in the time kept (issue 36).
ANSWER_RESERVE = 0.1


def databases_budget(budget: Budget, start: float) -> Budget:
    """The request's budget less :data:`ANSWER_RESERVE` of what was left at ``start``:
    the deadline of every discovered database's part of the pass. The client and the
    request's end are the request's own, so B9-B12 hold as they do for the request."""
    reserve = ANSWER_RESERVE * max(0.0, budget.deadline - start)
    return replace(budget, deadline=budget.deadline - reserve)


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


@dataclass(slots=True, eq=False)
class Walk:
    """One database's part of a pass: its task, and whether its preflight has answered."""

    server: Server
    ready: asyncio.Event = field(default_factory=asyncio.Event)  # its preflight is done
    task: asyncio.Task[ServerResult] | None = None

    def start(
        self, group: asyncio.TaskGroup, slots: asyncio.Semaphore, budget: Budget,
        shedding: Shedding,
    ) -> None:  # fmt: skip
        """Walk the database once a slot is free. Each checks the request before it
        connects and before each collector (B10), so once ``budget`` is spent or the client
        gone, the walks still waiting start nothing."""
        self.task = group.create_task(self._walk(slots, budget, shedding))

    async def _walk(
        self, slots: asyncio.Semaphore, budget: Budget, shedding: Shedding
    ) -> ServerResult:
        async with slots:
            return await self.server.scrape(budget, shedding, self.ready)

    def result(self) -> ServerResult:
        """What the walk produced (once the pass's task group has ended)."""
        assert self.task is not None
        return self.task.result()


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
        shedding = self._shedding()
        self.server_time.begin(start, self.databases.servers, shedding)  # after the breaker
        parts: list[Part] = []
        places: list[str] = []  # the database of each part
        slots = asyncio.Semaphore(self.width)  # databases walked at once, the main one too
        main = Walk(self.databases.main)
        async with asyncio.TaskGroup() as group:
            main.start(group, slots, budget, shedding)
            others = await self._discover_meanwhile(
                group, main, slots=slots, budget=databases_budget(budget, start), shedding=shedding
            )
        results = [main.result(), *(self._cut_short(other, budget) for other in others)]
        failed = self._merge(results[0], snapshot, parts)
        places.extend([self.databases.main.label] * len(parts))
        # Other databases count only beside a main database that is up: a fatal collector
        # there makes the target down, whatever they produced meanwhile.
        for walk, result in zip(others, results[1:], strict=True) if self.databases.main.up else ():
            failed |= self._merge(result, snapshot, parts)
            places.extend([walk.server.label] * (len(parts) - len(places)))
        self._measure(start, [main, *others])
        self.databases.note_plans()
        unique = self.repeated.apply(parts, places)  # the main database's first (issue 36)
        snapshot.families = self.series_cap.apply(unique)  # whole collectors (issue 13)
        # A pass that outlived its request (a bounded collector ran past the budget) has
        # no one to answer: the request gets 503, the results stay cached (B21).
        snapshot.interrupted = snapshot.interrupted or budget.interruption()
        self._account(start, failed=failed, interrupted=snapshot.interrupted)
        self._judge(results, snapshot.interrupted, ran_for=self.clock() - start)
        return snapshot

    async def _discover_meanwhile(
        self,
        group: asyncio.TaskGroup,
        main: Walk,
        *,
        slots: asyncio.Semaphore,
        budget: Budget,
        shedding: Shedding,
    ) -> list[Walk]:
        """Once the main database's preflight has named the databases, start walking the
        others beside its collectors (issue 22), within the same ``slots`` and under
        ``budget``, theirs; none when the main database could not be reached or the
        request ended first."""
        assert main.task is not None
        waiting = asyncio.ensure_future(main.ready.wait())
        try:
            await asyncio.wait((main.task, waiting), return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()
        if not main.ready.is_set() or budget.interruption() is not None:
            return []
        if self.recovery_seen is not None and self.databases.main.facts is not None:
            self.recovery_seen(self.databases.main.facts.in_recovery)  # read by this pass
        await self.databases.sync()
        # Other databases are cut in the main plan's run order (D16).
        reference = self.databases.main.plan.planned if self.databases.main.plan else None
        shedding = replace(shedding, reference=reference)
        others = [Walk(server) for server in self.databases.servers[1:]]
        for other in others:
            other.start(group, slots, budget, shedding)
        return others

    def _cut_short(self, walk: Walk, budget: Budget) -> ServerResult:
        """A discovered database's result; one whose own deadline passed while the request
        still had time is left out of this answer, alone (issue 36): the others are
        answered, its statements in flight were cancelled (B9, B12) or ended by their own
        timeout (B11). Counted as its failure; logged when it starts and when it ends."""
        result, server = walk.result(), walk.server
        cut = result.interrupted is Interruption.BUDGET and budget.interruption() is None
        if cut:
            result.interrupted = None
            result.error = result.error or (
                f"database {server.label}: no answer within its part of the scrape's budget; "
                "left out of this answer"
            )
            server.error_count += 1
            server.up = server.up and walk.ready.is_set()  # connect afresh next time
        if cut != server.cut_short:
            self._log_cut(server.label, cut=cut)
        server.cut_short = cut
        return result

    @staticmethod
    def _log_cut(datname: str, *, cut: bool) -> None:
        if cut:
            log.warning(
                "database did not answer within its part of the scrape's budget: left out "
                "of the answers until it does, the other databases answered without it",
                extra={"datname": datname},
            )
        else:
            log.info("database answers again within the scrape's budget",
                     extra={"datname": datname})  # fmt: skip

    def _measure(self, start: float, walks: Sequence[Walk]) -> None:
        """Tell the server-time budget what the pass's statements took (issue 31). A
        preflight that did not complete (its database gave no answer: a lock, a stall, a
        refusal) is not counted: it measured a wait, not the server's work, and no stretch
        of any database's collectors would save it (issue 36)."""
        spent = overhead = 0.0
        for walk in walks:
            result = walk.result()
            counted = result.preflight_time if walk.ready.is_set() else 0.0
            spent += result.server_time - result.preflight_time + counted
            overhead += counted
        self.server_time.record(start, spent, overhead)

    @staticmethod
    def _merge(result: ServerResult, snapshot: Snapshot, parts: list[Part]) -> bool:
        """Add one database's collector results to ``parts``; True when it failed."""
        parts.extend(result.parts)
        snapshot.interrupted = snapshot.interrupted or result.interrupted
        return bool(result.error)

    def _shedding(self) -> Shedding:
        """What this pass sheds; a degraded breaker whose cool-down is over probes (D16)."""
        if self.breaker.begin(self.clock()):
            self._log_breaker()
        return Shedding(self.breaker.level, self.breaker.policy.levels)

    def _judge(
        self, results: Sequence[ServerResult], interrupted: Interruption | None, *, ran_for: float
    ) -> None:
        """Tell the breaker what the pass showed, the main database's part first; log a
        change of state once (D16)."""
        main, *others = (result.tally for result in results)
        verdict, reason = judge_pass(main, others, interrupted=interrupted,
                                     policy=self.breaker.policy, ran_for=ran_for)  # fmt: skip
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
