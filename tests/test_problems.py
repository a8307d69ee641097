"""Problem reporting for the files the exporter reads: located, complete, never quoting
a URL's password."""

from __future__ import annotations

import pytest

from exporter.config.problems import Notes, kind_name, kind_of
from exporter.errors import Problem

URL = "postgresql://monitor:s3cr3t-Pa55@db:5432/postgres"


def test_problems_are_kept_in_order_with_their_place() -> None:
    """Every problem is noted, none stops the others; each is located as file:where."""
    notes = Notes("c.yml")
    notes.error("a.query", "query is required")
    notes.error("b.ttl", "expected a number")
    assert notes.problems == [
        Problem("c.yml:a.query", "query is required"),
        Problem("c.yml:b.ttl", "expected a number"),
    ]
    assert notes.warnings == []


def test_a_problem_of_the_whole_file_is_located_at_the_file() -> None:
    """An empty place (a missing file) is the file alone."""
    notes = Notes("c.yml")
    notes.error("", "no such file or directory")
    notes.warn("", "empty")
    assert notes.problems == [Problem("c.yml", "no such file or directory")]
    assert notes.warnings == ["c.yml: empty"]


def test_a_password_is_masked_in_the_place_and_the_message() -> None:
    """Keys and values come from the file: a URL there is shown without its password."""
    notes = Notes("t.yml")
    notes.error(f"targets[0].{URL}", f"unknown field {URL}")
    notes.warn(URL, URL)
    text = f"{notes.problems[0]} {notes.warnings[0]}"
    assert "s3cr3t-Pa55" not in text
    assert "monitor" in text


def test_a_long_place_is_shortened() -> None:
    """A key of thousands of characters does not make a message of thousands."""
    notes = Notes("c.yml")
    notes.error("k" * 5000, "bad")
    assert len(notes.problems[0].location) < 500


def test_unknown_fields_are_warnings_naming_the_known_ones() -> None:
    """The Go exporter ignores unknown fields: a warning, not a problem."""
    notes = Notes("c.yml")
    notes.warn_unknown("b", {"ttl": 1, "tll": 1}, frozenset({"ttl", "query"}))
    assert notes.problems == []
    assert notes.warnings == ["c.yml:b.tll: unknown field, ignored (known: query, ttl)"]


def test_text_after_an_unquoted_comma_is_explained() -> None:
    """``{description: a, b}`` makes ``b`` a key without a value: say to quote the text."""
    notes = Notes("c.yml")
    notes.warn_unknown(
        "b.metrics[0]", {"usage": "GAUGE", "is the size": None}, frozenset({"usage"})
    )
    assert notes.warnings == [
        "c.yml:b.metrics[0].is the size: text after an unquoted comma became a key, "
        "ignored; quote the text"
    ]


@pytest.mark.parametrize(
    ("value", "name", "shown"),
    [
        (True, "a boolean", "a boolean True"),
        (3, "an integer", "an integer 3"),
        (1.5, "a number", "a number 1.5"),
        ("x", "a string", "a string 'x'"),
        ([1], "a list", "a list"),
        ({"a": 1}, "a mapping", "a mapping"),
        (None, "nothing", "nothing"),
        (b"x", "bytes", "bytes b'x'"),
    ],
)
def test_values_are_described_by_their_yaml_type(value: object, name: str, shown: str) -> None:
    """kind_name never quotes the value (it may be a secret); kind_of adds an excerpt,
    but never of a list or a mapping."""
    assert kind_name(value) == name
    assert kind_of(value) == shown


def test_kind_of_quotes_only_an_excerpt() -> None:
    """A huge value is cut to an excerpt."""
    assert len(kind_of("x" * 10_000)) < 200
