"""Samples: a collector's result rows turned into rendered series (pure, no I/O).

This is the scrape's CPU hot path. Everything that depends only on the
collector is decided once in :class:`SampleBuilder`; per batch the work is
column-wise and mostly done by C-level ``map``/``join``: one label string per
row, reused by every value column of that row.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from itertools import accumulate, repeat
from operator import add, eq, itemgetter, mul
from typing import Any

from exporter.config.definitions import Collector, Column, Usage
from exporter.errors import MissingColumnError, RepeatedLabelsError, TooManySeriesError, excerpt
from exporter.expose.exposition import Family, escape_label_value, format_value, label_block
from exporter.pg.casting import NAN, Cast, Kind, cast_for, go_float, label_text

_FAST_TYPES: frozenset[type] = frozenset({int, float})  # what str() renders as format_value
_TEXT_KINDS = frozenset({Kind.TEXT, Kind.NUMERIC})  # loaded as the label text itself


class _Plain:
    """A GAUGE or COUNTER column present in the result: how its cells are rendered, chosen
    once from the column's type (issue 30): a column of numbers renders a batch at C level."""

    __slots__ = ("batch", "cell", "column", "convert", "filler", "help", "kind", "name",
                 "null_text", "scale")  # fmt: skip

    def __init__(self, collector: Collector, column: Column, index: int, cast: Cast) -> None:
        self.column, self.cell = column, itemgetter(index)  # the column's cell of a row
        self.name = collector.metric_name(column)
        self.help = _help(collector, column)
        self.kind = "counter" if column.usage is Usage.COUNTER else "gauge"
        self.convert = cast.converter(column.scale)
        # A NULL takes the default, scaled whatever the column's type (as Go does).
        self.null_text = format_value(_null_value(column))
        self.scale = column.scale if cast.scaled else None
        self.batch = self._batch_renderer(cast.kind)
        self.filler: object = "0" if cast.kind is Kind.NUMERIC else 0  # stands in for a NULL

    def _batch_renderer(self, kind: Kind) -> Callable[[list[Any]], Iterable[str] | None] | None:
        """How a batch of this column's non-NULL cells renders at C level; None: cell by cell."""
        if kind is Kind.BOOL:
            return self._booleans
        if kind is Kind.NUMERIC:
            return self._numerics
        if kind is Kind.INT and self.scale is None:
            return self._integers
        if kind in (Kind.INT, Kind.FLOAT, Kind.EPOCH):
            return self._numbers
        return None

    def render(self, value: object) -> str:
        """One cell, by the general rules."""
        if value is None:
            return self.null_text
        return format_value(self.convert(value))

    def render_all(self, values: list[Any]) -> Iterable[str]:
        """A batch of cells: a column of numbers at C level, its NULLs put in after."""
        batch = self.batch
        texts = None if batch is None else batch(values)
        if texts is not None:
            return texts
        if batch is None or _NONE not in frozenset(map(type, values)):
            return map(self.render, values)  # text, or cells not from our loaders
        nulls = [n for n, value in enumerate(values) if value is None]
        filler = self.filler
        texts = batch([filler if value is None else value for value in values])
        if texts is None:
            return map(self.render, values)
        rendered = list(texts)
        for n in nulls:
            rendered[n] = self.null_text
        return rendered

    # Each renders a batch at C level, or says None: NULLs there, or cells of other types.

    def _integers(self, values: list[Any]) -> Iterable[str] | None:
        return map(str, values) if frozenset(map(type, values)) <= _FAST_TYPES else None

    def _booleans(self, values: list[Any]) -> Iterable[str] | None:
        if frozenset(map(type, values)) <= _BOOL_TYPE:
            return map(_BOOLEAN_TEXT.__getitem__, values)
        return None

    def _numerics(self, values: list[Any]) -> Iterable[str] | None:
        """numeric's own text where every parser reads it as the nearest float: digits
        (PostgreSQL never writes an exponent) short of float's range, no NaN or Infinity.
        Else the nearest float, ±Inf beyond its range."""
        try:
            if self.scale is None and max(map(len, values)) < _PLAIN_DIGITS:
                joined = "".join(values)
                if "N" not in joined and "I" not in joined:
                    return values
            return self._numbers(list(map(float, values)))
        except (TypeError, ValueError):
            return None

    def _numbers(self, values: list[Any]) -> Iterable[str] | None:
        if not frozenset(map(type, values)) <= _FAST_TYPES:
            return None
        scale = self.scale
        numbers = values if scale is None else list(map(mul, values, repeat(scale)))
        if all(map(math.isfinite, numbers)):
            return map(str, numbers)  # str of an int or a finite float is format_value
        return map(format_value, numbers)


