"""The README's flag table says what ``exporter.config.flags.FLAGS`` does: names, short forms,
environment variables and defaults."""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

import pytest

from exporter.config.flags import FLAGS, Flag

README = Path(__file__).resolve().parent.parent / "README.md"


class Row(NamedTuple):
    """One row of the table, reduced to what FLAGS also holds."""

    name: str
    short: str
    env: frozenset[str]
    default: str


def table_rows(text: str) -> dict[str, Row]:
    """Rows of the first table under the ``### Flags`` heading, keyed by long name."""
    lines = text.split("\n")
    start = lines.index("### Flags")
    body = _first_table(lines[start + 1 :])[2:]  # past the header and the ruler
    rows: dict[str, Row] = {}
    for line in body:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == 5, f"the flag table has five columns: {line!r}"
        flag, short, env, default, _meaning = cells
        name = _code(flag).removeprefix("--")
        assert name not in rows, f"--{name} has two rows"
        rows[name] = Row(
            name=name,
            short=_code(short).removeprefix("-"),
            env=frozenset(re.findall(r"`([A-Z][A-Z0-9_]*)`", env)),
            default=default.replace("`", ""),
        )
    return rows


def _first_table(lines: list[str]) -> list[str]:
    table: list[str] = []
    for line in lines:
        if line.startswith("|"):
            table.append(line)
        elif table:
            break
    return table


def _code(cell: str) -> str:
    return cell.strip().strip("`")


def expected(flag: Flag) -> Row:
    """What the README must say of a flag: its own variable, or the variables its help
    names when the flag has none of its own (``--url`` reads several)."""
    env = {flag.env} if flag.env else set(re.findall(r"\$([A-Z][A-Z0-9_]*)", flag.help))
    return Row(flag.name, flag.short, frozenset(env), flag.default)


def test_table_lists_exactly_the_flags() -> None:
    """Every flag of FLAGS has a row and every row is a flag."""
    assert set(table_rows(README.read_text())) == {flag.name for flag in FLAGS}


@pytest.mark.parametrize("flag", FLAGS, ids=lambda flag: flag.name)
def test_row_matches_flag(flag: Flag) -> None:
    """A flag's row gives its short form, environment variables and default as FLAGS has
    them (the default as ``--help`` prints it)."""
    row = table_rows(README.read_text()).get(flag.name)
    assert row == expected(flag)


def test_a_drifted_table_is_caught() -> None:
    """The parser sees a changed short form, variable or default, and a missing row."""
    text = README.read_text()
    rows = table_rows(text)
    drifted = text.replace("| `--tag` | `-t` |", "| `--tag` | `-T` |").replace(
        "`PG_EXPORTER_MAX_SERIES` | 100000", "`PG_EXPORTER_MAX_SERIE` | 1000"
    )
    changed = table_rows(drifted)
    assert changed["tag"].short == "T" != rows["tag"].short
    assert changed["max-series"] != expected(next(f for f in FLAGS if f.name == "max-series"))
    without = "\n".join(line for line in text.split("\n") if not line.startswith("| `--explain`"))
    assert "explain" not in table_rows(without)
