"""The counters of a probed ``top`` collector: what each named key's series shows and
what the remainder holds, from the named keys' rows and the totals over every key
(issue 38). Pure arithmetic on numbers: :mod:`probed` reads the database.

Counter by counter, each run: a key named in this run and the last shows its own
increase; one named anew shows its real value, or, when it was named before and is
still remembered, continues flat from what it showed, as :mod:`ranking` has it (so
that Prometheus, whose ``increase()`` spans a series' gaps, never counts an increase
twice). The remainder grows by the total's increase less the increases the named
series show, so that the named series and the remainder add up to the total. A named
key whose counter fell (a reset) shows no increase, and what it counted since goes to
the remainder; a named key no longer listed (dropped) takes its last values out of the
total's fall. Only a key not named that is dropped or reset makes the total fall
unseen: the remainder then does not grow in that run (it never falls), and misses at
most what the other keys not named counted in it.

Memory: the last values of the keys named in the last run, and what the series of the
keys named at some time show while the probe still lists them. Cost: a key whose row
reads as in the last run is passed as unchanged and costs nothing here.

:class:`Listing` keeps what the probe listed last, so that a run whose keys are those of
the last one (most runs: tables come and go seldom) finds the keys whose ranking counter
moved by comparing two arrays at C level, not one key after another.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from itertools import compress
from operator import add, ge, ne, sub

from exporter.collect.ranking import Group, Key
from exporter.pg.casting import array_elements


@dataclass(slots=True)
class Listing:
    """The keys a probe listed in its last run, as keys of a ranking, with their ranking
    counters. The probe's arrays come as PostgreSQL writes them (text: reading each
    element is left for when the text changed) or as lists."""

    raw_keys: object = None  # as the probe gave them
    raw_values: object = None
    group: Group = ()
    keys: list[Key] = field(default_factory=list)
    present: dict[Key, Group] = field(default_factory=dict)
    values: list[object] = field(default_factory=list)  # each key's, as the probe gave it

    def update(
        self, raw_keys: str | list[object], raw_values: str | list[object], group: Group
    ) -> list[tuple[Key, tuple[float | int | None]]]:
        """Take this run's listing; the keys whose value is not the last run's (or that
        are new), each with its value as a number. Raises ValueError for an array that
        is not one, or two of different lengths."""
        same_keys = raw_keys == self.raw_keys and group == self.group
        if same_keys and raw_values == self.raw_values:
            return []  # nothing moved: one comparison at C level
        values = _elements(raw_values)
        if same_keys:
            keys = self.keys
            _check_lengths(keys, values)
            moved = compress(range(len(values)), map(ne, values, self.values))
            changed = [(keys[n], (probe_number(values[n]),)) for n in moved]
        else:
            # As listed (no text of each made), with the group's labels after.
            listed = _elements(raw_keys)
            keys = [(key, *group) for key in listed] if group else list(zip(listed))
            _check_lengths(keys, values)
            last = dict(zip(self.keys, self.values, strict=True))
            changed = [
                (key, (probe_number(value),)) for key, value in zip(keys, values, strict=True)
                if key not in last or last[key] != value
            ]  # fmt: skip
            self.keys, self.group = keys, group
            self.present = dict.fromkeys(keys, group)
        self.raw_keys, self.raw_values, self.values = raw_keys, raw_values, values
        return changed

    @property
    def repeated(self) -> bool:
        """Whether a key is listed twice."""
        return len(self.present) != len(self.keys)


def _elements(raw: str | list[object]) -> list[object]:
    """An array's elements: read from its text, or the list as it is."""
    if isinstance(raw, str):
        return list(array_elements(raw))
    return raw


def _check_lengths(keys: list[Key], values: list[object]) -> None:
    if len(keys) != len(values):
        raise ValueError(f"it lists {len(keys)} keys but {len(values)} values to rank them")


def probe_number(value: object) -> float | int | None:
    """A probe's cell as a number: an int or float as it is, a text or decimal read;
    None for NULL and what is not a number."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return value
    if isinstance(value, str):
        return _read_number(value)
    return float(value) if isinstance(value, Decimal) else None


def _read_number(text: str) -> float | int | None:
    """A number's text as an int (counters are whole) or a float; None if it is none."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return None


