"""Tests for exporter.expose.samples: casting, labels, column checks, histograms and the
series cap."""

from __future__ import annotations

import datetime as dt
import math
import uuid
from collections.abc import Sequence
from decimal import Decimal

import pytest
from prometheus_client.parser import text_string_to_metric_families as parse_text

from exporter.config.definitions import Collector, Column, Usage
from exporter.errors import MissingColumnError, RepeatedLabelsError, TooManySeriesError
from exporter.expose import samples
from exporter.expose.exposition import Family, Format, encode
from exporter.expose.samples import SampleBuilder, layout_of
from exporter.pg.casting import label_text, to_number

UTC = dt.UTC
BOOL, BYTEA, INT8, INT4, TEXT, FLOAT8, NUMERIC, TIMESTAMP = 16, 17, 20, 23, 25, 701, 1700, 1114


def _collector(*columns: Column, key: str = "pg_t", name: str = "") -> Collector:
    return Collector(key=key, name=name or key, query="SELECT 1", columns=columns)


def _render(
    collector: Collector,
    names: Sequence[str],
    rows: Sequence[Sequence[object]],
    const_labels: Sequence[tuple[str, str]] = (),
    types: Sequence[int] | None = None,
) -> str:
    """Build, finish and encode in the text format."""
    builder = SampleBuilder(collector, names, const_labels, None, types)
    builder.add_rows(list(rows))
    return encode(builder.finish(), Format.TEXT).decode()


def _samples(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("#")]


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@pytest.mark.parametrize(
    ("value", "scale", "expected"),
    [
        (7, None, 7),
        (7, 2.0, 14.0),
        (1.5, None, 1.5),
        (1.5, 2.0, 3.0),
        (Decimal("12.25"), None, 12.25),
        (Decimal("12.25"), 2.0, 24.5),
        (Decimal("NaN"), None, math.nan),
        (True, None, 1),
        (False, None, 0),
        (True, 10.0, 1),  # booleans are not scaled
        (dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC), None, 1704164645.0),
        (dt.datetime(2024, 1, 2, 3, 4, 5), None, 1704164645.0),  # naive means UTC
        (
            dt.datetime(2024, 1, 2, 5, 4, 5, tzinfo=dt.timezone(dt.timedelta(hours=2))),
            None,
            1704164645.0,
        ),
        (dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC), 1000.0, 1704164645.0),  # not scaled
        (dt.date(2024, 1, 2), None, 1704153600.0),
        (dt.date(1969, 12, 31), None, -86400.0),
        (dt.date(2024, 1, 2), 2.0, 1704153600.0),  # not scaled
        (dt.timedelta(minutes=2, milliseconds=500), None, math.nan),  # as Go: an interval
        ("42", None, 42.0),
        ("-1.5e3", None, -1500.0),
        (" -1.5e3 ", None, math.nan),  # padded: Go's parser refuses it
        ("3", 0.5, 1.5),
        ("NaN", None, math.nan),
        ("Inf", None, math.inf),
        ("-inf", None, -math.inf),
        ("not a number", None, math.nan),
        ("", None, math.nan),
        (b"12", None, 12.0),  # bytea holding digits, as Go reads it
        ([1, 2], None, math.nan),
        ({"a": 1}, None, math.nan),
        (uuid.UUID(int=5), None, math.nan),
        (dt.time(12, 0), None, math.nan),
    ],
)
def test_to_number(value: object, scale: float | None, expected: float) -> None:
    """Each Python type a driver returns becomes the number the casting table says."""
    assert _same(to_number(value, scale), expected)


def test_to_number_subclass_of_known_type() -> None:
    """Subclasses convert like their base type (a datetime subclass is a timestamp)."""

    class Stamp(dt.datetime):
        pass

    class Count(int):
        pass

    assert to_number(Stamp(1970, 1, 1, 0, 1, tzinfo=UTC), 10.0) == 60.0
    assert to_number(Count(4), 10.0) == 40


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("plain", "plain"),
        (None, ""),
        (True, "true"),
        (False, "false"),
        (12, "12"),
        (1.5, "1.5"),
        (Decimal("2.50"), "2.50"),
        (dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC), "1704164645"),  # Unix seconds, as Go
        (dt.date(2024, 1, 2), "1704153600"),
        (b"caf\xc3\xa9", "café"),
        (b"\xff", "\\xff"),
        (b"caf\xe9", "caf\\xe9"),
        (memoryview(b"ab"), "ab"),
        (uuid.UUID(int=1), "00000000-0000-0000-0000-000000000001"),
    ],
)
def test_label_text(value: object, expected: str) -> None:
    """Label cells become text: NULL empty, booleans true/false, bytes decoded."""
    assert label_text(value) == expected


