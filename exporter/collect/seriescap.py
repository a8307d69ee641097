"""The exposition-wide series cap: whole collectors left out, least important first.

``--max-series`` bounds one collector run (D9); ``--max-total-series`` bounds what
one pass publishes over every database (issue 13), so that many databases times
per-table collectors cannot grow an exposition a Prometheus would choke on. When
the pass is over it, whole collectors are left out, never random series: the
highest ``priority`` number (the least important) first, then the last planned,
each on every database at once, until the rest fits. Choosing is a plain function.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from exporter.config.definitions import Collector
from exporter.expose.exposition import Family

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Part:
    """What one collector contributed to a pass on one database."""

    collector: Collector
    families: tuple[Family, ...]

    @property
    def series(self) -> int:
        """Series of this part."""
        return sum(family.series for family in self.families)


@dataclass(frozen=True, slots=True)
class Fitted:
    """A pass's families within the cap, and what was left out to get there."""

    families: list[Family]
    series: int  # published by collectors
    left_out: dict[str, int]  # collector name -> series left out, over every database


def fit(parts: Sequence[Part], limit: int) -> Fitted:
    """The parts' families, leaving out whole collectors until at most ``limit`` series
    remain (0: no limit); the least important (highest priority, then key) go first."""
    total = sum(part.series for part in parts)
    by_key: dict[str, tuple[Collector, int]] = {}
    for part in parts:
        collector, series = by_key.get(part.collector.key, (part.collector, 0))
        by_key[part.collector.key] = (collector, series + part.series)
    dropped: set[str] = set()
    left_out: dict[str, int] = {}
    ranked = sorted(by_key.values(), key=lambda cs: (cs[0].priority, cs[0].key), reverse=True)
    for collector, series in ranked:
        if not limit or total <= limit:
            break
        if series == 0:
            continue
        dropped.add(collector.key)
        left_out[collector.name] = left_out.get(collector.name, 0) + series
        total -= series
    families = [f for part in parts if part.collector.key not in dropped for f in part.families]
    return Fitted(families, total, left_out)


class SeriesCap:
    """The cap and what the last pass left out; says so in the log once per change."""

    def __init__(self, limit: int) -> None:
        self.limit = limit  # 0: no limit
        self.left_out: dict[str, int] = {}
        self.series = 0  # published by collectors at the last pass

    def apply(self, parts: Sequence[Part]) -> list[Family]:
        """The families to publish for this pass."""
        fitted = fit(parts, self.limit)
        if set(fitted.left_out) != set(self.left_out):
            self._log_change(fitted)
        self.left_out = fitted.left_out
        self.series = fitted.series
        return fitted.families

    def _log_change(self, fitted: Fitted) -> None:
        if not fitted.left_out:
            log.info("series budget: every collector is published again",
                     extra={"series": fitted.series, "limit": self.limit})  # fmt: skip
            return
        log.warning(
            "series budget of %d reached: leaving out collectors %s (%d series); raise "
            "--max-total-series, or narrow discovery or the collectors",
            self.limit,
            ",".join(sorted(fitted.left_out)),
            sum(fitted.left_out.values()),
            extra={"series": fitted.series, "limit": self.limit},
        )
