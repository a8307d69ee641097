"""How often the health probe asks: slowly while the target is steady, quickly while it
may be changing role (issue 18). Pure: the probe tells it what it saw and when.

A fast spell starts when something suggests a change: a reading that differs from the
last one (a failed probe, a new role, a replica's WAL receiver stopping or starting), a
slow answer, or a hint from outside (the probe's idle connection closing, a scrape
that saw another role). It ends after ``settle`` steady readings in a row; a reading
the target cannot stay in keeps it going only for that reading's ``hold`` (the prober
says how long a server down or a replica without upstream deserves), so a long
outage costs no more than the slow pace. Such a reading as the very first one starts
no spell: nothing was seen to change, and in a fleet a client naming unreachable
targets would otherwise buy ten connection attempts a second for each (issue 25).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

SLOW_INTERVAL = 1.0  # seconds between two probes while the target is steady
FAST_INTERVAL = 0.1  # seconds between two probes while it may be changing
SETTLE_READINGS = 3  # steady readings in a row that end a fast spell
FAST_LIMIT = 10.0  # seconds a suggestion from outside keeps the pace fast at most
SLOW_ANSWER = 0.25  # seconds: an answer slower than this suggests trouble


@dataclass(slots=True)
class Spell:
    """One fast spell: why it began, when, and what it cost."""

    reason: str
    started: float
    probes: int = 0  # probes run during the spell
    answered: int = 0  # of which the server answered: the queries it cost


class Pace:
    """Decides the interval before the next probe from the readings so far."""

    def __init__(
        self,
        slow: float = SLOW_INTERVAL,
        fast: float = FAST_INTERVAL,
        *,
        settle: int = SETTLE_READINGS,
        limit: float = FAST_LIMIT,
    ) -> None:
        if slow <= 0 or fast <= 0 or settle < 1 or limit <= 0:
            raise ValueError("intervals and the limit must be positive, settle at least 1")
        self.slow = slow
        self.fast = min(fast, slow)
        self.settle = settle
        self.limit = limit
        self.spell: Spell | None = None  # the fast spell under way, if any
        self._last: Hashable = None
        self._steady = 0
        self._fast_until = float("-inf")

    def suggest(self, reason: str, now: float, hold: float | None = None) -> None:
        """Something suggests the target is changing: probe quickly from now on, for at
        most ``hold`` seconds (``limit`` unless given) unless it steadies first."""
        self._fast_until = now + (self.limit if hold is None else hold)
        self._steady = 0
        if self.spell is None:
            self.spell = Spell(reason, now)

    def observe(
        self,
        reading: Hashable,
        now: float,
        *,
        hold: float | None,
        answered: bool,
        took: float = 0.0,
    ) -> Spell | None:
        """Account for one probe's reading; the spell it ended, if it ended one.

        ``hold`` is None for a reading the target can stay in (a primary, a streaming
        replica), else how long that reading may keep the pace fast; ``answered``
        says the server answered the query.
        """
        if self.spell is not None:
            self.spell.probes += 1
            self.spell.answered += answered
        if reading != self._last:
            if self._last is not None or hold is None:
                before = "start" if self._last is None else self._last
                self.suggest(f"{before} -> {reading}", now, hold)
        elif took > SLOW_ANSWER:
            self.suggest(f"an answer took {took:.2f}s", now, hold)
        elif hold is None:
            self._steady += 1
        self._last = reading
        if self.spell is not None and not self.is_fast(now):
            ended, self.spell = self.spell, None
            return ended
        return None

    def is_fast(self, now: float) -> bool:
        """True while a fast spell lasts."""
        return now < self._fast_until and self._steady < self.settle

    def interval(self, now: float) -> float:
        """Seconds from the start of one probe to the start of the next."""
        return self.fast if self.is_fast(now) else self.slow
