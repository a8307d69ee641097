"""Freshness, the failure cache and collector statistics (B6, B14, B16, D10)."""

from __future__ import annotations

from exporter.collect.cache import Entry, Outcome, is_fresh, ttl_left


def _entry(at: float, outcome: Outcome = Outcome.OK) -> Entry:
    return Entry(families=(), outcome=outcome, finished_at=at, duration=0.01)


def test_fresh_within_ttl_only() -> None:
    """An entry is served from cache strictly within its TTL (B6)."""
    entry = _entry(100.0)
    assert is_fresh(entry, 10, 109.9, disable_cache=False)
    assert not is_fresh(entry, 10, 110.0, disable_cache=False)


def test_ttl_zero_and_disable_cache_always_refresh() -> None:
    """``ttl: 0`` and ``--disable-cache`` mean refresh on every pass (B16)."""
    entry = _entry(100.0)
    assert not is_fresh(entry, 0, 100.0, disable_cache=False)
    assert not is_fresh(entry, 60, 100.0, disable_cache=True)
    assert not is_fresh(None, 60, 100.0, disable_cache=False)


def test_failed_refresh_is_cached_for_its_ttl() -> None:
    """A failure entry counts as fresh, so the collector is not re-run within its TTL (B14)."""
    failed = _entry(100.0, Outcome.TIMEOUT)
    assert is_fresh(failed, 30, 120.0, disable_cache=False)
    assert not is_fresh(failed, 30, 130.0, disable_cache=False)


def test_ttl_left_counts_down_to_zero() -> None:
    """The remaining TTL shrinks with time and never goes negative."""
    entry = _entry(100.0)
    assert ttl_left(entry, 10, 104.0) == 6.0
    assert ttl_left(entry, 10, 200.0) == 0.0
    assert ttl_left(None, 10, 100.0) == 0.0
