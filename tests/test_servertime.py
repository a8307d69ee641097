"""The server-time budget without a database, on the fake clock (issue 31): the meter, each
collector's demand read off its runtime, the target's plan and what it logs and says, and
how a stretch holds a collector's runtime beside its ttl, its back-off and the breaker.
Which collectors a plan stretches and how far: tests/test_stretch.py."""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field

import pytest

from exporter.collect.breaker import NO_SHEDDING, Shedding
from exporter.collect.cache import Entry, Outcome
from exporter.collect.planning import Plan
from exporter.collect.runtime import CollectorRuntime, CollectorState, Rules
from exporter.collect.servertime import (
    COST_WEIGHT,
    RECENT,
    RELAX_AFTER,
    SETTLE,
    ServerTimeBudget,
    ServerTimeMeter,
    demands_of,
    tier,
)
from exporter.collect.stretch import AT_CEILING
from exporter.config.definitions import Collector
from exporter.pg.preflight import ServerFacts
from tests.fixtures.clock import FakeClock

FACTS = ServerFacts(version=180000, in_recovery=False, datname="db", username="u")


# --- the meter ------------------------------------------------------------------------


def test_the_rate_is_what_the_passes_of_the_window_spent_over_its_length() -> None:
    """Seconds spent by the passes that started in the window, over the window, or over
    the time since the first pass while that is shorter; none before a second."""
    meter = ServerTimeMeter(window=100.0)
    assert meter.rate(0.0) is None
    meter.record(0.0, 2.0, 0.1)
    assert meter.rate(0.5) is None
    meter.record(10.0, 1.0, 0.1)
    assert meter.rate(20.0) == pytest.approx(3.0 / 20.0)
    meter.record(90.0, 1.0, 0.1)
    assert meter.rate(105.0) == pytest.approx(2.0 / 100.0)  # the first pass left the window
    assert meter.total == pytest.approx(4.0)  # the counter keeps every pass


def test_the_interval_is_the_mean_gap_of_the_recent_passes_so_a_burst_ages_out() -> None:
    """Ten passes 0.1 s apart, then passes 15 s apart: the interval is the burst's while it
    lasts, and 15 s once RECENT passes came after it, long before it leaves the window."""
    meter = ServerTimeMeter(window=300.0)
    assert meter.interval(0.0) is None
    now = 0.0
    for _ in range(10):
        meter.record(now, 0.1, 0.0)
        now += 0.1
    assert meter.interval(now) == pytest.approx(0.1)
    for _ in range(RECENT):
        now += 15.0
        meter.record(now, 0.1, 0.0)
    assert meter.interval(now) == pytest.approx(15.0)


def test_the_overhead_is_the_preflights_mean_per_pass() -> None:
    """What no stretch saves: the preflights, per pass, over the window."""
    meter = ServerTimeMeter(window=100.0)
    for start, overhead in ((0.0, 0.004), (10.0, 0.002)):
        meter.record(start, 0.05, overhead)
    assert meter.overhead(10.0) == pytest.approx(0.003)


# --- reading the runtimes -------------------------------------------------------------


def _collector(key: str, *, priority: int, ttl: float = 0.0, fatal: bool = False,
               ceiling: float | None = None) -> Collector:  # fmt: skip
    return Collector(key=key, name=key, query="SELECT 1", columns=(), ttl=ttl,
                     priority=priority, fatal=fatal, backoff_ceiling=ceiling)  # fmt: skip


def test_tiers_follow_the_breakers_thirds() -> None:
    """Tier n is the shedding level that first leaves a collector out; the first non-fatal
    collector and the fatal ones, never shed, are in the last tier."""
    from exporter.collect.breaker import shed_cut

    order = [_collector(f"c{i}", priority=100 + i) for i in range(6)]
    order.append(_collector("f", priority=99, fatal=True))
    cuts = [shed_cut(order, level, 3) for level in (1, 2, 3)]
    assert [tier(c, cuts) for c in order] == [4, 3, 2, 2, 1, 1, 4]


@dataclass
class _Database:
    """What the budget reads of a Server: its label, plan and runtimes."""

    label: str
    plan: Plan
    runtimes: dict[str, CollectorRuntime] = field(default_factory=dict)


