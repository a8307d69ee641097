"""The target's circuit breaker: verdicts, states, hysteresis and what is shed (D16)."""

from __future__ import annotations

import functools

import psycopg
import pytest

from exporter.collect.breaker import (
    DATABASE_LIMIT,
    Breaker,
    BreakerPolicy,
    BreakerState,
    PassTally,
    Verdict,
    distress_of,
    is_shed,
    judge,
    judge_pass,
    shed_cut,
)
from exporter.collect.budget import Interruption
from exporter.config.definitions import Collector, Column, Usage

POLICY = BreakerPolicy(cool_down=30.0, max_cool_down=120.0)


def _whole(tally: PassTally) -> Verdict:
    """The verdict on a pass that ran to its end."""
    return judge(tally, interrupted=None, policy=POLICY, ran_for=0.1)[0]


DISTRESS = (Verdict.DISTRESSED, "slow")
HEALTHY = (Verdict.HEALTHY, "")


def _collector(key: str, priority: int, *, fatal: bool = False) -> Collector:
    columns = (Column("v", Usage.GAUGE),)
    return Collector(key=key, name=key, query="SELECT 1 AS v", columns=columns,
                     priority=priority, fatal=fatal)  # fmt: skip


def _breaker() -> Breaker:
    return Breaker(policy=POLICY, random=lambda: 0.0)  # no jitter: cool-downs are exact


def _feed(breaker: Breaker, verdicts: list[tuple[Verdict, str]], now: float) -> float:
    for verdict, reason in verdicts:
        breaker.begin(now)
        breaker.observe(verdict, reason, now)
        now += 1.0
    return now


# --- verdicts -------------------------------------------------------------------------


def test_most_collectors_timing_out_is_distress() -> None:
    """Half or more of the executed collectors timing out (at least two) is distress."""
    assert _whole(PassTally(executed=4, timeouts=2)) is Verdict.DISTRESSED
    assert _whole(PassTally(executed=5, timeouts=2)) is Verdict.HEALTHY
    # One collector that always fails is the back-off's business, not the breaker's.
    assert _whole(PassTally(executed=1, timeouts=1)) is Verdict.HEALTHY


def test_a_pass_past_its_budget_is_distress_a_hang_up_says_nothing() -> None:
    """Running past the budget is distress; a round its client cut short is neutral."""
    tally = PassTally(executed=3)
    past = judge(tally, interrupted=Interruption.BUDGET, policy=POLICY, ran_for=1.0)
    assert past[0] is Verdict.DISTRESSED
    left = judge(tally, interrupted=Interruption.CLIENT, policy=POLICY, ran_for=1.0)
    assert left[0] is Verdict.NEUTRAL


def test_a_budget_spent_before_the_pass_could_run_says_nothing() -> None:
    """D16: a budget that ran out within the first second of the pass (a queued request, a
    client asking for microseconds) is no evidence against the server: neutral."""
    for tally in (PassTally(), PassTally(executed=2)):
        verdict = judge(tally, interrupted=Interruption.BUDGET, policy=POLICY, ran_for=0.99)
        assert verdict[0] is Verdict.NEUTRAL


def test_a_pass_that_ran_nothing_is_neutral() -> None:
    """All served from cache: no evidence either way."""
    assert _whole(PassTally()) is Verdict.NEUTRAL


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("connection failed: FATAL:  sorry, too many clients already", "53300"),
        ("FATAL:  remaining connection slots are reserved for roles with SUPERUSER", "53300"),
        ('FATAL:  too many connections for role "monitor"', "53300"),
        ("FATAL:  the database system is starting up", "57P03"),
        ("FATAL:  the database system is not yet accepting connections", "57P03"),
        ("connection refused", ""),
        ("FATAL:  password authentication failed", ""),
    ],
)
def test_connection_refusals_that_mean_distress(message: str, expected: str) -> None:
    """53300 and 57P03 are recognised by SQLSTATE or, lacking one, by the server's words."""
    found = distress_of(psycopg.OperationalError(message))
    assert (expected in found) if expected else found == ""


