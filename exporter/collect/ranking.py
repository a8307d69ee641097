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
``limit`` keys are named at once. The first run has no rates: it names every key when
there are at most ``limit`` (nothing to rank: the output is the collector's own, as
without ``top``), else none. A group's remainder is published from the first run in
which one of its keys is not named.

Cost: a key whose counters read exactly as at its last sample (most keys of a large
table of statistics, between two runs) costs a comparison of its cells; only the keys
that moved are converted and accounted. Rates fade lazily: a key's rate is kept with
the time it was set and read as ``rate × e^(-age / WINDOW)``, which is what a key that
stopped would have after as many runs of decay.

Memory: one :class:`_Key` per key seen in the last ``forget`` seconds (2 × hold, at
least ``WINDOW``, swept at most every ``WINDOW``), never more than ``max_keys`` (the
oldest absent ones go first).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from operator import add, ge, sub

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
#: A rate set this many WINDOWs ago has faded below e^-10 of itself: taken as 0.
FADED = 10.0

Key = tuple[Hashable, ...]  # a row's label texts, or a probe's key as it listed it
Group = tuple[Hashable, ...]
Values = Sequence[float | None]
#: The counters of a row as the caller has them, and how they become numbers.
Cells = Sequence[object]
Numbers = Callable[[Cells], Values]


def _as_numbers(cells: Cells) -> Values:
    """Cells that are numbers already (or None): as they are."""
    return cells  # type: ignore[return-value]


@dataclass(slots=True, eq=False)
class _Key:
    """What is remembered of one key."""

    group: Group
    last: list[float]  # the counters at the last sample; NaN: none yet
    seen: float  # when last known present (swept keys: within WINDOW)
    rate: float = 0.0  # per second, of the ranking counter, as it was at ``at``
    at: float | None = None  # when ``rate`` was set; None: never measured
    value: float = 0.0  # the ranking counter's last value: the tie-break
    was_named: bool = False  # its series exists already: naming it again is free
    shown: list[float] | None = None  # what its series showed last; None: never named
    out_since: float | None = None  # named, and ranked beyond the band (or absent) since

    def rate_at(self, now: float) -> float:
        """Its rate now: as measured, faded for the time since."""
        at = self.at
        if at is None or not self.rate:
            return 0.0
        return self.rate * math.exp((at - now) / WINDOW)


@dataclass(slots=True)
class _Spare:
    """The named keys that may give up their slot in this run, slowest last (sorted at
    the first need): those out of the band long enough, and those outside the leaders."""

    leaving: list[tuple[float, Key]] | None = None
    others: list[tuple[float, Key]] | None = None


