"""A ``top`` collector with a probe: every key ranked from two arrays, the named keys
alone read in full, the rest accounted from totals (issue 38).

Reading every column of every key to rank a few hundred of them costs more than the
keys are worth where there are tens of thousands (a database's tables: each row is
dozens of statistics, and a first look at each relation's is most of a pass). So the
probe, a query of one row, lists every key (``keys``, an array) with its ranking
counter (the column ``top.by``, an array in the same order), the labels the remainder
keeps, and the total over every key of each counter the remainder carries (a column
named as the counter). :class:`~exporter.collect.ranking.Ranking` names the keys from
the probe alone; the collector's query then reads the named keys, passed as its one
parameter ``$1`` (a text array), each row telling its key in the column ``top.id``.

What each named key's series shows and what the remainder holds is
:class:`~exporter.collect.account.Account`'s arithmetic. A GAUGE in ``top.sum`` is the
probe's total less the named keys'; ``top.max`` needs every key, so a probe has none.
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator, Collection, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from decimal import Decimal
from operator import itemgetter

from exporter.collect.account import Account, Listing
from exporter.collect.ranking import Key, Ranking
from exporter.collect.runtime import CollectorRuntime
from exporter.collect.topn import (
    Shape,
    as_number,
    converted,
    key_labels,
    shape_for,
    shown_row,
    value_cell,
)
from exporter.config.definitions import Collector, Top
from exporter.errors import (
    CollectorError,
    MissingColumnError,
    RepeatedLabelsError,
    TooManySeriesError,
    excerpt,
)
from exporter.expose.samples import ABSENT, SparseRows
from exporter.pg.postgres import Batch

#: The probe's column that lists every key.
KEYS = "keys"


@dataclass(frozen=True, slots=True)
class Probed:
    """One run's probe: the kept labels, the totals by column name, every key listed, and
    the keys named (those the query is to read)."""

    group: dict[str, object]
    totals: dict[str, float | None]
    keys: Collection[Key]
    named: tuple[Key, ...]


def read_probe(
    runtime: CollectorRuntime, names: Sequence[str], rows: list[tuple[object, ...]],
    now: float, cap: int,
) -> Probed | None:  # fmt: skip
    """The probe's one row ranked: which keys to read. None when it lists no key."""
    collector = runtime.collector
    top = collector.top
    assert top is not None
    if not rows:
        return None
    if len(rows) > 1:
        raise CollectorError(
            f"collector {collector.key}: its top probe returned more than one row; it must "
            "return one, listing every key in an array"
        )
    row = dict(zip(names, rows[0], strict=True))
    wanted = [KEYS, top.by, *top.keep]
    if missing := [name for name in wanted if name not in row]:
        raise MissingColumnError(
            f"collector {collector.key}: column {missing[0]} is missing from its top probe, "
            f"which returned {', '.join(names) or 'no columns'}; it needs {', '.join(wanted)}"
        )
    keys, ranks = row[KEYS], row[top.by]
    if keys is None:
        return None  # no key at all (array_agg over nothing)
    group = tuple(row[name] for name in top.keep)
    ranking, listing = _ranking(runtime, top)
    try:
        changed = listing.update(
            _array(collector, keys, KEYS), _array(collector, ranks, top.by), group
        )
    except ValueError as exc:
        raise CollectorError(
            f"collector {collector.key}: its top probe's arrays {KEYS} and {top.by}: {exc}"
        ) from None
    if len(listing.keys) > cap:
        raise TooManySeriesError(
            f"collector {collector.key}: its top probe lists more than {cap} keys to rank; "
            "nothing is published. Narrow the probe or raise the collector's max_series"
        )
    if not listing.keys:
        return None
    if listing.repeated:
        raise RepeatedLabelsError(
            f"collector {collector.key}: its top probe lists a key twice; each key must appear once"
        )
    decision = ranking.run_moved(now, listing.present, changed)
    totals = {name: _as_float(row[name]) for name in names if name not in wanted}
    named = tuple(sorted(decision.named))
    return Probed(dict(zip(top.keep, group, strict=True)), totals, listing.present, named)


def keys_literal(keys: Sequence[Key]) -> str:
    """The named keys as the text of an array, the query's ``$1`` (cast as it needs)."""
    quoted = (str(key[0]).replace("\\", "\\\\").replace('"', '\\"') for key in keys)
    return "{" + ",".join(f'"{key}"' for key in quoted) + "}"


async def accounted(
    runtime: CollectorRuntime, probed: Probed, batches: AsyncGenerator[Batch, None], cap: int
) -> AsyncGenerator[Batch, None]:
    """The named keys' rows (read in full by the query) with the counters their series
    show, then the remainder row, as one batch each."""
    collector = runtime.collector
    rows: list[tuple[object, ...]] = []
    columns: tuple[Sequence[str], Sequence[int]] = ((), ())
    async with aclosing(batches) as stream:
        async for names, types, batch in stream:
            columns = (names, types)
            rows.extend(batch)
            if len(rows) > cap:
                raise TooManySeriesError(
                    f"collector {collector.key}: more than {cap} rows for the keys its probe "
                    "named; nothing is published. Raise the collector's max_series"
                )
    if not rows:  # nothing named, or every named key went between probe and query
        return
    names, types = columns
    top = collector.top
    assert top is not None
    if top.id not in names:
        raise MissingColumnError(
            f"collector {collector.key}: column {top.id} (top.id: the key of each row) is "
            f"missing from the result; the query returned {', '.join(names)}"
        )
    shape = shape_for(runtime, names, types)
    account = _account(runtime, shape)
    named, rest = _rows(collector, shape, names, rows, probed=probed, account=account)
    if named:
        yield names, shape.types, named
    if rest:
        yield names, shape.types, rest


