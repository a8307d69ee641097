"""Which collector queries are prepared, and when (issue 22): pure rules, no database."""

from __future__ import annotations

import re

import pytest

from exporter.pg.prepared import Prepared, preparable


@pytest.mark.parametrize(
    "query",
    [
        "SELECT 1 AS v",
        "  select 1 as v;  ",
        "WITH x AS (SELECT 1 AS v) SELECT v FROM x",
        "-- a comment\nSELECT 1 AS v",
        "/* one\n two */ /* three */ SELECT 1",
        "VALUES (1)",
        "TABLE pg_stat_archiver",
    ],
)
def test_one_plain_query_is_preparable(query: str) -> None:
    form = preparable(query, "k")
    assert form is not None
    name, statement = form
    assert name.startswith("pgx_")
    assert not statement.endswith(";")
    assert statement == statement.strip()


@pytest.mark.parametrize(
    "query",
    [
        "SHOW server_version_num",
        "SELECT 1; SELECT 2",
        "SELECT ';' AS v",  # cautious: a semicolon anywhere but the end rules it out
        "EXPLAIN SELECT 1",
        "SELECTION",
        "-- SELECT 1",
        "",
        ";",
        "SHOW STATS",  # a pgBouncer console command
    ],
)
def test_anything_else_stays_text(query: str) -> None:
    assert preparable(query, "k") is None


def test_names_follow_the_collector_and_the_text() -> None:
    """Same text, same name (a trailing semicolon aside); other text, another name; the
    collector's key shows in it, made a plain lower-case name of at most 63 characters."""
    first = preparable("SELECT 1 AS v", "pg_table")
    assert first is not None
    assert first[0].startswith("pgx_pg_table_")
    assert preparable("SELECT 1 AS v;", "pg_table") == first
    other = preparable("SELECT 2 AS v", "pg_table")
    assert other is not None
    assert other[0] != first[0]
    odd = preparable("SELECT 1", "Odd-Key." + "x" * 80)
    assert odd is not None
    assert odd[0].startswith("pgx_odd_key_xxx")
    assert len(odd[0]) <= 63
    assert re.fullmatch(r"[a-z0-9_]+", odd[0])


def test_a_query_is_prepared_on_its_second_run_only() -> None:
    """First run as text; the second prepares; once prepared (or refused) never again."""
    held = Prepared(object())
    assert held.due("pgx_a") is False  # first run: text
    assert held.due("pgx_a") is True  # second: prepare now
    held.names.add("pgx_a")
    assert held.due("pgx_a") is False  # prepared: EXECUTE, no PREPARE
    assert held.due("pgx_b") is False
    assert held.due("pgx_b") is True
    held.refused.add("pgx_b")
    assert held.due("pgx_b") is False  # refused: text for good


def test_a_refused_statement_is_no_longer_executed() -> None:
    held = Prepared(object(), names={"pgx_a"})
    held.refuse("pgx_a")
    assert "pgx_a" not in held.names
    assert held.due("pgx_a") is False
