"""Statement boundaries and first words as PostgreSQL's lexer reads them (D2)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.config.sqltext import (
    QUERIES,
    REFUSED,
    Statement,
    collector_sql_problem,
    split_statements,
    statement_count,
)
from tests.fixtures.sqlgen import script


def texts(sql: str, *, backslash_quotes: bool = False) -> list[str]:
    """The statements' texts."""
    return [s.text for s in split_statements(sql, backslash_quotes=backslash_quotes)]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT string_agg(datname, ';') FROM pg_database",
        "SELECT 'it''s; fine'",
        "SELECT E'a\\'; b'",
        "SELECT U&'d\\0061t;a'",
        "SELECT B'01', X'1F', N'a;b'",
        'SELECT 1 AS "a;b", 2 AS "say ""hi"";"',
        "SELECT $$;$$, $fn$ $$ ; $fn$, $é$;$é$",
        "SELECT 1 -- ; not a statement\n",
        "SELECT 1 /* ; /* nested ; */ still ; */",
        "SELECT 'a'\n';b'",
        "SELECT E'a'\n'\\';b'",
        "SELECT 'fillfactor=([0-9]+)'",
    ],
)
def test_semicolons_inside_text_do_not_end_a_statement(sql: str) -> None:
    """A ';' in a constant, quoted name, dollar quote or comment is text, not an end."""
    assert texts(sql) == [sql.strip()]
    assert statement_count(sql) == 1


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT 1; SELECT 2", ["SELECT 1", "SELECT 2"]),
        (
            "BEGIN READ WRITE; INSERT INTO t VALUES (1); COMMIT; SELECT true",
            ["BEGIN READ WRITE", "INSERT INTO t VALUES (1)", "COMMIT", "SELECT true"],
        ),
        ("SELECT 'a';SELECT 'b'", ["SELECT 'a'", "SELECT 'b'"]),
        ("SELECT $$a$$; SELECT $a$;$a$", ["SELECT $$a$$", "SELECT $a$;$a$"]),
        ("SELECT 1 -- c\r; SELECT 2", ["SELECT 1 -- c", "SELECT 2"]),
        ("SELECT x$a$; SELECT $a$", ["SELECT x$a$", "SELECT $a$"]),
        ("SELECT 1$a$; $a$; SELECT 2", ["SELECT 1$a$; $a$", "SELECT 2"]),
        ("SELECT $1; SELECT 2", ["SELECT $1", "SELECT 2"]),
        ("SELECT xe'\\'; SELECT 2; --'", ["SELECT xe'\\'", "SELECT 2"]),
        ("SELECT 1e'\\'; SELECT 2; --'", ["SELECT 1e'\\'; SELECT 2; --'"]),
        (
            "SELECT 'a' ';' -- same line: two constants\n; SELECT 2",
            ["SELECT 'a' ';' -- same line: two constants", "SELECT 2"],
        ),
        ("SELECT 'a'\n/* c */ ';'; SELECT 2", ["SELECT 'a'\n/* c */ ';'", "SELECT 2"]),
    ],
)
def test_statements_end_at_semicolons_outside_text(sql: str, expected: list[str]) -> None:
    """Each ';' outside text ends one, as the server's lexer reads it."""
    assert texts(sql) == expected


def test_escape_string_continues_with_backslash_escapes() -> None:
    """E'…' continued on the next line reads its backslashes there too: `\\'` is a quote."""
    sql = "SELECT E'a'\n'\\''; DELETE FROM t; --'"
    assert texts(sql) == ["SELECT E'a'\n'\\''", "DELETE FROM t"]


@pytest.mark.parametrize("sql", ["", "  ", ";", ";;\n;", "-- only a comment", "/* c */ ; -- c"])
def test_blanks_and_comments_are_no_statement(sql: str) -> None:
    """Empty statements, a trailing ';' and comments alone count for nothing."""
    assert split_statements(sql) == ()
    assert statement_count(sql) == 0


def test_trailing_and_empty_statements_are_fine() -> None:
    """`;SELECT 1;;` is one statement."""
    assert texts(";SELECT 1;;  ;") == ["SELECT 1"]


@pytest.mark.parametrize(
    "sql", ["SELECT 'unterminated; x", 'SELECT "x; y', "SELECT $a$ ; ", "SELECT /* ; /* */ ;"]
)
def test_unterminated_text_runs_to_the_end(sql: str) -> None:
    """The server reads an open quote or comment to the end (then refuses the text)."""
    assert statement_count(sql) == 1


def test_plain_string_backslash_depends_on_the_server_setting() -> None:
    """With standard_conforming_strings off, `\\'` does not end a plain string."""
    sql = "SELECT 'a\\''; SELECT 2; --'"
    assert texts(sql) == ["SELECT 'a\\''; SELECT 2; --'"]
    assert texts(sql, backslash_quotes=True) == ["SELECT 'a\\''", "SELECT 2"]
    assert statement_count(sql) == 2  # the larger reading
    assert statement_count("SELECT 'a\\'; SELECT 2") == 2


def test_bit_strings_never_read_backslashes() -> None:
    """B'…' and X'…' end at the quote whatever the setting."""
    assert texts("SELECT B'\\'; SELECT 2", backslash_quotes=True) == ["SELECT B'\\'", "SELECT 2"]


@pytest.mark.parametrize(
    ("sql", "keyword"),
    [
        ("select 1", "SELECT"),
        ("  -- c\n /* c */ WITH x AS (SELECT 1) SELECT * FROM x", "WITH"),
        ("((SELECT 1))", "SELECT"),
        ("SHOW POOLS", "SHOW"),
        ("begin", "BEGIN"),
        ("'x'", ""),
        ('"select"', ""),
        ("$$x$$", ""),
        ("sélect 1", "SÉLECT"),
    ],
)
def test_first_word(sql: str, keyword: str) -> None:
    """The first name outside comments and opening parentheses, upper-cased."""
    assert split_statements(sql) == (Statement(sql.strip(), keyword),)


