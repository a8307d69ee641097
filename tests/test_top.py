"""A branch's ``top`` mapping read into a Top, every problem located at its field
(issue 38); a branch without it is as before."""

from __future__ import annotations

from exporter.config.definitions import DEFAULT_HOLD, DEFAULT_OTHER, Collector, Definitions, Top
from exporter.config.dryrun import render_definitions
from exporter.config.problems import Notes
from exporter.config.validation import read_branch

METRICS = [
    {"datname": {"usage": "LABEL"}},
    {"query": {"usage": "LABEL"}},
    {"calls": {"usage": "COUNTER"}},
    {"mean": {"usage": "GAUGE"}},
]
BODY = {"query": "SELECT 1", "metrics": METRICS}


def _branch(top: object, metrics: object = METRICS) -> tuple[Collector | None, Notes]:
    notes = Notes("c.yml")
    return read_branch(notes, "pg_q", {**BODY, "metrics": metrics, "top": top}, 0), notes


def test_a_branch_without_top_has_none() -> None:
    """No key, no ranking: the branch loads exactly as before."""
    collector, notes = _branch(None)
    assert collector is not None
    assert collector.top is None
    assert notes.problems == []
    assert notes.warnings == []


def test_by_and_limit_alone_take_the_documented_defaults() -> None:
    """band 2 × limit, hold 600 s, churn limit / 4 an hour, nothing kept, "other"."""
    collector, notes = _branch({"by": "calls", "limit": 100})
    assert notes.problems == []
    assert collector is not None
    assert collector.top == Top("calls", 100, 200, DEFAULT_HOLD, 25.0, (), DEFAULT_OTHER)


def test_every_field_is_read() -> None:
    """Each field given is the one kept."""
    top = {"by": "calls", "limit": 5, "band": 9, "hold": 30, "churn": 2, "keep": ["datname"]}
    collector, _ = _branch({**top, "other": "rest"})
    assert collector is not None
    assert collector.top == Top("calls", 5, 9, 30.0, 2.0, ("datname",), "rest")


def test_every_problem_is_noted_at_its_field() -> None:
    """A gauge to rank by, a zero limit, a band below it, a negative hold, a kept column
    that is no label and an empty other are all reported, each where it is."""
    bad = {"by": "mean", "limit": 0, "band": -1, "hold": -5, "keep": ["calls"], "other": ""}
    collector, notes = _branch(bad)
    assert collector is None
    assert sorted(p.location for p in notes.problems) == [
        "c.yml:pg_q.top.band",
        "c.yml:pg_q.top.by",
        "c.yml:pg_q.top.hold",
        "c.yml:pg_q.top.keep[0]",
        "c.yml:pg_q.top.limit",
        "c.yml:pg_q.top.other",
    ]


def test_gauges_the_remainder_sums_or_takes_the_largest_of() -> None:
    """``sum`` and ``max`` name GAUGE columns; a column of another usage, or in both, is
    refused at its place."""
    metrics = [*METRICS, {"age": {"usage": "GAUGE"}}]
    top = {"by": "calls", "limit": 3, "sum": ["mean"], "max": ["age"]}
    collector, notes = _branch(top, metrics)
    assert notes.problems == []
    assert collector is not None
    assert collector.top is not None
    assert (collector.top.sum, collector.top.max) == (("mean",), ("age",))
    wrong = {"by": "calls", "limit": 3, "sum": ["calls", "mean"], "max": ["mean"]}
    collector, notes = _branch(wrong, metrics)
    assert collector is None
    assert [p.location for p in notes.problems] == ["c.yml:pg_q.top.sum[0]", "c.yml:pg_q.top.max"]


def test_a_band_narrower_than_the_limit_is_refused() -> None:
    """The band is where a named key may rank without starting to leave: at least limit."""
    collector, notes = _branch({"by": "calls", "limit": 10, "band": 9})
    assert collector is None
    assert [p.location for p in notes.problems] == ["c.yml:pg_q.top.band"]


def test_something_must_remain_to_rank() -> None:
    """Keeping every label leaves no key to rank; histograms cannot be summed by key."""
    collector, notes = _branch({"by": "calls", "limit": 3, "keep": ["datname", "query"]})
    assert collector is None
    assert "needs a LABEL column not in keep" in notes.problems[0].message
    histogram = [*METRICS, {"h": {"usage": "HISTOGRAM", "bucket": [1]}}]
    collector, notes = _branch({"by": "calls", "limit": 3}, histogram)
    assert collector is None
    assert "HISTOGRAM" in notes.problems[0].message