@dataclass(slots=True)
class Decision:
    """One run's outcome: the counters each named key shows, and each group's
    remainder counters (the groups with a key not named)."""

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
    cells: dict[Key, tuple[object, ...]] = field(default_factory=dict)  # the last run's rows
    named: set[Key] = field(default_factory=set)
    remainder: dict[Group, tuple[list[float], float]] = field(default_factory=dict)
    used: set[Group] = field(default_factory=set)  # groups whose remainder is published
    active: set[Key] = field(default_factory=set)  # keys whose rate may not be 0
    ever_named: int = 0
    tokens: float = 0.0
    last_run: float | None = None
    runs: int = 0
    weight: float = 1.0
    swept: float | None = None
    by_value: list[Key] | None = None  # every key by its ranking counter's value, largest first
    present_groups: tuple[dict[Key, Group], set[Group]] | None = None  # the last run's
    swept_present: dict[Key, Group] | None = None  # what the last full sweep was passed
    swept_present_at: float = 0.0  # the last run it was passed in

    @property
    def forget(self) -> float:
        """Seconds an absent key (or group) is remembered."""
        return max(2 * self.top.hold, WINDOW)

    def run(
        self, now: float, rows: Sequence[tuple[Key, Group, Cells]], numbers: Numbers = _as_numbers
    ) -> Decision:
        """Take one run's rows (key, group, counter cells; ``numbers`` turns cells into
        floats, None or NaN for a NULL) and decide what is named; every increase is
        accounted by its key or its remainder. The caller has made sure no key repeats."""
        keys, groups, cells = (
            [row[0] for row in rows],
            [row[1] for row in rows],
            [row[2] for row in rows],
        )
        return self.run_columns(now, keys, groups, cells, numbers)

    def run_columns(
        self, now: float, keys: Sequence[Key], groups: Sequence[Group], cells: Sequence[Cells],
        numbers: Numbers = _as_numbers,
    ) -> Decision:  # fmt: skip
        """:meth:`run` with the rows as three columns: the keys, their groups and their
        counter cells. The keys whose cells are those of their last sample cost a
        comparison; only the others are looked at one by one."""
        # Tuples, so that a list the caller changes later does not look idle next run.
        current = dict(zip(keys, map(tuple, cells), strict=True))
        present = dict(zip(keys, groups, strict=True))
        changed = _changed(current, self.cells)
        self.cells = current
        return self.run_moved(now, present, changed, numbers)

    def run_moved(
        self, now: float, present: dict[Key, Group], changed: Sequence[tuple[Key, Cells]],
        numbers: Numbers = _as_numbers,
    ) -> Decision:  # fmt: skip
        """:meth:`run` told only which keys are present (and their groups) and the cells of
        those that changed since the last run (every key, in the first): for a caller
        that finds them cheaper than a comparison of rows (a probe, :mod:`probed`)."""
        first = self.last_run is None
        dt = 0.0 if first else max(now - (self.last_run or 0.0), 1e-9)
        self.last_run, self.runs = now, self.runs + 1
        self.weight = 1 - math.exp(-dt / WINDOW)  # of this run's rate in a key's
        if not first:
            allowance = self.top.churn
            self.tokens = min(allowance * BURST, self.tokens + dt * allowance / 3600)
        moved = [
            (key, self._observe(key, present[key], numbers(row), now, None if first else dt))
            for key, row in changed
        ]
        before = set(self.named)
        if first:
            if len(present) <= self.top.limit:
                self._name_all(present)
        else:
            self._name(now, present)
        remainder = self._account(now, moved, before, present)
        if present is self.swept_present:
            self.swept_present_at = now
        if self.swept is None or now - self.swept >= WINDOW or len(self.keys) > self.max_keys:
            self._sweep(now, present)
        named = {key: list(self.keys[key].shown or ()) for key in self.named}
        return Decision(named, remainder)

    def _observe(
        self, key: Key, group: Group, values: Values, now: float, dt: float | None
    ) -> tuple[list[float], list[bool]]:
        """The key's increases since its last sample and which of them are resets, its
        state brought up to date (``dt``: seconds since the last run, None in the first)."""
        state = self.keys.get(key)
        new = state is None
        if state is None:
            # Seen for the first time after the first run: it started from zero since.
            start = math.nan if dt is None else 0.0
            state = self.keys[key] = _Key(group, [start] * self.counters, now)
            self.by_value = None
        last = state.last
        if None not in values and all(map(ge, values, last)):  # type: ignore[arg-type]
            # No NULL, no NaN (it compares false) and no reset: at C level.
            increases, resets = list(map(sub, values, last)), [False] * self.counters
            last[:] = values  # type: ignore[assignment]
        else:
            increases, resets = _increases(last, values)
        state.group, state.seen = group, now
        if resets[self.by]:
            self.by_value = None
        if not math.isnan(last[self.by]):
            state.value = last[self.by]
        if dt is not None:
            rate = increases[self.by] / dt
            at = state.at
            if new or self.runs == 2 or at is None:  # its first rate, or the first anybody has
                weight = 1.0 if new or self.runs == 2 else self.weight
                state.rate = weight * rate
            else:
                faded = state.rate * math.exp((at - now) / WINDOW) if state.rate else 0.0
                state.rate = faded + self.weight * (rate - faded)
            state.at = now
            if state.rate:
                self.active.add(key)
        return increases, resets

    def _name_all(self, present: dict[Key, Group]) -> None:
        """The first run, with no more keys than ``limit``: all of them, free."""
        for key in present:
            if not self._spelt_like_remainder(key):
                self.named.add(key)
                self.keys[key].was_named = True
        self.ever_named = len(self.named)

    def _name(self, now: float, present: dict[Key, Group]) -> None:
        """Name the keys that rank in the top ``limit`` and may enter (module docstring)."""
        top, keys = self.top, self.keys
        rates = {key: keys[key].rate_at(now) for key in self.active if key in present}
        order = [key for _, _, key in heapq.nsmallest(
            top.band, ((-rate, -keys[key].value, key) for key, rate in rates.items() if rate)
        )]  # fmt: skip
        if len(order) < top.band:  # the rest of the band: keys without a rate, by value
            order += self._idle(top.band - len(order), present, rates)
        band = set(order)
        for key in self.named:
            state = keys[key]
            state.out_since = None if key in band else (state.out_since or now)
        total = sum(rates.values())
        leaders = set(order[: top.limit])
        spare = _Spare()
        for key in order[: top.limit]:
            state = keys[key]
            if key in self.named or self._spelt_like_remainder(key):
                continue
            rate = rates.get(key, 0.0)
            heavy = total > 0 and rate >= HEAVY_SHARE * total
            free = self.ever_named < top.limit or state.was_named
            paid = not (heavy or free)
            if paid and (rate <= 0 or self.tokens < 1):
                continue
            if not self._make_room(now, heavy, leaders, spare):
                continue
            self.named.add(key)
            self.ever_named += 0 if state.was_named else 1
            state.was_named = True
            self.tokens -= 1 if paid else 0

    def _idle(self, wanted: int, present: dict[Key, Group], rates: dict[Key, float]) -> list[Key]:
        """The ``wanted`` present keys without a rate, by value: from an order of every
        key by value, kept until a key is added, its ranking counter resets, or a sweep
        drops a key or sees a rate fade (a key's value otherwise moves only with its
        rate, and a key with a rate is skipped here)."""
        if self.by_value is None:
            keys = self.keys
            self.by_value = [key for _, key in sorted((-keys[key].value, key) for key in keys)]
        found: list[Key] = []
        for key in self.by_value:
            if key in present and not rates.get(key):
                found.append(key)
                if len(found) == wanted:
                    break
        return found

    def _make_room(self, now: float, heavy: bool, leaders: set[Key], spare: _Spare) -> bool:
        """A slot for one more named key: a free one, or the slowest key's that may leave
        (or, for a heavy hitter, the slowest outside the leaders); False when none. The
        candidates are sorted once a run (``spare``): within a run no rate moves, and a
        key named in it is a leader that has not been out of the band."""
        if len(self.named) < self.top.limit:
            return True
        keys, hold = self.keys, self.top.hold
        if spare.leaving is None:
            spare.leaving = sorted(
                ((keys[key].rate_at(now), key) for key in self.named
                 if (since := keys[key].out_since) is not None and now - since >= hold),
                reverse=True,
            )  # fmt: skip
        victim = self._slowest(spare.leaving)
        if victim is None and heavy:
            if spare.others is None:
                spare.others = sorted(
                    ((keys[key].rate_at(now), key) for key in self.named if key not in leaders),
                    reverse=True,
                )
            victim = self._slowest(spare.others)
        if victim is None:
            return False
        self.named.discard(victim)
        keys[victim].out_since = None
        return True

    def _slowest(self, candidates: list[tuple[float, Key]]) -> Key | None:
        """The slowest of ``candidates`` (sorted fastest first) still named, taken out."""
        while candidates:
            _, key = candidates.pop()
            if key in self.named:
                return key
        return None

    def _spelt_like_remainder(self, key: Key) -> bool:
        """A key whose ranked labels all read ``other`` is never named: its series would
        be the remainder's, so it stays in the remainder."""
        return all(part == self.top.other for part in key[: self.width])

    def _account(
        self, now: float, moved: list[tuple[Key, tuple[list[float], list[bool]]]],
        before: set[Key], present: dict[Key, Group],
    ) -> dict[Group, list[float]]:  # fmt: skip
        """Add to each group's remainder the increases its own series do not show; the
        remainders of the groups that have a key not named."""
        keys, named = self.keys, self.named
        for key in named - before:  # named this run: its series starts where it stands
            state = keys[key]
            if state.shown is None:
                state.shown = list(state.last)
        for key, (increases, resets) in moved:
            state = keys[key]
            totals = self._totals(state.group, now)
            own = _show(state, increases, resets, key in before) if key in named else None
            if own is None:
                totals[:] = map(add, totals, increases)
                continue
            for n, increase in enumerate(increases):
                if increase and not own[n]:
                    totals[n] += increase
        groups = self._groups(present)
        if not groups <= self.used and sum(key in present for key in named) < len(present):
            self.used.update(group for key, group in present.items() if key not in named)
        return {group: list(self._totals(group, now)) for group in groups & self.used}

    def _groups(self, present: dict[Key, Group]) -> set[Group]:
        """The groups of the present keys: found again only for another mapping than the
        last run's (a probe passes the same one while its keys stay the same)."""
        held = self.present_groups
        if held is None or held[0] is not present:
            held = self.present_groups = (present, set(present.values()))
        return held[1]

    def _totals(self, group: Group, now: float) -> list[float]:
        """A group's remainder counters, marked as seen now."""
        totals, _ = self.remainder.get(group) or ([0.0] * self.counters, now)
        self.remainder[group] = (totals, now)
        return totals

    def _sweep(self, now: float, present: dict[Key, Group]) -> None:
        """Drop keys and groups absent too long, and the oldest absent keys beyond
        ``max_keys``; keys whose rate has faded leave ``active``.

        A caller that passes the same mapping run after run while its keys stay the same
        (a probe, :mod:`probed`) costs no walk over the keys: when every key is in the
        mapping of the last full sweep and it is passed again, none is absent. Its keys
        were present at every run it was passed in, which a full sweep then notes."""
        keys = self.keys
        self.swept = now
        horizon = now - self.forget
        if present is not self.swept_present or len(keys) != len(present):
            if (old := self.swept_present) is not None:
                at = self.swept_present_at
                for key in old:
                    state = keys.get(key)
                    if state is not None and state.seen < at:
                        state.seen = at
            self.swept_present, self.swept_present_at = present, now
            for key in present:
                keys[key].seen = now
            gone = [key for key, state in keys.items() if state.seen < horizon]
            if len(keys) - len(gone) > self.max_keys:
                absent = sorted((s.seen, k) for k, s in keys.items() if k not in present)
                gone = [key for _, key in absent[: len(keys) - self.max_keys]]
            if gone:
                self.by_value = None
            for key in gone:
                del keys[key]
                self.named.discard(key)
                self.active.discard(key)
        for group in self._groups(present):
            self._totals(group, now)
        faded = now - FADED * WINDOW
        active = {key for key in self.active if (keys[key].at or 0.0) >= faded}
        if len(active) < len(self.active):  # their values moved since the order was made
            self.by_value = None
        self.active = active
        for group in [g for g, (_, seen) in self.remainder.items() if seen < horizon]:
            del self.remainder[group]
            self.used.discard(group)


