"""Tests for exporter.collect.topn: a ``top`` collector's rows become the named keys'
rows and one remainder row per kept labels, rendered like any collector's (issue 38)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence

import pytest
from prometheus_client.parser import text_string_to_metric_families as parse_text

from exporter.collect import topn
from exporter.collect.ranking import Ranking
from exporter.collect.runtime import CollectorRuntime
from exporter.collect.session import Session
from exporter.config.definitions import Collector, Column, Top, Usage
from exporter.errors import MissingColumnError, RepeatedLabelsError, TooManySeriesError
from exporter.expose.exposition import Format, encode
from exporter.pg.postgres import Batch
from tests.fixtures.clock import FakeClock

TEXT, INT8, NUMERIC, FLOAT8 = 25, 20, 1700, 701
NAMES = ("datname", "query", "calls", "time", "size")
TYPES = (TEXT, INT8, NUMERIC, FLOAT8, INT8)  # numeric counters arrive as text


def _collector(limit: int = 1, **top: object) -> Collector:
    columns = (
        Column("datname", Usage.LABEL),
        Column("query", Usage.LABEL),
        Column("calls", Usage.COUNTER),
        Column("time", Usage.COUNTER, scale=0.001),
        Column("size", Usage.GAUGE),
    )
    top = {"sum": ("size",)} | top
    ranked = Top("time", limit, 2 * limit, 600, 0, ("datname",), **top)  # type: ignore[arg-type]
    return Collector(key="pg_q", name="pg_q", query="SELECT 1", columns=columns, top=ranked)


def _rows(calls: dict[tuple[str, int], int]) -> list[tuple[object, ...]]:
    """One row per (database, query ID): calls as numeric text, time = 2 ms a call."""
    return [(d, q, str(c), 2.0 * c, 100) for (d, q), c in calls.items()]


async def _batches(*batches: Sequence[tuple[object, ...]]) -> AsyncGenerator[Batch, None]:
    for rows in batches:
        yield NAMES, TYPES, list(rows)


async def _scrape(
    session: Session, runtime: CollectorRuntime, rows: list[tuple[object, ...]]
) -> dict[tuple[str, str, str], float]:
    """One run through the session: {(metric, datname, query): value}."""
    builder = await session._build(runtime.collector, _batches(rows), runtime)
    assert builder is not None
    text = encode(builder.finish(), Format.TEXT).decode()
    return {
        (s.name.removesuffix("_total"), s.labels["datname"], s.labels["query"]): s.value
        for family in parse_text(text)
        for s in family.samples
    }


async def test_the_busiest_key_is_named_and_the_rest_summed_per_database() -> None:
    """After the first run (no rates yet: all remainder), the busiest key is named with
    its real values; each database's other keys are one series with query="other",
    counters from zero and gauges summed; the key label is text, the scale applied."""
    clock = FakeClock()
    session = Session(pgbouncer=False, const_labels=(), max_series=100, clock=clock)
    runtime = CollectorRuntime(_collector())
    first = await _scrape(session, runtime, _rows({("a", 1): 10, ("a", 2): 10, ("b", 3): 5}))
    assert first[("pg_q_calls", "a", "other")] == 0
    assert first[("pg_q_size", "a", "other")] == 200
    clock.advance(10)
    second = await _scrape(session, runtime, _rows({("a", 1): 90, ("a", 2): 20, ("b", 3): 6}))
    assert second == {
        ("pg_q_calls", "a", "1"): 90,
        ("pg_q_calls", "a", "other"): 80 + 10,  # the named key's entry run, and key 2's
        ("pg_q_calls", "b", "other"): 1,
        ("pg_q_time", "a", "1"): 0.18,
        ("pg_q_time", "a", "other"): 0.18,
        ("pg_q_time", "b", "other"): 0.002,
        ("pg_q_size", "a", "1"): 100,
        ("pg_q_size", "a", "other"): 100,
        ("pg_q_size", "b", "other"): 100,
    }


async def test_a_collector_without_top_is_untouched_by_the_runtime() -> None:
    """The runtime passed, no top: the rows render as they are, no ranking is made."""
    plain = _collector()
    plain = Collector(key=plain.key, name=plain.name, query=plain.query, columns=plain.columns)
    session = Session(pgbouncer=False, const_labels=(), max_series=100, clock=FakeClock())
    runtime = CollectorRuntime(plain)
    found = await _scrape(session, runtime, _rows({("a", 1): 10, ("a", 2): 10}))
    assert ("pg_q_calls", "a", "2") in found
    assert runtime.ranking is None


async def test_more_rows_than_the_cap_fail_the_run_before_any_ranking() -> None:
    """A top collector reads its rows whole: more than max_series of them fail it."""
    runtime = CollectorRuntime(_collector())
    rows = _rows({("a", n): 1 for n in range(5)})
    with pytest.raises(TooManySeriesError, match="more than 4 rows to rank"):
        async for _ in topn.ranked(runtime, _batches(rows[:3], rows[3:]), FakeClock(), 4):
            pass
    assert runtime.ranking is None


async def test_an_empty_result_ranks_nothing() -> None:
    """No rows: nothing yielded, the ranking untouched (the run publishes nothing)."""
    runtime = CollectorRuntime(_collector())
    assert [b async for b in topn.ranked(runtime, _batches(), FakeClock(), 4)] == []


def test_repeated_labels_fail_the_run() -> None:
    """Two rows of one label set: the run fails, as for any collector with counters."""
    collector = _collector()
    shape = topn.shape_of(collector, NAMES, TYPES)
    assert collector.top is not None
    ranking = Ranking(collector.top, 2, 1, 1)
    rows = _rows({("a", 1): 1}) * 2
    with pytest.raises(RepeatedLabelsError, match="more than one row has the labels"):
        topn.rank_rows(ranking, shape, rows, 0.0, collector)
    assert ranking.keys == {}


def test_a_missing_label_or_ranking_column_fails_the_run() -> None:
    """The key and the ranking counter must be in the result."""
    with pytest.raises(MissingColumnError, match="column time"):
        topn.shape_of(_collector(), ("datname", "query", "calls"), (TEXT, INT8, NUMERIC))


def test_a_ranking_is_made_anew_when_the_results_counters_change() -> None:
    """A counter column that goes missing changes the shape: a fresh ranking, not one
    whose remembered values sit in the wrong columns."""
    runtime = CollectorRuntime(_collector())
    full = topn.ranking_of(runtime, topn.shape_of(runtime.collector, NAMES, TYPES))
    assert topn.ranking_of(runtime, topn.shape_of(runtime.collector, NAMES, TYPES)) is full
    fewer = topn.shape_of(runtime.collector, NAMES[:2] + NAMES[3:], TYPES[:2] + TYPES[3:])
    assert topn.ranking_of(runtime, fewer) is not full


async def test_a_remainder_value_of_our_choosing_labels_the_remainder() -> None:
    """``other`` sets what the remainder's ranked labels read."""
    session = Session(pgbouncer=False, const_labels=(), max_series=100, clock=FakeClock())
    runtime = CollectorRuntime(_collector(other="(rest)"))
    found = await _scrape(session, runtime, _rows({("a", 1): 10, ("a", 2): 20}))
    assert ("pg_q_calls", "a", "(rest)") in found


