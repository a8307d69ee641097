"""Tests for exporter.collect.ranking: every increase accounted once, a remainder that
only grows, churn bounded by the allowance, heavy hitters named fast (issue 38).

Runs are driven by an injected clock (``now``); :class:`Reader` reads the served
counters as Prometheus's ``increase()`` does (a drop is a reset, a series' first
sample counts from there), so "accounted" means what a dashboard would sum.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable

import pytest

from exporter.collect.ranking import BURST, HEAVY_SHARE, WINDOW, Group, Key, Ranking
from exporter.config.definitions import Top

GROUP = ("db",)


def _ranking(limit: int = 3, band: int = 6, hold: float = 60, churn: float = 0.0) -> Ranking:
    """A ranking of two counters (calls, then time), ranked by time."""
    return Ranking(Top("time", limit, band, hold, churn), counters=2, by=1, width=1)


class Reader:
    """What a Prometheus scraping each run would count: per series, the sum of its
    increases between samples (a drop counts the new value), from its first sample."""

    def __init__(self) -> None:
        self.last: dict[Key, list[float]] = {}
        self.counted = [0.0, 0.0]
        self.remainders: list[list[float]] = []
        self.drops = 0  # samples below their series' last: resets as Prometheus sees them

    def scrape(self, ranking: Ranking, now: float, counters: dict[Key, list[float]]) -> set[Key]:
        decision = ranking.run(now, [(key, GROUP, values) for key, values in counters.items()])
        served = {key: shown for key, shown in decision.named.items() if key in counters}
        served |= {("other", str(group[0])): v for group, v in decision.remainder.items()}
        for series, values in served.items():
            before = self.last.get(series)
            if before is not None:
                for n, (v, b) in enumerate(zip(values, before, strict=True)):
                    self.counted[n] += v - b if v >= b else v
                    self.drops += v < b
            self.last[series] = list(values)
        self.remainders.append(decision.remainder.get(GROUP, [0.0, 0.0]))
        return set(decision.named)


class Workload:
    """Keys whose counters grow by a rate each run; keys may be reset or vanish."""

    def __init__(self, rates: dict[Key, float]) -> None:
        self.rates = rates
        self.values: dict[Key, list[float]] = {key: [0.0, 0.0] for key in rates}
        self.true = [0.0, 0.0]  # increases since the first run

    def step(self, dt: float) -> dict[Key, list[float]]:
        for key, rate in self.rates.items():
            calls = rate * dt
            values = self.values.setdefault(key, [0.0, 0.0])
            values[0] += calls
            values[1] += calls * 0.002
            self.true[0] += calls
            self.true[1] += calls * 0.002
        return {key: list(values) for key, values in self.values.items()}


def _key(n: int) -> Key:
    return (f"q{n}", "db")


def _run(ranking: Ranking, workload: Workload, runs: int, dt: float = 10.0,
         change: Callable[[int, Workload], None] | None = None) -> Reader:  # fmt: skip
    """Scrape every ``dt`` seconds; ``change`` alters the workload before each run."""
    reader = Reader()
    reader.scrape(ranking, 0.0, workload.step(0.0))
    workload.true = [0.0, 0.0]  # what happened before the first run is no increase
    for n in range(1, runs + 1):
        if change is not None:
            change(n, workload)
        reader.scrape(ranking, n * dt, workload.step(dt))
    return reader


def _nondecreasing(remainders: list[list[float]]) -> bool:
    return all(b[n] >= a[n] for a, b in itertools.pairwise(remainders) for n in range(2))


def test_named_and_remainder_add_up_to_every_increase_through_promotions() -> None:
    """Keys whose rates change at random are promoted and demoted; what the named series
    and the remainder show adds up to the true increase, exactly."""
    rng = random.Random(7)
    workload = Workload({_key(n): rng.uniform(0, 5) for n in range(20)})

    def shuffle(run: int, w: Workload) -> None:
        if run % 5 == 0:
            w.rates = {key: rng.uniform(0, 5) ** 3 for key in w.rates}

    ranking = _ranking(limit=4, band=6, hold=20, churn=3600)
    reader = _run(ranking, workload, 200, change=shuffle)
    assert reader.counted == pytest.approx(workload.true, rel=1e-9)
    assert _nondecreasing(reader.remainders)
    assert ranking.ever_named > 4  # keys did come and go
    assert reader.drops == 0


def test_resets_and_disappearances_never_lower_the_remainder() -> None:
    """A key reset to zero, one that vanishes and comes back from zero (deallocated), and a
    stats reset of every key: the remainder never falls and nothing is counted twice."""
    workload = Workload({_key(n): float(n + 1) for n in range(8)})
    gone: dict[Key, float] = {}

    def trouble(run: int, w: Workload) -> None:
        if run == 30:
            w.values[_key(7)] = [0.0, 0.0]  # the top key reset alone
        if run == 40:
            gone[_key(1)] = w.rates.pop(_key(1))  # deallocated ...
            del w.values[_key(1)]
        if run == 50:
            w.rates[_key(1)] = gone[_key(1)]  # ... and back, from zero
        if run == 70:
            w.values = {key: [0.0, 0.0] for key in w.values}  # stats reset

    ranking = _ranking(limit=3, band=4, hold=30, churn=3600)
    reader = _run(ranking, workload, 100, change=trouble)
    assert _nondecreasing(reader.remainders)
    assert reader.counted == pytest.approx(workload.true, rel=1e-9)
    assert reader.drops == 0  # named keys' series stay flat through their resets


def test_nothing_is_named_before_rates_are_known_then_the_busiest_are() -> None:
    """The first run has no rates: everything is in the remainder, which starts at 0;
    the second names the top ``limit`` by rate, free of the churn allowance."""
    workload = Workload({_key(n): float(n) for n in range(10)})
    ranking = _ranking(limit=3)
    first = ranking.run(0.0, [(k, GROUP, v) for k, v in workload.step(0).items()])
    assert first.named == {}
    assert first.remainder == {GROUP: [0.0, 0.0]}
    second = ranking.run(10.0, [(k, GROUP, v) for k, v in workload.step(10).items()])
    assert second.named == {key: workload.values[key] for key in (_key(9), _key(8), _key(7))}


def test_a_named_key_shows_its_own_value_and_the_remainder_only_what_it_missed() -> None:
    """While named, a key's increases are its series'; the run it enters and the runs after
    it leaves, its increases are the remainder's."""
    ranking = _ranking(limit=1, band=1, hold=0, churn=3600 * 100)
    a, b = _key(1), _key(2)
    decisions = [
        ranking.run(0, [(a, GROUP, [0, 0]), (b, GROUP, [0, 0])]),
        ranking.run(10, [(a, GROUP, [0, 10]), (b, GROUP, [0, 1])]),  # a enters: its 10 missed
        ranking.run(20, [(a, GROUP, [0, 20]), (b, GROUP, [0, 2])]),  # a's 10 its own
    ]
    assert decisions[1].named == {a: [0, 10]}
    assert [d.remainder[GROUP][1] for d in decisions] == [0, 11, 12]