def test_null_with_and_without_default() -> None:
    """NULL is NaN without a default, else the default, scaled."""
    collector = _collector(
        Column("k", Usage.LABEL),
        Column("plain", Usage.GAUGE),
        Column("dflt", Usage.GAUGE, default=3.0, scale=2.0),
    )
    text = _render(collector, ["k", "plain", "dflt"], [("a", None, None), ("b", 1, 4)])
    assert _samples(text) == [
        'pg_t_plain{k="a"} NaN',
        'pg_t_plain{k="b"} 1',
        'pg_t_dflt{k="a"} 6.0',
        'pg_t_dflt{k="b"} 8.0',
    ]


def test_scale_and_fast_paths_agree_with_general_rules() -> None:
    """Uniform int/float/Decimal batches render exactly like mixed ones (one code path's result)."""
    collector = _collector(Column("v", Usage.GAUGE, scale=0.5), Column("k", Usage.LABEL))
    uniform = _render(collector, ["k", "v"], [("a", 3), ("b", 5)])
    mixed = _render(collector, ["k", "v"], [("a", 3), ("b", 5), ("c", "x")])
    assert _samples(uniform) == ['pg_t_v{k="a"} 1.5', 'pg_t_v{k="b"} 2.5']
    assert _samples(mixed)[:2] == _samples(uniform)
    floats = _render(collector, ["k", "v"], [("a", 1.0), ("b", math.inf), ("c", Decimal(4))])
    assert _samples(floats) == ['pg_t_v{k="a"} 0.5', 'pg_t_v{k="b"} +Inf', 'pg_t_v{k="c"} 2.0']
    decimals = _render(collector, ["k", "v"], [("a", Decimal("1.5")), ("b", Decimal("NaN"))])
    assert _samples(decimals) == ['pg_t_v{k="a"} 0.75', 'pg_t_v{k="b"} NaN']


def test_numeric_keeps_its_digits_or_is_its_nearest_float() -> None:
    """A numeric column (text from the loaders): its own digits while every parser reads
    them as a float; beyond a float's range +Inf, never its 401 digits (issue 29); NaN;
    a NULL among them, and a scale, as for any number."""
    collector = _collector(Column("k", Usage.LABEL), Column("v", Usage.GAUGE))
    plain: list[tuple[str, object]] = [("a", "12.50"), ("b", "-0.0000001")]
    assert _samples(_render(collector, ["k", "v"], plain, types=(TEXT, NUMERIC))) == [
        'pg_t_v{k="a"} 12.50',
        'pg_t_v{k="b"} -0.0000001',
    ]
    odd = [*plain, ("c", "1" + "0" * 400), ("d", "NaN"), ("e", None)]
    text = _render(collector, ["k", "v"], odd, types=(TEXT, NUMERIC))
    assert _samples(text) == [
        'pg_t_v{k="a"} 12.5',
        'pg_t_v{k="b"} -1e-07',
        'pg_t_v{k="c"} +Inf',
        'pg_t_v{k="d"} NaN',
        'pg_t_v{k="e"} NaN',
    ]
    values = [s.value for m in parse_text(text) for s in m.samples]
    assert values[:3] == [12.5, -1e-7, math.inf]
    scaled = _collector(Column("k", Usage.LABEL), Column("v", Usage.GAUGE, scale=2.0))
    assert _samples(_render(scaled, ["k", "v"], plain, types=(TEXT, NUMERIC))) == [
        'pg_t_v{k="a"} 25.0',
        'pg_t_v{k="b"} -2e-07',
    ]


