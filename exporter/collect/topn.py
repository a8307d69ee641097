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
from operator import itemgetter
from typing import Any

from exporter.collect.ranking import Group, Key, Ranking
from exporter.collect.runtime import CollectorRuntime
from exporter.config.definitions import Collector, Usage
from exporter.errors import MissingColumnError, RepeatedLabelsError, TooManySeriesError, excerpt
from exporter.expose.samples import ABSENT, SparseRows
from exporter.pg.casting import Kind, cast_for
from exporter.pg.postgres import Batch

TEXT_OID, FLOAT8_OID = 25, 701
_AS_IS = frozenset({Kind.INT, Kind.FLOAT, Kind.BOOL, Kind.EPOCH})  # numbers already
_TEXTS = frozenset({Kind.TEXT, Kind.NUMERIC})  # labels that are their text already


@dataclass(frozen=True, slots=True)
class Shape:
    """Where a result's columns are, decided once per run from its column names."""

    key: tuple[int, ...]  # the ranked LABEL columns
    kept: tuple[int, ...]  # the LABEL columns the remainder keeps
    counters: tuple[int, ...]
    gauges: tuple[int, ...]
    summed: tuple[int, ...]  # the GAUGE columns the remainder sums (``top.sum``)
    largest: tuple[int, ...]  # and those it takes the largest of (``top.max``)
    by: int  # the ranking counter's place among ``counters`` (-1: a probe ranks)
    label_texts: tuple[Callable[[Any], str] | None, ...]  # per key and kept column; None: text
    numbers: dict[int, Callable[[Any], float | int]]  # value columns to convert
    types: tuple[int, ...]  # the type oids of the rows that come out
    width: int

    def convert(self, row: Sequence[object]) -> Sequence[float | None]:
        """A row's counters as numbers (None for a NULL, NaN where a text is none)."""
        numbers = self.numbers
        cells = [row[n] for n in self.counters]
        if not numbers:
            return cells  # type: ignore[return-value]
        return [
            cell if cell is None or (f := numbers.get(n)) is None else f(cell)  # type: ignore[misc]
            for n, cell in zip(self.counters, cells, strict=True)
        ]


def shape_of(collector: Collector, names: Sequence[str], types: Sequence[int]) -> Shape:
    """The shape of a result of ``collector`` with these columns; a LABEL column or the
    ranking counter missing from it fails the run."""
    top = collector.top
    assert top is not None
    index = {name: n for n, name in enumerate(names)}
    probed = top.probe is not None  # the probe ranks: the rows need not hold ``by``
    wanted = [c.name for c in collector.label_columns] + ([] if probed else [top.by])
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
        key, kept, counters, gauges,
        tuple(n for n in gauges if names[n] in top.sum),
        tuple(n for n in gauges if names[n] in top.max),
        -1 if probed else counters.index(index[top.by]),
        tuple(None if casts[n].kind in _TEXTS else casts[n].label for n in key + kept),
        numbers, out, len(names),
    )  # fmt: skip


def shape_for(runtime: CollectorRuntime, names: Sequence[str], types: Sequence[int]) -> Shape:
    """:func:`shape_of` the runtime's collector, kept while its result's columns are the
    same (run after run, as a rule)."""
    columns = (tuple(names), tuple(types))
    held = runtime.shape
    if held is None or held[0] != columns:
        held = runtime.shape = (columns, shape_of(runtime.collector, names, types))
    return held[1]


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


def rank_rows(
    ranking: Ranking, shape: Shape, rows: list[tuple[object, ...]], now: float,
    collector: Collector,
) -> tuple[list[tuple[object, ...]], SparseRows]:  # fmt: skip
    """The rows to publish: the named keys', and one remainder row per kept labels that
    has a key not named. Per row, only C-level work unless its counters moved."""
    identities = key_labels(shape, rows)
    _check_unique(collector, identities)
    groups = _columns(shape.kept, rows)
    # Whole rows are compared with the last run's: a row that reads the same is idle.
    decision = ranking.run_columns(now, identities, groups, rows, shape.convert)
    named, held = decision.named, ranking.cells
    out = [  # a named key absent from this run has no row: its series goes stale
        shown_row(shape, converted(shape, held[key], key), named[key])
        for key in sorted(named)
        if key in held
    ]
    gauges: dict[Group, dict[int, list[float]]] = {group: {} for group in decision.remainder}
    if shape.summed or shape.largest:
        for key, group, row in zip(identities, groups, rows, strict=True):
            found = gauges.get(group)
            if found is not None and key not in named:
                for n in shape.summed + shape.largest:
                    if (value := as_number(value_cell(shape, row, n))) is not None:
                        found.setdefault(n, []).append(value)
    other = ranking.top.other
    rest = SparseRows(
        _remainder(shape, other, group, totals, gauges[group])
        for group, totals in decision.remainder.items()
    )
    return out, rest


