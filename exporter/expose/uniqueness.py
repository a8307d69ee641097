"""Unique series: no page serves one series twice (issue 36, guarantee 8).

A page holds what every collector produced on every database, and families of one
name are merged into one (``exposition.encode``). Each source's own series are
unique already (``SampleBuilder`` refuses rows repeating a label set), but two
sources may produce the same series: one collector on two databases when its
series carry no label telling the databases apart, or two collectors whose names
meet. A strict parser refuses such a page whole, and Prometheus keeps one of the
two at random. Here the first source's series is kept and the later one left out,
and the caller is told which, to say so once.

The check is a plain function over rendered families and its cost is low: sources
whose families carry a label fixed to different values in each (a per-database
collector's ``datname``, see ``Family.fixed``) cannot meet, and are told apart
without reading a sample; only the others have their samples read.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from exporter.expose.exposition import Family


@dataclass(frozen=True, slots=True)
class Repeat:
    """Series of one source left out because an earlier source served them already."""

    source: int  # position of the source whose series were left out
    first: int  # position of the source that keeps them
    family: str
    series: int


@dataclass(frozen=True, slots=True)
class _Entry:
    source: int
    position: int  # of the family among its source's families
    family: Family


def without_repeats(
    sources: Sequence[tuple[Family, ...]],
) -> tuple[list[tuple[Family, ...]], list[Repeat]]:
    """``sources`` (in the order their series are served) with every series that an earlier
    source also produced left out, and what was left out."""
    groups: defaultdict[str, list[_Entry]] = defaultdict(list)
    for source, families in enumerate(sources):
        for position, family in enumerate(families):
            if family.series:
                groups[family.name].append(_Entry(source, position, family))
    kept = [list(families) for families in sources]
    repeats: list[Repeat] = []
    for entries in groups.values():
        if len(entries) < 2:
            continue
        for cluster in _may_meet(entries):
            for entry, family, repeat in _check(cluster):
                kept[entry.source][entry.position] = family
                repeats.append(repeat)
    if not repeats:
        return list(sources), []
    return [tuple(f for f in families if f.series) for families in kept], repeats


def _may_meet(entries: list[_Entry]) -> list[list[_Entry]]:
    """The entries of one name that may share a series, in clusters of two or more: all of
    them, unless a label fixed in every one splits them by its value (families of one kind
    only, as the encoder drops a family of another kind whole)."""
    kind = entries[0].family.kind
    entries = [e for e in entries if e.family.kind == kind]
    labels = set(dict(entries[0].family.fixed))
    for entry in entries[1:]:
        labels.intersection_update(dict(entry.family.fixed))
    best = [entries]
    for label in sorted(labels):
        split: defaultdict[str, list[_Entry]] = defaultdict(list)
        for entry in entries:
            split[dict(entry.family.fixed)[label]].append(entry)
        if len(split) > len(best):
            best = list(split.values())
    return [cluster for cluster in best if len(cluster) > 1]


def _check(cluster: list[_Entry]) -> list[tuple[_Entry, Family, Repeat]]:
    """Read the samples of a cluster: each later family without the series an earlier
    one has, and what it lost."""
    first_by_series: dict[bytes, int] = {}
    found: list[tuple[_Entry, Family, Repeat]] = []
    for entry in cluster:
        lines = entry.family.text_samples.split(b"\n")[:-1]
        # A value holds no space, so a series is its line up to the last one.
        identities = [line.rpartition(b" ")[0] for line in lines]
        if first_by_series.keys().isdisjoint(identities):
            repeated = []
        else:
            repeated = [n for n, key in enumerate(identities) if key in first_by_series]
        if repeated:
            first = first_by_series[identities[repeated[0]]]
            found.append(_without(entry, lines, repeated, first))
        earlier = first_by_series
        first_by_series = dict.fromkeys(identities, entry.source)
        first_by_series.update(earlier)  # a series repeated keeps naming its first source
    return found


def _without(
    entry: _Entry, lines: list[bytes], repeated: list[int], first: int
) -> tuple[_Entry, Family, Repeat]:
    """The entry's family less the ``repeated`` lines."""
    family = entry.family
    drop = set(repeated)
    rest = [line for n, line in enumerate(lines) if n not in drop]
    samples = b"".join(line + b"\n" for line in rest)
    smaller = Family(family.name, family.kind, family.help, len(rest), samples, family.fixed)
    return entry, smaller, Repeat(entry.source, first, family.name, len(repeated))
