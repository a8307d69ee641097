"""The thin I/O layer: one PostgreSQL connection and a collector's SQL on it.

Everything here awaits the server; decisions (what to run, how to turn rows into
series) live in pure modules: the limits a statement runs under in ``limits``, what
the server is in ``preflight``. Rows are streamed, never buffered whole (D9).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from typing import cast

import psycopg
from psycopg.abc import Buffer
from psycopg.adapt import Loader
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import Format, TransactionStatus

from exporter.config.definitions import Predicate
from exporter.config.target import mask
from exporter.errors import CollectorError, PredicateError
from exporter.pg import libpqfiles
from exporter.pg.casting import decode_text
from exporter.pg.guards import BEGIN_GUARDED

log = logging.getLogger(__name__)

APPLICATION_NAME = "pg_exporter"
FETCH_BATCH = 1000  # rows converted per step: bounds Python objects alive at once (D9)
# libpq 17 can deliver rows in chunks; older ones only one row per result.
_STREAM_CHUNK = FETCH_BATCH if psycopg.pq.version() >= 170000 else 1


def conninfo_for(url: str, dbname: str | None, connect_timeout: float) -> str:
    """Connection string for ``url``, optionally on another database, with our identity."""
    params = conninfo_to_dict(url)
    extra: dict[str, str | int] = {}
    if dbname is not None:
        extra["dbname"] = dbname
    if "application_name" not in params:
        extra["application_name"] = APPLICATION_NAME
    # libpq rounds connect_timeout up to whole seconds (minimum 2); asyncio.timeout in
    # connect() is what really bounds connecting, this only stops libpq waiting forever.
    extra["connect_timeout"] = max(2, int(connect_timeout + 0.999))
    return make_conninfo(url, **extra)


#: How a transaction of ours ends (issue 36), in one round trip on one server connection:
#: everything it set is rolled back, then the session advisory locks a function we
#: called took (a rollback keeps them) are let go, under the guards the login gave or,
#: where it gave none, in a guarded transaction of its own: a function may have turned
#: JIT on for the rest of our transaction, never past it.
END_OWN_TRANSACTION = "ROLLBACK; SELECT pg_catalog.pg_advisory_unlock_all()"
END_UNGUARDED_TRANSACTION = (
    f"ROLLBACK; {BEGIN_GUARDED}; SELECT pg_catalog.pg_advisory_unlock_all(); ROLLBACK"
)


def logged_in_guarded(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> bool:
    """Whether the connection logged in with the guards (libpq ``options``, issue 36)."""
    return "default_transaction_read_only=on" in conn.info.get_parameters().get("options", "")


_LOGIN_SETTING = re.compile(r"-c\s*([A-Za-z_.]+)=")


def login_settings(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> frozenset[str]:
    """The names of the settings the connection logged in with (libpq ``options``)."""
    return frozenset(_LOGIN_SETTING.findall(conn.info.get_parameters().get("options", "")))


def bounded(sql: str, seconds: float) -> str:
    """``sql`` in a read-only transaction of its own whose statement limit is ``seconds``,
    JIT off, rolled back, in one round trip: for a statement of ours on a connection
    that did not log in with the guards (issue 36). Its rows are the third result."""
    ms = max(1, int(seconds * 1000))
    return f"{BEGIN_GUARDED}; SET LOCAL statement_timeout = {ms}; {sql}; ROLLBACK"


def role_of(conninfo: str) -> str:
    """The role a connection string logs in as ("" when libpq's default)."""
    return str(conninfo_to_dict(conninfo).get("user") or "")


def with_options(conninfo: str, options: str) -> str:
    """``conninfo`` logging in with ``options`` too (after any of the URL's own, which
    ours override where both set a setting)."""
    own = str(conninfo_to_dict(conninfo).get("options") or "")
    return make_conninfo(conninfo, options=f"{own} {options}".strip())


# What a server (or a pooler in front of it) says when it refuses our login options.
_REFUSED_OPTIONS = (
    "configuration parameter",
    "startup parameter",
    "permission denied to set parameter",
    "invalid value for parameter",
)


def refused_options(exc: BaseException) -> bool:
    """Whether a failed login was refused for the options it carried."""
    text = str(exc)
    return any(words in text for words in _REFUSED_OPTIONS)


def first_line(exc: BaseException) -> str:
    """An error's first line of substance, for a log line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


async def connect(
    conninfo: str, connect_timeout: float
) -> psycopg.AsyncConnection[tuple[object, ...]]:
    """Open an autocommit connection within ``connect_timeout`` seconds (D6)."""
    try:
        async with asyncio.timeout(connect_timeout):
            # prepare_threshold None: psycopg never prepares a statement by itself. Behind a
            # pooler its _pg3_N statements (our COMMIT, our preflight) stayed on a server
            # connection an application got next, and its DEALLOCATE ALL after our
            # ROLLBACK dropped the application's own (issue 29).
            conn = await libpqfiles.connect(  # libpq's files examined first (issue 29)
                conninfo, autocommit=True, prepare_threshold=None
            )
    except TimeoutError:
        raise psycopg.OperationalError(
            f"connecting to {mask(conninfo)} took longer than {connect_timeout:g}s "
            "(raise --connect-timeout if the server is slow to accept)"
        ) from None
    if conn.info.parameter_status("client_encoding") == "SQL_ASCII":
        decode_sql_ascii(conn)
    return conn


class _SqlAsciiText(Loader):
    """Text from a SQL_ASCII server, for which psycopg returns bytes: decoded by the
    exporter's one rule (UTF-8, invalid bytes escaped), so no ``b'...'`` reaches a label."""

    def load(self, data: Buffer) -> str:
        return decode_text(bytes(data))


class _SqlAsciiBinaryText(_SqlAsciiText):
    format = Format.BINARY


# The types psycopg reads as text, and type 0: any type it has no loader for.
_TEXT_TYPES = ("text", "varchar", "bpchar", "name", '"char"')


def decode_sql_ascii(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> None:
    """Make this connection (only) return text as str, escaped where not UTF-8 (issue 25)."""
    adapters = conn.adapters
    adapters.register_loader(0, _SqlAsciiText)
    for name in _TEXT_TYPES:
        adapters.register_loader(name, _SqlAsciiText)
        adapters.register_loader(name, _SqlAsciiBinaryText)


#: What a query yields: (column names, column type oids, a batch of rows).
Batch = tuple[Sequence[str], Sequence[int], list[tuple[object, ...]]]


async def console_batches(
    cur: psycopg.AsyncCursor[tuple[object, ...]], query: str
) -> AsyncGenerator[Batch, None]:
    """A pgBouncer console command's (column names, type oids, rows): simple protocol, no
    transaction, no SET (D4). Its answers are small, so they are read whole."""
    await cur.execute(query, prepare=False)
    rows = await cur.fetchall() if cur.description else []
    if rows:
        description = cur.description or ()
        yield [d.name for d in description], [d.type_code for d in description], rows


async def run_predicate(
    cur: psycopg.AsyncCursor[tuple[object, ...]], predicate: Predicate, *, console: bool = False
) -> bool:
    """True when the predicate holds; NULL, false or no row mean skip.

    On PostgreSQL it goes by the extended protocol, which takes one statement only, so
    no predicate can end our read-only transaction and go on writing (D2, issue 29);
    pgBouncer's console (``console``) speaks only the simple one (D4)."""
    await cur.execute(predicate.sql, prepare=False, binary=not console)
    if cur.description is None or len(cur.description) != 1:
        raise PredicateError(f"predicate {predicate.name!r} must return exactly one column")
    rows = await cur.fetchmany(2)
    if len(rows) > 1:
        raise PredicateError(f"predicate {predicate.name!r} returned more than one row")
    if not rows or rows[0][0] is None:
        return False
    value = rows[0][0]
    if not isinstance(value, bool):
        raise PredicateError(
            f"predicate {predicate.name!r} returned {type(value).__name__}, expected a boolean"
        )
    return value


async def stream_batches(
    cur: psycopg.AsyncCursor[tuple[object, ...]], query: str, params: Sequence[object] = ()
) -> AsyncGenerator[Batch, None]:
    """Run ``query`` (with ``params``, for a cursor that takes ``$1``) and yield (column
    names, type oids, rows) in batches as rows arrive (D9).

    Rows are streamed, never buffered whole: a consumer that stops early (a series
    cap, a missing column) makes psycopg cancel the rest of the query in the server.
    An empty result yields nothing: psycopg does not keep its column names, and
    there is nothing to publish from it.
    """
    names: Sequence[str] = ()
    types: Sequence[int] = ()
    batch: list[tuple[object, ...]] = []
    # aclosing: when the consumer stops early, psycopg must cancel and drain the query
    # now, before the transaction is settled, not whenever the generator is collected.
    stream = cast(
        AsyncGenerator[tuple[object, ...], None],
        cur.stream(query, params or None, size=_STREAM_CHUNK),
    )
    async with aclosing(stream) as rows:
        async for row in rows:
            if not batch and not names:
                names = [d.name for d in cur.description or ()]
                types = [d.type_code for d in cur.description or ()]
            batch.append(row)
            if len(batch) >= FETCH_BATCH:
                yield names, types, batch
                batch = []
    if batch:
        yield names, types, batch


async def described(
    cur: psycopg.AsyncCursor[tuple[object, ...]], query: str, params: Sequence[object]
) -> AsyncGenerator[Batch, None]:
    """Run ``query``, which returns no row (it is passed no key), and yield its column
    names and type oids with an empty batch: what a streamed empty result cannot tell."""
    await cur.execute(query, params)
    if cur.rowcount > 0:
        raise CollectorError(
            "its query returned rows when passed no key: it must read only the keys in $1"
        )
    description = cur.description or ()
    if description:
        yield [d.name for d in description], [d.type_code for d in description], []


async def send_limits(cur: psycopg.AsyncCursor[tuple[object, ...]], sql: str) -> None:
    """Put limits in force in one round trip: the SQL ``limits`` built for the connection's
    way (a read-only transaction of the collector's own, or session settings, D1)."""
    await cur.execute(sql, prepare=False)


async def settle(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> bool:
    """End the collector's transaction; False when the connection is no longer usable (D7)."""
    if conn.closed or conn.broken:
        return False
    status = conn.info.transaction_status
    try:
        # ROLLBACK, never COMMIT: our transactions write nothing, and a rollback undoes
        # whatever a function we called set for the session (issue 36); a session-level
        # advisory lock it took outlives a rollback, so it is let go in the same round trip
        # (behind a pooler the next application would otherwise find it held).
        if status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
            guarded = logged_in_guarded(conn)
            end = END_OWN_TRANSACTION if guarded else END_UNGUARDED_TRANSACTION
            await conn.execute(end, prepare=False)
        elif status != TransactionStatus.IDLE:
            return False
    except psycopg.Error:
        return False
    return conn.info.transaction_status == TransactionStatus.IDLE


async def close_quietly(conn: psycopg.AsyncConnection[tuple[object, ...]] | None) -> None:
    """Close a connection, ignoring errors from one that is already gone."""
    if conn is None or conn.closed:
        return
    try:
        await conn.close()
    except psycopg.Error as exc:  # pragma: no cover - best effort
        log.debug("closing connection failed: %s", exc)


#: Longest wait for the server to end a backend the exporter closed (seconds).
BACKEND_EXIT_WAIT = 1.0


async def close_and_wait(
    conn: psycopg.AsyncConnection[tuple[object, ...]] | None, within: float = BACKEND_EXIT_WAIT
) -> None:
    """Close a connection and wait, at most ``within`` seconds, until its backend is gone.

    A backend lingers in ``pg_stat_activity`` and holds its connection slot for a moment
    after the client has said goodbye; opening the next connection at once would let the
    server see one more than the budget (issue 13). The server closes the socket only
    after it has released the backend's slot, so a copy of the socket, kept past libpq's
    close, reads end-of-file exactly then.
    """
    if conn is None or conn.closed:
        return
    watch: socket.socket | None = None
    with contextlib.suppress(OSError, psycopg.Error):
        watch = socket.socket(fileno=os.dup(conn.fileno()))
    await close_quietly(conn)
    if watch is None:
        return
    with watch:
        watch.setblocking(False)
        loop = asyncio.get_running_loop()
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(within):
                while await loop.sock_recv(watch, 4096):
                    pass  # the server's last words (a TLS close, an error): read to the end
