"""One collector's runtime on one database, on the fake clock, without a database
(B6, B14, D15, D16, D17)."""

from __future__ import annotations

import logging

import pytest

from exporter.collect.cache import Entry, Outcome
from exporter.collect.runtime import CollectorRuntime, CollectorState, CollectorStats, Rules
from exporter.collect.server import Server, ServerOptions
from exporter.config.definitions import Collector, Definitions, Predicate
from tests.fixtures.clock import FakeClock

TTL = 10.0
CEILING = 300.0


class Draws:
    """A random source that returns what the test sets, and counts its calls."""

    def __init__(self, value: float = 0.5) -> None:
        self.value = value
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return self.value


def _collector(*, fatal: bool = False) -> Collector:
    return Collector(key="c", name="c", query="SELECT 1", columns=(), ttl=TTL, fatal=fatal)


def _runtime(
    draws: Draws | None = None, *, disable_cache: bool = False, fatal: bool = False
) -> CollectorRuntime:
    rules = Rules(disable_cache=disable_cache, backoff_ceiling=CEILING, random=draws or Draws())
    return CollectorRuntime(_collector(fatal=fatal), rules)


def _run(
    runtime: CollectorRuntime, clock: FakeClock, outcome: Outcome, *, lost: bool = False
) -> Entry:
    """One run that ended now with ``outcome``, settled."""
    entry = Entry((), outcome, clock.now, 0.25, error=outcome.value)
    runtime.settle(entry, lost=lost, datname="db")
    return entry


def _fail_until_backing_off(runtime: CollectorRuntime, clock: FakeClock) -> None:
    """Two timeouts in a row, each run when it is due: the second starts the back-off."""
    _run(runtime, clock, Outcome.TIMEOUT)
    clock.advance(TTL)
    _run(runtime, clock, Outcome.TIMEOUT)


def test_a_result_is_served_from_the_cache_within_its_ttl_only() -> None:
    """B6: within its TTL the cached entry is served and counted as a hit; at the TTL the
    collector runs again."""
    clock, runtime = FakeClock(), _runtime()
    ok = _run(runtime, clock, Outcome.OK)
    clock.advance(TTL - 0.1)
    assert runtime.hold(clock.now) is ok
    assert (runtime.stats.hits, runtime.stats.outcomes[Outcome.CACHED]) == (1, 1)
    clock.advance(0.1)
    assert runtime.hold(clock.now) is None


def test_disable_cache_runs_every_time() -> None:
    """B16: with --disable-cache a result just kept is not served."""
    clock, runtime = FakeClock(), _runtime(disable_cache=True)
    _run(runtime, clock, Outcome.OK)
    assert runtime.held_back(clock.now) is None


def test_a_failure_is_cached_like_a_result() -> None:
    """B14: a failed run is kept and served, empty, for the TTL instead of re-running."""
    clock, runtime = FakeClock(), _runtime()
    failed = _run(runtime, clock, Outcome.ERROR)
    clock.advance(TTL / 2)
    assert runtime.hold(clock.now) is failed
    assert runtime.stats.errors == 1
    assert runtime.entry is failed


def test_the_first_failure_waits_the_ttl_and_is_not_yet_a_back_off() -> None:
    """D15: one failure is only the failure cache (B14): no back-off state, no warning."""
    clock, runtime = FakeClock(), _runtime()
    _run(runtime, clock, Outcome.TIMEOUT)
    assert runtime.backoff is not None
    assert (runtime.backoff.failures, runtime.backoff.backing_off) == (1, False)
    assert runtime.backoff.retry_at == clock.now + TTL
    assert runtime.state is CollectorState.NORMAL


def test_failures_in_a_row_double_the_wait_up_to_the_ceiling() -> None:
    """D15: with the draw at its top each failure in a row doubles the wait (2, 4, 8 … TTLs)
    until the ceiling, and the collector is held back in BACKOFF until then."""
    clock, runtime = FakeClock(), _runtime(draws=Draws(0.999999))
    waits = []
    for _ in range(8):
        _run(runtime, clock, Outcome.TIMEOUT)
        assert runtime.backoff is not None
        waits.append(round(runtime.backoff.wait))
        clock.advance(runtime.backoff.wait)
    assert waits == [10, 20, 40, 80, 160, 300, 300, 300]


