"""A ``top`` collector with a probe: every key ranked from two arrays, the named keys
alone read in full, the rest accounted from totals (issue 38).

Reading every column of every key to rank a few hundred of them costs more than the
keys are worth where there are tens of thousands (a database's tables: each row is
dozens of statistics, and a first look at each relation's is most of a pass). So the
probe lists, in one row per group of the labels the remainder keeps (``top.keep``:
one row in all when it keeps none), every key of the group (``keys``, an array) with
its ranking counter (the column ``top.by``, an array in the same order), and the total
over the group's keys of each counter the remainder carries (a column named as the
counter). :class:`~exporter.collect.ranking.Ranking` names the keys from the probe
alone; the collector's query then reads the named keys, passed as its one parameter
``$1`` (a text array), each row telling its key in the column ``top.id`` and its group
in the kept labels. A key is its text and its group's labels.

What each named key's series shows and what the remainder holds is
:class:`~exporter.collect.account.Account`'s arithmetic. A GAUGE in ``top.sum`` is the
probe's total less the named keys'; ``top.max`` needs every key, so a probe has none.
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator, Collection, Sequence
from dataclasses import dataclass
from operator import itemgetter

from exporter.collect.account import Account, Listing, Probing, probe_number
from exporter.collect.ranking import Group, Key, Ranking
from exporter.collect.runtime import CollectorRuntime
from exporter.collect.topn import (
    Shape,
    as_number,
    converted,
    key_labels,
    read_whole,
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
class Listed:
    """One group of a run's probe: its totals by column name, and every key it listed."""

    totals: dict[str, float | int | None]
    keys: Collection[Key]


@dataclass(frozen=True, slots=True)
class Probed:
    """One run's probe: each group by its kept labels' texts, and the keys named."""

    groups: dict[Group, Listed]
    named: tuple[Key, ...]


def read_probe(
    runtime: CollectorRuntime, names: Sequence[str], rows: list[tuple[object, ...]],
    now: float, cap: int,
) -> Probed | None:  # fmt: skip
    """The probe's rows (one per group) ranked: which keys to read. None when it lists no
    key."""
    collector = runtime.collector
    top = collector.top
    assert top is not None
    wanted = [KEYS, top.by, *top.keep]
    if missing := [name for name in wanted if name not in names]:
        raise MissingColumnError(
            f"collector {collector.key}: column {missing[0]} is missing from its top probe, "
            f"which returned {', '.join(names) or 'no columns'}; it needs {', '.join(wanted)}"
        )
    ranking, probing = _ranking(runtime, top)
    groups: dict[Group, Listed] = {}
    changed: list[tuple[Key, tuple[float | int | None]]] = []
    for cells in rows:
        row = dict(zip(names, cells, strict=True))
        group = tuple("" if row[name] is None else str(row[name]) for name in top.keep)
        if group in groups:
            raise CollectorError(
                f"collector {collector.key}: its top probe returned two rows for "
                f"{excerpt(dict(zip(top.keep, group, strict=True)))}; it must return one row "
                "per group of the labels in top.keep"
            )
        if row[KEYS] is None:
            continue  # no key in this group (array_agg over nothing)
        listing = probing.listings.get(group) or probing.listings.setdefault(group, Listing())
        try:
            changed += listing.update(
                _array(collector, row[KEYS], KEYS), _array(collector, row[top.by], top.by), group
            )
        except ValueError as exc:
            raise CollectorError(
                f"collector {collector.key}: its top probe's arrays {KEYS} and {top.by}: {exc}"
            ) from None
        if listing.repeated:
            raise RepeatedLabelsError(
                f"collector {collector.key}: its top probe lists a key twice; each key must "
                "appear once in its group"
            )
        totals = {name: probe_number(row[name]) for name in names if name not in wanted}
        groups[group] = Listed(totals, listing.present)
    for gone in [group for group in probing.listings if group not in groups]:
        del probing.listings[gone]  # its keys leave the ranking with them
        probing.accounts.pop(gone, None)
    if not groups:
        return None
    present = probing.present()
    if len(present) > cap:
        raise TooManySeriesError(
            f"collector {collector.key}: its top probe lists more than {cap} keys to rank; "
            "nothing is published. Narrow the probe or raise the collector's max_series"
        )
    decision = ranking.run_moved(now, present, changed)
    return Probed(groups, tuple(sorted(decision.named)))


def keys_literal(keys: Sequence[Key]) -> str:
    """The named keys as the text of an array, the query's ``$1`` (cast as it needs):
    each once, whatever the groups it was named in."""
    texts = dict.fromkeys(str(key[0]) for key in keys)
    quoted = (text.replace("\\", "\\\\").replace('"', '\\"') for text in texts)
    return "{" + ",".join(f'"{text}"' for text in quoted) + "}"


