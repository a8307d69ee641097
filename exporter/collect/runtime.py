"""One collector's runtime on one database: its cached result, statistics, back-off,
predicate answers, whether the breaker shed it and how far the server-time budget
stretched its ttl, with the rules over them.

What the Go exporter calls a ``Collector`` (our :class:`~exporter.config.definitions.Collector`
is the definition). Plain state and arithmetic: the caller reads the clock and passes
``now``, and the random source comes in with :class:`Rules`, so every rule here (B6,
B14, D15–D17) is testable without a database. ``Server`` keeps one per planned branch
and drops them all when the definitions are reloaded.
"""

from __future__ import annotations

import enum
import logging
import random as _random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from exporter.collect.account import Probing
from exporter.collect.backoff import (
    PERIOD_JITTER,
    Backoff,
    after_failure,
    ceiling_for,
    retry_in,
    spread,
)
from exporter.collect.cache import Entry, Outcome, fresh_since, is_fresh
from exporter.collect.ranking import Ranking
from exporter.config.definitions import Collector, Predicate
from exporter.config.settings import DEFAULT_BACKOFF_CEILING
from exporter.pg.loginrate import Random

if TYPE_CHECKING:  # topn reads runtimes: a type here only
    from exporter.collect.topn import Shape

log = logging.getLogger(__name__)


@dataclass(slots=True)
class CollectorStats:
    """Counters for one collector on one database since start (or the last reload)."""

    total: int = 0  # executions attempted, cache hits and passes it was held back
    hits: int = 0
    errors: int = 0
    skips: int = 0  # predicate said no
    last_duration: float = 0.0
    series: int = 0
    outcomes: dict[Outcome, int] = field(default_factory=dict)

    def record(self, outcome: Outcome, *, duration: float | None = None, series: int = 0) -> None:
        """Count one execution (or cache hit) with its outcome."""
        self.total += 1
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        if outcome in (Outcome.CACHED, Outcome.STRETCHED):
            self.hits += 1
            return
        if outcome in (Outcome.BACKOFF, Outcome.SHED):
            return  # nothing ran: the last run's figures stand
        if outcome is Outcome.SKIPPED:
            self.skips += 1
        elif outcome.failed:
            self.errors += 1
        if duration is not None:
            self.last_duration = duration
        self.series = series


class CollectorState(enum.Enum):
    """Where a collector stands, as ``/stat`` and the self-metrics show it."""

    NORMAL = "normal"  # runs when its TTL says so
    BACKOFF = "backoff"  # failed several times in a row: waits longer than its TTL
    SHED = "shed"  # left out by the breaker at the last pass (D16)
    STRETCHED = "stretched"  # refreshed less often to keep the server-time budget (issue 31)


@dataclass(frozen=True, slots=True)
class Rules:
    """What every collector runtime of one exporter shares."""

    disable_cache: bool = False  # --disable-cache: nothing is served from the cache (B16)
    backoff_ceiling: float = DEFAULT_BACKOFF_CEILING  # --backoff-ceiling, in seconds (D15)
    random: Random = _random.random  # back-off and predicate jitter (D15, D17)


@dataclass(frozen=True, slots=True)
class Answer:
    """A predicate's answer, when it was asked, and how long it holds (jittered, D17)."""

    value: bool
    asked_at: float  # monotonic seconds
    ttl: float


