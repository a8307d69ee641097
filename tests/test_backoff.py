"""Per-collector back-off and bounded jitter, as plain arithmetic (D15, D17)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from exporter.collect.backoff import (
    MIN_STEP,
    Backoff,
    after_failure,
    ceiling_for,
    retry_in,
    spread,
    wait_after,
)
from exporter.config.definitions import Collector


def _top() -> float:
    return 0.999999


def _bottom() -> float:
    return 0.0


def test_first_failure_waits_the_ttl_exactly() -> None:
    """The first failure in a row is kept for the TTL, as the failure cache always did."""
    assert wait_after(1, 60.0, 600.0, _top) == 60.0
    assert wait_after(1, 0.0, 600.0, _top) == 0.0


def test_each_further_failure_doubles_the_upper_bound_up_to_the_ceiling() -> None:
    """With the random draw at its top, waits are 2, 4, 8 … TTLs, then the ceiling."""
    waits = [wait_after(n, 10.0, 300.0, _top) for n in range(2, 8)]
    assert waits == pytest.approx([20.0, 40.0, 80.0, 160.0, 300.0, 300.0], rel=1e-5)


def test_full_jitter_never_goes_below_the_ttl() -> None:
    """A draw of 0 still waits the TTL: a failure is always remembered that long (B14)."""
    assert wait_after(5, 10.0, 600.0, _bottom) == 10.0


def test_a_short_ttl_doubles_from_one_second() -> None:
    """``ttl: 0`` backs off too: its doubling starts from MIN_STEP."""
    assert wait_after(2, 0.0, 600.0, _top) == pytest.approx(2 * MIN_STEP, rel=1e-5)
    assert wait_after(4, 0.0, 600.0, _top) == pytest.approx(8 * MIN_STEP, rel=1e-5)


def test_ceiling_zero_means_ttl_only() -> None:
    """A ceiling of 0 turns the doubling off: every failure waits the TTL."""
    assert [wait_after(n, 5.0, 0.0, _top) for n in (1, 2, 9)] == [5.0, 5.0, 5.0]


def test_a_long_run_of_failures_stays_at_the_ceiling() -> None:
    """However many failures, the wait is finite and capped."""
    assert wait_after(10_000, 1.0, 600.0, _top) == pytest.approx(600.0, rel=1e-5)


def test_draws_are_spread_over_the_whole_range() -> None:
    """Full jitter: many draws for one step cover it from the TTL to the step."""
    rng = random.Random(7)
    waits = [wait_after(6, 1.0, 600.0, rng.random) for _ in range(500)]
    assert min(waits) == 1.0  # the floor is hit (draws below the TTL)
    assert 30.0 < max(waits) <= 32.0
    assert len(set(waits)) > 400


def test_after_failure_counts_and_schedules() -> None:
    """Each failure adds one and sets the next allowed attempt from when it ended."""
    first = after_failure(Backoff(), 100.0, 10.0, 600.0, _top)
    assert (first.failures, first.retry_at, first.backing_off) == (1, 110.0, False)
    second = after_failure(first, 110.0, 10.0, 600.0, _top)
    assert (second.failures, second.backing_off) == (2, True)
    assert second.retry_at == pytest.approx(130.0, rel=1e-5)


def test_retry_in_counts_only_a_wait_beyond_the_ttl() -> None:
    """Within the TTL the cache explains the wait; /stat shows back-off only from failure 2."""
    assert retry_in(None, 0.0) == 0.0
    assert retry_in(Backoff(failures=1, retry_at=50.0), 10.0) == 0.0
    assert retry_in(Backoff(failures=3, retry_at=50.0, backing_off=True), 10.0) == 40.0
    assert retry_in(Backoff(failures=3, retry_at=50.0, backing_off=True), 60.0) == 0.0


def test_a_ceiling_of_zero_never_backs_off() -> None:
    """With the doubling off, failures are counted but the state stays normal."""
    state = Backoff()
    for at in (0.0, 5.0, 10.0):
        state = after_failure(state, at, 5.0, 0.0, _top)
    assert (state.failures, state.backing_off, state.retry_at) == (3, False, 15.0)


def test_spread_shortens_by_at_most_the_fraction() -> None:
    """Jittered periods differ, come due early by at most the fraction, never late (D17)."""
    rng = random.Random(3)
    periods = [spread(60.0, 0.1, rng.random) for _ in range(200)]
    assert all(54.0 <= p <= 60.0 for p in periods)
    assert len(set(periods)) == 200
    assert max(periods) - min(periods) > 5.0


def test_the_collector_ceiling_wins_and_fatal_collectors_never_back_off() -> None:
    """A collector's backoff_ceiling overrides the global one; a fatal collector waits its
    TTL only, so pg_up follows the server."""
    plain = Collector(key="c", name="c", query="SELECT 1", columns=())
    assert ceiling_for(plain, 600.0) == 600.0
    assert ceiling_for(replace(plain, backoff_ceiling=30.0), 600.0) == 30.0
    assert ceiling_for(replace(plain, backoff_ceiling=30.0, fatal=True), 600.0) == 0.0
