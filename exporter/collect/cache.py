"""A collector's cached result and how its execution ended: plain data, no I/O.

A refresh, successful or not, records when it ended. A failed refresh stores an
empty result, so the collector stays empty for its TTL instead of being re-run
by every scrape (B14, D11); nothing stale is ever served as fresh (B15).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from exporter.expose.exposition import Family


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