def test_a_connection_refusal_is_distress_whatever_else_the_pass_did() -> None:
    """Too many connections counts even in a round its client cut short."""
    tally = PassTally(distress="too many connections (53300)")
    verdict, reason = judge(tally, interrupted=Interruption.CLIENT, policy=POLICY, ran_for=1.0)
    assert (verdict, reason) == (Verdict.DISTRESSED, "too many connections (53300)")


def _pass(main: PassTally, *others: PassTally) -> Verdict:
    """The verdict on a whole pass over the main database and ``others``."""
    return judge_pass(main, others, interrupted=None, policy=POLICY, ran_for=0.1)[0]


def test_a_discovered_database_whose_collectors_time_out_is_no_distress() -> None:
    """Issue 36: a discovered database's collectors timing out say nothing of the server
    (they back off, D15), however many; the main database's part is judged, and any
    database's runs count as health."""
    stalled = PassTally(executed=8, timeouts=8)
    assert _pass(PassTally(executed=1), stalled) is Verdict.HEALTHY
    assert _pass(PassTally(), stalled) is Verdict.HEALTHY
    assert _pass(PassTally(executed=2, timeouts=2), PassTally(executed=9)) is Verdict.DISTRESSED
    assert _pass(PassTally(), PassTally()) is Verdict.NEUTRAL


def test_a_discovered_database_refused_by_its_own_limit_is_no_distress() -> None:
    """Issue 36: a database owner's CONNECTION LIMIT refuses that database alone; a refusal
    of the server's connections, by whichever database saw it, is the server's distress."""
    own = distress_of(psycopg.OperationalError('FATAL:  too many connections for database "t"'))
    assert own == DATABASE_LIMIT
    assert _pass(PassTally(executed=3), PassTally(distress=own)) is Verdict.HEALTHY
    assert _pass(PassTally(distress=own)) is Verdict.DISTRESSED  # the main database's own
    full = distress_of(psycopg.OperationalError("FATAL:  sorry, too many clients already"))
    assert _pass(PassTally(executed=3), PassTally(distress=full)) is Verdict.DISTRESSED


# --- states ---------------------------------------------------------------------------


def test_trips_after_consecutive_distress_only() -> None:
    """One distressed pass between healthy ones does not trip; two in a row do."""
    breaker = _breaker()
    _feed(breaker, [DISTRESS, HEALTHY, DISTRESS, HEALTHY], 0.0)
    assert breaker.state is BreakerState.NORMAL
    _feed(breaker, [DISTRESS, DISTRESS], 10.0)
    assert (breaker.state, breaker.level, breaker.trips) == (BreakerState.DEGRADED, 1, 1)


def test_further_distress_sheds_more_up_to_the_last_level() -> None:
    """Each distressed pass while degraded sheds another tier, never past the last."""
    breaker = _breaker()
    _feed(breaker, [DISTRESS] * 6, 0.0)
    assert (breaker.state, breaker.level) == (BreakerState.DEGRADED, POLICY.levels)


def test_probes_after_the_cool_down_and_recovers_a_tier_at_a_time() -> None:
    """Healthy passes while degraded wait for the cool-down; probing then restores one tier
    per ``recover_after`` healthy passes and closes only after the last (no flapping)."""
    breaker = _breaker()
    now = _feed(breaker, [DISTRESS, DISTRESS, DISTRESS], 0.0)  # level 2
    now = _feed(breaker, [HEALTHY] * 5, now)
    assert breaker.state is BreakerState.DEGRADED  # the cool-down is not over
    breaker.begin(now + 30.0)
    assert (breaker.state, breaker.level) == (BreakerState.PROBING, 1)
    levels = []
    for _ in range(2 * POLICY.recover_after):
        breaker.observe(Verdict.HEALTHY, "", now + 31.0)
        levels.append((breaker.state, breaker.level))
    assert levels[POLICY.recover_after - 1] == (BreakerState.PROBING, 0)
    assert levels[-2] == (BreakerState.PROBING, 0)
    assert levels[-1] == (BreakerState.NORMAL, 0)