def test_a_null_among_numbers_takes_its_place_in_the_batch() -> None:
    """NULLs in a column of numbers (as pg_io has): the default or NaN in their rows, the
    numbers rendered as without them."""
    collector = _collector(
        Column("k", Usage.LABEL),
        Column("n", Usage.GAUGE),
        Column("d", Usage.GAUGE, default=7.0, scale=2.0),
        Column("b", Usage.GAUGE),
    )
    rows = [("a", 1, 1.5, True), ("b", None, None, None), ("c", 3, math.inf, False)]
    text = _render(collector, ["k", "n", "d", "b"], rows, types=(TEXT, INT8, FLOAT8, BOOL))
    assert _samples(text) == [
        'pg_t_n{k="a"} 1',
        'pg_t_n{k="b"} NaN',
        'pg_t_n{k="c"} 3',
        'pg_t_d{k="a"} 3.0',
        'pg_t_d{k="b"} 14.0',
        'pg_t_d{k="c"} +Inf',
        'pg_t_b{k="a"} 1',
        'pg_t_b{k="b"} NaN',
        'pg_t_b{k="c"} 0',
    ]
    nothing = _render(
        collector, ["k", "n", "d", "b"], [("z", None, None, None)], types=(TEXT, INT8, FLOAT8, BOOL)
    )
    assert _samples(nothing) == ['pg_t_n{k="z"} NaN', 'pg_t_d{k="z"} 14.0', 'pg_t_b{k="z"} NaN']


def test_value_types_in_one_column() -> None:
    """Without type oids, booleans, timestamps and text in a value column are cast by
    their Python type."""
    collector = _collector(Column("k", Usage.LABEL), Column("v", Usage.GAUGE, scale=10.0))
    rows = [
        ("bool", True),
        ("ts", dt.datetime(1970, 1, 1, 0, 0, 2)),
        ("text", "1.5"),
        ("junk", "n/a"),
        ("bytes", b"1"),
    ]
    assert _samples(_render(collector, ["k", "v"], rows)) == [
        'pg_t_v{k="bool"} 1',
        'pg_t_v{k="ts"} 2',
        'pg_t_v{k="text"} 15.0',
        'pg_t_v{k="junk"} NaN',
        'pg_t_v{k="bytes"} 10.0',
    ]


def test_each_column_is_cast_by_its_type_oid() -> None:
    """With the result's type oids, the same Python value is cast by its column's type:
    epoch seconds unscaled, numbers scaled, PostgreSQL's text parsed as Go parses it."""
    collector = _collector(
        Column("k", Usage.LABEL),
        Column("ts", Usage.GAUGE, scale=10.0),
        Column("n", Usage.GAUGE, scale=10.0),
        Column("t", Usage.GAUGE, scale=10.0),
        Column("b", Usage.GAUGE, scale=10.0),
    )
    types = (TEXT, TIMESTAMP, INT8, TEXT, BOOL)
    rows = [("a", 7, 7, "7", True), ("b", math.inf, 8, " 8", False)]
    text = _render(collector, ["k", "ts", "n", "t", "b"], rows, types=types)
    assert _samples(text) == [
        'pg_t_ts{k="a"} 7',
        'pg_t_ts{k="b"} +Inf',
        'pg_t_n{k="a"} 70.0',
        'pg_t_n{k="b"} 80.0',
        'pg_t_t{k="a"} 70.0',
        'pg_t_t{k="b"} NaN',
        'pg_t_b{k="a"} 1',
        'pg_t_b{k="b"} 0',
    ]


def test_label_columns_are_cast_by_their_type_oid() -> None:
    """Labels by type: floats in Go's form, timestamps Unix seconds or ``infinity``,
    booleans, bytes decoded, NULL empty; ``scale`` and ``default`` do not apply."""
    collector = _collector(
        Column("f", Usage.LABEL, scale=2.0, default=1.0),
        Column("ts", Usage.LABEL),
        Column("b", Usage.LABEL),
        Column("raw", Usage.LABEL),
        Column("v", Usage.GAUGE),
    )
    types = (FLOAT8, TIMESTAMP, BOOL, BYTEA, INT4)
    rows = [(1e6, 1709210096, True, b"caf\xe9", 1), (None, -math.inf, None, None, 2)]
    text = _render(collector, ["f", "ts", "b", "raw", "v"], rows, types=types)
    assert _samples(text) == [
        'pg_t_v{f="1e+06",ts="1709210096",b="true",raw="caf\\\\xe9"} 1',
        'pg_t_v{f="",ts="-infinity",b="",raw=""} 2',
    ]


def test_of_two_columns_of_one_name_the_last_counts() -> None:
    """As in Go, a result with two columns of one name reads the last of them."""
    collector = _collector(Column("l", Usage.LABEL), Column("v", Usage.GAUGE))
    text = _render(collector, ["l", "l", "v", "v"], [("first", "last", 1, 2)])
    assert _samples(text) == ['pg_t_v{l="last"} 2']


