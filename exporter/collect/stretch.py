"""Which collectors to refresh less often, and how much less, so that the exporter's
statements keep within a server-time budget (issue 31): pure arithmetic on each
collector's :class:`Demand`, read off its runtime by :mod:`exporter.collect.servertime`.

A stretch multiplies the period a collector runs at by 2, 4, 8, … up to its ceiling;
:func:`allocate` stretches as little as it takes, the least important first, and
:func:`decide` keeps a plan between passes unless it no longer fits or a lighter one fits
well (hysteresis).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

#: A plan is relaxed only for one that fits this share of the budget: costs that hover at
#: the budget do not stretch and relax a collector at every other pass.
LOW_WATER = 0.8
AT_CEILING = math.inf  # the factor of a collector stretched as far as its ceiling allows
_EPSILON = 1e-9  # seconds per second: a deficit below this is none

Key = tuple[str, str]  # (database, branch key)
Stretches = Mapping[Key, float]  # the stretch factor of each stretched collector


@dataclass(frozen=True, slots=True)
class Demand:
    """One collector's claim on the server's time, as the last pass left it."""

    key: Key
    tier: int  # 1: the third the breaker sheds first; higher is more important
    cost: float  # seconds its last run took
    ttl: float  # its ttl in force (0 under --disable-cache)
    interval: float  # seconds between passes
    ceiling: float  # the longest it may be held back (D15), and so stretched
    wait: float = 0.0  # the back-off it is serving: never multiplied by a stretch

    @property
    def base(self) -> float:
        """Seconds between its runs unstretched: its ttl, at least the pass interval."""
        return max(self.ttl, self.interval)

    def period(self, factor: float) -> float:
        """Seconds between its runs stretched by ``factor``, at most its ceiling."""
        return self.base if factor <= 1.0 else min(self.ceiling, self.base * factor)

    def effective_ttl(self, factor: float) -> float:
        """The ttl that makes it run every :meth:`period`: half a pass interval short of
        it, so that the pass falling due runs it, though passes come a little early or
        late, and a result is never held a whole pass beyond its ceiling."""
        return self.period(factor) - self.interval / 2

    def rate(self, factor: float = 1.0) -> float:
        """Seconds of server time per second it takes, stretched by ``factor``."""
        return self.cost / max(self.period(factor), self.wait, _EPSILON)

    def saving(self, factor: float) -> float:
        """Seconds per second stretching it by ``factor`` saves."""
        return self.rate() - self.rate(factor)

    def factors(self) -> Iterator[float]:
        """The stretches it may take: 2, 4, 8, … while within its ceiling, then the
        ceiling itself; none when the ceiling is shorter than twice its base (a ``fatal``
        collector's is 0)."""
        if self.ceiling < 2 * self.base:
            return
        factor = 2.0
        while self.base * factor < self.ceiling:
            yield factor
            factor *= 2.0
        yield AT_CEILING


def predicted(demands: Iterable[Demand], overhead: float, plan: Stretches) -> float:
    """Seconds per second the collectors and the preflights take under ``plan``."""
    return overhead + sum(d.rate(plan.get(d.key, 1.0)) for d in demands)


def saving(demands: Iterable[Demand], plan: Stretches) -> float:
    """Seconds per second ``plan`` saves."""
    return sum(d.saving(plan[d.key]) for d in demands if d.key in plan)


def stretch_order(demands: Iterable[Demand]) -> list[Demand]:
    """The least important tier first, the costliest first within it."""
    return sorted(demands, key=lambda d: (d.tier, -d.rate(), d.key))


def allocate(demands: Sequence[Demand], overhead: float, target: float) -> dict[Key, float]:
    """The least stretching, in :func:`stretch_order`, that brings what the statements
    take to ``target`` or below: each collector as far as needed, up to its ceiling,
    before the next is touched; as close as the ceilings allow when nothing fits."""
    deficit = predicted(demands, overhead, {}) - target
    plan: dict[Key, float] = {}
    for demand in stretch_order(demands):
        if deficit <= _EPSILON:
            break
        factor = _enough(demand, deficit)
        if factor is not None:
            plan[demand.key] = factor
            deficit -= demand.saving(factor)
    return plan


def _enough(demand: Demand, deficit: float) -> float | None:
    """The smallest factor of ``demand`` that saves ``deficit``, else its largest; None
    when stretching it saves nothing."""
    last = None
    for factor in demand.factors():
        last = factor
        if demand.saving(factor) >= deficit:
            break
    return last if last is not None and demand.saving(last) > 0 else None


@dataclass(frozen=True, slots=True)
class Decision:
    """The plan for the next pass, and the last one as it still applies."""

    plan: dict[Key, float]
    kept: dict[Key, float]  # the last plan, less the collectors that no longer cost anything
    relaxing: bool  # the plan stretches less than the kept one, which fits the budget too


def decide(
    demands: Sequence[Demand], overhead: float, budget: float, previous: Stretches
) -> Decision:
    """The plan for the next pass, from the last one (hysteresis): stretched further when
    the last no longer fits the budget, relaxed when a lighter plan fits ``LOW_WATER`` of
    it, kept otherwise. No budget (0) stretches nothing."""
    live = {d.key for d in demands if d.rate() > 0}  # a shed or idle collector costs nothing
    kept = {key: factor for key, factor in previous.items() if key in live}
    if budget <= 0:
        return Decision({}, kept, relaxing=bool(kept))
    if predicted(demands, overhead, kept) > budget:
        return Decision(allocate(demands, overhead, budget), kept, relaxing=False)
    relaxed = allocate(demands, overhead, budget * LOW_WATER)
    if saving(demands, relaxed) < saving(demands, kept):
        return Decision(relaxed, kept, relaxing=True)
    return Decision(kept, kept, relaxing=False)