_NONE = type(None)


class _Absent:
    """The type of :data:`ABSENT`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ABSENT"


#: A value cell that makes no sample at all (not even the column's default), in a batch
#: of :class:`SparseRows`: a ``top`` remainder's gauge that neither sums nor has a largest.
ABSENT = _Absent()


class SparseRows(list[tuple[object, ...]]):
    """A batch of rows some of whose value cells may be :data:`ABSENT`."""

    __slots__ = ()


_VARIES = object()  # a LABEL column whose rows have more than one value
_BOOL_TYPE: frozenset[type] = frozenset({bool})
_PLAIN_DIGITS = 300  # a numeric's text this long is below 1e300: no float overflows on it
_BOOLEAN_TEXT = {True: "1", False: "0"}


class _Bins:
    """Histogram accumulator for one label tuple: per-bucket counts and the sum."""

    __slots__ = ("counts", "total")

    def __init__(self, size: int) -> None:
        self.counts = [0] * size  # non-cumulative; the last one is above every bound
        self.total = 0.0


class _Histogram:
    """A HISTOGRAM column: observations folded into bins (one dict per execution) per
    label tuple."""

    __slots__ = ("base", "bounds", "cell", "column", "convert", "help", "le_parts")

    def __init__(self, collector: Collector, column: Column, index: int, cast: Cast) -> None:
        self.column, self.cell = column, itemgetter(index)
        self.convert = cast.converter(column.scale)
        self.base = collector.metric_name(column)
        self.help = _help(collector, column)
        self.bounds = column.buckets
        self.le_parts = [f'le="{go_float(b)}"}} ' for b in (*column.buckets, math.inf)]

    def observe(self, bins: dict[str, _Bins], keys: list[str], values: Iterable[object]) -> None:
        """Fold one batch into ``bins``; NULL (without default) and NaN are not observations."""
        bounds, size, convert = self.bounds, len(self.bounds) + 1, self.convert
        default, null = self.column.default, _null_value(self.column)
        for key, raw in zip(keys, values, strict=True):
            acc = bins.get(key)
            if acc is None:
                acc = bins[key] = _Bins(size)
            if raw is not None:
                number = convert(raw)
            elif default is not None:
                number = null
            else:
                continue
            if not math.isnan(number):
                acc.counts[bisect_left(bounds, number)] += 1
                acc.total += number

    def families(self, bins: dict[str, _Bins], fixed: _Pairs) -> list[Family]:
        """The ``_bucket``, ``_count`` and ``_sum`` families of ``bins``, all gauges."""
        buckets: list[str] = []
        for key, acc in bins.items():
            opening = "{" if key == " " else key[:-2] + ","
            cumulative = accumulate(acc.counts)
            buckets.extend(
                f"{opening}{le}{n}" for le, n in zip(self.le_parts, cumulative, strict=True)
            )
        counts = [f"{key}{sum(acc.counts)}" for key, acc in bins.items()]
        sums = [f"{key}{format_value(acc.total)}" for key, acc in bins.items()]
        return [
            _family(self.base + "_bucket", "gauge", self.help, buckets, fixed),
            _family(self.base + "_count", "gauge", self.help, counts, fixed),
            _family(self.base + "_sum", "gauge", self.help, sums, fixed),
        ]


def _null_value(column: Column) -> float:
    """What a NULL cell counts as: the default, scaled whatever the column's type (as Go
    does), else NaN."""
    if column.default is None:
        return NAN
    return column.default if column.scale is None else column.default * column.scale


def _help(collector: Collector, column: Column) -> str:
    """A value column's HELP text: its description, else where it comes from."""
    return column.description or f"{collector.key} column {column.name}"


