"""The statement splitter agrees with PostgreSQL's own lexer, on 18 and on 13 (D2).

Each text is sent whole with the simple query protocol, which runs every statement
it holds and returns a result for each: the server's count of results is the truth
that :func:`exporter.config.sqltext.split_statements` must match, with
``standard_conforming_strings`` on and off. Every text only reads constants.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings

from exporter.config.sqltext import collector_sql_problem, split_statements, statement_count
from rigs.localpg import LocalCluster
from tests.fixtures.sqlgen import script

# Texts whose reading turns on one rule of the lexer each; all valid SQL either way.
TRICKY = [
    "SELECT string_agg(x, ';') FROM (VALUES ('a'), ('b')) v(x)",
    "SELECT 'a\\'; SELECT '; SELECT 2 --'",  # a backslash before a quote, read both ways
    "SELECT 'a\\''; SELECT 2; --'",
    "SELECT E'a\\'; b'",
    "SELECT E'a'\n'\\''; SELECT 2; --'",  # an E'…' constant continued on the next line
    "SELECT 'a'\n-- c\n';'; SELECT 2",
    "SELECT 'a' -- c\n';'; SELECT 2",
    "SELECT 1 -- c\r; SELECT 2",  # a carriage return ends a line comment
    "SELECT 1 /* a /* ; */ ; */; SELECT 2",
    "SELECT $$;$$, $a$ $$; $a$; SELECT $é$;$é$",
    'SELECT 1 AS "a;b""c"; SELECT 2',
    "SELECT B'01' AS \"\\\"; SELECT X'1F'",
    "SELECT U&'\\0061;' AS u; SELECT 2",
    "SELECT 1.e3; SELECT .5e1",
    "SELECT 1;;;SELECT 2;",
]


def results(connection: psycopg.Connection[tuple[object, ...]], sql: str) -> int:
    """How many results the server returns for the text sent as one simple query."""
    cursor = connection.execute(sql.encode())  # bytes: psycopg sends it untouched
    count = 1 if cursor.pgresult is not None else 0
    while cursor.nextset():
        count += 1
    return count


@pytest.fixture(scope="module", params=["pg18", "pg13"])
def server(request: pytest.FixtureRequest) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    cluster: LocalCluster = request.getfixturevalue(request.param)
    with psycopg.connect(cluster.dsn(), autocommit=True) as connection:
        connection.execute("SET escape_string_warning = off")
        yield connection


def with_setting(
    connection: psycopg.Connection[tuple[object, ...]], *, standard: bool, sql: str
) -> int:
    connection.execute(f"SET standard_conforming_strings = {'on' if standard else 'off'}")
    try:
        return results(connection, sql)
    finally:
        connection.execute("RESET standard_conforming_strings")


@pytest.mark.parametrize("sql", TRICKY)
def test_tricky_texts_split_as_the_server_runs_them(
    server: psycopg.Connection[tuple[object, ...]], sql: str
) -> None:
    """Each rule of the lexer, under either standard_conforming_strings."""
    on = with_setting(server, standard=True, sql=sql)
    assert len(split_statements(sql)) == on
    if "U&" not in sql:  # the server refuses U&'…' when the setting is off
        off = with_setting(server, standard=False, sql=sql)
        assert len(split_statements(sql, backslash_quotes=True)) == off
        assert statement_count(sql) == max(on, off)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=script())
def test_generated_texts_split_as_the_server_runs_them(
    server: psycopg.Connection[tuple[object, ...]], case: tuple[str, int]
) -> None:
    """SELECTs full of quotes, comments and semicolons: one result per statement found."""
    sql, _ = case
    assert len(split_statements(sql)) == results(server, sql)


ESCAPE = (
    "DO $$BEGIN PERFORM set_config('default_transaction_read_only', 'off', false); "
    "COMMIT; CREATE TABLE escaped_{n} (); END$$"
)


@pytest.mark.parametrize("extended", [False, True], ids=["simple", "extended"])
@pytest.mark.parametrize(
    "sql", ["VACUUM {t}", "ANALYZE {t}", "REINDEX TABLE {t}", ESCAPE, "CHECKPOINT"]
)
def test_commands_refused_at_load_run_under_the_read_only_default(
    server: psycopg.Connection[tuple[object, ...]], sql: str, extended: bool
) -> None:
    """What the load-time rule is for (D2): with the session read only, as collectors run
    on a direct connection, these still run, by either protocol (the extended one takes
    a single statement, but this is one), and a DO block even turns the read-only
    default off, commits and creates a table. Each is refused when a file is loaded."""
    n = abs(hash((sql, extended))) % 10**8
    table = f"guarded_{n}"
    server.execute(f"CREATE TABLE IF NOT EXISTS {table} (x int)")
    text = sql.format(t=table, n=n)
    server.execute("SELECT set_config('default_transaction_read_only', 'on', false)")
    try:
        server.execute(text.encode(), binary=extended)  # binary: by the extended protocol
    finally:
        server.execute("RESET default_transaction_read_only")
    if text.startswith("DO"):
        created = server.execute(f"SELECT to_regclass('escaped_{n}') IS NOT NULL").fetchone()
        assert created == (True,)
        server.execute(f"DROP TABLE escaped_{n}")
    assert collector_sql_problem(text) is not None
