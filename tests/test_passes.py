"""One collection pass without a database: a pass whose request is over before it
starts, how databases' results merge, what the breaker sheds and is told (D16), and the
counters behind the exporter self-metrics (B18). A pass that connects (the main database's
preflight, discovered databases walked beside it) is covered in tests/integration."""

from __future__ import annotations

import logging

import pytest

from exporter.collect.breaker import Breaker, BreakerPolicy, BreakerState
from exporter.collect.budget import Budget, Interruption
from exporter.collect.databases import Databases
from exporter.collect.passes import (
    CollectionPass,
    PassStats,
    RepeatedSeries,
    Snapshot,
    databases_budget,
)
from exporter.collect.seriescap import Part, SeriesCap
from exporter.collect.server import ServerResult
from exporter.config.definitions import Collector, Definitions
from exporter.config.settings import Settings
from exporter.expose.exposition import Family
from tests.fixtures.clock import FakeClock

COLLECTOR = Collector(key="a", name="a", query="SELECT 1", columns=())


def _pass(clock: FakeClock, breaker: Breaker | None = None) -> CollectionPass:
    settings = Settings(url="postgresql://127.0.0.1:1/main")
    databases = Databases(settings, Definitions((COLLECTOR,)), clock=clock, random=lambda: 0.5)

    def seen(in_recovery: bool) -> None:
        raise AssertionError("no preflight ran")

    return CollectionPass(databases, breaker or Breaker(random=lambda: 0.5), SeriesCap(0),
                          PassStats(), width=2, clock=clock, recovery_seen=seen)  # fmt: skip


def _family(name: str) -> Family:
    return Family(name=name, kind="gauge", help="", series=1)


async def test_a_pass_whose_budget_is_spent_connects_nothing_and_is_interrupted() -> None:
    """B10, B18: the budget ran out before the pass: nothing connects, the snapshot is
    interrupted, the pass is counted but not as an error, and the breaker takes it for
    no evidence against the server (D16): a client asking for a few microseconds, twice,
    must not make the target shed."""
    clock = FakeClock()
    walk = _pass(clock)
    budget = Budget.starting_now(1.0, clock=clock)
    clock.advance(1.0)
    snapshot = await walk.run(budget)
    assert (snapshot.families, snapshot.interrupted) == ([], Interruption.BUDGET)
    assert (walk.stats.scrapes, walk.stats.errors) == (1, 0)
    assert walk.databases.main.conn is None
    assert walk.databases.connections.opened == 0
    assert walk.breaker.streak == 0


async def test_a_pass_whose_client_left_is_neither_an_error_nor_distress() -> None:
    """A client that hung up says nothing about the server: interrupted, not an error,
    and the breaker's streak is untouched."""
    clock = FakeClock()
    walk = _pass(clock)
    snapshot = await walk.run(Budget.starting_now(60.0, client_gone=lambda: True, clock=clock))
    assert snapshot.interrupted is Interruption.CLIENT
    assert (walk.stats.scrapes, walk.stats.errors, walk.breaker.streak) == (1, 0, 0)


def test_merging_keeps_run_order_and_the_first_interruption() -> None:
    """Each database's parts follow the previous ones; the first interruption stands; a
    database with an error makes the pass failed (the tallies are judged apart, D16)."""
    snapshot, parts = Snapshot(families=[]), list[Part]()
    first = ServerResult(parts=[Part(COLLECTOR, (_family("x"),))])
    second = ServerResult(parts=[Part(COLLECTOR, (_family("y"),))], error="database b: down",
                          interrupted=Interruption.CLIENT)  # fmt: skip
    third = ServerResult(interrupted=Interruption.BUDGET)
    assert not CollectionPass._merge(first, snapshot, parts)
    assert CollectionPass._merge(second, snapshot, parts)
    assert not CollectionPass._merge(third, snapshot, parts)
    assert [f.name for part in parts for f in part.families] == ["x", "y"]
    assert snapshot.interrupted is Interruption.CLIENT


def test_a_degraded_breaker_sheds_its_level_until_its_cool_down_ends_then_probes() -> None:
    """D16: degraded, the pass sheds the breaker's level; once the cool-down is over the
    breaker probes with one level less."""
    clock = FakeClock()
    breaker = Breaker(BreakerPolicy(levels=3), lambda: 0.5, state=BreakerState.DEGRADED,
                      level=2, probe_at=clock.now + 5.0)  # fmt: skip
    walk = _pass(clock, breaker)
    assert (walk._shedding().level, walk._shedding().levels) == (2, 3)
    clock.advance(5.0)
    assert walk._shedding().level == 1
    assert breaker.state is BreakerState.PROBING


def test_only_a_failed_pass_that_was_not_interrupted_counts_as_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """B18: an interrupted pass is logged once at INFO with its reason, not counted as an
    error even when a database failed; a failed one is; each pass is counted with its
    duration on the clock."""
    clock = FakeClock()
    walk = _pass(clock)
    start = clock.now
    clock.advance(0.5)
    with caplog.at_level(logging.INFO, logger="exporter.collect.passes"):
        walk._account(start, failed=True, interrupted=Interruption.BUDGET)
    assert (walk.stats.scrapes, walk.stats.errors, walk.stats.last_duration) == (1, 0, 0.5)
    interrupted = [r for r in caplog.records if r.getMessage().startswith("collection round inter")]
    assert [(r.levelno, getattr(r, "reason", None)) for r in interrupted] == [
        (logging.INFO, "budget")
    ]
    walk._account(start, failed=True, interrupted=None)
    walk._account(start, failed=False, interrupted=None)
    assert (walk.stats.scrapes, walk.stats.errors) == (3, 1)
    assert walk.stats.last_scrape_time > 0  # wall clock, for people


def test_the_discovered_databases_deadline_keeps_a_tenth_of_the_budget_to_answer() -> None:
    """Issue 36: the discovered databases' parts end a tenth of the budget the pass found
    before the request's deadline; the client and the request's end are the request's."""
    clock = FakeClock()
    request = Budget.starting_now(10.0, clock=clock)
    clock.advance(2.0)
    theirs = databases_budget(request, clock.now)
    assert theirs.remaining() == pytest.approx(7.2)
    assert theirs.ended is request.ended
    clock.advance(7.2)
    assert (theirs.interruption(), request.interruption()) == (Interruption.BUDGET, None)
    request.ended.set()
    assert theirs.interruption() is Interruption.CLIENT


def test_repeated_series_are_left_out_and_logged_once_while_they_last(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 36, guarantee 8: a collector whose series another database already produced
    has them left out, the main database's kept; the log names the collector and both
    databases once, not at every pass, and again if the repeat comes back after it ended."""
    same = Family("a_v", "gauge", "", 1, b'a_v{k="1"} 1\n')
    other = Family("a_v", "gauge", "", 1, b'a_v{k="2"} 1\n')
    repeated = RepeatedSeries()
    parts, places = [Part(COLLECTOR, (same,)), Part(COLLECTOR, (same,))], ["main", "app"]
    with caplog.at_level(logging.WARNING, logger="exporter.collect.passes"):
        for _ in range(3):
            kept = repeated.apply(parts, places)
            assert kept == [parts[0], Part(COLLECTOR, ())]
        assert repeated.apply([parts[0], Part(COLLECTOR, (other,))], places)[1].series == 1
        repeated.apply(parts, places)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert "collector a on database app: 1 series (a_v)" in messages[0]
    assert "collector a on database main" in messages[0]
