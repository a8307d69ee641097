"""An operator's YAML file read within bounds: numbers as the Go exporter reads them,
duplicate keys noted, and every bound a file can break stopping it with its line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from exporter.config.problems import Notes
from exporter.config.yamlfiles import Bounds, parse_yaml, read_text

SMALL = Bounds(chars=200, values=10, alias_expansion=50)


def _parse(text: str, bounds: Bounds = SMALL) -> tuple[object, Notes]:
    notes = Notes("f.yml")
    return parse_yaml(text, notes, bounds), notes


def test_numbers_read_as_the_go_exporter_reads_them() -> None:
    """``090600`` is decimal (not octal) and ``1e-6`` a number (not text)."""
    data, notes = _parse("v: 090600\ne: 1e-6\no: 0o17\n")
    assert data == {"v": 90600, "e": 1e-6, "o": "0o17"}
    assert notes.problems == []


def test_a_duplicate_key_is_a_warning_with_its_line() -> None:
    data, notes = _parse("a: 1\nb: 2\na: 3\n")
    assert data == {"a": 3, "b": 2}
    assert notes.warnings == [
        "f.yml:line 3: key 'a' appears twice in one mapping; the last one wins"
    ]


def test_too_many_values_stop_at_the_line_reached() -> None:
    """Past the bound on values, reading stops: the problem names the line reached."""
    _, notes = _parse("a: [1, 2, 3]\nb: [4, 5, 6]\nc: [7, 8, 9]\n")
    assert [str(p) for p in notes.problems] == [
        "f.yml:line 3: more than 10 values in one file; split it into several"
    ]


def test_aliases_that_expand_past_the_bound_are_refused() -> None:
    """A few bytes of aliases may not stand for an enormous document."""
    text = "a: &x [aaaaaaaaaa, bbbbbbbbbb]\nb: *x\nc: *x\n"
    _, notes = _parse(text)
    (problem,) = notes.problems
    assert problem.location == "f.yml:line 3"
    assert "aliases expand the document by more than 50 characters" in problem.message


def test_malformed_yaml_names_the_line_and_the_fix() -> None:
    """A syntax error is located by line and says what to fix."""
    data, notes = _parse("a: [1, 2\nb: 3\n")
    assert data is None
    (problem,) = notes.problems
    assert problem.location.startswith("f.yml:line ")
    assert problem.message.endswith("fix the syntax (indentation, quoting)")


def test_a_value_yaml_cannot_build_is_a_problem_not_a_traceback() -> None:
    """PyYAML raises plain exceptions for 2001-13-45: noted, with the way out."""
    data, notes = _parse("d: 2001-13-45\n")
    assert data is None
    assert "quote it as text" in notes.problems[0].message


def test_a_file_past_its_size_is_refused_by_its_bound(tmp_path: Path) -> None:
    """The caller's limit holds: no more than it is read."""
    path = tmp_path / "big.yml"
    path.write_text("a: 1\n" * 1_000_000)
    notes = Notes(str(path))
    assert read_text(str(path), notes, "check --x", limit=1024 * 1024) is None
    assert notes.problems[0].message.startswith("more than 1 MiB of text")


def test_a_missing_file_gets_the_callers_hint(tmp_path: Path) -> None:
    """The flag or variable to check is the caller's (--config, --targets.file)."""
    notes = Notes("gone.yml")
    assert read_text(str(tmp_path / "gone.yml"), notes, "check --targets.file") is None
    assert notes.problems[0].message == "no such file or directory; check --targets.file"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """A FIFO would block the reader forever: refused as not a regular file."""
    fifo = tmp_path / "fifo.yml"
    os.mkfifo(fifo)
    notes = Notes(str(fifo))
    assert read_text(str(fifo), notes, "check --config") is None
    assert notes.problems[0].message.startswith("cannot read the file:")
