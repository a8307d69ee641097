"""Ranking: which keys of a ``top`` collector are named, and the remainder's counters
(issue 38). Pure arithmetic on numbers: the caller passes ``now`` and the rows.

Each run, every key's increase of each counter since the run before is found (a value
below the last one is a reset: the increase is the value itself, never negative) and
accounted exactly once: by the key's own series when it was named at its last sample
and still is and the counter did not reset, else by its group's remainder, which
therefore only grows. A named key's series shows its real value from the run it is
first named; after a run whose increase went to the remainder (it came back after a
time unnamed, or its counter reset) it continues from the value it showed, flat, so
that Prometheus, whose ``increase()`` spans a series' gaps, never counts an increase
twice nor sees a counter fall. A key's rate is the mean of its ranking counter's
increases, weighted over about ``WINDOW`` seconds.

A key is named when it ranks in the top ``limit`` and one of these holds: fewer than
``limit`` keys were ever named (the first fill); it was named before and is still
remembered (its series exists already); it carries ``HEAVY_SHARE`` of the total rate
(a heavy hitter); or a token of the ``churn`` allowance is left (tokens accrue at
``churn`` an hour, at most ``BURST`` hours' worth, starting empty). It takes a free
slot, or the slot of the slowest named key that ranked beyond ``band`` for ``hold``
seconds; a heavy hitter without such a slot takes the slowest other key's. At most
``limit`` keys are named at once. Nothing is named in the first run, which has no
rates.

Memory: one :class:`_Key` per key seen in the last ``forget`` seconds (2 × hold, at
least ``WINDOW``), never more than ``max_keys`` (the oldest absent ones go first).
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from exporter.config.definitions import Top

#: Seconds over which a key's rate is averaged (the time constant of its weighting).
WINDOW = 60.0
#: A key carrying this share of the total rate is named whatever the churn allowance:
#: one that holds 10 % of a steady load crosses it within 1.6 WINDOW, under 2 minutes.
HEAVY_SHARE = 0.08
#: Hours of churn allowance that may be saved up.
BURST = 1 / 12
#: Keys remembered at most, per collector and database.
MAX_KEYS = 200_000

Key = tuple[str, ...]
Group = tuple[Hashable, ...]
Values = Sequence[float | None]


@dataclass(slots=True, eq=False)
class _Key:
    """What is remembered of one key."""

    group: Group
    last: array[float]  # the counters at the last sample; NaN: none yet
    seen: float  # when last present
    rate: float = 0.0  # per second, of the ranking counter
    rated: bool = False  # its rate was measured once: later ones are weighted in
    value: float = 0.0  # the ranking counter's last value: the tie-break
    was_named: bool = False  # its series exists already: naming it again is free
    shown: array[float] | None = None  # what its series showed last; None: never named
    out_since: float | None = None  # named, and ranked beyond the band (or absent) since


@dataclass(slots=True)
class Decision:
    """One run's outcome: the counters each named key shows, and each group's
    remainder counters."""

    named: dict[Key, list[float]]
    remainder: dict[Group, list[float]]


@dataclass(slots=True)
class Ranking:
    """One ``top`` collector's keys on one database, across runs."""

    top: Top
    counters: int  # how many counter columns; the ranking one is at index ``by``
    by: int
    width: int  # how many labels of a key are ranked (the rest are kept by the remainder)
    signature: Hashable = ()  # what the caller made it for: a new one is made when it changes
    max_keys: int = MAX_KEYS
    keys: dict[Key, _Key] = field(default_factory=dict)
    named: set[Key] = field(default_factory=set)
    remainder: dict[Group, tuple[list[float], float]] = field(default_factory=dict)
    ever_named: int = 0
    tokens: float = 0.0
    last_run: float | None = None

    @property
    def forget(self) -> float:
        """Seconds an absent key (or group) is remembered."""
        return max(2 * self.top.hold, WINDOW)

    def run(self, now: float, rows: Sequence[tuple[Key, Group, Values]]) -> Decision:
        """Take one run's rows (key, group, counters; a NULL or NaN counter is None) and
        decide what is named; every increase is accounted by its key or its remainder.
        The caller has made sure no key repeats."""
        dt = None if self.last_run is None else max(now - self.last_run, 1e-9)
        self.last_run = now
        if dt is not None:
            allowance = self.top.churn
            self.tokens = min(allowance * BURST, self.tokens + dt * allowance / 3600)
        seen = [(key, self._observe(key, group, values, now, dt)) for key, group, values in rows]
        before = set(self.named)
        present = {key for key, _ in seen}
        if dt is not None:
            self._decay_absent(present, dt)
            self._name(now, present)
        remainder = self._account(now, seen, before)
        self._forget(now)
        named = {key: list(self.keys[key].shown or ()) for key in self.named}
        return Decision(named, remainder)

    def _observe(
        self, key: Key, group: Group, values: Values, now: float, dt: float | None
    ) -> tuple[list[float], list[bool]]:
        """The key's increases since its last sample and which of them are resets, its
        state brought up to date."""
        state = self.keys.get(key)
        if state is None:
            # Seen for the first time after the first run: it started from zero since.
            start = math.nan if dt is None else 0.0
            state = self.keys[key] = _Key(group, array("d", [start] * self.counters), now)
        resets = [v is not None and v < state.last[n] for n, v in enumerate(values)]
        increases = [_increase(state.last, n, v) for n, v in enumerate(values)]
        state.group, state.seen = group, now
        ranked = values[self.by]
        if ranked is not None and not math.isnan(ranked):
            state.value = ranked
        if dt is not None:
            rate = increases[self.by] / dt
            weight = 1 - math.exp(-dt / WINDOW) if state.rated else 1.0
            state.rate += weight * (rate - state.rate)
            state.rated = True
        return increases, resets

    def _decay_absent(self, present: set[Key], dt: float) -> None:
        """An absent key's rate fades as if it had stopped."""
        fade = math.exp(-dt / WINDOW)
        for key, state in self.keys.items():
            if key not in present:
                state.rate *= fade

    def _name(self, now: float, present: set[Key]) -> None:
        """Name the keys that rank in the top ``limit`` and may enter (module docstring)."""
        top = self.top
        order = heapq.nsmallest(top.band, present, key=self._order)
        band = set(order)
        for key in self.named:
            state = self.keys[key]
            state.out_since = None if key in band else (state.out_since or now)
        total = sum(self.keys[key].rate for key in present)
        leaders = set(order[: top.limit])
        for key in order[: top.limit]:
            state = self.keys[key]
            if key in self.named or self._spelt_like_remainder(key):
                continue
            heavy = total > 0 and state.rate >= HEAVY_SHARE * total
            free = self.ever_named < top.limit or state.was_named
            paid = not (heavy or free)
            if paid and (state.rate <= 0 or self.tokens < 1):
                continue
            if not self._make_room(now, heavy, leaders):
                continue
            self.named.add(key)
            self.ever_named += 0 if state.was_named else 1
            state.was_named = True
            self.tokens -= 1 if paid else 0

    def _make_room(self, now: float, heavy: bool, leaders: set[Key]) -> bool:
        """A slot for one more named key: a free one, or the slowest key's that may leave
        (or, for a heavy hitter, the slowest outside the leaders); False when none."""
        named = [(self.keys[key].rate, key) for key in self.named]
        if len(named) < self.top.limit:
            return True
        hold = self.top.hold
        leaving = [
            (rate, key)
            for rate, key in named
            if (since := self.keys[key].out_since) is not None and now - since >= hold
        ]
        if not leaving and heavy:
            leaving = [(rate, key) for rate, key in named if key not in leaders]
        if not leaving:
            return False
        victim = min(leaving)[1]
        self.named.discard(victim)
        self.keys[victim].out_since = None
        return True

    def _spelt_like_remainder(self, key: Key) -> bool:
        """A key whose ranked labels all read ``other`` is never named: its series would
        be the remainder's, so it stays in the remainder."""
        return all(part == self.top.other for part in key[: self.width])

    def _order(self, key: Key) -> tuple[float, float, Key]:
        state = self.keys[key]
        return (-state.rate, -state.value, key)

    def _account(
        self, now: float, seen: list[tuple[Key, tuple[list[float], list[bool]]]], before: set[Key]
    ) -> dict[Group, list[float]]:
        """Add to each group's remainder the increases its own series do not show."""
        for key, (increases, resets) in seen:
            state = self.keys[key]
            totals, _ = self.remainder.get(state.group) or ([0.0] * self.counters, now)
            self.remainder[state.group] = (totals, now)
            own = _show(state, increases, resets, key in before) if key in self.named else None
            for n, increase in enumerate(increases):
                if own is None or not own[n]:
                    totals[n] += increase
        groups = {self.keys[key].group for key, _ in seen}
        return {group: list(self.remainder[group][0]) for group in groups}

    def _forget(self, now: float) -> None:
        """Drop keys and groups absent too long, and the oldest absent keys beyond
        ``max_keys``."""
        horizon = now - self.forget
        gone = [key for key, state in self.keys.items() if state.seen < horizon]
        if len(self.keys) - len(gone) > self.max_keys:
            absent = sorted((s.seen, k) for k, s in self.keys.items() if s.seen < now)
            gone = [key for _, key in absent[: len(self.keys) - self.max_keys]]
        for key in gone:
            del self.keys[key]
            self.named.discard(key)
        for group in [g for g, (_, seen) in self.remainder.items() if seen < horizon]:
            del self.remainder[group]


def _show(state: _Key, increases: list[float], resets: list[bool], continuous: bool) -> list[bool]:
    """Bring a named key's shown counters up to date; True where its series shows the
    increase, which it does only when it was named at its last sample (``continuous``)."""
    shown = state.shown
    if shown is None:  # named for the first time: its real values, from here on
        state.shown = array("d", state.last)
        return [False] * len(increases)
    own = []
    for n, increase in enumerate(increases):
        if math.isnan(shown[n]):
            shown[n] = state.last[n]  # the first value known: a start, no increase
            own.append(False)
        elif resets[n] or not continuous:
            own.append(False)  # flat: the remainder takes what the gap or reset hides
        else:
            shown[n] += increase
            own.append(True)
    return own


def _increase(last: array[float], n: int, value: float | None) -> float:
    """A counter's increase since its last sample, and the sample kept: never negative
    (a value below the last is a reset, counted from zero); 0 without a last sample."""
    if value is None or math.isnan(value):
        return 0.0
    before = last[n]
    last[n] = value
    if math.isnan(before):
        return 0.0
    if value >= before:
        return value - before
    return max(value, 0.0)