def test_labels_order_rename_const_and_escaping() -> None:
    """LABEL columns in file order, renamed, then const labels; values escaped."""
    collector = _collector(
        Column("b", Usage.LABEL),
        Column("v", Usage.COUNTER),
        Column("a", Usage.LABEL, rename="alpha"),
        Column("skip", Usage.DISCARD),
    )
    rows = [('q"uote', 1, "back\\slash", "x"), ("new\nline", 2, None, "y"), (True, 3, 7, "z")]
    text = _render(
        collector,
        ["a", "b", "v", "skip"],
        [(r[2], r[0], r[1], r[3]) for r in rows],
        const_labels=[("job", 'pg%s"')],
    )
    assert _samples(text) == [
        'pg_t_v{b="q\\"uote",alpha="back\\\\slash",job="pg%s\\""} 1',
        'pg_t_v{b="new\\nline",alpha="",job="pg%s\\""} 2',
        'pg_t_v{b="true",alpha="7",job="pg%s\\""} 3',
    ]


def test_const_labels_without_label_columns() -> None:
    """Const labels alone still form the label block, percent signs untouched."""
    collector = _collector(Column("v", Usage.GAUGE))
    assert _samples(_render(collector, ["v"], [(1,)], const_labels=[("a", "100%")])) == [
        'pg_t_v{a="100%"} 1'
    ]
    assert _samples(_render(collector, ["v"], [(1,)])) == ["pg_t_v 1"]


def test_family_names_kinds_and_help() -> None:
    """Names are <name>_<rename or column>; COUNTER is a counter; HELP falls back to the key."""
    collector = _collector(
        Column("calls", Usage.COUNTER, description="Times called"),
        Column("mean", Usage.GAUGE, rename="avg"),
        key="pg_stat_x_branch",
        name="pg_x",
    )
    builder = SampleBuilder(collector, ["calls", "mean"], [], None)
    builder.add_rows([(1, 2.5)])
    families = builder.finish()
    assert [(f.name, f.kind, f.help, f.series) for f in families] == [
        ("pg_x_calls", "counter", "Times called", 1),
        ("pg_x_avg", "gauge", "pg_stat_x_branch column mean", 1),
    ]


@pytest.mark.parametrize("usage", [Usage.LABEL, Usage.HISTOGRAM])
def test_missing_label_or_histogram_column_fails(usage: Usage) -> None:
    """A LABEL or HISTOGRAM column absent from the result fails with an actionable message."""
    column = Column("gone", usage, buckets=(1.0,) if usage is Usage.HISTOGRAM else ())
    collector = Collector(
        key="pg_k",
        name="pg_k",
        query="q",
        columns=(column, Column("v", Usage.GAUGE)),
        source="conf/0100-x.yml",
    )
    with pytest.raises(MissingColumnError) as caught:
        SampleBuilder(collector, ["v", "extra"], [], None)
    message = str(caught.value)
    assert message.startswith(f"collector pg_k: column gone ({usage.value}) is missing")
    assert "v, extra" in message
    assert "conf/0100-x.yml" in message


def test_missing_value_column_is_a_warning_and_extras_are_ignored() -> None:
    """A missing GAUGE/COUNTER column omits its metric with a warning; extra columns are ignored."""
    collector = _collector(Column("here", Usage.GAUGE), Column("gone", Usage.COUNTER))
    builder = SampleBuilder(collector, ["extra", "here"], [], None)
    builder.add_rows([("ignored", 1)])
    families = builder.finish()
    assert [f.name for f in families] == ["pg_t_here"]
    assert builder.warnings == [
        "collector pg_t: column gone (COUNTER) is missing from the result; "
        "metric pg_t_gone is omitted"
    ]


def test_result_column_order_does_not_matter() -> None:
    """Columns are found by name, whatever their position in the result."""
    collector = _collector(Column("k", Usage.LABEL), Column("v", Usage.GAUGE))
    assert _samples(_render(collector, ["v", "k"], [(5, "a")])) == ['pg_t_v{k="a"} 5']


