"""A collector branch's metrics list: each entry as a Column, then the columns checked
together (repeats, label names, metric families)."""

from __future__ import annotations

from exporter.config.columns import is_number, read_metrics
from exporter.config.definitions import Column, Usage
from exporter.config.problems import Notes
from exporter.config.rules import LABEL_RULE


def _read(raw: object, name: str = "pg_x") -> tuple[tuple[Column, ...], dict[str, str]]:
    notes = Notes("c.yml")
    columns = read_metrics(notes, "b", name, raw)
    return columns, {p.location: p.message for p in notes.problems}


def test_entries_become_columns_in_order() -> None:
    """Usage in any case, rename, scale, default and buckets are read."""
    columns, problems = _read(
        [
            {"datname": {"usage": "label", "rename": "db"}},
            {"size": {"usage": "GAUGE", "scale": "1e-3", "default": 0}},
            {"lat": {"usage": "HISTOGRAM", "bucket": [0.1, 1]}},
        ]
    )
    assert problems == {}
    assert [(c.name, c.usage) for c in columns] == [
        ("datname", Usage.LABEL),
        ("size", Usage.GAUGE),
        ("lat", Usage.HISTOGRAM),
    ]
    assert (columns[0].output_name, columns[1].scale, columns[2].buckets) == (
        "db",
        1e-3,
        (0.1, 1.0),
    )


def test_a_metrics_list_is_required() -> None:
    """A branch without metrics yields nothing: say what the list looks like."""
    assert _read(None)[1] == {
        "c.yml:b.metrics": "metrics must be a non-empty list like `- datname: {usage: LABEL}`"
    }


def test_a_label_name_follows_the_one_label_rule() -> None:
    """The rule the command line and the targets file use, __ names reserved."""
    _, problems = _read([{"a": {"usage": "LABEL", "rename": "__x"}}, {"v": {"usage": "GAUGE"}}])
    assert problems == {
        "c.yml:b.metrics[0].rename": f"invalid label name '__x': expected {LABEL_RULE}"
    }


def test_le_is_reserved_beside_a_histogram() -> None:
    """Histogram buckets carry ``le``: a label of that name would be overwritten."""
    _, problems = _read([{"le": {"usage": "LABEL"}}, {"h": {"usage": "HISTOGRAM", "bucket": [1]}}])
    assert "label 'le' is reserved" in problems["c.yml:b.metrics[0]"]


def test_a_gauge_may_not_take_a_histograms_family_name() -> None:
    """``h`` as a histogram exposes ``pg_x_h_count``: a gauge ``h_count`` clashes."""
    _, problems = _read(
        [{"h": {"usage": "HISTOGRAM", "bucket": [1]}}, {"h_count": {"usage": "GAUGE"}}]
    )
    assert problems == {
        "c.yml:b.metrics[1]": "metric 'pg_x_h_count' is also produced by b.metrics[0]; rename one"
    }


def test_no_value_column_is_a_problem_only_when_every_entry_was_read() -> None:
    """A bad entry may have been the value column: do not claim there is none."""
    assert "no GAUGE" in _read([{"a": {"usage": "LABEL"}}])[1]["c.yml:b.metrics"]
    _, problems = _read([{"a": {"usage": "LABEL"}}, {"v": {"usage": "GAGE"}}])
    assert "c.yml:b.metrics" not in problems
    assert "expected one of" in problems["c.yml:b.metrics[1].usage"]


def test_numbers_are_yaml_numbers_that_fit_a_float() -> None:
    """Booleans are not numbers; an integer past the float range is not either."""
    assert is_number(1)
    assert is_number(1.5)
    assert not is_number(True)
    assert not is_number("1")
    assert not is_number(10**400)