async def accounted(
    runtime: CollectorRuntime, probed: Probed, batches: AsyncGenerator[Batch, None], cap: int
) -> AsyncGenerator[Batch, None]:
    """The named keys' rows (read in full by the query) with the counters their series
    show, then each group's remainder, as one batch each."""
    collector = runtime.collector
    (names, types), rows = await read_whole(
        batches, cap, f"collector {collector.key}: more than {cap} rows for the keys its "
        "probe named; nothing is published. Raise the collector's max_series",
    )  # fmt: skip
    if not names:  # no row and no columns told: nothing to publish
        return
    top = collector.top
    assert top is not None
    if top.id not in names:
        raise MissingColumnError(
            f"collector {collector.key}: column {top.id} (top.id: the key of each row) is "
            f"missing from the result; the query returned {', '.join(names)}"
        )
    shape = shape_for(runtime, names, types)
    named, rest = _rows(collector, shape, names, rows, probed=probed, runtime=runtime)
    if named:
        yield names, shape.types, named
    if rest:
        yield names, shape.types, rest


def _ranking(runtime: CollectorRuntime, top: Top) -> tuple[Ranking, Probing]:
    """The runtime's ranking of the probe's keys (one counter), and what the probe listed
    last and each group's account; made anew together."""
    held, probing = runtime.ranking, runtime.probing
    if held is None or held.signature != ("probe",) or probing is None:
        held = runtime.ranking = Ranking(top, 1, 0, 1, ("probe",))
        probing = runtime.probing = Probing()
    return held, probing


def _account(probing: Probing, group: Group, shape: Shape) -> Account:
    """A group's account, made anew when the result's counters moved."""
    signature = (shape.counters, shape.key, shape.kept)
    held = probing.accounts.get(group)
    if held is None or held.signature != signature:
        held = probing.accounts[group] = Account(signature, len(shape.counters))
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


def _rows(
    collector: Collector, shape: Shape, names: Sequence[str], rows: list[tuple[object, ...]],
    *, probed: Probed, runtime: CollectorRuntime,
) -> tuple[list[tuple[object, ...]], SparseRows]:  # fmt: skip
    """The named keys' rows with the counters their series show, and each group's
    remainder."""
    top = collector.top
    probing = runtime.probing
    assert top is not None
    assert top.id is not None
    assert probing is not None
    at, kept_at = names.index(top.id), shape.kept
    named = set(probed.named)
    by_group: dict[Group, dict[Key, tuple[object, ...]]] = {group: {} for group in probed.groups}
    for row in rows:
        texts = tuple("" if row[n] is None else str(row[n]) for n in kept_at)
        if (cell := row[at]) is None or (key := (str(cell), *texts)) not in named:
            continue  # a key the probe did not name (the query ignored $1, or another group)
        found = by_group[texts]
        if key in found:
            raise RepeatedLabelsError(
                f"collector {collector.key}: more than one row has {excerpt(key[0])} in its "
                f"column {top.id} (top.id); nothing from this run is published. Return one "
                "row per key"
            )
        found[key] = row
    out: list[tuple[object, ...]] = []
    rest = SparseRows()
    for group, by_key in by_group.items():
        listed = probed.groups[group]
        account = _account(probing, group, shape)
        out += _group_rows(shape, names, by_key, listed, account)
        if account.published:
            rest.append(_remainder(
                collector, shape, names, group, listed, counters=account.remainder,
                named=list(by_key.values()),
            ))  # fmt: skip
    return out, rest


def _group_rows(
    shape: Shape, names: Sequence[str], by_key: dict[Key, tuple[object, ...]], listed: Listed,
    account: Account,
) -> list[tuple[object, ...]]:  # fmt: skip
    """One group's named rows with the counters their series show (its account run)."""
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
    totals = [_total(listed, names[n]) for n in shape.counters]
    shown = account.run(values, listed.keys, totals)
    fresh = [key for key, moved in values.items() if moved is not None]
    labels = key_labels(shape, [by_key[key] for key in fresh])
    made = {
        key: shown_row(shape, converted(shape, by_key[key], label[: len(shape.key)]), shown[key])
        for key, label in zip(fresh, labels, strict=True)
    }
    out = [made[key] if key in made else rendered[key][1] for key in by_key]
    account.rendered = {key: (by_key[key], row) for key, row in zip(by_key, out, strict=True)}
    return out


def _total(listed: Listed, name: str) -> float:
    """A group's total of a column; NaN where the probe gives none."""
    value = listed.totals.get(name)
    return math.nan if value is None else value


def _remainder(
    collector: Collector, shape: Shape, names: Sequence[str], group: Group, listed: Listed,
    *, counters: list[float], named: list[tuple[object, ...]],
) -> tuple[object, ...]:  # fmt: skip
    """A group's remainder row: ``other`` for each ranked label, the kept labels, the
    remainder's counters (none where the probe gives no total), a GAUGE in ``top.sum``
    as the group's total less its named keys' (none without a total)."""
    top = collector.top
    assert top is not None
    cells: list[object] = [None] * shape.width
    for n in shape.key:
        cells[n] = top.other
    for n, text in zip(shape.kept, group, strict=True):
        cells[n] = text
    for n, value in zip(shape.counters, counters, strict=True):
        cells[n] = ABSENT if math.isnan(_total(listed, names[n])) else value
    for n in shape.gauges:
        total = _total(listed, names[n])
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