@pytest.mark.parametrize(
    "batches",
    [[[("a", 1), ("b", 2), ("a", 3)]], [[("a", 1), ("b", 2)], [("c", 4), ("b", 5)]]],
    ids=["within a batch", "across batches"],
)
def test_repeated_label_sets_fail_a_gauge_collector(
    batches: list[list[tuple[object, ...]]],
) -> None:
    """Rows repeating a label set, within or across batches, fail the run (Go 1.6.1),
    naming the collector and the labels."""
    collector = _collector(Column("k", Usage.LABEL), Column("v", Usage.GAUGE))
    builder = SampleBuilder(collector, ["k", "v"], [("env", "x")], None)
    for batch in batches[:-1]:
        builder.add_rows(batch)
    with pytest.raises(RepeatedLabelsError) as caught:
        builder.add_rows(batches[-1])
    message = str(caught.value)
    assert "collector pg_t" in message
    assert 'k="' in message
    assert 'env="x"' in message
    assert "LABEL columns unique" in message


def test_rows_without_labels_are_one_label_set() -> None:
    """A collector without LABEL columns may return one row; a second one fails it."""
    collector = _collector(Column("v", Usage.COUNTER))
    builder = SampleBuilder(collector, ["v"], [], None)
    builder.add_rows([(1,)])
    with pytest.raises(RepeatedLabelsError, match="no labels"):
        builder.add_rows([(2,)])


def test_histogram_only_collector_merges_repeated_label_sets() -> None:
    """HISTOGRAM columns alone fold repeated label sets into one distribution."""
    collector = _collector(Column("k", Usage.LABEL), Column("v", Usage.HISTOGRAM, buckets=(1.0,)))
    builder = SampleBuilder(collector, ["k", "v"], [], None)
    builder.add_rows([("a", 0.5), ("a", 2.0)])
    builder.add_rows([("a", 0.1)])
    text = encode(builder.finish(), Format.TEXT).decode()
    assert 'pg_t_v_count{k="a"} 3' in _samples(text)


def test_batches_equal_one_batch() -> None:
    """Feeding rows in batches gives the same families as feeding them at once."""
    collector = _collector(Column("k", Usage.LABEL), Column("v", Usage.GAUGE))
    rows = [(f"r{i}", i) for i in range(10)]
    one = SampleBuilder(collector, ["k", "v"], [], None)
    one.add_rows(rows)
    many = SampleBuilder(collector, ["k", "v"], [], None)
    for start in range(0, 10, 3):
        many.add_rows(iter(rows[start : start + 3]))
    many.add_rows([])
    assert encode(one.finish(), Format.TEXT) == encode(many.finish(), Format.TEXT)


def test_empty_result_produces_no_families() -> None:
    """No rows, no series, no families."""
    builder = SampleBuilder(_collector(Column("v", Usage.GAUGE)), ["v"], [], None)
    builder.add_rows([])
    assert builder.finish() == ()
    assert builder.series == 0


HISTOGRAM = _collector(
    Column("kind", Usage.LABEL),
    Column("lat", Usage.HISTOGRAM, description="Latency", buckets=(0.5, 1.0, 10.0)),
    key="pg_h",
)


def test_histogram_output_exactly() -> None:
    """Cumulative buckets per label tuple with le last, then _count and _sum, all gauges."""
    rows = [("r", 0.2), ("w", 2), ("r", 0.5), ("r", 20.0), ("w", None), ("r", Decimal("1"))]
    text = _render(HISTOGRAM, ["kind", "lat"], rows, const_labels=[("ins", "i")])
    assert text == (
        "# HELP pg_h_lat_bucket Latency\n# TYPE pg_h_lat_bucket gauge\n"
        'pg_h_lat_bucket{kind="r",ins="i",le="0.5"} 2\n'
        'pg_h_lat_bucket{kind="r",ins="i",le="1"} 3\n'
        'pg_h_lat_bucket{kind="r",ins="i",le="10"} 3\n'
        'pg_h_lat_bucket{kind="r",ins="i",le="+Inf"} 4\n'
        'pg_h_lat_bucket{kind="w",ins="i",le="0.5"} 0\n'
        'pg_h_lat_bucket{kind="w",ins="i",le="1"} 0\n'
        'pg_h_lat_bucket{kind="w",ins="i",le="10"} 1\n'
        'pg_h_lat_bucket{kind="w",ins="i",le="+Inf"} 1\n'
        "# HELP pg_h_lat_count Latency\n# TYPE pg_h_lat_count gauge\n"
        'pg_h_lat_count{kind="r",ins="i"} 4\n'
        'pg_h_lat_count{kind="w",ins="i"} 1\n'
        "# HELP pg_h_lat_sum Latency\n# TYPE pg_h_lat_sum gauge\n"
        'pg_h_lat_sum{kind="r",ins="i"} 21.7\n'
        'pg_h_lat_sum{kind="w",ins="i"} 2.0\n'
    )


