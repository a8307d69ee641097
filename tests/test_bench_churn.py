"""bench.churn and its workload (issue 38): what a scrape served of pg_query, what the
scrapes add up to, when the heavy hitter was named, and which statement each call runs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from bench.churn import (
    Figures,
    Heavy,
    Labels,
    Report,
    Served,
    Truth,
    figures_of,
    first_named,
    increases,
    parse_args,
    parse_served,
    render,
    split,
)
from bench.churn_workload import Plan, heavy_allowance, hot_start, shape_of

_OURS = b"""\
# HELP pg_query_calls Times the statement was executed
# TYPE pg_query_calls counter
pg_query_calls{datname="churn",query="-42"} 10
pg_query_calls{query="other",datname="churn"} 7
pg_query_exec_time{datname="churn",query="-42"} 0.5
pg_query_rows{datname="churn",query="-42"} 3
pg_query_rows{datname="a\\"b",query="9"} 1
pg_database_size{datname="churn"} 8000
pg_exporter_query_scrape_total_count{datname="postgres",query="pg_query"} 5
pg_exporter_query_scrape_hit_count{datname="postgres",query="pg_query"} 2
pg_exporter_query_scrape_total_count{datname="postgres",query="pg_db"} 9
"""

_GO = b"""\
pg_query_calls{datname="churn",query="-42"} 10
pg_exporter_query_scrape_total_count{datname="postgres",query="pg_query_17"} 4
pg_exporter_query_scrape_hit_count{datname="postgres",query="pg_query_17"} 3
"""

CHURN_42: Labels = (("datname", "churn"), ("query", "-42"))
CHURN_OTHER: Labels = (("datname", "churn"), ("query", "other"))


def test_a_scrape_gives_pg_query_samples_by_label_set_in_name_order() -> None:
    """Labels are keyed in name order whatever the exposition's order; other families are
    left out; an escaped quote stays inside its value."""
    served = parse_served(_OURS, at=3.0)
    assert served.calls == {CHURN_42: 10.0, CHURN_OTHER: 7.0}
    assert served.exec_seconds == {CHURN_42: 0.5}
    assert len(served.series) == 5
    assert ("pg_query_rows", (("datname", 'a\\"b'), ("query", "9"))) in served.series
    assert served.at == 3.0


def test_pg_query_runs_are_executions_of_any_of_its_branches() -> None:
    """Runs are scrapes minus cache hits, of ``pg_query`` or a Go branch of it only."""
    assert parse_served(_OURS, at=0.0).runs == 3.0
    assert parse_served(_GO, at=0.0).runs == 1.0
    assert parse_served(b"", at=0.0).runs == 0.0


def test_increases_span_consecutive_scrapes_that_hold_the_series() -> None:
    """A series counts its increases between scrapes that both hold it: its first value is
    no increase, a gap loses what happened across it, a drop is a reset from zero."""
    a: Labels = (("query", "a"),)
    b: Labels = (("query", "b"),)
    samples: list[dict[Labels, float]] = [
        {a: 5.0}, {a: 8.0, b: 100.0}, {b: 104.0}, {a: 20.0, b: 3.0}, {a: 21.0},
    ]  # fmt: skip
    assert increases(samples) == {a: 3.0 + 1.0, b: 4.0 + 3.0}
    assert increases([]) == {}
    assert increases([{a: 1.0}]) == {}


def test_the_remainder_is_split_from_the_named_series() -> None:
    """``query="other"`` is the remainder; every other series is named."""
    assert split({CHURN_42: 3.0, CHURN_OTHER: 4.0, (("query", "7"),): 1.0}) == (4.0, 4.0)
    assert split({}) == (0.0, 0.0)


def _served(at: float, *queries: str, runs: float = 0.0) -> Served:
    calls: dict[Labels, float] = {(("datname", "d"), ("query", q)): 1.0 for q in queries}
    series = frozenset(("pg_query_calls", labels) for labels in calls)
    return Served(at, calls, {}, series, runs)


def test_the_heavy_hitter_is_named_at_the_first_scrape_after_it_began_that_labels_it() -> None:
    """Seconds from its start to the first scrape naming it; a scrape before its start does
    not count; never named, or never run, is None."""
    served = [_served(1.0, "h"), _served(6.0, "x"), _served(11.0, "h"), _served(16.0, "h")]
    assert first_named(served, "h", since=4.0) == 7.0
    assert first_named(served, "h", since=12.0) == 4.0
    assert first_named(served, "h", since=17.0) is None
    assert first_named(served, "zz", since=0.0) is None
    assert first_named(served, None, since=None) is None


def test_figures_count_series_per_scrape_and_over_the_window() -> None:
    """Per scrape: median and max; over the window: the union of label sets."""
    served = [_served(0.0, "a", "b"), _served(5.0, "b", "c", "d"), _served(10.0, "e")]
    got = figures_of("ours", served, 1, Heavy("c", 2.0), started=1.0)
    assert got.calls_per_scrape == (2, 3)
    assert got.all_per_scrape == (2, 3)
    assert (got.distinct_calls, got.distinct_all) == (5, 5)
    assert got.heavy_named_after == 2.0  # began at 1 + 2 = 3 s, named by the scrape at 5 s
    assert (got.scrapes, got.failed) == (3, 1)


def test_the_truth_of_the_window_is_the_increase_of_every_figure() -> None:
    """T1 − T0, the application's part included."""
    assert Truth(10.0, 5.0, 8.0, 1.0) - Truth(4.0, 2.0, 3.0, 0.5) == Truth(6.0, 3.0, 5.0, 0.5)


def test_the_report_gives_shares_of_the_truth_and_never_for_an_unnamed_heavy_hitter() -> None:
    """Named alone and named + remainder as shares of the true increase."""
    figures = Figures("go", 10, 0, (128.0, 128), (1152.0, 1152), 256, 2304,
                      named_calls=250.0, other_calls=0.0, named_exec_ms=10.0,
                      other_exec_ms=0.0, heavy_named_after=None)  # fmt: skip
    report = Report({}, ["1.0", "1.0", "1.0"], "abc1234", 360.0, Truth(1000.0, 40.0, 900.0),
                    Heavy(None, None), 990, [figures])  # fmt: skip
    text = render(report)
    assert "the application's 90.0% and 0.0% of them" in text
    row = text.splitlines()[-1]
    assert row.startswith("| Go pg_exporter binary | 10 (0) | 128 / 128 | 1152 / 1152 |")
    assert "| 2.00×; 2.00× | 25.0% / 25.0% | 25.0% / 25.0% | never |" in row


def test_most_calls_go_to_the_hot_set_and_the_rest_reach_every_other_shape() -> None:
    """With a hot share of 0.9, nine calls in ten are hot, spread evenly; the cold calls
    visit every shape outside the hot set once before any twice."""
    plan = Plan(shapes=50, hot=10, hot_share=0.9, move=60.0)
    shapes = Counter(shape_of(plan, call, elapsed=0.0) for call in range(400))
    hot = {k: n for k, n in shapes.items() if k < 10}
    assert sum(hot.values()) == 360
    assert set(hot.values()) == {36}
    cold = [shape_of(plan, call, 0.0) for call in range(400) if call % 10 == 9]
    assert sorted(cold) == list(range(10, 50))


def test_the_hot_set_moves_on_every_move_seconds_and_wraps_around() -> None:
    """Every ``move`` seconds the hot set is the next ``hot`` shapes."""
    plan = Plan(shapes=50, hot=20, move=60.0)
    assert [hot_start(plan, t) for t in (0.0, 59.9, 60.0, 120.0, 150.0)] == [0, 0, 20, 40, 40]
    assert hot_start(plan, 180.0) == 10
    assert {shape_of(plan, call, 61.0) for call in range(9)} <= set(range(20, 40))


def test_the_heavy_hitter_may_run_what_brings_it_to_its_share() -> None:
    """After running the allowance, it holds exactly its share; when ahead, nothing."""
    allowance = heavy_allowance(heavy_ms=5.0, all_ms=100.0, share=0.1)
    assert (5.0 + allowance) / (100.0 + allowance) == pytest.approx(0.1)
    assert heavy_allowance(heavy_ms=20.0, all_ms=100.0, share=0.1) == 0.0
    ahead = heavy_allowance(heavy_ms=5.0, all_ms=100.0, share=0.1, ahead_ms=50.0)
    assert (5.0 + ahead) / (150.0 + ahead) == pytest.approx(0.1)


def test_the_heavy_hitter_begins_at_two_thirds_of_the_window_unless_told() -> None:
    """``--heavy-at`` defaults to 2/3 of ``--minutes``."""
    assert parse_args([]).plan.heavy_at == 240.0
    assert parse_args(["--minutes", "60"]).plan.heavy_at == 2400.0
    assert parse_args(["--heavy-at", "30"]).plan.heavy_at == 30.0


def test_the_go_config_is_found_beside_the_binary_or_required(tmp_path: Path) -> None:
    """Without ``--go-config``, ``pg_exporter.yml`` beside the binary or in its src/; with
    neither, the command line is refused."""
    binary = tmp_path / "pg_exporter"
    binary.write_text("")
    with pytest.raises(SystemExit):
        parse_args(["--go-binary", str(binary)])
    (tmp_path / "src").mkdir()
    (tmp_path / "src/pg_exporter.yml").write_text("")
    assert parse_args(["--go-binary", str(binary)]).go_config == tmp_path / "src/pg_exporter.yml"