_Pairs = tuple[tuple[str, str], ...]


def _family(name: str, kind: str, help: str, lines: list[str], fixed: _Pairs) -> Family:
    """A family from lines that lack only the metric name."""
    text = name + ("\n" + name).join(lines) + "\n" if lines else ""
    return Family(name, kind, help, len(lines), text.encode("utf-8", "replace"), fixed)


class _Layout:
    """What a builder needs that depends only on the collector, the result's column names
    and the const labels: decided once and shared by every execution (and database)."""

    __slots__ = ("casts", "collector", "histogram_width", "histograms", "label_getters",
                 "label_texts", "outputs", "plain", "template", "warnings")  # fmt: skip

    def __init__(
        self,
        collector: Collector,
        column_names: Sequence[str],
        const_labels: Sequence[tuple[str, str]],
        column_types: Sequence[int] | None = None,
    ) -> None:
        index = _index_columns(collector, column_names)
        self.collector = collector
        # Each column's cast, from its type oid: decided here, once, not per row.
        types = column_types if column_types is not None else [None] * len(column_names)
        self.casts = [cast_for(oid) for oid in types]
        labels = [index[c.name] for c in collector.label_columns]
        self.label_getters = [itemgetter(n) for n in labels]
        # How each LABEL column's cells become text; None: they are their text already.
        self.label_texts = [
            None if self.casts[n].kind in _TEXT_KINDS else self.casts[n].label for n in labels
        ]
        self.template = _label_template(collector.label_columns, const_labels)
        self.warnings: list[str] = []
        self.outputs = self._value_outputs(index)  # in column order
        # (position in outputs, output): an execution keeps its lines and bins by position.
        self.plain = [(n, o) for n, o in enumerate(self.outputs) if isinstance(o, _Plain)]
        self.histograms = [(n, o) for n, o in enumerate(self.outputs) if isinstance(o, _Histogram)]
        self.histogram_width = sum(len(h.bounds) + 3 for _, h in self.histograms)

    def _value_outputs(self, index: dict[str, int]) -> list[_Plain | _Histogram]:
        """One output per value column found; a missing GAUGE/COUNTER is only a warning."""
        outputs: list[_Plain | _Histogram] = []
        for column in self.collector.value_columns:
            if column.usage is Usage.HISTOGRAM:
                n = index[column.name]
                outputs.append(_Histogram(self.collector, column, n, self.casts[n]))
            elif column.name in index:
                n = index[column.name]
                outputs.append(_Plain(self.collector, column, n, self.casts[n]))
            else:
                self.warnings.append(
                    f"collector {self.collector.key}: column {column.name} "
                    f"({column.usage.value}) is missing from the result; "
                    f"metric {self.collector.metric_name(column)} is omitted"
                )
        return outputs


def _index_columns(collector: Collector, column_names: Sequence[str]) -> dict[str, int]:
    """Result position of each column name (of two of one name, the last, as in Go); a
    missing LABEL or HISTOGRAM column fails."""
    index = {name: position for position, name in enumerate(column_names)}
    for column in collector.columns:
        if column.usage in (Usage.LABEL, Usage.HISTOGRAM) and column.name not in index:
            raise MissingColumnError(
                f"collector {collector.key}: column {column.name} ({column.usage.value}) "
                f"is missing from the result; the query returned "
                f"{', '.join(column_names) or 'no columns'}; fix the query or the metrics "
                f"list{' in ' + collector.source if collector.source else ''}"
            )
    return index


_LayoutKey = tuple[int, tuple[str, ...], tuple[int, ...] | None, tuple[tuple[str, str], ...]]
#: Layouts by (collector's id, column names, column types, const labels). Each entry holds
#: its collector, so that id names no other collector while the entry stands; reloaded
#: collectors get entries of their own, and the table is emptied when full (issue 22: a
#: layout costs about as much as rendering a small result).
_LAYOUTS: dict[_LayoutKey, _Layout] = {}
LAYOUTS_MAX = 4096


