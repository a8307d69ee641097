"""Collector result cache and per-collector statistics: plain data, no I/O.

A refresh, successful or not, records when it ended. A failed refresh stores an
empty result, so the collector stays empty for its TTL instead of being re-run
by every scrape (B14, D11); nothing stale is ever served as fresh (B15).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from exporter.exposition import Family


class Outcome(enum.Enum):
    """How one collector execution ended (D10)."""

    OK = "ok"
    CACHED = "cached"
    SKIPPED = "skipped"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    ERROR = "error"
    TOO_MANY_SERIES = "too_many_series"
    BACKOFF = "backoff"  # not run: failed several times in a row and still waiting (D15)
    SHED = "shed"  # not run: the breaker left it out of this pass (D16)
    # Served from its cache beyond its ttl, within the ttl the server-time budget stretched
    # it to (issue 31): a cache hit, counted apart.
    STRETCHED = "stretched"

    @property
    def failed(self) -> bool:
        """True for outcomes that count as collector errors."""
        return self in (Outcome.TIMEOUT, Outcome.CANCELLED, Outcome.ERROR, Outcome.TOO_MANY_SERIES)


@dataclass(frozen=True, slots=True)
class Entry:
    """The published result of one collector refresh on one database."""

    families: tuple[Family, ...]
    outcome: Outcome
    finished_at: float  # monotonic seconds
    duration: float
    series: int = 0
    error: str = ""


def is_fresh(entry: Entry | None, ttl: float, now: float, *, disable_cache: bool) -> bool:
    """True when ``entry`` may be served instead of running the collector again."""
    finished_at = entry.finished_at if entry is not None else None
    return fresh_since(finished_at, ttl, now, disable_cache=disable_cache)


def fresh_since(finished_at: float | None, ttl: float, now: float, *, disable_cache: bool) -> bool:
    """True when a result obtained at ``finished_at`` is still within ``ttl`` (B16)."""
    if finished_at is None or disable_cache or ttl <= 0:
        return False
    return now - finished_at < ttl


def ttl_left(entry: Entry | None, ttl: float, now: float) -> float:
    """Seconds until ``entry`` expires (0 when expired or absent)."""
    if entry is None or ttl <= 0:
        return 0.0
    return max(0.0, ttl - (now - entry.finished_at))


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