def _ran(runtime: CollectorRuntime, clock: FakeClock, took: float) -> CollectorRuntime:
    runtime.settle(Entry((), Outcome.OK, clock.now, took))
    return runtime


def _database(clock: FakeClock, collectors: list[Collector], costs: list[float],
              rules: Rules | None = None) -> _Database:  # fmt: skip
    plan = Plan(FACTS, tuple(sorted(collectors, key=lambda c: (c.priority, c.key))), ())
    database = _Database("db", plan)
    for collector, took in zip(collectors, costs, strict=True):
        runtime = CollectorRuntime(collector, rules or Rules())
        database.runtimes[collector.key] = _ran(runtime, clock, took)
    return database


def test_demands_read_cost_ttl_ceiling_and_back_off_from_the_runtimes() -> None:
    """Each collector's last duration is its cost, its ttl (0 under --disable-cache) its
    base, its back-off ceiling the limit; the breaker's shedding makes it cost nothing."""
    clock = FakeClock()
    own = _collector("own", priority=101, ttl=60.0, ceiling=120.0)
    shed = _collector("shed", priority=102, ttl=10.0)
    database = _database(clock, [own, shed], [0.5, 0.2])
    planned = database.plan.planned
    by_key = {d.key[1]: d for d in demands_of(database, planned, NO_SHEDDING, 15.0)}
    assert (by_key["own"].cost, by_key["own"].base, by_key["own"].ceiling) == (0.5, 60.0, 120.0)
    assert (by_key["shed"].base, by_key["shed"].ceiling) == (15.0, 600.0)
    shedding = Shedding(level=2)  # keeps the first third of two: the first
    assert {d.key[1]: d.cost for d in demands_of(database, planned, shedding, 15.0)} == {
        "own": 0.5, "shed": 0.0,
    }  # fmt: skip
    uncached = _database(clock, [own], [0.5], Rules(disable_cache=True))
    (demand,) = demands_of(uncached, planned[:1], NO_SHEDDING, 15.0)
    assert demand.base == 15.0


# --- the target's budget --------------------------------------------------------------


def _passes(budget: ServerTimeBudget, clock: FakeClock, spent: float, count: int = 0) -> None:
    """``count`` passes a second apart, by default enough for the budget to act (SETTLE)."""
    for _ in range(count or int(SETTLE) + 2):
        budget.record(clock.now, spent, 0.0)
        clock.advance(1.0)