def layout_of(
    collector: Collector,
    column_names: Sequence[str],
    const_labels: Sequence[tuple[str, str]],
    column_types: Sequence[int] | None = None,
) -> _Layout:
    """The collector's layout for a result with these columns, made on first use."""
    types = None if column_types is None else tuple(column_types)
    key = (id(collector), tuple(column_names), types, tuple(const_labels))
    layout = _LAYOUTS.get(key)
    if layout is None or layout.collector is not collector:
        made = _Layout(collector, column_names, const_labels, types)  # may raise: nothing kept
        if len(_LAYOUTS) >= LAYOUTS_MAX:
            _LAYOUTS.clear()
        layout = _LAYOUTS[key] = made
    return layout


class SampleBuilder:
    """Rows of one collector execution → families; feed batches, then finish once.

    After an exception the builder is unusable: the execution publishes nothing.
    """

    def __init__(
        self,
        collector: Collector,
        column_names: Sequence[str],
        const_labels: Sequence[tuple[str, str]],
        max_series: int | None,
        column_types: Sequence[int] | None = None,
    ) -> None:
        """``column_types``: the result's type oids (psycopg's ``description[i].type_code``),
        which decide each column's cast; without them each cell is cast by its Python type."""
        self.collector = collector
        self.max_series = max_series
        self.series = 0
        self._layout = layout = layout_of(collector, column_names, const_labels, column_types)
        self.warnings = list(layout.warnings)
        # Rendered lines (label block + " " + value, without the metric name) and
        # histogram bins of this execution, by the output's position.
        self._lines: dict[int, list[str]] = {n: [] for n, _ in layout.plain}
        self._bins: dict[int, dict[str, _Bins]] = {n: {} for n, _ in layout.histograms}
        self._seen: set[str] = set()  # label blocks of plain series already emitted
        self._histogram_keys: set[str] = set()
        # Each LABEL column's escaped value while every row so far has had that one, else
        # _VARIES: the families' ``fixed`` pairs (issue 36); None before the first row.
        self._fixed: list[str | object] | None = None

    def add_rows(self, rows: Iterable[Sequence[object]]) -> None:
        """Render one batch of rows; raises TooManySeriesError above the cap and
        RepeatedLabelsError when GAUGE or COUNTER rows repeat a label set."""
        batch = rows if isinstance(rows, list) else list(rows)
        if not batch:
            return
        layout = self._layout
        keys = self._label_blocks(batch)
        if layout.plain:
            self._check_unique(keys)
        new_keys = set(keys) - self._histogram_keys if layout.histograms else set()
        columns = [(n, plain, keys, list(map(plain.cell, batch))) for n, plain in layout.plain]
        if isinstance(batch, SparseRows):
            columns = [(n, plain, *_present(keys, cells)) for n, plain, _, cells in columns]
        self._count(
            sum(len(cells) for *_, cells in columns) + len(new_keys) * layout.histogram_width
        )
        self._histogram_keys |= new_keys
        for n, plain, blocks, cells in columns:
            self._lines[n].extend(map(add, blocks, plain.render_all(cells)))
        for n, histogram in layout.histograms:
            histogram.observe(self._bins[n], keys, map(histogram.cell, batch))

    def _label_blocks(self, batch: list[Sequence[object]]) -> list[str]:
        """One ``{labels} `` string per row (const labels included)."""
        layout = self._layout
        template, getters = layout.template, layout.label_getters
        if not getters:
            return [template] * len(batch)
        columns = [
            _label_column(list(map(g, batch)), label)
            for g, label in zip(getters, layout.label_texts, strict=True)
        ]
        self._note_fixed(columns)
        return list(map(template.__mod__, zip(*columns, strict=True)))

    def _note_fixed(self, columns: list[list[str]]) -> None:
        """Keep each LABEL column's value while every row has the same one. At C level,
        stopping at the first row that differs: a column of one value costs ~10 ns a row."""
        fixed = self._fixed
        if fixed is None:
            fixed = self._fixed = [column[0] for column in columns]
        for n, column in enumerate(columns):
            value = fixed[n]
            if value is not _VARIES and not all(map(eq, column, repeat(value))):
                fixed[n] = _VARIES

    def _check_unique(self, keys: list[str]) -> None:
        """One row per label set, across all batches, when GAUGE or COUNTER series are made.

        Two rows of one label set would make two series of one identity, which Prometheus
        refuses; keeping either would publish a value chosen by row order. As the Go
        exporter does since 1.6.1, the whole run fails instead (histograms merge rows).
        """
        fresh = set(keys)
        if len(fresh) == len(keys) and self._seen.isdisjoint(fresh):
            self._seen |= fresh
            return
        labels = _first_repeat(keys, set(self._seen)).strip() or "(no labels)"
        raise RepeatedLabelsError(
            f"collector {self.collector.key}: more than one row has the labels {excerpt(labels)}; "
            "a GAUGE or COUNTER needs one row per label set, so nothing from this run is "
            "published. Make the LABEL columns unique (add a LABEL column or aggregate in the "
            f"query){' in ' + self.collector.source if self.collector.source else ''}"
        )

    def _count(self, added: int) -> None:
        self.series += added
        if self.max_series is not None and self.series > self.max_series:
            raise TooManySeriesError(
                f"collector {self.collector.key}: more than {self.max_series} series "
                f"({self.series} so far); nothing is published. Narrow the query or raise "
                "the collector's max_series"
            )

    def finish(self) -> tuple[Family, ...]:
        """One family per metric family that got series, in column order."""
        families: list[Family] = []
        fixed = self.fixed()
        for n, output in enumerate(self._layout.outputs):
            if isinstance(output, _Plain):
                lines = self._lines[n]
                families.append(_family(output.name, output.kind, output.help, lines, fixed))
            else:
                families.extend(output.families(self._bins[n], fixed))
        return tuple(f for f in families if f.series)

    def fixed(self) -> _Pairs:
        """(label, escaped value) of the LABEL columns that had one value in every row."""
        if self._fixed is None:  # no LABEL column, or no row
            return ()
        names = [column.output_name for column in self.collector.label_columns]
        pairs = zip(names, self._fixed, strict=True)
        return tuple((name, value) for name, value in pairs if isinstance(value, str))


