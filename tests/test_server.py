"""One scraped database without a database: its label, when it needs a connection at all
(issue 13), what it serves from its collectors' runtimes (B6, B14, D15, D16), and what a
reload resets. Connecting, the preflight and running SQL are covered in tests/integration."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from exporter.collect.breaker import NO_SHEDDING, PassTally, Shedding
from exporter.collect.budget import Budget, Interruption
from exporter.collect.cache import Entry, Outcome
from exporter.collect.planning import make_plan
from exporter.collect.seriescap import Part
from exporter.collect.server import Server, ServerOptions, ServerResult
from exporter.config.definitions import Collector, Definitions
from exporter.errors import FatalCollectorFailed
from exporter.expose.exposition import Family
from exporter.pg.preflight import ServerFacts
from exporter.pg.prepared import Prepared
from tests.fixtures.clock import FakeClock

TTL = 10.0
FACTS = ServerFacts(version=180000, in_recovery=False, datname="app", username="u")
OPTIONS = ServerOptions(url="postgresql://127.0.0.1:1/main", connect_timeout=1.0,
                        const_labels=(), tags=(), disable_cache=False, max_series=100)  # fmt: skip


def _collector(key: str, priority: int = 1, *, fatal: bool = False) -> Collector:
    return Collector(key=key, name=key, query="SELECT 1", columns=(), ttl=TTL,
                     priority=priority, fatal=fatal)  # fmt: skip


A, B = _collector("a", 1), _collector("b", 2)


def _discovered(clock: FakeClock, *collectors: Collector, up: bool = True) -> Server:
    """A discovered database that a previous pass planned (and found up or not)."""
    definitions = Definitions(collectors or (A, B))
    server = Server("app", OPTIONS, definitions, is_main=False, clock=clock, random=lambda: 0.999)
    server.plan = make_plan(definitions, FACTS, ())
    server.facts = FACTS
    server.up = up
    return server


def _ran(server: Server, collector: Collector, clock: FakeClock, outcome: Outcome) -> Entry:
    """One run of ``collector`` that ended now with ``outcome``, settled in its runtime."""
    family = Family(name=collector.key, kind="gauge", help="", series=1)
    families = (family,) if outcome is Outcome.OK else ()
    entry = Entry(families, outcome, clock.now, 0.1, series=len(families), error=outcome.value)
    server.runtime(collector).settle(entry, datname=server.label)
    return entry


def _far_budget(clock: FakeClock) -> Budget:
    return Budget.starting_now(60.0, clock=clock)


# --- the label ---------------------------------------------------------------------


def test_the_label_is_the_servers_name_then_the_given_one_then_the_urls() -> None:
    """Once the preflight has read it, the server's own name; before, the discovered name,
    else the URL's database; '' when the URL names none."""
    server = Server(None, OPTIONS, Definitions(()), is_main=True)
    assert server.label == "main"
    assert Server(None, replace(OPTIONS, url="host=h"), Definitions(()), is_main=True).label == ""
    named = Server("app", OPTIONS, Definitions(()), is_main=False)
    assert named.label == "app"
    named.facts = ServerFacts(version=180000, in_recovery=False, datname="App", username="u")
    assert named.label == "App"


# --- whether a connection is needed ------------------------------------------------


def test_the_main_database_always_needs_its_connection() -> None:
    """Even with every collector fresh, the main database's preflight says whether the
    target is up: it is always asked."""
    clock = FakeClock()
    server = _discovered(clock)
    server.is_main = True
    _ran(server, A, clock, Outcome.OK)
    _ran(server, B, clock, Outcome.OK)
    assert server._needs_connection(NO_SHEDDING)


def test_a_discovered_database_not_yet_planned_or_down_needs_its_connection() -> None:
    """No plan yet, or down at the last pass: connect, whatever the caches hold."""
    clock = FakeClock()
    unplanned = _discovered(clock)
    unplanned.plan = None
    assert unplanned._needs_connection(NO_SHEDDING)
    down = _discovered(clock, up=False)
    _ran(down, A, clock, Outcome.OK)
    _ran(down, B, clock, Outcome.OK)
    assert down._needs_connection(NO_SHEDDING)


def test_a_discovered_database_with_every_collector_fresh_is_not_connected() -> None:
    """Issue 13: all fresh in cache, no connection; one stale collector needs one."""
    clock = FakeClock()
    server = _discovered(clock)
    _ran(server, A, clock, Outcome.OK)
    assert server._needs_connection(NO_SHEDDING)  # b never ran
    _ran(server, B, clock, Outcome.OK)
    assert not server._needs_connection(NO_SHEDDING)
    clock.advance(TTL)
    assert server._needs_connection(NO_SHEDDING)


