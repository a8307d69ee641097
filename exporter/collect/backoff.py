"""Per-collector and per-login back-off, bounded jitter: plain arithmetic, no I/O (D15, D17).

A failed collector is first kept empty for its TTL (B14). Each further failure in
a row doubles the wait, with full jitter, up to a ceiling; one success resets it.
The caller keeps one :class:`Backoff` per collector and database, and passes the
random source in, so tests can make it deterministic. A login the server refused
waits likewise before the next (:func:`exporter.pg.loginrate.login_wait`).
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.config.definitions import Collector
from exporter.pg.loginrate import Random

#: The doubling starts from the TTL, or from this for a shorter TTL (``ttl: 0`` included).
MIN_STEP = 1.0
#: Periodic work (predicate refreshes) comes due up to this fraction of its period early.
PERIOD_JITTER = 0.1
_MAX_DOUBLINGS = 40  # 2**40 s is beyond any ceiling: stops the float from growing for nothing


@dataclass(frozen=True, slots=True)
class Backoff:
    """Consecutive failures of one collector on one database, and when it may run again."""

    failures: int = 0
    retry_at: float = 0.0  # monotonic seconds; no attempt before this
    wait: float = 0.0  # the wait chosen after the last failure, in seconds
    backing_off: bool = False  # the wait may go beyond the TTL: failure 2 on, ceiling > 0


def ceiling_for(collector: Collector, default: float) -> float:
    """The collector's own ceiling, else ``default``; 0 for a ``fatal`` collector, which
    decides pg_up and must therefore follow the server at its TTL."""
    if collector.fatal:
        return 0.0
    return default if collector.backoff_ceiling is None else collector.backoff_ceiling


def wait_after(failures: int, ttl: float, ceiling: float, random: Random) -> float:
    """Seconds to wait after the ``failures``-th failure in a row (D15).

    The first waits the TTL, as the failure cache always did; from the second on the
    wait is drawn uniformly below ``step = min(ceiling, max(ttl, MIN_STEP) * 2**(n-1))``
    (full jitter), and never shorter than the TTL. A ceiling of 0 turns the doubling off.
    """
    if failures <= 1 or ceiling <= 0:
        return ttl
    doublings = min(failures - 1, _MAX_DOUBLINGS)
    step = min(ceiling, max(ttl, MIN_STEP) * 2.0**doublings)
    return max(ttl, random() * step)


def after_failure(
    previous: Backoff, finished_at: float, ttl: float, ceiling: float, random: Random
) -> Backoff:
    """The state after one more failure that ended at ``finished_at``."""
    failures = previous.failures + 1
    wait = wait_after(failures, ttl, ceiling, random)
    active = failures >= 2 and ceiling > 0
    return Backoff(failures=failures, retry_at=finished_at + wait, wait=wait, backing_off=active)


def retry_in(backoff: Backoff | None, now: float) -> float:
    """Seconds until a collector in back-off may run again (0 when it may run now)."""
    if backoff is None or not backoff.backing_off:
        return 0.0
    return max(0.0, backoff.retry_at - now)


def spread(period: float, fraction: float, random: Random) -> float:
    """``period`` shortened by up to ``fraction`` of itself, at random (D17).

    Never longer than asked for: a TTL is a promise about staleness, and a jittered
    one only comes due a little early, so work that started together drifts apart.
    """
    return period * (1.0 - fraction * random())
