"""The request budget: how long one scrape may spend, and whether it should stop (B7–B10)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

#: The HTTP write limit: no scrape may take longer than this, header or not.
DEFAULT_BUDGET = 30.0
SCRAPE_TIMEOUT_HEADER = "X-Prometheus-Scrape-Timeout-Seconds"


def budget_seconds(header: str | None, default: float = DEFAULT_BUDGET) -> float:
    """The budget for a request: the header's value when it is a finite positive number
    below ``default``, else ``default`` (B7). Never raises."""
    if header is None:
        return default
    try:
        value = float(header.strip())
    except ValueError:
        return default
    if not math.isfinite(value) or value <= 0:
        return default
    return min(value, default)


def _never() -> bool:
    return False


@dataclass(frozen=True, slots=True)
class Budget:
    """A request's deadline on the monotonic clock, and a probe for its client."""

    deadline: float
    client_gone: Callable[[], bool] = field(default=_never)
    clock: Callable[[], float] = field(default=time.monotonic)

    @classmethod
    def starting_now(
        cls,
        seconds: float,
        client_gone: Callable[[], bool] = _never,
        clock: Callable[[], float] = time.monotonic,
    ) -> Budget:
        """A budget of ``seconds`` from now."""
        return cls(deadline=clock() + seconds, client_gone=client_gone, clock=clock)

    def remaining(self) -> float:
        """Seconds left (never negative)."""
        return max(0.0, self.deadline - self.clock())

    def interruption(self) -> str | None:
        """Why the request should stop now: ``"budget"``, ``"client"``, or None (B10)."""
        if self.client_gone():
            return "client"
        if self.clock() >= self.deadline:
            return "budget"
        return None
