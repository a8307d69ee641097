"""Top N with a remainder: a ``top`` collector's rows ranked by :mod:`ranking`, the named
keys' rows passed on with their own values and the others summed into one remainder
row per kept labels, whose key labels read ``top.other`` (issue 38).

The rows that come out are what :class:`exporter.expose.samples.SampleBuilder` renders,
so names, help, scale and const labels are as for any collector. In a remainder row,
a COUNTER holds the remainder's count (it only grows), a GAUGE the sum of the values
of the keys not named in this run, and any other column NULL.
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from exporter.collect.ranking import Group, Key, Ranking
from exporter.collect.runtime import CollectorRuntime
from exporter.config.definitions import Collector, Usage
from exporter.errors import MissingColumnError, RepeatedLabelsError, TooManySeriesError, excerpt
from exporter.pg.casting import Kind, cast_for
from exporter.pg.postgres import Batch

TEXT_OID, FLOAT8_OID = 25, 701
_AS_IS = frozenset({Kind.INT, Kind.FLOAT, Kind.BOOL, Kind.EPOCH})  # numbers already


@dataclass(frozen=True, slots=True)
class Shape:
    """Where a result's columns are, decided once per run from its column names."""

    key: tuple[int, ...]  # the ranked LABEL columns
    kept: tuple[int, ...]  # the LABEL columns the remainder keeps
    counters: tuple[int, ...]
    gauges: tuple[int, ...]
    by: int  # the ranking counter's place among ``counters``
    label_texts: tuple[Callable[[Any], str], ...]  # per key and kept column
    numbers: dict[int, Callable[[Any], float | int]]  # value columns to convert
    types: tuple[int, ...]  # the type oids of the rows that come out
    width: int


def shape_of(collector: Collector, names: Sequence[str], types: Sequence[int]) -> Shape:
    """The shape of a result of ``collector`` with these columns; a LABEL column or the
    ranking counter missing from it fails the run."""
    top = collector.top
    assert top is not None
    index = {name: n for n, name in enumerate(names)}
    wanted = [c.name for c in collector.label_columns] + [top.by]
    if missing := [name for name in wanted if name not in index]:
        raise MissingColumnError(
            f"collector {collector.key}: column {missing[0]} (needed to rank by {top.by}) is "
            f"missing from the result; the query returned {', '.join(names) or 'no columns'}"
        )
    casts = [cast_for(oid) for oid in types]
    labels = collector.label_columns
    key = tuple(index[c.name] for c in labels if c.name not in top.keep)
    kept = tuple(index[c.name] for c in labels if c.name in top.keep)
    present = [c for c in collector.value_columns if c.name in index]
    counters = tuple(index[c.name] for c in present if c.usage is Usage.COUNTER)
    gauges = tuple(index[c.name] for c in present if c.usage is Usage.GAUGE)
    numbers = {n: casts[n].number for n in counters + gauges if casts[n].kind not in _AS_IS}
    # Key labels are text from here on, and values converted from text are floats.
    out = tuple(TEXT_OID if n in key else FLOAT8_OID if n in numbers else t
                for n, t in enumerate(types))  # fmt: skip
    return Shape(
        key, kept, counters, gauges, counters.index(index[top.by]),
        tuple(casts[n].label for n in key + kept), numbers, out, len(names),
    )  # fmt: skip


def ranking_of(runtime: CollectorRuntime, shape: Shape) -> Ranking:
    """The runtime's ranking, made anew when the result's counters moved (a column
    that went missing or came back)."""
    signature = (shape.counters, shape.by, shape.key, shape.kept)
    held = runtime.ranking
    if held is not None and held.signature == signature:
        return held
    top = runtime.collector.top
    assert top is not None
    held = runtime.ranking = Ranking(top, len(shape.counters), shape.by, len(shape.key), signature)
    return held


