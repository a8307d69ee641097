"""Unique series: a page never serves one series twice (issue 36, guarantee 8)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from exporter.config.definitions import Collector, Column, Usage
from exporter.expose.exposition import Family, Format, encode
from exporter.expose.samples import SampleBuilder
from exporter.expose.uniqueness import Repeat, without_repeats

PER_DB = Collector(
    key="pg_t",
    name="pg_t",
    query="SELECT 1",
    columns=(Column("datname", Usage.LABEL), Column("k", Usage.LABEL),
             Column("v", Usage.GAUGE), Column("h", Usage.HISTOGRAM, buckets=(1.0,))),
)  # fmt: skip


def families(
    rows: Sequence[tuple[object, ...]], collector: Collector = PER_DB
) -> tuple[Family, ...]:
    """What one run of ``collector`` over ``rows`` publishes."""
    builder = SampleBuilder(collector, ["datname", "k", "v", "h"], [("env", "x")], None)
    builder.add_rows(list(rows))
    return builder.finish()


def om_parse(page: bytes) -> int:
    """Samples on an OpenMetrics page, by the strict parser (raises on a repeated series)."""
    parsed = text_string_to_metric_families(page.decode())  # type: ignore[no-untyped-call]
    return sum(len(family.samples) for family in parsed)


def test_two_databases_rows_repeating_each_other_are_served_once() -> None:
    """A cluster-wide query run on two databases gives the same rows twice: the first
    database's series are kept, the second's repeats left out and reported, and the page
    passes the strict parser, which refuses it otherwise."""
    rows = [("a", "1", 1, 0.5), ("b", "2", 2, 2.0)]
    first, second = families(rows), families(rows)
    with_repeats = encode([*first, *second], Format.OPENMETRICS)
    with pytest.raises(ValueError, match="grouping"):
        om_parse(with_repeats)
    sources, repeats = without_repeats([first, second])
    assert sources[0] == first
    assert sources[1] == ()  # every one of its series repeated the first's
    assert {r.family for r in repeats} == {"pg_t_v", "pg_t_h_bucket", "pg_t_h_count", "pg_t_h_sum"}
    assert all(r.source == 1 and r.first == 0 for r in repeats)
    assert sum(r.series for r in repeats if r.family == "pg_t_v") == 2
    page = encode([f for source in sources for f in source], Format.OPENMETRICS)
    assert om_parse(page) == sum(f.series for f in first)


def test_only_the_repeated_series_are_left_out() -> None:
    """A source that repeats some series of an earlier one keeps the others."""
    first = families([("a", "1", 1, 0.5)])
    second = families([("a", "1", 7, 0.5), ("b", "2", 2, 0.5)])
    sources, repeats = without_repeats([first, second])
    kept = {f.name: f for f in sources[1]}
    assert kept["pg_t_v"].series == 1
    assert kept["pg_t_v"].text_samples == b'pg_t_v{datname="b",k="2",env="x"} 2\n'
    assert Repeat(1, 0, "pg_t_v", 1) in repeats


def test_rows_without_labels_from_two_sources_meet() -> None:
    """A collector without LABEL columns on two databases: one series, served once."""
    collector = Collector(key="pg_n", name="pg_n", query="SELECT 1",
                          columns=(Column("v", Usage.GAUGE),))  # fmt: skip
    one = SampleBuilder(collector, ["v"], [], None)
    one.add_rows([(1,)])
    two = SampleBuilder(collector, ["v"], [], None)
    two.add_rows([(2,)])
    sources, repeats = without_repeats([one.finish(), two.finish()])
    assert [len(s) for s in sources] == [1, 0]
    assert repeats == [Repeat(1, 0, "pg_n_v", 1)]


def test_sources_told_apart_by_a_fixed_label_are_not_read() -> None:
    """Families whose ``datname`` is fixed to a different value in each cannot meet: they
    are passed through untouched, their samples never read (the cheap path)."""
    first = families([("a", str(n), n, 0.5) for n in range(3)])
    second = families([("b", str(n), n, 0.5) for n in range(3)])
    assert dict(first[0].fixed) == {"datname": "a"}
    poisoned = tuple(
        Family(f.name, f.kind, f.help, f.series, b"unreadable", f.fixed) for f in second
    )
    sources, repeats = without_repeats([first, poisoned])
    assert repeats == []
    assert sources[1] == poisoned


def test_a_label_that_varies_is_not_fixed() -> None:
    """A LABEL column with two values in the rows, even across batches, is not fixed."""
    builder = SampleBuilder(PER_DB, ["datname", "k", "v", "h"], [], None)
    builder.add_rows([("a", "1", 1, 0.5)])
    builder.add_rows([("a", "2", 1, 0.5)])
    assert builder.fixed() == (("datname", "a"),)
    builder.add_rows([("b", "3", 1, 0.5)])
    assert builder.fixed() == ()


def test_families_of_another_kind_are_left_to_the_encoder() -> None:
    """A family of the same name but another kind is dropped whole by the encoder, so it
    is not reported as repeating series."""
    gauge = Family("pg_x", "gauge", "x", 1, b"pg_x 1\n")
    counter = Family("pg_x", "counter", "x", 1, b"pg_x 1\n")
    assert without_repeats([(gauge,), (counter,)]) == ([(gauge,), (counter,)], [])
