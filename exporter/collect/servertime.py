"""The server-time budget: at most so much of the server's time per second for the
exporter's own statements, averaged over a window, kept by refreshing the least important
of the costliest collectors less often (issue 31).

Not the request's :class:`~exporter.collect.budget.Budget` (how long one scrape may take): this one
is about the database. Pure logic on an injected clock: :class:`ServerTimeMeter` keeps
what each pass's statements took, :func:`demands_of` reads each collector's
:class:`~exporter.collect.stretch.Demand` off its runtime,
:mod:`exporter.collect.stretch` says which to stretch and how far, and
:class:`ServerTimeBudget` keeps the plan between passes, sets the
runtimes' stretches and says when it changed. What a statement "took" is the time the
client waited for it: the server's work plus the round trips and the reading of its rows,
an upper bound of the server's share (docs/degradation.md says why this measure and not
``pg_stat_statements``).
"""

from __future__ import annotations

import logging
import random as _random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from exporter.collect.backoff import ceiling_for
from exporter.collect.breaker import Shedding, is_shed, shed_cut
from exporter.collect.planning import Plan
from exporter.collect.runtime import CollectorRuntime
from exporter.collect.stretch import Demand, Key, decide, predicted, saving, stretch_order
from exporter.config.definitions import Collector
from exporter.pg.loginrate import Random

log = logging.getLogger(__name__)

#: Seconds the measured rate is averaged over, and the pass interval estimated from.
WINDOW = 300.0
#: Passes the interval between passes is averaged over: an HA pair's uneven gaps included.
RECENT = 9
#: Seconds of passes seen in the window before the budget acts: a few scrapes in a row (a
#: person with curl, a test) are no rate yet; a client that keeps scraping is.
SETTLE = 30.0
#: Seconds a lighter plan must keep fitting before the plan is relaxed: it is stretched
#: further at once, relaxed only once costs have stayed lower (noisy costs do not flap it).
RELAX_AFTER = 60.0
#: A collector's cost is its runs' durations, each new one weighing this much: a run slowed
#: once (a lock, a busy client) does not restretch what the others settled.
COST_WEIGHT = 0.25
_MAX_PASSES = 20_000  # kept in the window at most: a pass every 15 ms for 300 s
_SHORTEST = 1e-3  # seconds: a stretch that ends at once is still a stretch


@dataclass(frozen=True, slots=True)
class PassTime:
    """What one pass's statements took, in seconds, by when it started."""

    started: float
    spent: float  # every statement: preflights and collectors
    overhead: float  # the preflights, which no stretching saves


@dataclass(slots=True)
class ServerTimeMeter:
    """The passes of the last ``window`` seconds and what their statements took."""

    window: float = WINDOW
    passes: deque[PassTime] = field(default_factory=lambda: deque(maxlen=_MAX_PASSES))
    total: float = 0.0  # seconds since start, every pass
    first: float | None = None  # when the first pass started

    def record(self, started: float, spent: float, overhead: float) -> None:
        """Count one pass that started at ``started``."""
        self.passes.append(PassTime(started, spent, overhead))
        self.total += spent
        self.first = started if self.first is None else self.first

    def _recent(self, now: float) -> list[PassTime]:
        while self.passes and self.passes[0].started <= now - self.window:
            self.passes.popleft()
        return list(self.passes)

    def span(self, now: float) -> float:
        """Seconds the rate is measured over: the window, or the time since the first pass
        while that is shorter."""
        return 0.0 if self.first is None else min(self.window, now - self.first)

    def rate(self, now: float) -> float | None:
        """Seconds of server time per second over :meth:`span`; None before a second."""
        span = self.span(now)
        if span < 1.0:
            return None
        return sum(p.spent for p in self._recent(now)) / span

    def interval(self, now: float) -> float | None:
        """The mean seconds between the last :data:`RECENT` passes in the window; None with
        fewer than two. Recent, so that a burst of scrapes counts while it lasts and not
        for a whole window after it."""
        recent = self._recent(now)[-RECENT:]
        if len(recent) < 2 or recent[-1].started <= recent[0].started:
            return None
        return (recent[-1].started - recent[0].started) / (len(recent) - 1)

    def seen(self, now: float) -> float:
        """Seconds from the first pass in the window to the last."""
        recent = self._recent(now)
        return recent[-1].started - recent[0].started if recent else 0.0

    def overhead(self, now: float) -> float:
        """The preflights' seconds per pass, averaged over the window."""
        recent = self._recent(now)
        return sum(p.overhead for p in recent) / len(recent) if recent else 0.0


# --- reading the collectors' runtimes ---------------------------------------------------