def test_top_must_be_a_mapping_and_unknown_fields_are_warnings() -> None:
    """A list is refused; an unknown field is ignored with a warning, as elsewhere."""
    collector, notes = _branch(["calls"])
    assert collector is None
    assert notes.problems[0].location == "c.yml:pg_q.top"
    collector, notes = _branch({"by": "calls", "limit": 3, "window": 60})
    assert collector is not None
    assert notes.warnings[0].startswith("c.yml:pg_q.top.window: unknown field")


def test_dry_run_prints_top_so_that_the_output_loads_again() -> None:
    """--dry-run writes the top mapping back with every default spelt out."""
    collector, _ = _branch({"by": "calls", "limit": 4, "keep": ["datname"]})
    assert collector is not None
    text = render_definitions(Definitions((collector,)))
    assert "  top:\n    by: calls\n    limit: 4\n    band: 8\n" in text


PROBE = "SELECT array_agg(1) AS keys, array_agg(1) AS reads"


def test_a_probe_ranks_by_a_column_of_its_own_and_needs_id() -> None:
    """With a probe, ``by`` names the probe's array of ranking counters (no column of the
    branch need hold it), and ``id`` the column that tells each row's key."""
    collector, notes = _branch({"by": "reads", "limit": 2, "probe": PROBE, "id": "query"})
    assert notes.problems == []
    assert collector is not None
    assert collector.top is not None
    assert (collector.top.by, collector.top.probe, collector.top.id) == ("reads", PROBE, "query")


def test_a_probe_without_id_or_with_max_is_refused_where_it_is_written() -> None:
    """Each problem at its field, the fix in its words: a probe without ``id``, an ``id``
    without a probe, ``max`` (a probe gives totals, not every key's gauge), SQL that could
    leave the read-only transaction; ``by`` without a probe is still a COUNTER column."""
    cases: list[tuple[dict[str, object], str, str]] = [
        ({"probe": PROBE}, "c.yml:pg_q.top.id", "required with probe"),
        ({"by": "calls", "id": "query"}, "c.yml:pg_q.top.probe",
         "expected the SQL that lists, a row per group"),
        ({"probe": PROBE, "id": "query", "max": ["mean"]}, "c.yml:pg_q.top.max",
         "a probe gives totals only"),
        ({"probe": PROBE + "; COMMIT", "id": "query"}, "c.yml:pg_q.top.probe", ""),
        ({}, "c.yml:pg_q.top.by", "not a COUNTER column of this branch"),
        ({"by": "calls", "probe": PROBE, "id": "query"}, "c.yml:pg_q.top.by",
         "name the probe's array of ranking counters otherwise"),
    ]  # fmt: skip
    for fields, location, words in cases:
        _, notes = _branch({"by": "reads", "limit": 2} | fields)
        assert any(p.location == location and words in p.message for p in notes.problems), (
            fields,
            notes.problems,
        )


def test_dry_run_prints_a_probe_so_that_the_output_loads_again() -> None:
    """--dry-run writes ``id`` and ``probe`` back, and what it writes loads as it was."""
    collector, _ = _branch({"by": "reads", "limit": 2, "probe": PROBE, "id": "query"})
    assert collector is not None
    text = render_definitions(Definitions((collector,)))
    assert "    id: query\n" in text
    assert PROBE in text


def test_a_probe_on_a_pgbouncer_branch_is_refused_at_loading() -> None:
    """pgBouncer's console takes no parameter, so a probed branch tagged pgbouncer (the
    only ones run there, D4) is refused where it is written, not at each run."""
    notes = Notes("c.yml")
    top = {"by": "reads", "limit": 2, "probe": PROBE, "id": "query"}
    body = {**BODY, "top": top, "tags": ["pgbouncer"]}
    assert read_branch(notes, "pg_q", body, 0) is None
    assert [p.location for p in notes.problems] == ["c.yml:pg_q.top.probe"]
    assert "pgBouncer's console, which takes none" in notes.problems[0].message
