"""Every PostgreSQL type as a value and as a label, as the Go exporter publishes it
(issue 30): our exposition for the cases of ``tests/data/gocompat/values`` on a real
server equals the Go 1.4.1 binary's recorded answer series by series, label text byte by
byte, but for the differences docs/compatibility.md keeps on purpose, each of which
must be seen as that row says."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families as parse_text

from rigs.localpg import LocalCluster
from tests.fixtures.gocompat import Difference, compare_series, same_value, series_of
from tests.fixtures.govalues import (
    DATABASE,
    PREFIX,
    Cases,
    config,
    digest,
    golden_paths,
    load_cases,
    prepare,
)
from tests.fixtures.promtool import unexpected_problems
from tests.fixtures.rawhttp import Start, get

DOCS = Path(__file__).parents[2] / "docs" / "compatibility.md"
KEPT_HEADING = "## Differences kept on purpose"
_FAMILY = re.compile(rf"{PREFIX}(.+)_(?:value|label)_[a-z]+\{{")
_SPAN = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class KeptRow:
    """A row of the table naming case expressions: the first is its example."""

    what: str
    examples: tuple[str, ...]
    types: frozenset[str]  # the cases of the examples: every difference there is the row's
    example_case: str
    go: str
    ours: str


def kept_rows(cases: Cases, text: str) -> list[KeptRow]:
    """The rows of the differences table whose "what" names an expression of the cases."""
    type_of = {value: case.name for case in cases.types for value in case.values}
    section = text.split(KEPT_HEADING, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if len(cells) != 4 or not line.startswith("| "):
            continue
        examples = tuple(span for span in _SPAN.findall(cells[0]) if span in type_of)
        if examples:
            types = frozenset(type_of[e] for e in examples)
            example = type_of[examples[0]]
            rows.append(KeptRow(cells[0], examples, types, example, cells[1], cells[2]))
    return rows


def _escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _unescaped(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), text)


def _facts(series: Mapping[str, str], case: str, example: str) -> tuple[str | None, str | None]:
    """(the example's plain GAUGE value, its plain label text) in one exposition; None:
    no such series."""
    k = f'k="{_escaped(example)}"'
    value = series.get(f"{PREFIX}{case}_value_g{{{k}}}")
    label = None
    for key in series:
        if key.startswith(f"{PREFIX}{case}_label_one{{{k},l="):
            found = re.search(r',l="((?:[^"\\]|\\.)*)"', key)
            label = _unescaped(found.group(1)) if found else None
    return value, label


def _check_claims(cell: str, value: str | None, label: str | None, who: str) -> list[str]:
    """What a Go or ours cell says of the example, against what that exposition has."""
    wrong = []
    said_value = re.search(r"value `([^`]*)`", cell)
    if said_value and (value is None or not same_value(said_value.group(1), value)):
        wrong.append(f"{who} value is {value}, the table says {said_value.group(1)}")
    said_label = re.search(r"label `([^`]*)`", cell)
    if said_label and label != said_label.group(1):
        wrong.append(f"{who} label is {label!r}, the table says {said_label.group(1)!r}")
    if "label: no series" in cell and label is not None:
        wrong.append(f"{who} has a label series {label!r}, the table says none")
    if not (said_value or said_label or "no series" in cell):
        wrong.append(f"{who}'s cell quotes no value or label: {cell!r}")
    return wrong


def unaccounted(
    rows: list[KeptRow],
    found: list[Difference],
    go: Mapping[str, str],
    ours: Mapping[str, str],
) -> list[str]:
    """Every way the differences and the table disagree; empty when the table is exact."""
    problems = []
    by_type: dict[str, list[Difference]] = {}
    for difference in found:
        match = _FAMILY.match(difference.series)
        by_type.setdefault(match.group(1) if match else "?", []).append(difference)
    covered = {t for row in rows for t in row.types}
    for case, differences in sorted(by_type.items()):
        if case not in covered:
            problems += [f"not a kept difference (compatibility.md): {d}" for d in differences]
    for row in rows:
        if not any(t in by_type for t in row.types):
            problems.append(f"a kept difference no longer differs: {row.what}")
        case, example = row.example_case, row.examples[0]
        problems += _check_claims(row.go, *_facts(go, case, example), "Go")
        problems += _check_claims(row.ours, *_facts(ours, case, example), "ours")
    return problems


async def _expositions(
    cluster: LocalCluster, start: Start, major: int, **settings: object
) -> tuple[dict[str, str], str, int]:
    """(Go's recorded series, our text exposition, our port) for the cases on this server."""
    cases = load_cases()
    features = prepare(cluster, cases)
    text = config(cases, cluster.version, features)
    prom, meta = golden_paths(major)
    facts = json.loads(meta.read_text(encoding="utf-8"))
    assert facts["config_sha256"] == digest(text), (
        f"{prom.name} was recorded from other cases: re-record (python -m tests.fixtures.govalues)"
    )
    served = await start(cluster, text, url=cluster.dsn(DATABASE), **settings)
    answer = await get(served.port)
    assert answer.status == 200
    return series_of(prom.read_text(encoding="utf-8"), PREFIX), answer.text, served.port


@pytest.mark.parametrize("fixture", ["pg18", "pg13"])
async def test_values_and_labels_as_go_publishes_them(
    fixture: str, request: pytest.FixtureRequest, start: Start
) -> None:
    """Series by series, label text byte by byte: equal to Go's, or a kept difference."""
    cluster: LocalCluster = request.getfixturevalue(fixture)
    go, exposition, _ = await _expositions(cluster, start, int(fixture[2:]))
    ours = series_of(exposition, PREFIX)
    assert len(go) > 1000  # every case answered, on both sides
    found = compare_series(go, ours)
    rows = kept_rows(load_cases(), DOCS.read_text(encoding="utf-8"))
    assert rows, "no row of the differences table names a case: is it still there?"
    problems = unaccounted(rows, found, go, ours)
    assert not problems, "\n".join(problems)


OPENMETRICS = "application/openmetrics-text; version=1.0.0"


@pytest.mark.parametrize("fixture", ["pg18", "pg13"])
async def test_every_exposition_parses_whatever_the_values(
    fixture: str, request: pytest.FixtureRequest, start: Start, promtool: str
) -> None:
    """The extremes of every type through a real server (issue 29, finding 5): the text
    format passes ``promtool check metrics`` and client_python's parser, OpenMetrics its
    strict parser. A numeric beyond a float's range is +Inf, not its 401 digits."""
    cluster: LocalCluster = request.getfixturevalue(fixture)
    _, text, port = await _expositions(cluster, start, int(fixture[2:]), openmetrics=True)
    assert unexpected_problems(promtool, text.encode("utf-8")) == []
    assert sum(len(f.samples) for f in parse_text(text)) > 1000
    answer = await get(port, Accept=OPENMETRICS)
    assert answer.headers["Content-Type"].startswith("application/openmetrics-text")
    families = list(parse_openmetrics(answer.text))  # type: ignore[no-untyped-call]
    assert sum(len(f.samples) for f in families if f.name.startswith(PREFIX)) > 1000
    assert 'gv_numeric_overflow_value_g{k="10::numeric ^ 400"} +Inf\n' in text