class Database(Protocol):
    """What the budget reads of one scraped database (a ``Server``)."""

    @property
    def label(self) -> str: ...

    @property
    def plan(self) -> Plan | None: ...

    @property
    def runtimes(self) -> dict[str, CollectorRuntime]: ...


def tier(collector: Collector, cuts: Sequence[tuple[int, str] | None]) -> int:
    """The collector's tier: the breaker's shedding level that first leaves it out (D16),
    one past the last for what no level sheds (the first collector, the ``fatal`` ones).
    ``cuts``: :func:`~exporter.collect.breaker.shed_cut` at each level, from the first."""
    return next((n for n, cut in enumerate(cuts, 1) if is_shed(collector, cut)), len(cuts) + 1)


#: What a run of a collector costs, in seconds, from its key and runtime.
Cost = Callable[[Key, CollectorRuntime], float]


def last_cost(key: Key, runtime: CollectorRuntime) -> float:
    """The duration of its last run."""
    return runtime.stats.last_duration


def demands_of(
    database: Database,
    planned: Sequence[Collector],
    shedding: Shedding,
    interval: float,
    cost: Cost = last_cost,
) -> list[Demand]:
    """The demand of each collector of ``planned`` that has run on ``database``, tiered in
    the run order of ``shedding.reference`` (the main database's plan) as the breaker
    cuts it; a collector this pass sheds costs nothing (the breaker comes first)."""
    order = shedding.reference if shedding.reference is not None else planned
    cuts = [shed_cut(order, level, shedding.levels) for level in range(1, shedding.levels + 1)]
    cut = shedding.cut(planned)
    found = []
    for collector in planned:
        runtime = database.runtimes.get(collector.key)
        if runtime is None or not runtime.ran:
            continue
        key = (database.label, collector.key)
        spent = 0.0 if is_shed(collector, cut) else cost(key, runtime)
        found.append(_demand(key, runtime, tier(collector, cuts), interval, spent))
    return found


def _demand(key: Key, runtime: CollectorRuntime, tier: int, interval: float,
            cost: float) -> Demand:  # fmt: skip
    collector, rules = runtime.collector, runtime.rules
    ttl = 0.0 if rules.disable_cache else collector.ttl
    backoff = runtime.backoff
    wait = backoff.wait if backoff is not None and backoff.backing_off else 0.0
    ceiling = ceiling_for(collector, rules.backoff_ceiling)
    return Demand(key, tier, cost, ttl, interval, ceiling, wait)


# --- the target's budget ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Stretched:
    """One collector the plan stretches, as ``/explain`` and the log name it."""

    ttl: float  # its ttl in force
    every: float  # seconds between its runs, stretched
    stretched: float  # its effective ttl