def test_distinct_keys_over_an_hour_stay_within_limit_plus_the_allowance() -> None:
    """2 000 shapes, a hot set of 200 that moves every minute, limit 100, scraped every
    10 s for an hour: at most limit + churn (+ one burst) distinct keys are ever named,
    never more than limit at once, and the counters still add up."""
    shapes = 2000
    limit, churn = 100, 25.0

    def hot_set(minute: int) -> dict[Key, float]:
        hot = {(minute * 200 + n) % shapes for n in range(200)}
        return {_key(n): 20.0 if n in hot else 0.05 for n in range(shapes)}

    workload = Workload(hot_set(0))
    ranking = _ranking(limit=limit, band=2 * limit, hold=600, churn=churn)
    named_ever: set[Key] = set()
    most = 0

    def move(run: int, w: Workload) -> None:
        nonlocal most
        named_ever.update(ranking.named)
        most = max(most, len(ranking.named))
        if run % 6 == 0:
            w.rates = hot_set(run // 6)

    reader = _run(ranking, workload, 360, change=move)
    named_ever.update(ranking.named)
    assert most <= limit
    assert len(named_ever) <= limit + churn + churn * BURST + 1
    assert reader.counted == pytest.approx(workload.true, rel=1e-9)


@pytest.mark.parametrize("existing", [False, True], ids=["new key", "quiet key waking"])
def test_a_key_with_a_tenth_of_the_load_is_named_within_two_minutes(existing: bool) -> None:
    """With no churn allowance left, a statement that comes to carry 10 % of the load is
    named within 120 s: whether it is new or was there all along, quiet."""
    rates = {_key(n): 1.0 for n in range(200)}
    heavy = _key(999)
    if existing:
        rates[heavy] = 0.0
    workload = Workload(rates)
    ranking = _ranking(limit=20, band=40, hold=600, churn=0.0)
    started: list[float] = []

    def arrive(run: int, w: Workload) -> None:
        if run == 60:
            w.rates[heavy] = 200 * 0.1 / 0.9  # a tenth of the new total
            started.append(run * 10.0)

    named_at: list[float] = []
    reader = Reader()
    reader.scrape(ranking, 0.0, workload.step(0))
    for run in range(1, 100):
        arrive(run, workload)
        if heavy in reader.scrape(ranking, run * 10.0, workload.step(10)) and not named_at:
            named_at.append(run * 10.0)
    assert named_at
    assert named_at[0] - started[0] <= 120
    assert HEAVY_SHARE < 0.1


def test_a_key_leaves_only_after_ranking_beyond_the_band_for_the_hold() -> None:
    """A named key that stops keeps its name while its fading rate still ranks within the
    band, and for ``hold`` seconds beyond it; then a rising key (no heavy hitter) takes
    its slot. Never more than ``limit`` are named."""
    ranking = _ranking(limit=2, band=4, hold=60, churn=3600 * 100)
    rates = {_key(n): 0.5 for n in range(10, 110)}  # a hundred quiet keys
    rates |= {_key(0): 3.0, _key(1): 2.5, _key(5): 0.0}
    values = {key: [0.0, 0.0] for key in rates}

    def run(now: float) -> set[Key]:
        for key, rate in rates.items():
            values[key][1] += rate * 10
        return set(ranking.run(now, [(k, GROUP, v) for k, v in values.items()]).named)

    run(0)
    assert run(10) == {_key(0), _key(1)}
    rates[_key(1)], rates[_key(5)] = 0.0, 2.8  # key 1 stops, key 5 rises (5 % of the load)
    named_over = [run(20 + 10 * n) for n in range(30)]
    # Its rate 2.5 e^(-t/60) falls below the quiet keys' 0.5 after ~97 s: out of the band.
    assert all(_key(1) in named for named in named_over[:9])
    left = next(n for n, named in enumerate(named_over) if _key(1) not in named)
    assert 10 * left >= 97 + 60 - 10
    assert _key(5) in named_over[-1]
    assert all(len(named) <= 2 for named in named_over)


def test_only_the_keys_that_moved_are_looked_at_and_idle_rates_fade() -> None:
    """A key whose cells read as at its last sample is not observed again (its state is
    the same object, its last values untouched), and its rate fades as if decayed run by
    run: after one WINDOW it is e^-1 of what it was."""
    ranking = _ranking(limit=1, band=1)
    busy, idle = _key(1), _key(2)
    ranking.run(0, [(busy, GROUP, [0, 0]), (idle, GROUP, [0, 0])])
    ranking.run(10, [(busy, GROUP, [1, 10]), (idle, GROUP, [1, 60])])
    rate = ranking.keys[idle].rate_at(10)
    assert rate == pytest.approx(6.0)
    for n in range(2, 8):
        ranking.run(10.0 * n, [(busy, GROUP, [n, 10 * n]), (idle, GROUP, [1, 60])])
    assert ranking.keys[idle].at == 10  # never observed again
    assert ranking.keys[idle].rate_at(70) == pytest.approx(rate * math.exp(-1))


def test_state_of_keys_unseen_for_twice_the_hold_is_dropped() -> None:
    """Memory is bounded by the keys seen lately: a key absent for 2 × hold is forgotten,
    and so is its group's remainder when the whole group is gone."""
    ranking = _ranking(hold=30)
    ranking.run(0, [(_key(1), ("a",), [1, 1]), (_key(2), ("b",), [1, 1])])
    ranking.run(10, [(_key(1), ("a",), [2, 2])])
    assert set(ranking.keys) == {_key(1), _key(2)}
    ranking.run(71, [(_key(1), ("a",), [3, 3])])
    assert set(ranking.keys) == {_key(1)}
    assert set(ranking.remainder) == {("a",)}


def test_a_cap_on_keys_drops_the_longest_absent_first() -> None:
    """Beyond ``max_keys`` the keys absent longest go first, whatever the hold."""
    ranking = _ranking(hold=10_000)
    ranking.max_keys = 3
    for n in range(5):
        ranking.run(float(n), [(_key(n), GROUP, [1, 1])])
    assert set(ranking.keys) == {_key(2), _key(3), _key(4)}


def test_a_key_spelt_like_the_remainder_is_never_named() -> None:
    """A real key whose ranked labels read "other" stays in the remainder, so no two
    series share a label set."""
    ranking = _ranking(limit=2)
    spelt = ("other", "db")
    first = ranking.run(0, [(spelt, GROUP, [0, 0]), (_key(1), GROUP, [0, 0])])
    assert set(first.named) == {_key(1)}  # no more keys than the limit: all but the spelt
    decision = ranking.run(10, [(spelt, GROUP, [0, 100]), (_key(1), GROUP, [0, 1])])
    assert decision.named == {_key(1): [0, 1]}
    assert decision.remainder[GROUP] == [0, 100]


def test_null_and_nan_counters_count_nothing() -> None:
    """A NULL (None) or NaN cell neither moves the remainder nor forgets the last value:
    the next value counts from the one before the gap."""
    ranking = _ranking(limit=1)
    big, quiet = _key(3), _key(1)
    ranking.run(0, [(big, GROUP, [100, 100]), (quiet, GROUP, [5, 5])])
    ranking.run(10, [(big, GROUP, [200, 200]), (quiet, GROUP, [None, math.nan])])
    decision = ranking.run(20, [(big, GROUP, [300, 300]), (quiet, GROUP, [6, 6])])
    assert set(decision.named) == {big}
    assert decision.remainder[GROUP] == [100.0 + 1, 100.0 + 1]  # big's entry run, quiet's 1


def test_a_group_with_an_unnamed_key_publishes_its_remainder_while_a_named_key_is_away() -> None:
    """Named keys absent from a run do not hide that a present key is left out: its
    group's remainder is published from that run on."""
    ranking = _ranking(limit=2, band=2, hold=600)
    a, b, c = _key(1), _key(2), _key(3)
    first = ranking.run(0, [(a, GROUP, [0, 0]), (b, GROUP, [0, 0])])
    assert set(first.named) == {a, b}
    assert first.remainder == {}
    decision = ranking.run(10, [(a, GROUP, [0, 100]), (c, GROUP, [0, 1])])  # b away, c new
    assert c not in decision.named
    assert decision.remainder == {GROUP: [0, 1]}


def test_a_listing_passed_again_is_not_walked_and_an_absent_key_is_kept_its_while() -> None:
    """A probe passes the same mapping while its keys stay the same: sweeps then find
    none absent without walking them. When a key goes, it is remembered ``forget``
    seconds from the last run it was listed in, however long the listing stood still."""
    ranking = Ranking(Top("time", 1, 2, 60), counters=1, by=0, width=1)
    present: dict[Key, Group] = {("a",): GROUP, ("b",): GROUP}
    ranking.run_moved(0.0, present, [(("a",), (1,)), (("b",), (2,))])
    now = 0.0
    for _ in range(60):  # ten minutes of the same listing, a run every 10 s
        now += 10
        ranking.run_moved(now, present, [])
    assert ranking.swept_present is present
    left: dict[Key, Group] = {
        ("a",): GROUP
    }  # b is gone after the last run that listed it, at `now`
    gone_at = now
    while now < gone_at + ranking.forget - 10:
        now += 10
        ranking.run_moved(now, left, [])
        assert ("b",) in ranking.keys, now - gone_at
    now += 20
    ranking.run_moved(now + WINDOW, left, [])  # a sweep past the horizon
    assert ("b",) not in ranking.keys