@dataclass(slots=True)
class Probing:
    """A probed collector's state on one database: per group (the labels a probe row
    keeps) what it listed last and its account; every group's keys in one mapping."""

    listings: dict[Group, Listing] = field(default_factory=dict)
    accounts: dict[Group, Account] = field(default_factory=dict)
    merged: tuple[list[dict[Key, Group]], dict[Key, Group]] | None = None

    def present(self) -> dict[Key, Group]:
        """Every listed key with its group: one group's own mapping as it is (the same
        object while its keys stay the same), several merged anew only when one changed."""
        mappings = [listing.present for listing in self.listings.values()]
        if len(mappings) == 1:
            return mappings[0]
        held = self.merged
        if (
            held is None
            or len(held[0]) != len(mappings)
            or not all(map(operator.is_, held[0], mappings))
        ):
            merged: dict[Key, Group] = {}
            for mapping in mappings:
                merged.update(mapping)
            held = self.merged = (mappings, merged)
        return held[1]


@dataclass(slots=True)
class Account:
    """One probed collector's counters on one database, across runs."""

    signature: Hashable  # what the caller made it for: a new one is made when it changes
    counters: int
    last: dict[Key, list[float]] = field(default_factory=dict)  # the last run's named keys
    shown: dict[Key, list[float]] = field(default_factory=dict)  # what their series show
    totals: list[float] | None = None  # the totals at the last run (NaN: not given)
    remainder: list[float] = field(default_factory=list)
    published: bool = False  # the remainder has been published once: it stays
    # The caller's: each named key's last row as read and as published (:mod:`probed`).
    rendered: dict[Key, tuple[tuple[object, ...], tuple[object, ...]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.remainder:
            self.remainder = [0.0] * self.counters

    def run(
        self, rows: Mapping[Key, Sequence[float] | None], listed: Collection[Key],
        totals: Sequence[float],
    ) -> dict[Key, list[float]]:  # fmt: skip
        """Take one run: the named keys' counters (NaN for NULL; None: a key named in the
        last run whose counters read as then), every key the probe listed, and the totals
        over all of them (NaN: not given). Returns what each named key's series shows (not
        to be changed); the remainder is then in ``remainder``."""
        shown_increase = [0.0] * self.counters  # of this run's, what the named series show
        out = {key: self._named(key, values, shown_increase) for key, values in rows.items()}
        for key in [key for key in self.last if key not in rows]:
            gone = self.last.pop(key)
            if key not in listed:  # dropped: its counts left the total with it
                for n, before in enumerate(gone):
                    if not math.isnan(before):
                        shown_increase[n] -= before
        for key in [key for key in self.shown if key not in rows and key not in listed]:
            del self.shown[key]
        now = [float(t) for t in totals]
        if self.totals is not None:
            for n, (after, before) in enumerate(zip(now, self.totals, strict=True)):
                if not (math.isnan(after) or math.isnan(before)):
                    self.remainder[n] += max(0.0, after - before - shown_increase[n])
        self.totals = now
        if len(listed) > len(rows):
            self.published = True
        return out

    def _named(
        self, key: Key, values: Sequence[float] | None, increase: list[float]
    ) -> list[float]:
        """What a named key's series shows now; what it shows of this run's increase is
        added to ``increase``."""
        shown = self.shown.get(key)
        last = self.last.get(key)
        if values is None:  # as in the last run, when it was named: nothing moved
            assert shown is not None
            assert last is not None
            return shown
        if shown is None:  # named for the first time: its real values from here on
            shown = self.shown[key] = list(values)
            self.last[key] = list(values)
        elif last is None:  # named again after a time unnamed: flat from what it showed
            shown[:] = [v if math.isnan(s) else s for s, v in zip(shown, values, strict=True)]
            self.last[key] = list(values)
        else:
            self._advance(last, shown, values, increase)
        return shown

    @staticmethod
    def _advance(
        last: list[float], shown: list[float], values: Sequence[float], increase: list[float]
    ) -> None:
        """A key named in the last run and this one: its series shows its increase."""
        if all(map(ge, values, last)):  # no NaN (it compares false), no reset: at C level
            increases = list(map(sub, values, last))
            shown[:] = map(add, shown, increases)
            increase[:] = map(add, increase, increases)
            last[:] = values
            return
        for n, value in enumerate(values):
            if math.isnan(value):
                continue  # NULL: no increase, the last value kept
            before, last[n] = last[n], value
            if math.isnan(before):
                if math.isnan(shown[n]):
                    shown[n] = value  # the first value known: a start
            elif value >= before:
                shown[n] += value - before
                increase[n] += value - before
            else:  # a reset: flat, and the remainder takes what it counted since
                increase[n] -= before