def test_collectors_backing_off_or_shed_need_no_connection() -> None:
    """D15, D16: a collector in back-off or left out by the breaker runs nothing."""
    clock = FakeClock()
    server = _discovered(clock)
    _ran(server, A, clock, Outcome.OK)
    _ran(server, B, clock, Outcome.TIMEOUT)
    clock.advance(TTL)
    _ran(server, B, clock, Outcome.TIMEOUT)  # second in a row: b backs off ~2 TTLs
    clock.advance(TTL)  # its cached failure has expired, its back-off has not
    _ran(server, A, clock, Outcome.OK)
    assert server.runtime(B).held_back(clock.now) is Outcome.BACKOFF
    assert not server._needs_connection(NO_SHEDDING)
    fresh = _discovered(clock)
    _ran(fresh, A, clock, Outcome.OK)  # b never ran, but the breaker sheds it
    assert fresh._needs_connection(NO_SHEDDING)
    assert not fresh._needs_connection(Shedding(level=2, levels=2))


# --- a walk served from the runtimes, without connecting ---------------------------


async def test_a_fresh_discovered_database_is_walked_from_its_cache_unconnected() -> None:
    """Every collector fresh: the walk publishes the cached families in run order, sets
    ``ready``, and opens no connection."""
    clock = FakeClock()
    server = _discovered(clock)
    ok_b, ok_a = _ran(server, B, clock, Outcome.OK), _ran(server, A, clock, Outcome.OK)
    ready = asyncio.Event()
    result = await server.scrape(_far_budget(clock), NO_SHEDDING, ready)
    assert result.families == [*ok_a.families, *ok_b.families]
    assert (result.error, result.interrupted, result.tally.executed) == ("", None, 0)
    assert ready.is_set()
    assert (server.conn, server.connections.opened) == (None, 0)
    assert (server.scrape_count, server.error_count) == (1, 0)


async def test_a_cached_fatal_failure_keeps_the_database_down_for_its_ttl() -> None:
    """B14: a fatal collector's failure is served from the cache, so the database is down
    and publishes nothing until the TTL ends, without running it again."""
    clock = FakeClock()
    fatal = _collector("f", 5, fatal=True)  # after a: what a published is dropped too
    server = _discovered(clock, A, fatal)
    _ran(server, fatal, clock, Outcome.ERROR)
    _ran(server, A, clock, Outcome.OK)
    result = await server.scrape(_far_budget(clock))
    assert "fatal collector f failed on app: error" in result.error
    assert (result.parts, server.up, server.error_count) == ([], False, 1)


async def test_a_shed_collector_is_counted_and_remembered_as_shed() -> None:
    """D16: what the breaker leaves out is in the pass's tally and in ``shed`` until the
    next pass, and publishes nothing."""
    clock = FakeClock()
    server = _discovered(clock)
    _ran(server, A, clock, Outcome.OK)
    result = await server.scrape(_far_budget(clock), Shedding(level=2, levels=2))
    assert result.tally.shed == ["b"]
    assert server.shed == ("b",)
    assert [part.collector.key for part in result.parts] == ["a", "b"]
    assert result.parts[1].families == ()


async def test_a_walk_whose_request_has_ended_does_nothing() -> None:
    """B10: a request already over interrupts the walk before it connects; that is an
    interrupted walk, not an error."""
    clock = FakeClock()
    server = Server(None, OPTIONS, Definitions((A,)), is_main=True, clock=clock)
    budget = Budget.starting_now(1.0, clock=clock)
    clock.advance(1.0)
    result = await server.scrape(budget)
    assert (result.interrupted, result.error, result.parts) == (Interruption.BUDGET, "", [])
    assert (server.conn, server.scrape_count, server.error_count) == (None, 1, 0)


async def test_a_fatal_collector_held_in_the_cache_raises_from_collect() -> None:
    """collect() serves the cached failure of a fatal collector as a failure."""
    clock = FakeClock()
    fatal = _collector("f", fatal=True)
    server = _discovered(clock, fatal)
    _ran(server, fatal, clock, Outcome.TIMEOUT)
    with pytest.raises(FatalCollectorFailed, match="fatal collector f failed on app"):
        await server.collect(fatal, _far_budget(clock), PassTally())


# --- results and reloads -----------------------------------------------------------


def test_a_results_families_are_every_parts_in_run_order() -> None:
    """ServerResult.families flattens the parts in the order the collectors ran."""
    one, two, three = (Family(name=n, kind="gauge", help="", series=1) for n in "xyz")
    result = ServerResult(parts=[Part(B, (one, two)), Part(A, ()), Part(A, (three,))])
    assert result.families == [one, two, three]


def test_a_reload_drops_the_plan_the_runtimes_and_what_was_prepared() -> None:
    """A changed collector must not serve the old one's result: plan again, fresh
    runtimes, prepared statements dropped on their next use."""
    clock = FakeClock()
    server = _discovered(clock)
    _ran(server, A, clock, Outcome.OK)
    server.session.prepared = Prepared(object(), names={"pgx_a"})
    reloaded = Definitions((B,))
    server.use(reloaded)
    assert (server.definitions, server.plan, server.runtimes) == (reloaded, None, {})
    assert server.session.prepared.obsolete