def _present(keys: list[str], cells: list[object]) -> tuple[list[str], list[object]]:
    """A column's label blocks and cells, without the rows whose cell is ABSENT."""
    if ABSENT not in cells:
        return keys, cells
    kept = [(key, cell) for key, cell in zip(keys, cells, strict=True) if cell is not ABSENT]
    return [key for key, _ in kept], [cell for _, cell in kept]


def _first_repeat(keys: list[str], seen: set[str]) -> str:
    """The first key already in ``seen`` or earlier in ``keys``."""
    for key in keys:
        if key in seen:
            return key
        seen.add(key)
    raise AssertionError("no repeated key")  # pragma: no cover - callers checked


def _label_template(labels: Sequence[Column], const_labels: Sequence[tuple[str, str]]) -> str:
    """``{a="%s",b="%s",const="v"} ``: a ``%`` template over the LABEL columns.

    Without LABEL columns it is the (constant) label block itself.
    """
    const = label_block(const_labels)[1:-1]  # without the braces
    if not labels:
        return "{" + const + "} " if const else " "
    variable = ",".join(f'{c.output_name}="%s"' for c in labels)
    return "{" + variable + ("," + const.replace("%", "%%") if const else "") + "} "


def _label_column(values: list[Any], label: Callable[[Any], str] | None) -> list[str]:
    """Escaped label values of one column (NULL: empty); text passes through untouched."""
    if label is not None:
        values = ["" if v is None else label(v) for v in values]
    try:
        joined = "\x00".join(values)  # TypeError: a NULL, or not loaded by our loaders
    except TypeError:
        return [escape_label_value(label_text(v)) for v in values]
    if "\\" in joined or '"' in joined or "\n" in joined:
        return list(map(escape_label_value, values))
    return values