def test_a_collector_in_back_off_runs_nothing_and_publishes_nothing() -> None:
    """D15: past its TTL but before its retry time it is held back as BACKOFF, counted
    apart from hits and errors; at its retry time it runs."""
    clock, runtime = FakeClock(), _runtime(draws=Draws(0.999999))
    _fail_until_backing_off(runtime, clock)
    assert runtime.backoff is not None
    retry_at = runtime.backoff.retry_at
    clock.advance(TTL)  # the cached failure has expired
    held = runtime.hold(clock.now)
    assert held is not None
    assert (held.outcome, held.families) == (Outcome.BACKOFF, ())
    assert runtime.stats.outcomes[Outcome.BACKOFF] == 1
    assert runtime.state is CollectorState.BACKOFF
    assert runtime.retry_in(clock.now) == pytest.approx(retry_at - clock.now)
    clock.now = retry_at
    assert runtime.hold(clock.now) is None


@pytest.mark.parametrize("draw", [0.0, 0.3, 0.999999])
def test_the_back_off_jitter_stays_between_the_ttl_and_the_doubled_step(draw: float) -> None:
    """D15, D17: full jitter, drawn from the injected random source, never waits less than
    the TTL nor more than the doubled step."""
    draws = Draws(draw)
    clock, runtime = FakeClock(), _runtime(draws=draws)
    _fail_until_backing_off(runtime, clock)
    assert runtime.backoff is not None
    assert draws.calls == 1  # the first failure waits the TTL exactly: no draw
    assert TTL <= runtime.backoff.wait <= 2 * TTL
    assert runtime.backoff.wait == pytest.approx(max(TTL, draw * 2 * TTL))


def test_a_fatal_collector_never_backs_off() -> None:
    """D15: a fatal collector decides pg_up, so it follows the server at its TTL."""
    clock, runtime = FakeClock(), _runtime(draws=Draws(0.999999), fatal=True)
    for _ in range(4):
        _run(runtime, clock, Outcome.TIMEOUT)
        clock.advance(TTL)
    assert runtime.backoff is not None
    assert (runtime.backoff.failures, runtime.backoff.backing_off) == (4, False)
    assert runtime.hold(clock.now) is None


def test_a_success_ends_the_back_off_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """D15: entering back-off is logged once at WARNING, one success clears the count and
    is logged once at INFO, with the collector and database as fields."""
    clock, runtime = FakeClock(), _runtime(draws=Draws(0.999999))
    with caplog.at_level(logging.INFO, logger="exporter.collect.runtime"):
        _fail_until_backing_off(runtime, clock)
        assert runtime.backoff is not None
        clock.now = runtime.backoff.retry_at
        _run(runtime, clock, Outcome.TIMEOUT)  # a third failure: no second warning
        assert runtime.backoff is not None
        clock.now = runtime.backoff.retry_at
        _run(runtime, clock, Outcome.OK)
    assert runtime.backoff is None
    assert runtime.state is CollectorState.NORMAL
    said = [(r.levelno, r.getMessage().split(":")[0]) for r in caplog.records]
    assert said == [
        (logging.WARNING, "collector backing off after 2 failures in a row"),
        (logging.INFO, "collector recovered after 3 failures in a row"),
    ]
    assert {(getattr(r, "collector", ""), getattr(r, "datname", "")) for r in caplog.records} == {
        ("c", "db")
    }


def test_a_run_cut_short_with_its_request_is_no_verdict() -> None:
    """D15, B12: a cancelled run neither counts a failure nor clears one; it is kept (and
    counted as an error) like any result."""
    clock, runtime = FakeClock(), _runtime(draws=Draws(0.999999))
    _fail_until_backing_off(runtime, clock)
    before = runtime.backoff
    cancelled = _run(runtime, clock, Outcome.CANCELLED)
    assert runtime.backoff is before
    assert runtime.entry is cancelled
    fresh = _runtime()
    _run(fresh, clock, Outcome.CANCELLED)
    assert fresh.backoff is None


def test_a_plain_error_on_a_lost_connection_is_neither_cached_nor_counted() -> None:
    """D7, D8, D15: an error because the connection died is the connection's doing: the
    collector is not cached (it runs again on the next pass) and no failure is counted;
    its statistics still show the run."""
    clock, runtime = FakeClock(), _runtime()
    ok = _run(runtime, clock, Outcome.OK)
    clock.advance(TTL)
    _run(runtime, clock, Outcome.ERROR, lost=True)
    assert runtime.entry is ok
    assert runtime.backoff is None
    assert runtime.hold(clock.now) is None
    assert runtime.stats.errors == 1


