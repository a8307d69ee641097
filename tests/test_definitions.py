"""Collector definitions: the bounds on a ttl or timeout that the Go exporter shares."""

from __future__ import annotations

import pytest

from exporter.config.definitions import MAX_SECONDS
from exporter.config.loading import read_document

BRANCH = """
b:
  query: SELECT 1 AS v
  metrics: [{{v: {{usage: GAUGE}}}}]
  predicate_queries: [{{name: p, predicate_query: SELECT true, ttl: {predicate_ttl}}}]
  ttl: {ttl}
  timeout: {timeout}
"""


def _read(ttl: str = "1", timeout: str = "1", predicate_ttl: str = "1") -> dict[str, str]:
    """Problems of the branch by location, or the branch's values under ``ok``."""
    text = BRANCH.format(ttl=ttl, timeout=timeout, predicate_ttl=predicate_ttl)
    parsed = read_document(text, "c.yml", 0)
    if not parsed.problems:
        (collector,) = parsed.collectors
        return {"ok": f"{collector.ttl} {collector.timeout} {collector.predicates[0].ttl}"}
    return {p.location: p.message for p in parsed.problems}


def test_max_seconds_is_the_longest_go_duration() -> None:
    """Go keeps durations as int64 nanoseconds: 2^63 - 1 of them."""
    assert pytest.approx(9223372036.854775807) == MAX_SECONDS


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("ttl", "1.0e+10"),
        ("ttl", ".nan"),
        ("ttl", "10000000000000000000000000"),
        ("timeout", "1.0e+10"),
        ("timeout", "-1.0e+10"),
        ("timeout", ".inf"),
        ("timeout", "-.inf"),
        ("predicate_ttl", "1.0e+300"),
    ],
)
def test_overflowing_or_non_finite_seconds_are_refused(field: str, value: str) -> None:
    """A ttl, timeout or predicate ttl beyond a Go duration, or not finite, is refused
    where it is written, saying the bound (Go 1.5.0)."""
    problems = _read(**{field: value})
    where = "c.yml:b.predicate_queries[0].ttl" if field == "predicate_ttl" else f"c.yml:b.{field}"
    assert "9223372036" in problems[where]
    assert "Go duration" in problems[where]


def test_seconds_a_go_duration_holds_are_kept() -> None:
    """At the bound, and a year (more than PostgreSQL's statement_timeout holds), pass."""
    assert _read(ttl="9223372036", timeout="-9223372036") == {"ok": "9223372036.0 None 1.0"}
    assert _read(timeout="31536000", predicate_ttl="31536000") == {
        "ok": "1.0 31536000.0 31536000.0"
    }