def _increases(last: list[float], values: Values) -> tuple[list[float], list[bool]]:
    """Counter by counter: the increases since ``last`` (updated) and which are resets.
    A NULL or NaN is no increase and keeps the last value; a value below the last is a
    reset, counted from zero; nothing counts against a last value not known (NaN)."""
    increases, resets = [0.0] * len(last), [False] * len(last)
    for n, value in enumerate(values):
        if value is None or math.isnan(value):
            continue
        before, last[n] = last[n], value
        if value >= before:
            increases[n] = value - before
        elif not math.isnan(before):
            resets[n] = True
            increases[n] = value if value > 0 else 0.0
    return increases, resets


def _show(state: _Key, increases: list[float], resets: list[bool], continuous: bool) -> list[bool]:
    """Bring a named key's shown counters up to date; True where its series shows the
    increase, which it does only when it was named at its last sample (``continuous``)."""
    shown = state.shown
    if shown is None:  # named for the first time: its real values, from here on
        state.shown = list(state.last)
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


def _changed(
    current: dict[Key, tuple[object, ...]], last: dict[Key, tuple[object, ...]]
) -> list[tuple[Key, tuple[object, ...]]]:
    """The keys (and cells) of ``current`` whose cells differ from ``last``'s or are new.
    A comparison of tuples a key (the cells' strings are new objects each run, so a set
    difference would hash them all: twice the time)."""
    old = last.get
    return [(key, row) for key, row in current.items() if old(key) != row]