class ServerTimeBudget:
    """One target's server-time budget: the meter, and the plan that keeps within it."""

    def __init__(
        self,
        budget_ms: float,
        window: float = WINDOW,
        random: Random = _random.random,
        off: str = "--server.time-budget 0",
    ) -> None:
        self.budget = max(0.0, budget_ms) / 1000.0  # seconds of server time per second
        self.off = off  # why there is none, when there is none
        self.random = random  # where a newly stretched collector's first period ends
        self.meter = ServerTimeMeter(window)
        self.plan: dict[Key, float] = {}
        self.demand = 0.0  # seconds per second, unstretched, as last predicted
        self.planned = 0.0  # seconds per second under the plan, as last predicted
        self.stretched: dict[Key, Stretched] = {}  # in stretch order
        self.decided = False  # True once SETTLE seconds of passes were seen
        # Each collector's smoothed cost, and when the run it last took in ended.
        self.costs: dict[Key, tuple[float, float]] = {}
        # Newly stretched collectors: when the run their first stretched period counts from
        # ended, and how long that first period holds its result.
        self.first: dict[Key, tuple[float, float]] = {}
        self.lighter_since: float | None = None  # since when a lighter plan has fitted

    @property
    def enabled(self) -> bool:
        """False when no budget is set (0)."""
        return self.budget > 0

    def record(self, started: float, spent: float, overhead: float) -> None:
        """What one pass's statements took."""
        self.meter.record(started, spent, overhead)

    def begin(self, now: float, databases: Sequence[Database], shedding: Shedding) -> None:
        """Decide the plan for the pass starting now, from what each database's collectors
        cost and what the breaker sheds in it, tiered in the main database's run order (the
        first of ``databases``); set each collector's stretch; log a change once."""
        interval = self.meter.interval(now)
        main = databases[0].plan if databases else None
        if interval is None or main is None or self.meter.seen(now) < SETTLE:
            return
        shedding = replace(shedding, reference=main.planned)
        costs, self.costs = self.costs, {}
        demands = [
            demand
            for database in databases
            if database.plan is not None
            for demand in demands_of(
                database, database.plan.planned, shedding, interval, self._smoothed(costs)
            )
        ]
        before, was = saving(demands, self.plan), set(self.stretched)
        if self._choose(now, demands, self.meter.overhead(now) / interval):
            self._log(now, further=saving(demands, self.plan) > before)
        for database in databases:
            for key, runtime in database.runtimes.items():
                runtime.stretch = self._stretch((database.label, key), runtime, was)

    def _stretch(self, key: Key, runtime: CollectorRuntime, was: set[Key]) -> float:
        """The collector's effective ttl now. Its first stretched period ends at random
        within the full one (D17): collectors stretched at one pass, which mostly ran at
        one pass, would otherwise come due together at every period, and a window holding
        that pass would see them all."""
        full = self.effective_ttl(key)
        ended = runtime.entry.finished_at if runtime.entry is not None else 0.0
        first = self.first.pop(key, None)
        if full <= 0:
            return 0.0
        if first is None and key not in was:
            first = (ended, full * self.random())
        if first is None or first[0] != ended:  # it ran since: full periods from now on
            return full
        self.first[key] = first
        return max(first[1], _SHORTEST)

    def _smoothed(self, before: dict[Key, tuple[float, float]]) -> Cost:
        """The cost of each collector's runs, smoothed by COST_WEIGHT, kept for the next."""

        def cost(key: Key, runtime: CollectorRuntime) -> float:
            entry = runtime.entry
            ended = entry.finished_at if entry is not None else 0.0
            last = runtime.stats.last_duration
            held = before.get(key)
            if held is None:
                value = last
            elif held[1] == ended:
                value = held[0]  # no run since
            else:
                value = held[0] + COST_WEIGHT * (last - held[0])
            self.costs[key] = (value, ended)
            return value

        return cost

    def _log(self, now: float, *, further: bool) -> None:
        stretched = ", ".join(
            f"{datname}/{key} every {s.every:.0f}s (ttl {s.ttl:g}s)"
            for (datname, key), s in self.stretched.items()
        )
        log.log(
            logging.WARNING if further else logging.INFO,
            "server-time budget: %s%s",
            self.describe(now),
            f" ({stretched})" if stretched else "",
            extra={"stretched": len(self.stretched)},
        )

    def _choose(self, now: float, demands: Sequence[Demand], overhead: float) -> bool:
        """The plan for the pass starting now, relaxed only once a lighter one has fitted
        for RELAX_AFTER seconds; True when it changed (to be logged once)."""
        self.decided = True
        decision = decide(demands, overhead, self.budget, self.plan)
        plan = decision.plan
        if not decision.relaxing:
            self.lighter_since = None
        elif self.lighter_since is None:
            self.lighter_since, plan = now, decision.kept
        elif now - self.lighter_since < RELAX_AFTER:
            plan = decision.kept
        else:
            self.lighter_since = None  # relaxed now: a further step waits as long again
        self.demand = predicted(demands, overhead, {})
        self.planned = predicted(demands, overhead, plan)
        changed = plan != self.plan
        self.plan = plan
        self.stretched = {
            d.key: Stretched(d.ttl, d.period(plan[d.key]), d.effective_ttl(plan[d.key]))
            for d in stretch_order(demands)
            if d.key in plan
        }
        return changed

    def effective_ttl(self, key: Key) -> float:
        """The effective ttl the plan gives the collector; 0 when it is not stretched."""
        stretched = self.stretched.get(key)
        return stretched.stretched if stretched is not None else 0.0

    def stretched_on(self, datname: str) -> str:
        """The collectors of ``datname`` the plan stretches, costliest first, for ``/explain``."""
        return ", ".join(
            f"{key} (ttl {s.ttl:g}s, refreshed every {s.every:.0f}s)"
            for (name, key), s in self.stretched.items()
            if name == datname
        )

    def describe(self, now: float) -> str:
        """The budget and what keeps to it, in one line, for the log and ``/explain``."""
        head = f"{self.budget * 1000:g} ms/s" if self.enabled else f"none ({self.off})"
        rate = self.meter.rate(now)
        if not self.decided:
            return f"{head}, not measured yet: it acts after {SETTLE:g}s of passes"
        text = (
            head
            if rate is None
            else f"{head}; measured {_ms(rate)} over {self.meter.span(now):.0f}s"
        )
        if not self.stretched:
            return f"{text}; the collectors take {_ms(self.demand)}: nothing stretched"
        over = " (over the budget even so: each is at its ceiling)" * (self.planned > self.budget)
        return (
            f"{text}; the collectors would take {_ms(self.demand)}, "
            f"{_ms(self.planned)} with {len(self.stretched)} stretched{over}"
        )


def _ms(seconds: float) -> str:
    """Seconds per second as the milliseconds a second that the flag counts."""
    return f"{seconds * 1000:.1f} ms/s"