def test_histogram_without_labels_and_with_default() -> None:
    """Without labels le stands alone; NULL counts as the (scaled) default when there is one."""
    collector = _collector(
        Column("lat", Usage.HISTOGRAM, buckets=(1.0,), default=0.25, scale=4.0), key="pg_h"
    )
    text = _render(collector, ["lat"], [(None,), (0.1,), ("junk",)])
    assert _samples(text) == [
        'pg_h_lat_bucket{le="1"} 2',
        'pg_h_lat_bucket{le="+Inf"} 2',
        "pg_h_lat_count 2",
        "pg_h_lat_sum 1.4",
    ]


def test_histogram_with_gauge_columns() -> None:
    """Beside a GAUGE, histograms get one row per label set; a repeated set fails the run."""
    collector = _collector(
        Column("k", Usage.LABEL),
        Column("lat", Usage.HISTOGRAM, buckets=(1.0,)),
        Column("g", Usage.GAUGE),
        key="pg_h",
    )
    builder = SampleBuilder(collector, ["k", "lat", "g"], [], None)
    builder.add_rows([("a", 0.5, 10), ("b", 2, 20)])
    families = builder.finish()
    assert [f.name for f in families] == [
        "pg_h_lat_bucket",
        "pg_h_lat_count",
        "pg_h_lat_sum",
        "pg_h_g",
    ]
    assert _samples(encode(families, Format.TEXT).decode())[-2] == 'pg_h_g{k="a"} 10'
    assert builder.series == 10  # 2 tuples x (2 buckets + count + sum + 1 gauge)
    repeated = SampleBuilder(collector, ["k", "lat", "g"], [], None)
    with pytest.raises(RepeatedLabelsError):
        repeated.add_rows([("a", 0.5, 10), ("a", 2, 20)])


def test_series_cap_counts_plain_and_histogram_series() -> None:
    """Exactly at the cap passes; beyond it raises naming collector, count and cap."""
    builder = SampleBuilder(HISTOGRAM, ["kind", "lat"], [], max_series=12)
    builder.add_rows([("a", 1), ("b", 1)])  # 2 tuples × (3 buckets + Inf + count + sum)
    builder.add_rows([("a", 2)])  # a known tuple adds observations, not series
    assert builder.series == 12
    with pytest.raises(TooManySeriesError, match=r"collector pg_h: more than 12 series \(18 "):
        builder.add_rows([("c", 1)])
    collector = _collector(
        Column("k", Usage.LABEL), Column("v", Usage.GAUGE), Column("w", Usage.GAUGE)
    )
    exact = SampleBuilder(collector, ["k", "v", "w"], [], max_series=4)
    exact.add_rows([("a", 1, 1), ("b", 2, 2)])
    assert exact.series == 4
    with pytest.raises(TooManySeriesError, match="pg_t: more than 4 series"):
        exact.add_rows([("c", 3, 3)])


def test_series_cap_raises_for_a_batch_that_crosses_it() -> None:
    """A batch that crosses the cap raises, though the builder was under it before (D9).

    Nothing of that execution is published (the builder is unusable after the error):
    ``test_over_series_cap_fails_cleanly_and_stops_the_query`` shows it against PostgreSQL."""
    collector = _collector(Column("k", Usage.LABEL), Column("v", Usage.GAUGE))
    builder = SampleBuilder(collector, ["k", "v"], [], max_series=3)
    builder.add_rows([("a", 1)])
    with pytest.raises(TooManySeriesError):
        builder.add_rows([("b", 2), ("c", 3), ("d", 4)])


def _wide_collector() -> tuple[Collector, list[str]]:
    columns = [
        Column("datname", Usage.LABEL),
        Column("relname", Usage.LABEL),
        *(Column(f"v{i}", Usage.COUNTER if i % 2 else Usage.GAUGE) for i in range(8)),
    ]
    return _collector(*columns, key="pg_table"), [c.name for c in columns]