def rank_rows(ranking: Ranking, shape: Shape, rows: list[tuple[object, ...]], now: float,
              collector: Collector) -> list[tuple[object, ...]]:  # fmt: skip
    """The rows to publish: the named keys' and one remainder row per kept labels."""
    converted = [_converted(shape, row) for row in rows]
    identities = [_identity(shape, row) for row in rows]
    _check_unique(collector, identities)
    observed = [
        (key, tuple(row[n] for n in shape.kept), [_number(row[n]) for n in shape.counters])
        for key, row in zip(identities, converted, strict=True)
    ]
    decision = ranking.run(now, observed)
    out = [
        _shown(shape, row, decision.named[key])
        for key, row in zip(identities, converted, strict=True)
        if key in decision.named
    ]
    gauges = {group: [0.0] * len(shape.gauges) for group in decision.remainder}
    for (key, group, _), row in zip(observed, converted, strict=True):
        if key not in decision.named:
            sums = gauges[group]
            for m, n in enumerate(shape.gauges):
                sums[m] += _number(row[n]) or 0.0
    other = ranking.top.other
    out.extend(_remainder(shape, other, group, totals, gauges[group])
               for group, totals in decision.remainder.items())  # fmt: skip
    return out


def _shown(shape: Shape, row: tuple[object, ...], shown: list[float]) -> tuple[object, ...]:
    """A named key's row with the counters its series shows (NaN: none known yet)."""
    cells = list(row)
    for n, value in zip(shape.counters, shown, strict=True):
        cells[n] = None if math.isnan(value) else value
    return tuple(cells)


def _remainder(
    shape: Shape, other: str, group: Group, counters: list[float], gauges: list[float]
) -> tuple[object, ...]:
    """A group's remainder row: ``other`` for each ranked label, the kept labels as they
    are, the remainder's counters and the gauges' sums; NULL elsewhere."""
    cells: list[object] = [None] * shape.width
    for n in shape.key:
        cells[n] = other
    for columns, values in ((shape.kept, group), (shape.counters, counters),
                            (shape.gauges, gauges)):  # fmt: skip
        for n, value in zip(columns, values, strict=True):
            cells[n] = value
    return tuple(cells)


def _converted(shape: Shape, row: tuple[object, ...]) -> tuple[object, ...]:
    """The row with its key labels as text and its values as numbers where their type
    said otherwise, so that a remainder's numbers render in the same column."""
    cells = list(row)
    for n, label in zip(shape.key, shape.label_texts, strict=False):
        cells[n] = "" if row[n] is None else label(row[n])
    for n, number in shape.numbers.items():
        if row[n] is not None:
            cells[n] = number(row[n])
    return tuple(cells)


def _identity(shape: Shape, row: tuple[object, ...]) -> Key:
    """A row's labels as text: its key, then its kept labels."""
    columns = shape.key + shape.kept
    return tuple(
        "" if row[n] is None else label(row[n])
        for n, label in zip(columns, shape.label_texts, strict=True)
    )


def _number(value: object) -> float | None:
    """A converted cell as a float; None for NULL, NaN and what is not a number."""
    if isinstance(value, int | float) and not math.isnan(value):
        return float(value)
    return None


def _check_unique(collector: Collector, identities: list[Key]) -> None:
    """One row per label set, as for any collector with counters: the run fails else."""
    if len(set(identities)) == len(identities):
        return
    seen: set[Key] = set()
    for repeated in identities:
        if repeated in seen:
            break
        seen.add(repeated)
    raise RepeatedLabelsError(
        f"collector {collector.key}: more than one row has the labels {excerpt(repeated)}; "
        "a ranked collector needs one row per label set, so nothing from this run is "
        "published. Make the LABEL columns unique (aggregate in the query)"
    )


async def ranked(
    runtime: CollectorRuntime, batches: AsyncGenerator[Batch, None], now: Callable[[], float],
    cap: int,
) -> AsyncGenerator[Batch, None]:  # fmt: skip
    """The run's batches read whole (at most ``cap`` rows), ranked, as one batch."""
    collector = runtime.collector
    rows: list[tuple[object, ...]] = []
    columns: tuple[Sequence[str], Sequence[int]] = ((), ())
    async with aclosing(batches) as stream:
        async for names, types, batch in stream:
            columns = (names, types)
            rows.extend(batch)
            if len(rows) > cap:
                raise TooManySeriesError(
                    f"collector {collector.key}: more than {cap} rows to rank; nothing is "
                    "published. Narrow the query or raise the collector's max_series"
                )
    if not rows:
        return
    shape = shape_of(collector, *columns)
    ranking = ranking_of(runtime, shape)
    yield columns[0], shape.types, rank_rows(ranking, shape, rows, now(), collector)