def key_labels(shape: Shape, rows: list[tuple[object, ...]]) -> list[Key]:
    """Each row's labels as text, its key then its kept labels: column by column at C
    level (a NULL label is empty)."""
    columns = [
        _texts(list(map(itemgetter(n), rows))) if label is None
        else [("" if cell is None else label(cell)) for cell in map(itemgetter(n), rows)]
        for n, label in zip(shape.key + shape.kept, shape.label_texts, strict=True)
    ]  # fmt: skip
    return list(zip(*columns, strict=True)) if columns else [() for _ in rows]


def _texts(column: list[object]) -> list[object]:
    """A text column's cells, a NULL as empty."""
    return [("" if cell is None else cell) for cell in column] if None in column else column


def _columns(
    positions: tuple[int, ...], rows: list[tuple[object, ...]]
) -> list[tuple[object, ...]]:
    """The cells at ``positions`` of each row, as a tuple each."""
    if not positions:
        return [() for _ in rows]
    if len(positions) == 1:
        return list(zip(map(itemgetter(positions[0]), rows)))
    return list(map(itemgetter(*positions), rows))


def value_cell(shape: Shape, row: tuple[object, ...], n: int) -> object:
    """A value cell as a number where its type said otherwise."""
    value = row[n]
    number = shape.numbers.get(n)
    return value if number is None or value is None else number(value)


def shown_row(shape: Shape, row: tuple[object, ...], shown: list[float]) -> tuple[object, ...]:
    """A named key's row with the counters its series shows (NaN: none known yet)."""
    cells = list(row)
    for n, value in zip(shape.counters, shown, strict=True):
        cells[n] = None if math.isnan(value) else value
    return tuple(cells)


def _remainder(
    shape: Shape, other: str, group: Group, counters: list[float], gauges: dict[int, list[float]]
) -> tuple[object, ...]:
    """A group's remainder row: ``other`` for each ranked label, the kept labels as they
    are, the remainder's counters, the sum or the largest of the unnamed keys' gauges
    where ``top`` says so, no sample of any other gauge; NULL elsewhere."""
    cells: list[object] = [None] * shape.width
    for n in shape.key:
        cells[n] = other
    for columns, values in ((shape.kept, group), (shape.counters, counters)):
        for n, value in zip(columns, values, strict=True):
            cells[n] = value
    for n in shape.gauges:
        found = gauges.get(n)
        cells[n] = ABSENT if not found else math.fsum(found) if n in shape.summed else max(found)
    return tuple(cells)


def converted(shape: Shape, row: tuple[object, ...], key: Key) -> tuple[object, ...]:
    """The row with its key labels as text (``key``) and its values as numbers where
    their type said otherwise, so that a remainder's numbers render in the same column."""
    cells = list(row)
    for n, text in zip(shape.key, key, strict=False):
        cells[n] = text
    for n, number in shape.numbers.items():
        if row[n] is not None:
            cells[n] = number(row[n])
    return tuple(cells)


def as_number(value: object) -> float | None:
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


async def read_whole(
    batches: AsyncGenerator[Batch, None], cap: int, too_many: str
) -> tuple[tuple[Sequence[str], Sequence[int]], list[tuple[object, ...]]]:
    """Every row of ``batches`` with the result's column names and type oids (empty when
    none was told); more than ``cap`` rows stop the query and fail the run (``too_many``)."""
    rows: list[tuple[object, ...]] = []
    columns: tuple[Sequence[str], Sequence[int]] = ((), ())
    async with aclosing(batches) as stream:
        async for names, types, batch in stream:
            columns = (names, types)
            rows.extend(batch)
            if len(rows) > cap:
                raise TooManySeriesError(too_many)
    return columns, rows


async def ranked(
    runtime: CollectorRuntime, batches: AsyncGenerator[Batch, None], now: Callable[[], float],
    cap: int,
) -> AsyncGenerator[Batch, None]:  # fmt: skip
    """The run's batches read whole (at most ``cap`` rows), ranked, as one batch."""
    collector = runtime.collector
    columns, rows = await read_whole(
        batches, cap, f"collector {collector.key}: more than {cap} rows to rank; nothing is "
        "published. Narrow the query or raise the collector's max_series",
    )  # fmt: skip
    if not rows:
        return
    shape = shape_for(runtime, *columns)
    ranking = ranking_of(runtime, shape)
    named, rest = rank_rows(ranking, shape, rows, now(), collector)
    if named:
        yield columns[0], shape.types, named
    if rest:
        yield columns[0], shape.types, rest