def test_the_budget_stretches_the_expensive_collector_not_the_fatal_and_logs_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A pass a second; a fatal collector costing 20 ms and an expensive one costing 200 ms
    against a budget of 100 ms a second: the expensive one is stretched (WARNING, once),
    the fatal one never; the runtimes carry the effective ttl; costs falling relax it
    (INFO, once)."""
    clock = FakeClock()
    fatal = _collector("up", priority=100, fatal=True)
    dear = _collector("dear", priority=101, ttl=1.0)
    database = _database(clock, [fatal, dear], [0.02, 0.2])
    budget = ServerTimeBudget(100.0, random=lambda: 0.5)
    budget.begin(clock.now, [database], NO_SHEDDING)  # no interval yet: nothing decided
    assert not budget.decided
    assert budget.describe(clock.now).endswith("not measured yet: it acts after 30s of passes")
    _passes(budget, clock, 0.22)
    caplog.set_level(logging.INFO, logger="exporter.collect.servertime")
    for _ in range(3):
        budget.begin(clock.now, [database], NO_SHEDDING)
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "db/dear every 4s (ttl 1s)" in caplog.records[0].getMessage()
    # Its first stretched period ends at random (half of it, drawn 0.5), then full ones:
    # 4 s less half a pass.
    assert database.runtimes["dear"].stretch == pytest.approx(1.75)
    _ran(database.runtimes["dear"], clock, 0.2)
    budget.begin(clock.now, [database], NO_SHEDDING)
    assert database.runtimes["dear"].stretch == pytest.approx(3.5)
    assert database.runtimes["up"].stretch == 0.0
    assert budget.demand == pytest.approx(0.22)
    assert budget.planned == pytest.approx(0.07)
    assert "dear (ttl 1s, refreshed every 4s)" in budget.stretched_on("db")
    caplog.clear()
    plans, lighter_at = [dict(budget.plan)], None
    for second in range(int(RELAX_AFTER) * 3):  # its runs get cheap: relaxed, slowly
        clock.advance(1.0)
        _ran(database.runtimes["dear"], clock, 0.03)
        budget.begin(clock.now, [database], NO_SHEDDING)
        if lighter_at is None and budget.lighter_since is not None:
            lighter_at = second
        plans.append(dict(budget.plan))
    changes = [i for i, (a, b) in enumerate(itertools.pairwise(plans)) if a != b]
    assert lighter_at is not None
    assert changes[0] >= lighter_at + RELAX_AFTER  # not before a lighter plan fitted so long
    assert [r.levelno for r in caplog.records] == [logging.INFO] * len(changes)  # relaxing
    assert database.runtimes["dear"].stretch == 0.0
    assert "nothing stretched" in budget.describe(clock.now)


def test_one_slow_run_does_not_restretch_what_the_others_settled() -> None:
    """A collector's cost is smoothed over its runs (COST_WEIGHT): one run three times as
    slow as usual (a lock, a busy client) moves it by half, not threefold; a pass without
    a new run leaves it as it was."""
    clock = FakeClock()
    dear = _collector("dear", priority=101)
    database = _database(clock, [dear], [0.1])
    budget = ServerTimeBudget(200.0)
    _passes(budget, clock, 0.1)
    budget.begin(clock.now, [database], NO_SHEDDING)
    assert budget.demand == pytest.approx(0.1)
    clock.advance(1.0)
    _ran(database.runtimes["dear"], clock, 0.3)
    budget.begin(clock.now, [database], NO_SHEDDING)
    assert budget.demand == pytest.approx(0.1 + COST_WEIGHT * 0.2)
    assert budget.plan == {}
    budget.begin(clock.now, [database], NO_SHEDDING)
    assert budget.demand == pytest.approx(0.1 + COST_WEIGHT * 0.2)


def test_a_few_scrapes_in_a_row_are_no_rate_yet() -> None:
    """Passes back to back over less than SETTLE seconds (a person with curl, a test) decide
    nothing, however much they cost a second; once they span SETTLE, the budget acts."""
    clock = FakeClock()
    database = _database(clock, [_collector("dear", priority=101)], [0.5])
    budget = ServerTimeBudget(100.0)
    for _ in range(int(SETTLE) * 10):  # every 0.1 s: 5 s of server time a second
        budget.record(clock.now, 0.5, 0.0)
        budget.begin(clock.now, [database], NO_SHEDDING)
        assert budget.plan == {}
        clock.advance(0.1)
    budget.record(clock.now, 0.5, 0.0)
    budget.begin(clock.now, [database], NO_SHEDDING)
    assert budget.plan != {}


def test_over_the_budget_even_so_is_said() -> None:
    """A fatal collector alone over the budget: the other is at its ceiling and the words
    say the budget is still exceeded."""
    clock = FakeClock()
    fatal = _collector("up", priority=100, fatal=True)
    other = _collector("other", priority=101, ceiling=4.0)
    database = _database(clock, [fatal, other], [0.5, 0.5])
    budget = ServerTimeBudget(100.0, random=lambda: 0.999)
    _passes(budget, clock, 1.0)
    budget.begin(clock.now, [database], NO_SHEDDING)
    assert budget.plan == {("db", "other"): AT_CEILING}
    assert database.runtimes["other"].stretch == pytest.approx(3.5 * 0.999)
    assert "over the budget even so" in budget.describe(clock.now)


def test_collectors_stretched_together_come_due_apart() -> None:
    """D17: ten collectors stretched at one pass, having run at one pass, get first periods
    drawn within the full one, so their runs spread over it instead of coming due at one
    pass each period; a collector stretched before keeps its phase."""
    clock = FakeClock()
    collectors = [_collector(f"c{i}", priority=101 + i) for i in range(10)]
    database = _database(clock, collectors, [0.1] * 10)
    draws = iter(i / 10 for i in range(1, 11))
    budget = ServerTimeBudget(100.0, random=lambda: next(draws))
    _passes(budget, clock, 1.0)
    budget.begin(clock.now, [database], NO_SHEDDING)
    stretches = sorted(r.stretch for r in database.runtimes.values())
    assert len(set(stretches)) == 10
    assert stretches[0] < stretches[-1] / 4
    for c in collectors:  # each within its full stretch
        assert 0 < database.runtimes[c.key].stretch <= budget.effective_ttl(("db", c.key))
    budget.begin(clock.now, [database], NO_SHEDDING)  # no run since: the same first periods
    assert sorted(r.stretch for r in database.runtimes.values()) == stretches


def test_without_a_budget_the_demand_is_still_measured() -> None:
    """--server.time-budget 0: nothing is stretched, but what the collectors take is known,
    to choose a budget from."""
    clock = FakeClock()
    database = _database(clock, [_collector("dear", priority=101)], [0.5])
    budget = ServerTimeBudget(0.0)
    _passes(budget, clock, 0.5)
    budget.begin(clock.now, [database], NO_SHEDDING)
    assert budget.plan == {}
    assert database.runtimes["dear"].stretch == 0.0
    assert budget.demand == pytest.approx(0.5)
    assert budget.describe(clock.now).startswith("none (--server.time-budget 0); measured")


# --- a stretched runtime --------------------------------------------------------------


def _stretched(clock: FakeClock, *, disable_cache: bool = False) -> CollectorRuntime:
    rules = Rules(disable_cache=disable_cache, random=lambda: 0.999)
    runtime = CollectorRuntime(_collector("c", priority=101, ttl=10.0), rules)
    _ran(runtime, clock, 0.3)
    runtime.stretch = 40.0
    return runtime


def test_a_stretched_collector_serves_its_result_until_its_stretched_ttl() -> None:
    """Within its ttl: cached; beyond it and within the stretch: served from the cache as
    ``stretched`` (a cache hit, counted apart); beyond the stretch it runs."""
    clock = FakeClock()
    runtime = _stretched(clock)
    entry = runtime.entry
    clock.advance(5.0)
    assert runtime.hold(clock.now) is entry
    clock.advance(20.0)
    assert runtime.held_back(clock.now) is Outcome.STRETCHED
    assert runtime.hold(clock.now) is entry
    assert runtime.stats.hits == 2
    assert runtime.stats.outcomes[Outcome.STRETCHED] == 1
    assert runtime.state is CollectorState.STRETCHED
    assert runtime.ttl == 40.0
    clock.advance(15.0)
    assert runtime.held_back(clock.now) is None


def test_the_stretch_holds_under_disable_cache() -> None:
    """B16: --disable-cache runs every collector each pass, except what is held back: a
    stretched collector serves its last result within its stretched ttl."""
    clock = FakeClock()
    runtime = _stretched(clock, disable_cache=True)
    clock.advance(1.0)
    assert runtime.held_back(clock.now) is Outcome.STRETCHED
    clock.advance(40.0)
    assert runtime.held_back(clock.now) is None


def test_a_stretched_collector_in_back_off_waits_for_the_later_of_the_two() -> None:
    """D15: after two failures in a row it waits 19.98 s (jitter 0.999 of 20 s); the
    stretch counts from the same last run, so it runs once the later of the two is over,
    never after their sum or product."""
    clock = FakeClock()
    runtime = _stretched(clock)
    for _ in range(2):
        clock.advance(41.0)
        runtime.settle(Entry((), Outcome.ERROR, clock.now, 0.1, error="boom"))
    assert runtime.backoff is not None
    assert runtime.backoff.wait == pytest.approx(19.98)
    failed_at = clock.now
    assert runtime.held_back(failed_at + 30.0) is Outcome.STRETCHED  # the failure, kept 40 s
    assert runtime.held_back(failed_at + 40.5) is None
    runtime.stretch = 15.0  # shorter than the wait: the wait holds it
    assert runtime.held_back(failed_at + 16.0) is Outcome.BACKOFF
    assert runtime.held_back(failed_at + 20.5) is None


def test_shed_wins_over_stretched_in_the_state_shown() -> None:
    """/stat shows the stronger hold: a shed collector is ``shed``, stretched or not."""
    clock = FakeClock()
    runtime = _stretched(clock)
    runtime.shed = True
    assert runtime.state is CollectorState.SHED
