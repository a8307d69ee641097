"""Which collectors the server-time budget stretches and how far, and how a plan is kept
between passes (issue 31): pure arithmetic on demands."""

from __future__ import annotations

import pytest

from exporter.collect.stretch import AT_CEILING, LOW_WATER, Demand, allocate, decide, predicted


def _demand(key: str, cost: float, *, tier: int = 1, ttl: float = 0.0, interval: float = 10.0,
            ceiling: float = 600.0, wait: float = 0.0) -> Demand:  # fmt: skip
    return Demand(("db", key), tier, cost, ttl, interval, ceiling, wait)


# --- one collector's demand -----------------------------------------------------------


def test_a_stretch_doubles_up_to_the_ceiling_which_caps_the_last() -> None:
    """Factors 2, 4, 8, … while within the ceiling, then the ceiling itself; the ttl set is
    half a pass interval short of the period, so the pass falling due runs it."""
    demand = _demand("c", 1.0, ttl=10.0, interval=15.0, ceiling=100.0)
    assert demand.base == 15.0
    assert list(demand.factors()) == [2.0, 4.0, AT_CEILING]
    assert [demand.period(f) for f in (1.0, 2.0, 4.0, AT_CEILING)] == [15.0, 30.0, 60.0, 100.0]
    assert demand.effective_ttl(2.0) == 22.5
    assert demand.rate(AT_CEILING) == pytest.approx(0.01)


def test_no_stretch_without_room_under_the_ceiling_a_fatal_ones_being_0() -> None:
    """A ceiling under twice the base leaves nothing to stretch; a fatal collector's ceiling
    is 0 (it follows the server at its ttl)."""
    assert list(_demand("c", 1.0, ceiling=19.0).factors()) == []
    assert list(_demand("c", 1.0, ceiling=0.0).factors()) == []
    assert list(_demand("c", 1.0, ceiling=20.0).factors()) == [AT_CEILING]


def test_a_stretch_and_a_back_off_overlap_instead_of_multiplying() -> None:
    """D15: a collector waiting 100 s after failures is held by whichever is longer, so a
    stretch shorter than the wait saves nothing and a longer one counts alone."""
    demand = _demand("c", 1.0, interval=10.0, wait=100.0)
    assert demand.rate() == pytest.approx(0.01)
    assert demand.saving(4.0) == 0.0  # 40 s: inside the wait
    assert demand.rate(16.0) == pytest.approx(1.0 / 160.0)  # 160 s, not 1600


# --- which collectors are stretched ---------------------------------------------------


def test_nothing_is_stretched_within_the_target() -> None:
    """The statements already take less than asked: no plan."""
    demands = [_demand("a", 0.5), _demand("b", 0.3)]
    assert allocate(demands, 0.01, 0.1) == {}


def test_the_least_important_tier_goes_first_even_when_a_more_important_costs_more() -> None:
    """The breaker's order (D16): the last third before the middle one; within a tier, the
    costliest first; each as far as needed before the next is touched."""
    important = _demand("important", 1.0, tier=2)  # 0.1 s/s
    cheap = _demand("cheap", 0.2, tier=1)  # 0.02 s/s
    dear = _demand("dear", 0.4, tier=1)  # 0.04 s/s
    demands = [important, cheap, dear]
    assert allocate(demands, 0.0, 0.14) == {("db", "dear"): 2.0}  # saves 0.02, as needed
    assert allocate(demands, 0.0, 0.13) == {("db", "dear"): 4.0}  # saves 0.03
    assert allocate(demands, 0.0, 0.105) == {("db", "dear"): AT_CEILING, ("db", "cheap"): 8.0}
    plan = allocate(demands, 0.0, 0.1)  # tier 1 at its ceiling is not enough
    assert plan == {("db", "dear"): AT_CEILING, ("db", "cheap"): AT_CEILING,
                    ("db", "important"): 2.0}  # fmt: skip
    assert predicted(demands, 0.0, plan) <= 0.1


def test_when_nothing_fits_every_stretch_is_at_its_ceiling_and_a_fatal_is_left_alone() -> None:
    """A fatal collector that alone takes more than the budget is never stretched; every
    other goes to its ceiling, and the prediction says the budget is still exceeded."""
    fatal = _demand("fatal", 1.0, tier=4, ceiling=0.0)
    other = _demand("other", 1.0)
    plan = allocate([fatal, other], 0.0, 0.05)
    assert plan == {("db", "other"): AT_CEILING}
    assert predicted([fatal, other], 0.0, plan) > 0.05


def test_a_collector_that_costs_nothing_is_not_stretched() -> None:
    """A shed collector's demand is 0 (the breaker comes first), as is one never run: no
    stretch would save anything."""
    plan = allocate([_demand("free", 0.0), _demand("dear", 1.0)], 0.0, 0.05)
    assert ("db", "free") not in plan


def test_no_budget_stretches_nothing() -> None:
    """0 turns the budget off, whatever the statements take."""
    assert decide([_demand("dear", 10.0)], 0.0, 0.0, {("db", "dear"): 2.0}).plan == {}


def test_a_plan_is_kept_until_costs_leave_the_band_between_low_water_and_the_budget() -> None:
    """Hysteresis: over the budget the plan stretches; costs falling back a little keep it;
    only once a lighter plan fits LOW_WATER of the budget is it relaxed, and once the
    collectors fit it unstretched, nothing is stretched."""
    budget = 0.1
    first = decide([_demand("c", 1.5)], 0.0, budget, {})  # 0.15 s/s
    plan = first.plan
    assert (plan, first.relaxing) == ({("db", "c"): 2.0}, False)
    lighter = 0.1 * 2 * LOW_WATER * 1.05  # unstretched 0.084 > LOW_WATER's 0.08
    assert decide([_demand("c", lighter * 10)], 0.0, budget, plan).plan == plan
    assert decide([_demand("c", 0.9)], 0.0, budget, plan).plan == plan  # 0.09: in the band
    relaxed = decide([_demand("c", 0.7)], 0.0, budget, plan)  # 0.07 fits LOW_WATER
    assert (relaxed.plan, relaxed.kept, relaxed.relaxing) == ({}, plan, True)
    assert decide([_demand("c", 0.9)], 0.0, budget, {}).plan == {}  # and stays off in the band
    further = decide([_demand("c", 3.5)], 0.0, budget, plan)
    assert (further.plan, further.relaxing) == ({("db", "c"): 4.0}, False)


def test_a_collector_the_breaker_sheds_drops_out_of_the_plan() -> None:
    """A shed collector costs nothing while shed: its stretch is not kept."""
    plan = {("db", "c"): 4.0, ("db", "d"): 2.0}
    kept = decide([_demand("c", 0.0), _demand("d", 1.0)], 0.0, 0.08, plan)
    assert kept.plan == kept.kept == {("db", "d"): 2.0}
