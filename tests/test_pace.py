"""The health probe's pace: slow while steady, fast while the target may be changing."""

from __future__ import annotations

import pytest

from exporter.health.pace import SLOW_ANSWER, Pace
from tests.fixtures.clock import FakeClock

SLOW, FAST, SETTLE, LIMIT = 1.0, 0.1, 3, 10.0


def _pace() -> Pace:
    return Pace(SLOW, FAST, settle=SETTLE, limit=LIMIT)


def _steady(pace: Pace, clock: FakeClock, reading: str, times: int) -> None:
    for _ in range(times):
        clock.advance(pace.interval(clock.now))
        pace.observe(reading, clock.now, hold=None, answered=True)


def test_a_steady_target_is_probed_slowly_after_the_first_readings() -> None:
    """The first reading is a change; ``settle`` equal steady readings end the spell."""
    clock = FakeClock()
    pace = _pace()
    pace.observe("primary", clock.now, hold=None, answered=True)
    assert pace.interval(clock.now) == FAST
    _steady(pace, clock, "primary", SETTLE - 1)
    assert pace.interval(clock.now) == FAST
    clock.advance(FAST)
    ended = pace.observe("primary", clock.now, hold=None, answered=True)
    assert pace.interval(clock.now) == SLOW
    assert ended is not None
    assert (ended.reason, ended.probes, ended.answered) == ("start -> primary", SETTLE, SETTLE)


def test_a_new_role_quickens_the_pace_until_it_settles() -> None:
    """primary -> replica starts a spell that ends after ``settle`` steady replica readings."""
    clock = FakeClock()
    pace = _pace()
    _steady(pace, clock, "primary", SETTLE + 1)
    assert pace.interval(clock.now) == SLOW
    clock.advance(SLOW)
    assert pace.observe("replica", clock.now, hold=None, answered=True) is None
    assert pace.interval(clock.now) == FAST
    _steady(pace, clock, "replica", SETTLE)
    assert pace.interval(clock.now) == SLOW


def test_an_unsteady_reading_keeps_the_pace_fast_only_for_its_hold() -> None:
    """A reading the target cannot stay in (down) is probed fast for its hold, then slowly,
    so a long outage costs no more than the slow pace; its spell counts unanswered probes."""
    clock = FakeClock()
    pace = _pace()
    _steady(pace, clock, "primary", SETTLE + 1)
    clock.advance(SLOW)
    pace.observe("down", clock.now, hold=2.0, answered=False)
    fast_probes = 0
    ended = None
    while ended is None:
        assert pace.interval(clock.now) == FAST
        clock.advance(FAST)
        ended = pace.observe("down", clock.now, hold=2.0, answered=False)
        fast_probes += 1
    assert pace.interval(clock.now) == SLOW
    assert fast_probes == pytest.approx(2.0 / FAST, abs=1)
    assert (ended.probes, ended.answered) == (fast_probes, 0)


def test_a_slow_answer_quickens_the_pace() -> None:
    """An unchanged reading that took longer than SLOW_ANSWER suggests trouble."""
    clock = FakeClock()
    pace = _pace()
    _steady(pace, clock, "primary", SETTLE + 1)
    clock.advance(SLOW)
    pace.observe("primary", clock.now, hold=None, answered=True, took=SLOW_ANSWER / 2)
    assert pace.interval(clock.now) == SLOW
    pace.observe("primary", clock.now, hold=None, answered=True, took=SLOW_ANSWER * 2)
    assert pace.interval(clock.now) == FAST
    assert pace.spell is not None
    assert "answer took" in pace.spell.reason


def test_a_suggestion_from_outside_lasts_until_steady_readings_or_the_limit() -> None:
    """suggest() quickens at once; steady readings end it, or the limit when none come."""
    clock = FakeClock()
    pace = _pace()
    _steady(pace, clock, "primary", SETTLE + 1)
    pace.suggest("the connection closed", clock.now)
    assert pace.interval(clock.now) == FAST
    _steady(pace, clock, "primary", SETTLE)
    assert pace.interval(clock.now) == SLOW
    pace.suggest("the connection closed", clock.now)
    clock.advance(LIMIT - 0.01)
    assert pace.interval(clock.now) == FAST
    clock.advance(0.02)
    assert pace.interval(clock.now) == SLOW


def test_the_fast_interval_never_exceeds_the_slow_one() -> None:
    """A slow interval shorter than the fast one is used for both."""
    assert Pace(0.05, 0.1).fast == 0.05


@pytest.mark.parametrize(
    "args", [(0.0, 0.1, 3, 1.0), (1.0, 0.0, 3, 1.0), (1.0, 0.1, 0, 1.0), (1.0, 0.1, 3, 0.0)]
)
def test_pace_rejects_nonsense(args: tuple[float, float, int, float]) -> None:
    """Zero intervals would spin; a zero settle or limit would never quicken."""
    slow, fast, settle, limit = args
    with pytest.raises(ValueError, match="positive"):
        Pace(slow, fast, settle=settle, limit=limit)