def test_a_timeout_on_a_lost_connection_is_cached_and_counted() -> None:
    """B14, D11, D15: a timeout that took the connection with it is still the collector's:
    kept for the TTL and counted as a failure in a row."""
    clock, runtime = FakeClock(), _runtime()
    timeout = _run(runtime, clock, Outcome.TIMEOUT, lost=True)
    assert runtime.entry is timeout
    assert runtime.backoff is not None
    assert runtime.backoff.failures == 1
    assert runtime.held_back(clock.now) is Outcome.CACHED


def test_a_shed_collector_runs_nothing_but_a_fresh_cache_is_still_served() -> None:
    """D16: shed by the breaker it is held back as SHED and publishes nothing; a result
    still within its TTL is served as usual, since serving it costs the server nothing."""
    clock, runtime = FakeClock(), _runtime()
    held = runtime.hold(clock.now, shed=True)
    assert held is not None
    assert (held.outcome, held.families) == (Outcome.SHED, ())
    assert runtime.stats.outcomes == {Outcome.SHED: 1}
    ok = _run(runtime, clock, Outcome.OK)
    assert runtime.hold(clock.now, shed=True) is ok
    runtime.shed = True
    assert runtime.state is CollectorState.SHED


def test_a_predicate_answer_is_kept_for_its_jittered_ttl() -> None:
    """D17: an answer holds for the predicate's TTL shortened by up to a tenth at random,
    so answers cached together come due apart; ttl 0 asks every time."""
    clock, runtime = FakeClock(), _runtime(draws=Draws(0.5))
    daily = Predicate("p", "SELECT true", ttl=100.0)
    assert runtime.answer(daily, clock.now) is None
    runtime.remember(daily, False, clock.now)
    clock.advance(94.5)  # 100 less 5% (half of the tenth) is 95
    assert runtime.answer(daily, clock.now) is False
    clock.advance(0.5)
    assert runtime.answer(daily, clock.now) is None
    always = Predicate("q", "SELECT true", ttl=0.0)
    runtime.remember(always, True, clock.now)
    assert runtime.answer(always, clock.now) is None


def test_a_reload_forgets_every_runtime() -> None:
    """B6, D15: reloaded definitions start from fresh caches, statistics and back-offs: a
    changed collector must not serve the old one's result."""
    options = ServerOptions(url="postgresql:///x", connect_timeout=1.0, const_labels=(),
                            tags=(), disable_cache=False, max_series=100)  # fmt: skip
    collector = _collector()
    server = Server(None, options, Definitions((collector,)), is_main=True, clock=FakeClock())
    runtime = server.runtime(collector)
    runtime.settle(Entry((), Outcome.TIMEOUT, 1000.0, 0.1))
    assert server.runtime(collector) is runtime
    server.use(Definitions((collector,)))
    fresh = server.runtime(collector)
    assert fresh is not runtime
    assert (fresh.entry, fresh.backoff, fresh.ran) == (None, None, False)


def test_stats_classify_outcomes() -> None:
    """Hits, skips and failures are counted apart, each outcome separately (D10)."""
    stats = CollectorStats()
    stats.record(Outcome.OK, duration=0.2, series=7)
    stats.record(Outcome.CACHED)
    stats.record(Outcome.SKIPPED, duration=0.01)
    stats.record(Outcome.TIMEOUT, duration=1.0)
    stats.record(Outcome.TOO_MANY_SERIES, duration=0.5)
    assert (stats.total, stats.hits, stats.skips, stats.errors) == (5, 1, 1, 2)
    assert stats.outcomes[Outcome.TIMEOUT] == 1
    assert stats.last_duration == 0.5
    assert stats.series == 0


def test_held_back_collectors_are_counted_but_keep_their_last_figures() -> None:
    """A collector held back by its back-off or shed by the breaker is one more visit with
    its own outcome, neither a hit nor an error; its last run's figures stand (D10, D15,
    D16)."""
    stats = CollectorStats()
    stats.record(Outcome.OK, duration=0.2, series=7)
    stats.record(Outcome.BACKOFF)
    stats.record(Outcome.SHED)
    assert (stats.total, stats.hits, stats.errors) == (3, 0, 0)
    assert (stats.outcomes[Outcome.BACKOFF], stats.outcomes[Outcome.SHED]) == (1, 1)
    assert (stats.series, stats.last_duration) == (7, 0.2)
    assert (Outcome.BACKOFF.failed, Outcome.SHED.failed) == (False, False)