def _ranking(runtime: CollectorRuntime, top: Top) -> tuple[Ranking, Listing]:
    """The runtime's ranking of the probe's keys (one counter, keys of one text), and
    what the probe listed last; both made anew together."""
    held, listing = runtime.ranking, runtime.listing
    if held is None or held.signature != ("probe",) or listing is None:
        held = runtime.ranking = Ranking(top, 1, 0, 1, ("probe",), first_by_value=True)
        listing = runtime.listing = Listing()
    return held, listing


def _account(runtime: CollectorRuntime, shape: Shape) -> Account:
    """The runtime's account, made anew when the result's counters moved."""
    signature = (shape.counters, shape.key, shape.kept)
    held = runtime.account
    if held is None or held.signature != signature:
        held = runtime.account = Account(signature, len(shape.counters))
    return held


def _array(collector: Collector, value: object, name: str) -> str | list[object]:
    """A probe column that must hold an array: its text as PostgreSQL writes it (read
    when it changed), or a list (NULL: an empty one)."""
    if value is None:
        return []
    if not isinstance(value, str | list):
        raise CollectorError(
            f"collector {collector.key}: its top probe's column {name} must be an array, "
            f"got {type(value).__name__} {excerpt(value)}"
        )
    return value


def _as_float(value: object) -> float | None:
    """A probe cell as a number; None for NULL and what is not a number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float | Decimal):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _rows(
    collector: Collector, shape: Shape, names: Sequence[str], rows: list[tuple[object, ...]],
    *, probed: Probed, account: Account,
) -> tuple[list[tuple[object, ...]], SparseRows]:  # fmt: skip
    """The named keys' rows with the counters their series show, and the remainder's."""
    top = collector.top
    assert top is not None
    assert top.id is not None
    at = names.index(top.id)
    named = {str(key[0]): key for key in probed.named}  # the query's id read as text
    by_key: dict[Key, tuple[object, ...]] = {}
    for row in rows:
        if (cell := row[at]) is None or (key := named.get(str(cell))) is None:
            continue  # a row of a key the probe did not name: the query ignored $1
        if key in by_key:
            raise RepeatedLabelsError(
                f"collector {collector.key}: more than one row has {excerpt(key[0])} in its "
                f"column {top.id} (top.id); nothing from this run is published. Return one "
                "row per key"
            )
        by_key[key] = row
    # A row that reads as it did in the last run, of a key named then: its counters did
    # not move, and what was published of it stands (most rows, between two runs).
    rendered = account.rendered
    values: dict[Key, list[float] | None] = {}
    for key, row in by_key.items():
        held = rendered.get(key)
        if held is not None and held[0] == row and key in account.last:
            values[key] = None
        else:
            values[key] = [math.nan if v is None else float(v) for v in shape.convert(row)]
    counters = [names[n] for n in shape.counters]
    shown = account.run(values, probed.keys, [_total(probed, name) for name in counters])
    fresh = [key for key, moved in values.items() if moved is not None]
    labels = key_labels(shape, [by_key[key] for key in fresh])
    made = {
        key: shown_row(shape, converted(shape, by_key[key], label[: len(shape.key)]), shown[key])
        for key, label in zip(fresh, labels, strict=True)
    }
    out = [made[key] if key in made else rendered[key][1] for key in by_key]
    account.rendered = {key: (by_key[key], row) for key, row in zip(by_key, out, strict=True)}
    kept = list(by_key.values())
    rest = SparseRows()
    if account.published:
        rest.append(
            _remainder(collector, shape, names, probed, counters=account.remainder, named=kept)
        )
    return out, rest


def _total(probed: Probed, name: str) -> float:
    """The probe's total of a column; NaN where it gives none."""
    value = probed.totals.get(name)
    return math.nan if value is None else value


def _remainder(
    collector: Collector, shape: Shape, names: Sequence[str], probed: Probed,
    *, counters: list[float], named: list[tuple[object, ...]],
) -> tuple[object, ...]:  # fmt: skip
    """The remainder row: ``other`` for each ranked label, the kept labels from the
    probe, the remainder's counters (none where the probe gives no total), a GAUGE in
    ``top.sum`` as the probe's total less the named keys' (none without a total)."""
    top = collector.top
    assert top is not None
    cells: list[object] = [None] * shape.width
    for n in shape.key:
        cells[n] = top.other
    for n in shape.kept:
        value = probed.group.get(names[n])
        cells[n] = None if value is None else str(value)
    for n, value in zip(shape.counters, counters, strict=True):
        cells[n] = ABSENT if math.isnan(_total(probed, names[n])) else value
    for n in shape.gauges:
        total = _total(probed, names[n])
        if n not in shape.summed or math.isnan(total):
            cells[n] = ABSENT
            continue
        cells[n] = total - _sum(shape, named, n)
    return tuple(cells)


def _sum(shape: Shape, rows: list[tuple[object, ...]], n: int) -> float:
    """The sum of column ``n`` over ``rows``, NULLs and what is not a number left out: at
    C level when the cells are numbers already (a count's integers)."""
    cells = list(map(itemgetter(n), rows))
    if n not in shape.numbers and frozenset(map(type, cells)) <= {int, float}:
        return math.fsum(cells)
    found = (as_number(value_cell(shape, row, n)) for row in rows)
    return math.fsum(v for v in found if v is not None)