def test_a_failed_probe_doubles_the_cool_down_up_to_its_cap() -> None:
    """Distress while probing goes back to degraded, one tier more, for twice as long."""
    breaker = _breaker()
    now = _feed(breaker, [DISTRESS, DISTRESS], 0.0)
    cool_downs = []
    for _ in range(4):
        now = breaker.probe_at
        assert breaker.begin(now)
        breaker.observe(Verdict.DISTRESSED, "still slow", now)
        cool_downs.append(breaker.probe_at - now)
    assert cool_downs == [60.0, 120.0, 120.0, 120.0]
    assert breaker.state is BreakerState.DEGRADED
    assert breaker.reason == "still slow"


def test_neutral_passes_change_nothing() -> None:
    """Hang-ups and all-cached passes neither trip nor recover the breaker."""
    breaker = _breaker()
    _feed(breaker, [DISTRESS, (Verdict.NEUTRAL, ""), DISTRESS], 0.0)
    assert breaker.state is BreakerState.DEGRADED


def test_cool_down_is_jittered_within_bounds() -> None:
    """Breakers tripped together probe at different times, none later than the cool-down."""
    probes = set()
    for seed in range(20):
        breaker = Breaker(policy=POLICY, random=functools.partial(float, 0.05 * seed))
        _feed(breaker, [DISTRESS, DISTRESS], 0.0)
        probes.add(round(breaker.probe_at - 1.0, 6))
    assert len(probes) == 20
    assert all(24.0 <= p <= 30.0 for p in probes)


# --- what is shed -----------------------------------------------------------------------


def test_levels_shed_thirds_from_the_end_of_the_run_order() -> None:
    """Level 1 keeps the first two thirds, level 2 one third, level 3 the first only;
    fatal collectors are never shed and do not count."""
    planned = [_collector(f"c{i}", 100 + i) for i in range(6)]
    planned.insert(3, _collector("vital", 103, fatal=True))
    kept = {
        level: [c.key for c in planned if not is_shed(c, shed_cut(planned, level, 3))]
        for level in range(4)
    }
    assert kept[0] == [c.key for c in planned]
    assert kept[1] == ["c0", "c1", "c2", "vital", "c3"]
    assert kept[2] == ["c0", "c1", "vital"]
    assert kept[3] == ["c0", "vital"]


def test_ties_in_priority_are_broken_by_key() -> None:
    """One file (one priority) still sheds, in run order: (priority, key)."""
    planned = sorted((_collector(k, 100) for k in "dcba"), key=lambda c: c.key)
    cut = shed_cut(planned, 2, 3)
    assert [c.key for c in planned if not is_shed(c, cut)] == ["a", "b"]


def test_the_cut_applies_to_collectors_of_other_databases() -> None:
    """A per-database collector not in the reference plan is placed by its run order."""
    planned = [_collector("a", 101), _collector("b", 102), _collector("c", 105)]
    cut = shed_cut(planned, 1, 3)
    assert not is_shed(_collector("x", 101), cut)
    assert is_shed(_collector("y", 103), cut)


def test_distress_at_the_last_level_is_no_change_but_delays_the_probe() -> None:
    """Degraded at the last level, more distress changes nothing to log, yet the cool-down
    starts over: no probe while the server is still struggling."""
    breaker = _breaker()
    now = _feed(breaker, [DISTRESS] * 4, 0.0)
    assert breaker.level == POLICY.levels
    assert breaker.observe(Verdict.DISTRESSED, "slow", now + 20.0) is False
    assert breaker.probe_at == now + 20.0 + 30.0