@given(script())
def test_generated_texts_split_where_they_were_joined(case: tuple[str, int]) -> None:
    """SELECTs full of quotes, comments and semicolons, joined by ';', split back so."""
    sql, count = case
    statements = split_statements(sql)
    assert len(statements) == count
    assert all(s.keyword == "SELECT" for s in statements)


@given(script(backslashes=True))
def test_texts_for_either_setting_count_the_same_both_ways(case: tuple[str, int]) -> None:
    """A text whose plain strings double their backslashes reads alike either way."""
    sql, count = case
    assert statement_count(sql) == count
    assert len(split_statements(sql, backslash_quotes=True)) == count


@given(st.text(max_size=60))
def test_any_text_splits_without_error(sql: str) -> None:
    """Arbitrary text never raises, and each statement is a piece of the text."""
    for statement in split_statements(sql):
        assert statement.text in sql
        assert statement.text
    assert statement_count(sql) >= len(split_statements(sql))


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT string_agg(datname, ';') FROM pg_database;",
        "WITH x AS (SELECT 1) SELECT * FROM x",
        "(VALUES (1))",
        "TABLE pg_database",
        "SHOW POOLS",
        "SHOW server_version_num",
        "EXPLAIN SELECT 1",
        "-- ; BEGIN\nSELECT 1 /* ; COMMIT */",
        "INSERT INTO t VALUES (1) RETURNING x",  # the read-only transaction refuses it (D2)
    ],
)
def test_one_query_may_be_run(sql: str) -> None:
    """One statement that reads (or that the read-only transaction refuses) is allowed."""
    assert collector_sql_problem(sql) is None


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("SELECT 1; SELECT 2", "several statements, where a collector runs one"),
        ("BEGIN READ WRITE; INSERT INTO t VALUES (1); COMMIT; SELECT true", "several"),
        ("SELECT 'a\\'; SELECT 2; --'", "several statements"),  # so on a server with backslashes
        ("begin", "'BEGIN', and it controls the transaction"),
        ("COMMIT", "'COMMIT', and it controls the transaction"),
        ("SET statement_timeout = 0", "'SET', and it changes the session"),
        ("reset all;", "'RESET', and it changes the session"),
        ("DO $$BEGIN COMMIT; END$$", "'DO', and a procedure or DO block may commit"),
        ("CALL p()", "'CALL', and a procedure or DO block may commit"),
        ("VACUUM", "'VACUUM', and it is maintenance or bulk work"),
        ("COPY (SELECT 1) TO PROGRAM 'true'", "'COPY', and it is maintenance or bulk work"),
        ("SHUTDOWN", "'SHUTDOWN', and it is a pgBouncer console command"),
        ("/* c */ (PAUSE)", "'PAUSE', and it is a pgBouncer console command"),
    ],
)
def test_several_statements_or_a_command_are_refused_with_why(sql: str, reason: str) -> None:
    """A text that could leave the read-only transaction is refused, saying why (D2)."""
    problem = collector_sql_problem(sql)
    assert problem is not None
    assert reason in problem


def test_the_refused_commands_are_the_ones_writing_collectors_lists() -> None:
    """docs/writing-collectors.md names every refused first word, and no other."""
    text = (Path(__file__).parents[1] / "docs" / "writing-collectors.md").read_text()
    section = text.split("## One statement that returns rows", 1)[1]
    listed = set(re.findall(r"`([A-Z_]+)`", section.split("None of these", 1)[0]))
    assert listed - set(QUERIES.replace(" or", ",").split(", ")) == set(REFUSED)


@pytest.mark.parametrize(
    ("sql", "named"),
    [
        ("SELECT set_config('statement_timeout', '0', false) AS v", "set_config"),
        ("SELECT pg_catalog.SET_CONFIG('search_path', 'evil', 'off') AS v", "set_config"),
        ("SELECT \"set_config\"('jit', 'on', (SELECT false)) AS v", "set_config"),
        ("SELECT set_config('jit', 'on') AS v", "set_config"),  # unbalanced: refused
        ("SELECT pg_advisory_lock(42) AS v", "pg_advisory_lock()"),
        ("SELECT pg_catalog.pg_try_advisory_lock_shared(1, 2) AS v", "pg_try_advisory_lock"),
        ('SELECT "pg_advisory_lock" (1) AS v', "pg_advisory_lock()"),
        ("SELECT dblink_connect('x') AS v", "dblink_connect()"),
    ],
)
def test_a_call_whose_effect_outlives_the_collector_is_refused(sql: str, named: str) -> None:
    """Issue 36: behind a pooler a session-level setting, advisory lock or connection would
    stay with the server connection the next application gets: refused at load, naming
    the call and what to write instead."""
    problem = collector_sql_problem(sql)
    assert problem is not None
    assert problem.startswith("a session side effect: ")
    assert named in problem


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT set_config('statement_timeout', '0', true) AS v",
        "SELECT pg_catalog.set_config('jit', f('a, b'), TRUE) AS v",
        "SELECT pg_advisory_xact_lock(42) AS v",
        "SELECT current_setting('work_mem') AS v",
        "SELECT count(*) AS v FROM pg_locks WHERE locktype = 'advisory'",
    ],
)
def test_transaction_scoped_calls_are_allowed(sql: str) -> None:
    """Their effect ends with our transaction, which is rolled back."""
    assert collector_sql_problem(sql) is None