async def test_a_collector_with_no_more_keys_than_its_limit_publishes_as_without_top() -> None:
    """Nothing to rank: from the first run every key is named with its own values and
    no remainder is published; it appears with the first key left unnamed, and stays."""
    session = Session(pgbouncer=False, const_labels=(), max_series=100, clock=FakeClock())
    runtime = CollectorRuntime(_collector(limit=2))
    first = await _scrape(session, runtime, _rows({("a", 1): 10, ("a", 2): 20}))
    assert first == {
        ("pg_q_calls", "a", "1"): 10, ("pg_q_time", "a", "1"): 0.02, ("pg_q_size", "a", "1"): 100,
        ("pg_q_calls", "a", "2"): 20, ("pg_q_time", "a", "2"): 0.04, ("pg_q_size", "a", "2"): 100,
    }  # fmt: skip
    second = _rows({("a", 1): 110, ("a", 2): 120, ("a", 3): 5})  # a quiet newcomer
    found = await _scrape(session, runtime, second)
    assert {q for _, _, q in found} == {"1", "2", "other"}
    assert found[("pg_q_calls", "a", "other")] == 5  # the newcomer's calls, from zero
    found = await _scrape(session, runtime, _rows({("a", 1): 210, ("a", 2): 220}))
    assert found[("pg_q_calls", "a", "other")] == 5  # stays, and never falls


@pytest.mark.parametrize(
    ("how", "expected"), [({"sum": ()}, None), ({"sum": (), "max": ("size",)}, 300)]
)
async def test_a_gauge_the_remainder_neither_sums_nor_maxes_has_no_remainder_sample(
    how: dict[str, object], expected: float | None
) -> None:
    """A gauge not in ``sum`` has no series in the remainder (not even NaN or its default);
    one in ``max`` carries the largest value of the keys not named."""
    session = Session(pgbouncer=False, const_labels=(), max_series=100, clock=FakeClock())
    runtime = CollectorRuntime(_collector(1, **how))
    rows: list[tuple[object, ...]] = [
        ("a", 1, "10", 20.0, 100), ("a", 2, "10", 20.0, 300), ("a", 3, "1", 2.0, None)
    ]  # fmt: skip
    found = await _scrape(session, runtime, rows)
    assert found[("pg_q_calls", "a", "other")] == 0
    assert found.get(("pg_q_size", "a", "other")) == expected


async def test_a_named_key_absent_from_a_run_has_no_row_and_fails_nothing() -> None:
    """A named key missing from a run (deallocated, its database gone) is still
    remembered as named; that run publishes the others and no row for it."""
    session = Session(pgbouncer=False, const_labels=(), max_series=100, clock=FakeClock())
    runtime = CollectorRuntime(_collector(limit=2))
    await _scrape(session, runtime, _rows({("a", 1): 10, ("a", 2): 20}))  # both named
    found = await _scrape(session, runtime, _rows({("a", 2): 30}))
    assert {q for _, _, q in found} == {"2"}
    assert runtime.ranking is not None
    assert ("1", "a") in runtime.ranking.named
