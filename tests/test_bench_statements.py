"""bench.statements: naming pg_stat_statements entries by the branch of our library (issue 22)."""

from __future__ import annotations

import re

from bench.statements import Cost, branch_queries, name_of, render
from exporter.config.loading import load_definitions
from tests.fixtures.helpers import COLLECTORS


def _as_pg_stat_statements_keeps_it(sql: str) -> str:
    """Constants replaced by $n, as pg_stat_statements stores a statement's text (the field
    of extract() and the booleans are constants too)."""
    counter = iter(range(1, 10_000))
    constant = r"'[^']*'|\b\d+\b|(?<=extract\()\w+|\b(?:true|false)\b"
    return re.sub(constant, lambda _: f"${next(counter)}", sql, flags=re.IGNORECASE)


def test_each_branch_is_named_by_its_own_normalised_text() -> None:
    """Every branch of the library, as pg_stat_statements keeps it, maps back to its own key
    (or to a branch of exactly the same SQL, as pgBouncer's versions of one SHOW)."""
    queries = branch_queries(COLLECTORS)
    wrong = {}
    for collector in load_definitions(str(COLLECTORS)).collectors:
        got = name_of(_as_pg_stat_statements_keeps_it(collector.query), queries)
        if got != collector.key and queries.get(got) != queries[collector.key]:
            wrong[collector.key] = got
    assert wrong == {}


def test_utility_statements_and_strangers_are_named_apart() -> None:
    """BEGIN and SET are named by their word; SQL of no branch is 'other'."""
    queries = branch_queries(COLLECTORS)
    assert name_of("begin read only", queries) == "BEGIN"
    assert name_of("SET LOCAL statement_timeout = $1", queries) == "SET"
    assert name_of("SELECT 1 FROM somewhere_else", queries) == "other"


def test_render_ranks_by_time_per_pass() -> None:
    """A cheap branch called often outranks a dearer one called rarely."""
    trials = [[Cost("cheap", 1.0, 10.0), Cost("dear", 5.0, 1.0)]]
    lines = render(trials, top=1).splitlines()
    assert lines[2] == "| cheap | 1.00 | 10.00 | 10.00 |"
    assert len(lines) == 3
