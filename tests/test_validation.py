"""One collector branch as a Collector, and the const labels checked against every
collector's labels (the branch's checks in depth: tests/test_loading.py)."""

from __future__ import annotations

from exporter.config.definitions import DEFAULT_TIMEOUT, PRIORITY_BASE, Collector
from exporter.config.problems import Notes
from exporter.config.validation import const_label_problems, read_branch
from exporter.errors import Problem

BODY = {"query": "SELECT 1", "metrics": [{"d": {"usage": "LABEL"}}, {"v": {"usage": "GAUGE"}}]}


def _branch(
    body: object, key: object = "pg_x", default_priority: int = 0
) -> tuple[Collector | None, Notes]:
    notes = Notes("c.yml")
    return read_branch(notes, key, body, default_priority), notes


def test_a_minimal_branch_gets_the_documented_defaults() -> None:
    """Name from the key, priority from the file's place, default timeout, no ttl."""
    collector, notes = _branch(BODY, default_priority=PRIORITY_BASE + 3)
    assert notes.problems == []
    assert collector is not None
    assert (collector.name, collector.priority) == ("pg_x", PRIORITY_BASE + 3)
    assert (collector.ttl, collector.timeout, collector.source) == (0.0, DEFAULT_TIMEOUT, "c.yml")


def test_a_branch_with_problems_is_none_and_every_problem_is_noted() -> None:
    """A bad ttl and a bad tag are both reported; no half-read Collector is returned."""
    collector, notes = _branch({**BODY, "ttl": -1, "tags": ["extension:"]})
    assert collector is None
    assert sorted(p.location for p in notes.problems) == ["c.yml:pg_x.tags[0]", "c.yml:pg_x.ttl"]


def test_a_blank_key_is_refused_before_its_body_is_read() -> None:
    """A key of spaces cannot prefix a metric: quote a real name."""
    collector, notes = _branch(BODY, key=" ")
    assert collector is None
    assert notes.problems[0].message == "a branch key must be a non-blank string; quote it"


def _collector(**body: object) -> Collector:
    collector, notes = _branch({**BODY, **body})
    assert collector is not None, notes.problems
    return collector


def test_a_const_label_may_not_be_a_collectors_label() -> None:
    """``--label d=x`` beside a collector labelling by ``d``: located at the collector."""
    assert const_label_problems([_collector()], ["d", "env"], self_metrics=False) == [
        Problem(
            "c.yml:pg_x",
            "const label 'd' from --label is also a label of this collector; rename one of them",
        )
    ]


def test_le_is_taken_by_a_collector_with_a_histogram() -> None:
    """Only beside a histogram does ``le`` clash (its buckets carry it)."""
    histogram = _collector(metrics=[{"h": {"usage": "HISTOGRAM", "bucket": [1]}}])
    assert [p.location for p in const_label_problems([histogram], ["le"], self_metrics=False)] == [
        "c.yml:pg_x"
    ]
    assert const_label_problems([_collector()], ["le"], self_metrics=False) == []


def test_the_self_metrics_labels_are_taken_unless_they_are_off() -> None:
    """datname and query label the exporter's own metrics (--disable-intro turns them off)."""
    found = const_label_problems([], ["query", "datname"], self_metrics=True)
    assert found == [Problem("--label", "datname, query is used by the self-metrics; rename it")]
    assert const_label_problems([], ["query", "datname"], self_metrics=False) == []


def test_a_query_or_predicate_of_several_statements_is_refused_where_it_is() -> None:
    """The query and each predicate are checked, the problem located at its field (D2)."""
    body = {
        **BODY,
        "query": "SELECT 1 AS v; DELETE FROM t",
        "predicate_queries": [{"predicate_query": "SELECT true"}, {"predicate_query": "BEGIN"}],
    }
    collector, notes = _branch(body)
    assert collector is None
    assert [p.location for p in notes.problems] == [
        "c.yml:pg_x.query",
        "c.yml:pg_x.predicate_queries[1].predicate_query",
    ]
    assert notes.problems[0].message.startswith("several statements, where a collector runs one")
    assert "not a query: it starts with 'BEGIN'" in notes.problems[1].message