def test_sixteen_thousand_series_shape() -> None:
    """2 000 rows × 8 columns: 8 families of 2 000 series each, parseable, sized as expected."""
    collector, names = _wide_collector()
    rows = [("db", f"t{r}", *(r * 8 + i for i in range(8))) for r in range(2000)]
    builder = SampleBuilder(collector, names, [("ins", "pg-1")], max_series=100_000)
    for start in range(0, 2000, 512):
        builder.add_rows(rows[start : start + 512])
    families = builder.finish()
    assert builder.series == 16_000
    assert [f.series for f in families] == [2000] * 8
    text = encode(families, Format.TEXT)
    lines = text.decode().splitlines()
    assert len(lines) == 16_000 + 2 * 8
    assert lines[2] == 'pg_table_v0{datname="db",relname="t0",ins="pg-1"} 0'
    assert lines[-1] == 'pg_table_v7{datname="db",relname="t1999",ins="pg-1"} 15999'
    expected = "".join(
        f"# HELP pg_table_v{i} pg_table column v{i}\n"
        f"# TYPE pg_table_v{i} {'counter' if i % 2 else 'gauge'}\n"
        + "".join(
            f'pg_table_v{i}{{datname="db",relname="t{r}",ins="pg-1"}} {r * 8 + i}\n'
            for r in range(2000)
        )
        for i in range(8)
    )
    assert text == expected.encode()
    parsed = list(parse_text(text.decode()))
    assert sum(len(m.samples) for m in parsed) == 16_000


def test_family_bytes_are_computed_once() -> None:
    """A finished family returns the same bytes object on every encode (cached scrapes)."""
    collector, names = _wide_collector()
    builder = SampleBuilder(collector, names, [], None)
    builder.add_rows([("db", "t", *range(8))])
    families: tuple[Family, ...] = builder.finish()
    for fmt in Format:
        assert all(f.body(fmt) is f.body(fmt) for f in families)
        assert all(f.header(fmt) is f.header(fmt) for f in families)


def test_executions_of_one_collector_share_a_layout_but_not_their_series() -> None:
    """The per-collector layout is made once; each execution publishes only its own rows
    and histogram observations, and says its own missing-column warnings."""
    collector = _collector(
        Column("k", Usage.LABEL),
        Column("v", Usage.GAUGE),
        Column("h", Usage.HISTOGRAM, buckets=(1.0,)),
        Column("gone", Usage.GAUGE),
    )
    names = ["k", "v", "h"]
    first = SampleBuilder(collector, names, [], None)
    first.add_rows([("a", 1, 0.5)])
    first.finish()
    second = SampleBuilder(collector, names, [], None)
    second.add_rows([("b", 2, 2.0)])
    text = encode(second.finish(), Format.TEXT).decode()
    assert layout_of(collector, names, []) is layout_of(collector, names, ())
    assert 'k="a"' not in text
    assert _samples(text) == [
        'pg_t_v{k="b"} 2',
        'pg_t_h_bucket{k="b",le="1"} 0',
        'pg_t_h_bucket{k="b",le="+Inf"} 1',
        'pg_t_h_count{k="b"} 1',
        'pg_t_h_sum{k="b"} 2.0',
    ]
    assert second.warnings == first.warnings
    assert len(second.warnings) == 1


def test_a_layout_belongs_to_its_result_columns_and_const_labels() -> None:
    """Another column order or other const labels get a layout of their own."""
    collector = _collector(Column("k", Usage.LABEL), Column("v", Usage.GAUGE))
    assert _samples(_render(collector, ["k", "v"], [("a", 1)])) == ['pg_t_v{k="a"} 1']
    assert _samples(_render(collector, ["v", "k"], [(2, "b")])) == ['pg_t_v{k="b"} 2']
    assert _samples(_render(collector, ["k", "v"], [("c", 3)], [("env", "x")])) == [
        'pg_t_v{k="c",env="x"} 3'
    ]


def test_the_layout_table_is_emptied_when_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reloads make new collectors: the table of layouts never grows past its bound."""
    monkeypatch.setattr(samples, "_LAYOUTS", {})
    monkeypatch.setattr(samples, "LAYOUTS_MAX", 3)
    for n in range(10):
        collector = _collector(Column("v", Usage.GAUGE), key=f"pg_{n}")
        assert _samples(_render(collector, ["v"], [(n,)])) == [f"pg_{n}_v {n}"]
        assert len(samples._LAYOUTS) <= 3