@dataclass(slots=True, eq=False)
class CollectorRuntime:
    """One collector's state on one database since start (or the last reload)."""

    collector: Collector
    rules: Rules = field(default_factory=Rules)
    entry: Entry | None = None  # the last result kept, a failure's included (B14)
    stats: CollectorStats = field(default_factory=CollectorStats)
    backoff: Backoff | None = None  # None until a failure; cleared by a success (D15)
    answers: dict[str, Answer] = field(default_factory=dict)  # by predicate name (D17)
    shed: bool = False  # the breaker left it out of the last pass (D16)
    stretch: float = 0.0  # the ttl the server-time budget stretched it to; 0: none (issue 31)
    ranking: Ranking | None = None  # a ``top`` collector's keys across runs (issue 38)
    probing: Probing | None = None  # and a probed one's listings and counters (issue 38)
    shape: tuple[tuple[tuple[str, ...], tuple[int, ...]], Shape] | None = None  # and its rows'

    @property
    def ran(self) -> bool:
        """True once the collector was executed, served or held back at least once."""
        return self.stats.total > 0

    @property
    def outcome(self) -> Outcome | None:
        """How the last run kept ended; None before the first."""
        return self.entry.outcome if self.entry is not None else None

    @property
    def state(self) -> CollectorState:
        """Where it stands, as ``/stat`` and the self-metrics show it."""
        if self.shed:
            return CollectorState.SHED
        if self.backoff is not None and self.backoff.backing_off:
            return CollectorState.BACKOFF
        return CollectorState.STRETCHED if self.stretch > 0 else CollectorState.NORMAL

    @property
    def ttl(self) -> float:
        """How long its result is served: its ttl, or the longer one it is stretched to."""
        return max(self.collector.ttl, self.stretch)

    def retry_in(self, now: float) -> float:
        """Seconds until a collector in back-off may run again (0 when it may run now)."""
        return retry_in(self.backoff, now)

    def held_back(self, now: float, *, shed: bool = False) -> Outcome | None:
        """Why the collector does not run now: CACHED within its TTL (B6, B14), STRETCHED
        within the longer one the server-time budget gives it, --disable-cache or not
        (issue 31), BACKOFF while failures in a row make it wait (D15), SHED when the
        breaker leaves it out (D16); None when it runs. A stretch and a back-off wait
        overlap: whichever ends later holds it, neither lengthens the other."""
        if is_fresh(self.entry, self.collector.ttl, now, disable_cache=self.rules.disable_cache):
            return Outcome.CACHED
        if self.stretch > 0 and is_fresh(self.entry, self.stretch, now, disable_cache=False):
            return Outcome.STRETCHED
        backoff = self.backoff
        if backoff is not None and backoff.backing_off and now < backoff.retry_at:
            return Outcome.BACKOFF
        return Outcome.SHED if shed else None

    def hold(self, now: float, *, shed: bool = False) -> Entry | None:
        """What to publish instead of running now, counted in the statistics: the cached
        entry, or nothing while in back-off or shed; None when the collector runs."""
        held = self.held_back(now, shed=shed)
        if held is None:
            return None
        self.stats.record(held)
        if held in (Outcome.CACHED, Outcome.STRETCHED) and self.entry is not None:
            return self.entry
        return Entry((), held, now, 0.0)

    def settle(self, entry: Entry, *, lost: bool = False, datname: str = "") -> None:
        """Take the result of a run: count it, judge it for back-off (D15) and keep it,
        a failure like a result (B14). ``lost``: the connection died under the run; a
        plain error is then the connection's doing, not the collector's, so it is
        neither counted against it nor cached, and the next pass runs it again."""
        self.stats.record(entry.outcome, duration=entry.duration, series=entry.series)
        blamed = not (lost and entry.outcome is Outcome.ERROR)
        if blamed and entry.outcome is not Outcome.CANCELLED:
            self._judge(entry, datname)
        if blamed:
            self.entry = entry

    def _judge(self, entry: Entry, datname: str) -> None:
        """Count one more failure in a row, or clear the count after a success (D15)."""
        previous = self.backoff or Backoff()
        self.backoff = None
        where = {"collector": self.collector.key, "datname": datname}
        if not entry.outcome.failed:
            if previous.backing_off:
                log.info("collector recovered after %d failures in a row", previous.failures,
                         extra=where)  # fmt: skip
            return
        ttl = 0.0 if self.rules.disable_cache else self.collector.ttl
        ceiling = ceiling_for(self.collector, self.rules.backoff_ceiling)
        backoff = after_failure(previous, entry.finished_at, ttl, ceiling, self.rules.random)
        self.backoff = backoff
        if backoff.backing_off and not previous.backing_off:
            log.warning(
                "collector backing off after %d failures in a row: next try in %.1fs, "
                "then up to twice as long after each failure, at most %gs",
                backoff.failures, backoff.wait, ceiling, extra=where,
            )  # fmt: skip

    def answer(self, predicate: Predicate, now: float) -> bool | None:
        """The predicate's cached answer while it holds; None when it must be asked."""
        cached = self.answers.get(predicate.name)
        if cached is None:
            return None
        if fresh_since(cached.asked_at, cached.ttl, now, disable_cache=self.rules.disable_cache):
            return cached.value
        return None

    def remember(self, predicate: Predicate, value: bool, now: float) -> None:
        """Keep an answer for the predicate's TTL, shortened at random by up to a tenth:
        answers cached together come due apart, not all in one pass (D17)."""
        ttl = spread(predicate.ttl, PERIOD_JITTER, self.rules.random)
        self.answers[predicate.name] = Answer(value, now, ttl)
