"""The pure parts of the PostgreSQL layer: the connection string, the SQL_ASCII text
loaders and the predicate's answer rules, without a database. Connecting, streaming,
settling and closing need a server: tests/integration covers them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import psycopg
import pytest
from psycopg.adapt import AdaptersMap
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import Format

from exporter.config.definitions import Predicate
from exporter.errors import PredicateError
from exporter.pg.casting import Escaped
from exporter.pg.postgres import (
    APPLICATION_NAME,
    _SqlAsciiBinaryText,
    _SqlAsciiText,
    conninfo_for,
    decode_sql_ascii,
    run_predicate,
)

URL = "postgresql://alice:s3cret@db.example:6432/main?sslmode=require"


def _params(url: str, dbname: str | None = None, timeout: float = 5.0) -> dict[str, object]:
    return dict(conninfo_to_dict(conninfo_for(url, dbname, timeout)))


def test_conninfo_keeps_the_url_database_unless_another_is_named() -> None:
    """Without a database name the URL's stands; with one (discovery) it replaces it."""
    assert _params(URL)["dbname"] == "main"
    assert _params(URL, "reports")["dbname"] == "reports"


def test_conninfo_keeps_everything_else_the_url_says() -> None:
    """User, password, host, port and options reach libpq unchanged, also on another
    database."""
    params = _params(URL, "reports")
    expected = {"user": "alice", "password": "s3cret", "host": "db.example", "port": "6432",
                "sslmode": "require"}  # fmt: skip
    assert {key: params[key] for key in expected} == expected


def test_conninfo_names_the_exporter_unless_the_url_names_itself() -> None:
    """application_name is pg_exporter by default; one given in the URL is kept."""
    assert _params(URL)["application_name"] == APPLICATION_NAME
    own = _params(URL + "&application_name=mine")
    assert own["application_name"] == "mine"


@pytest.mark.parametrize(
    ("seconds", "libpq"),
    [(0.1, "2"), (1.0, "2"), (2.0, "2"), (2.2, "3"), (3.0, "3"), (9.5, "10")],
)
def test_conninfo_rounds_connect_timeout_up_to_whole_seconds_of_at_least_two(
    seconds: float, libpq: str
) -> None:
    """libpq takes whole seconds (2 at least): a fraction rounds up, never down to 0."""
    assert _params(URL, timeout=seconds)["connect_timeout"] == libpq


def test_conninfo_replaces_a_connect_timeout_in_the_url() -> None:
    """--connect-timeout wins over the URL's connect_timeout."""
    assert _params(URL + "&connect_timeout=60", timeout=4.0)["connect_timeout"] == "4"


@pytest.mark.parametrize("loader", [_SqlAsciiText, _SqlAsciiBinaryText])
def test_sql_ascii_text_decodes_utf8_and_escapes_invalid_bytes(loader: type[_SqlAsciiText]) -> None:
    """Valid UTF-8 comes back as str; an invalid byte as \\xNN, marked Escaped, never b'..'."""
    load = loader(0).load
    assert load(b"caf\xc3\xa9") == "café"
    assert not isinstance(load(b"caf\xc3\xa9"), Escaped)
    escaped = load(memoryview(b"caf\xe9"))
    assert (escaped, isinstance(escaped, Escaped)) == ("caf\\xe9", True)


class _Holder:
    """What decode_sql_ascii touches of a connection: its adapters."""

    def __init__(self) -> None:
        self.adapters = AdaptersMap(psycopg.adapters)


def test_sql_ascii_loaders_cover_text_types_and_unknown_ones_on_that_connection_only() -> None:
    """text, varchar, bpchar, name, "char" (both formats) and type 0 get the SQL_ASCII
    loader on the connection given; the global adapters are left alone."""
    holder = _Holder()
    decode_sql_ascii(cast("psycopg.AsyncConnection[tuple[object, ...]]", holder))
    types = psycopg.adapters.types
    for name in ("text", "varchar", "bpchar", "name", '"char"'):
        oid = types[name].oid
        assert holder.adapters.get_loader(oid, Format.TEXT) is _SqlAsciiText, name
        assert holder.adapters.get_loader(oid, Format.BINARY) is _SqlAsciiBinaryText, name
        assert psycopg.adapters.get_loader(oid, Format.TEXT) is not _SqlAsciiText
    assert holder.adapters.get_loader(0, Format.TEXT) is _SqlAsciiText


class _Column:
    def __init__(self, name: str) -> None:
        self.name = name


class _Answers:
    """A cursor that has already received ``rows`` of ``width`` columns: only the
    predicate's reading of a result is tested here, not what PostgreSQL sends."""

    def __init__(self, rows: Sequence[tuple[object, ...]], width: int = 1) -> None:
        self.rows = list(rows)
        self.description = [_Column(f"c{i}") for i in range(width)]
        self.sent: list[str] = []
        self.binary: list[bool | None] = []

    async def execute(
        self, sql: str, *, prepare: bool | None = None, binary: bool | None = None
    ) -> None:
        self.sent.append(sql)
        self.binary.append(binary)

    async def fetchmany(self, size: int) -> list[tuple[object, ...]]:
        return self.rows[:size]


async def _answer(cursor: _Answers, *, console: bool = False) -> bool:
    predicate = Predicate(name="p", sql="SELECT true")
    cur = cast("psycopg.AsyncCursor[tuple[object, ...]]", cursor)
    return await run_predicate(cur, predicate, console=console)


async def test_a_predicate_goes_by_the_extended_protocol_but_to_the_console() -> None:
    """D2, issue 29: on PostgreSQL a predicate is sent so that it can hold one statement
    only (psycopg uses the extended protocol for binary results); pgBouncer's console
    speaks only the simple protocol (D4)."""
    postgres, console = _Answers([(True,)]), _Answers([(True,)])
    await _answer(postgres)
    await _answer(console, console=True)
    assert postgres.binary == [True]
    assert console.binary == [False]


@pytest.mark.parametrize(
    ("rows", "expected"), [([(True,)], True), ([(False,)], False), ([(None,)], False), ([], False)]
)
async def test_a_predicate_runs_only_on_a_true_answer(
    rows: list[tuple[object, ...]], expected: bool
) -> None:
    """true runs the collector; false, NULL or no row at all skip it."""
    assert await _answer(_Answers(rows)) is expected


@pytest.mark.parametrize(
    ("answers", "message"),
    [
        (_Answers([(True, True)], width=2), "exactly one column"),
        (_Answers([(True,), (True,)]), "more than one row"),
        (_Answers([(1,)]), "returned int, expected a boolean"),
    ],
)
async def test_a_predicate_with_a_malformed_answer_is_an_error_naming_it(
    answers: _Answers, message: str
) -> None:
    """Two columns, two rows or a non-boolean is the collector's error, with the
    predicate's name, never read as true."""
    with pytest.raises(PredicateError, match=f"predicate 'p' .*{message}"):
        await _answer(answers)
