"""The thin I/O layer: one PostgreSQL connection, its preflight facts, and collector SQL.

Everything here awaits the server; decisions (what to run, how to turn rows into
series) live in pure modules. Each collector's statement runs read only, under
server-side limits that match its client-side deadline (D1), so whichever fires
first leaves the same state: as session settings changed only when a collector's
differ from the last one's (one round trip per collector, issue 22), or in a
transaction of its own unless the preflight proved that the connection reaches
PostgreSQL directly (a pooler would hand session settings to an application) and
the server reports its read-only default.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import re
import socket
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import cast

import psycopg
from psycopg.abc import Buffer
from psycopg.adapt import Loader
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import Format, TransactionStatus

from exporter.casting import Escaped, decode_text
from exporter.definitions import Collector, Predicate
from exporter.errors import PredicateError
from exporter.planning import ServerFacts
from exporter.target import mask

log = logging.getLogger(__name__)

APPLICATION_NAME = "pg_exporter"
FETCH_BATCH = 1000  # rows converted per step: bounds Python objects alive at once (D9)
# libpq 17 can deliver rows in chunks; older ones only one row per result.
_STREAM_CHUNK = FETCH_BATCH if psycopg.pq.version() >= 170000 else 1
LOCK_TIMEOUT_CAP = 1.0  # seconds; lock waits are a small fraction of the statement limit (D3)

# The last three: the endpoint the server sees (own_transaction_reason). The socket
# directories only over a Unix socket, and only when the role may read them (else NULL,
# not an error): reading pg_settings instead would cost more than the rest together.
_PREFLIGHT_SQL = """
SELECT current_setting('server_version_num')::int,
       pg_is_in_recovery(),
       current_database(),
       current_user,
       ARRAY(SELECT extname::text FROM pg_extension),
       ARRAY(SELECT nspname::text FROM pg_namespace),
       ARRAY(SELECT datname::text FROM pg_database
             WHERE datallowconn AND NOT datistemplate ORDER BY datname),
       host(inet_server_addr()),
       coalesce(inet_server_port(), current_setting('port')::int),
       CASE WHEN inet_server_addr() IS NULL
                 AND pg_has_role('pg_read_all_settings', 'USAGE')
            THEN current_setting('unix_socket_directories') END
"""


@dataclass(frozen=True, slots=True)
class Preflight:
    """What one round trip tells about a server before its collectors run."""

    facts: ServerFacts
    databases: tuple[str, ...]  # connectable, non-template databases (for discovery)
    # Databases whose names are not UTF-8 (SQL_ASCII), escaped: libpq cannot name them.
    unnamed: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a session meets its server: as libpq dialed it, or as the server saw it.

    TCP: ``address`` and ``port`` of the server's end; a Unix socket: ``address`` ""
    and ``directory`` the socket's directory (dialed), or the server's list of them
    (``unix_socket_directories``, None when the role may not read it).
    """

    address: str
    port: int
    directory: str | None = None


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


async def connect(
    conninfo: str, connect_timeout: float
) -> psycopg.AsyncConnection[tuple[object, ...]]:
    """Open an autocommit connection within ``connect_timeout`` seconds (D6)."""
    try:
        async with asyncio.timeout(connect_timeout):
            conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
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


async def preflight(
    conn: psycopg.AsyncConnection[tuple[object, ...]], *, is_main: bool
) -> Preflight:
    """Version, recovery, database, user, extensions, schemas and databases in one query."""
    async with conn.cursor() as cur:
        await cur.execute(_PREFLIGHT_SQL)
        row = await cur.fetchone()
    if row is None:  # pragma: no cover - the query always returns a row
        raise psycopg.DataError("preflight query returned no row")
    version, recovery, datname, user, exts, schemas, dbs, address, port, directories = row
    seen = Endpoint(str(address or ""), int(str(port)), _optional(directories))
    facts = ServerFacts(
        version=int(str(version)),
        in_recovery=bool(recovery),
        datname=str(datname),
        username=str(user),
        extensions=frozenset(_strings(exts)),
        schemas=frozenset(_strings(schemas)),
        is_main=is_main,
        own_transaction=own_transaction_reason(conn, seen),
    )
    names = _strings(dbs)
    return Preflight(
        facts=facts,
        databases=tuple(n for n in names if not isinstance(n, Escaped)),
        unnamed=tuple(n for n in names if isinstance(n, Escaped)),
    )


def _optional(value: object) -> str | None:
    """A nullable text column (NULL: the role may not read the setting)."""
    return None if value is None else str(value)


def own_transaction_reason(
    conn: psycopg.AsyncConnection[tuple[object, ...]], seen: Endpoint
) -> str:
    """Why this connection's collectors each run in a read-only transaction of their own
    with SET LOCAL limits; "" when session limits are safe (issue 22).

    Session settings stay on the server's connection. Behind a pooler (pgBouncer in
    transaction or statement pooling, pgpool, Odyssey, a cloud proxy) that connection is
    next handed to an application, which would inherit our read-only default and our
    statement timeout. So session limits need proof that the session reaches PostgreSQL
    directly: the server sees the very endpoint libpq dialed (:func:`why_not_direct`).
    """
    if session_read_only(conn) is None:
        return "the server does not report its read-only default (before PostgreSQL 14)"
    try:
        hostaddr = conn.info.hostaddr  # libpq 12+; "" over a Unix socket
    except psycopg.NotSupportedError:
        return "libpq is too old to tell which address it connected to (before 12)"
    unix = not hostaddr
    dialed = Endpoint(hostaddr, conn.info.port, conn.info.host if unix else None)
    return why_not_direct(dialed, seen)


def why_not_direct(dialed: Endpoint, seen: Endpoint) -> str:
    """Why the endpoint the server saw does not prove a direct session; "" when it does.

    Anything between us and PostgreSQL that relays the session shows: the server sees
    the relay's connection, on another address, port or kind of socket. Harmless 1:1
    relays (an SSH tunnel, NAT, a Kubernetes Service) fail the proof too, and only cost
    the old round trips. What can still fool it (docs/database-safety.md, D1): a port
    mapping that publishes a pooler on exactly the address and port its PostgreSQL has in
    another network namespace (both in one container, the pooler published on the host's
    127.0.0.1:5432, PostgreSQL on the container's own 127.0.0.1:5432); a pooler's Unix
    socket in a directory PostgreSQL lists but could not bind; a proxy that answers
    inet_server_addr() itself.
    """
    if seen.port != dialed.port:
        return (
            f"the server listens on port {seen.port}, the connection was made to port "
            f"{dialed.port} (a pooler or a port mapping may stand between)"
        )
    if dialed.address or seen.address:  # TCP on either side
        if _address(dialed.address) != _address(seen.address):
            return (
                f"the server sees the connection arrive at {seen.address or 'a Unix socket'}, "
                f"it was made to {dialed.address or 'a Unix socket'} (a pooler, a proxy or "
                "NAT may stand between)"
            )
        return ""
    if seen.directory is None:
        return (
            "over a Unix socket, unix_socket_directories is needed to prove the connection "
            "direct and this role may not read it (grant pg_read_all_settings or pg_monitor)"
        )
    if _directory(dialed.directory or "") not in socket_directories(seen.directory):
        return (
            f"the connection was made to a Unix socket in {dialed.directory}, which is not "
            "one of the server's unix_socket_directories"
        )
    return ""


def _address(text: str) -> str:
    """An IP address in one spelling (IPv4 mapped into IPv6 as IPv4); other text as is."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return text
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def socket_directories(setting: str) -> frozenset[str]:
    """The directories of a ``unix_socket_directories`` value (commas, optional quotes)."""
    items = (item.strip().strip('"') for item in setting.split(","))
    return frozenset(_directory(item) for item in items if item)


def _directory(path: str) -> str:
    """A socket directory in one spelling; an abstract name (``@name``) as is."""
    return os.path.normpath(path) if path.startswith("/") else path


def _strings(value: object) -> list[str]:
    """The items of a text array; an :class:`Escaped` one stays marked as such."""
    if not isinstance(value, list):
        return []
    return [v if isinstance(v, str) else str(v) for v in value]


_BOUNCER_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def pgbouncer_version(text: str) -> int:
    """``PgBouncer 1.22.1`` → 12201 (0 when no version is found)."""
    found = _BOUNCER_VERSION.search(text)
    if found is None:
        return 0
    major, minor, patch = (int(part or 0) for part in found.groups())
    return major * 10000 + minor * 100 + patch


async def pgbouncer_preflight(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> Preflight:
    """pgBouncer's admin console: its version from ``SHOW VERSION`` (a row, or a notice
    from older versions). The console speaks only the simple query protocol (D4)."""
    notices: list[str] = []

    def keep(diagnostic: psycopg.errors.Diagnostic) -> None:
        notices.append(diagnostic.message_primary or "")

    conn.add_notice_handler(keep)
    try:
        cur = await conn.execute("SHOW VERSION", prepare=False)
        row = await cur.fetchone() if cur.description else None
    finally:
        conn.remove_notice_handler(keep)
    text = str(row[0]) if row else " ".join(notices)
    facts = ServerFacts(
        version=pgbouncer_version(text), in_recovery=False, datname="pgbouncer",
        username=conn.info.user, pgbouncer=True,
    )  # fmt: skip
    return Preflight(facts=facts, databases=())


async def console_batches(
    cur: psycopg.AsyncCursor[tuple[object, ...]], query: str
) -> AsyncGenerator[tuple[Sequence[str], list[tuple[object, ...]]], None]:
    """A pgBouncer console command's (column names, rows): simple protocol, no
    transaction, no SET (D4). Its answers are small, so they are read whole."""
    await cur.execute(query, prepare=False)
    rows = await cur.fetchall() if cur.description else []
    if rows:
        yield [d.name for d in cur.description or ()], rows


#: The largest value of PostgreSQL's millisecond limits (INT_MAX, about 24.8 days). A
#: longer timeout, which Go allows, is kept by the client-side deadline alone.
MAX_LIMIT_MS = 2**31 - 1


#: A limit left to the server's own default (the role's, the database's or the config's).
SERVER_DEFAULT = None


@dataclass(frozen=True, slots=True)
class Limits:
    """The server-side limits of one collector (D1): setting name → milliseconds, or
    SERVER_DEFAULT where the collector sets nothing (an unbounded collector's statement)."""

    settings: tuple[tuple[str, int | None], ...]

    @classmethod
    def of(cls, timeout: float | None, server_version: int) -> Limits:
        """Limits derived from a collector's timeout; None: unbounded."""
        ms = 0 if timeout is None else max(1, min(int(timeout * 1000), MAX_LIMIT_MS))
        lock = LOCK_TIMEOUT_CAP if timeout is None else min(timeout / 4, LOCK_TIMEOUT_CAP)
        settings: list[tuple[str, int | None]] = [
            ("statement_timeout", ms if timeout is not None else SERVER_DEFAULT),
            ("lock_timeout", max(1, int(lock * 1000))),
            ("idle_in_transaction_session_timeout", max(1000, ms)),
        ]
        if server_version >= 170000:
            # A backstop only: when it fires the server ends the whole session, so it must
            # come after the statement limit, which merely cancels the statement.
            txn = min(2 * ms + 1000, MAX_LIMIT_MS) if timeout is not None else SERVER_DEFAULT
            settings.append(("transaction_timeout", txn))
        return cls(tuple(settings))


def limits_sql(timeout: float | None, server_version: int) -> str:
    """``BEGIN READ ONLY`` plus SET LOCAL limits derived from a collector's timeout (D1)."""
    limits = Limits.of(timeout, server_version).settings
    sets = [f"SET LOCAL {name} = {ms}" for name, ms in limits if ms is not SERVER_DEFAULT]
    return "; ".join(["BEGIN READ ONLY", *sets])


def session_sql(limits: Limits, previous: Limits | None) -> str:
    """One statement that brings a session from ``previous`` limits to ``limits`` (issue
    22): everything, read-only default first, on a session not yet set up (``previous``
    None); otherwise only the settings that differ; "" when none does. One SELECT of
    set_config() rather than a SET each: one statement for the server to run and count,
    and, like any statement that fails, it changes nothing when it is cancelled."""
    if previous is None:
        changed = [("default_transaction_read_only", "'on'")]
        changed += [(name, _setting(name, ms)) for name, ms in limits.settings]
    else:
        changed = [
            (name, _setting(name, ms))
            for name, ms in limits.settings
            if (name, ms) not in previous.settings
        ]
    calls = ", ".join(f"set_config('{name}', {value}, false)" for name, value in changed)
    return f"SELECT {calls}" if calls else ""


def _setting(name: str, ms: int | None) -> str:
    """A limit as SQL text: milliseconds, or what RESET would restore."""
    if ms is SERVER_DEFAULT:
        return f"(SELECT reset_val FROM pg_settings WHERE name = '{name}')"
    return f"'{ms}'"


def session_read_only(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> bool | None:
    """The session's read-only default as the server last reported it (PostgreSQL 14+
    reports every change, whoever made it); None when the server does not report it."""
    value = conn.info.parameter_status("default_transaction_read_only")
    return None if value is None else value == "on"


async def run_predicate(cur: psycopg.AsyncCursor[tuple[object, ...]], predicate: Predicate) -> bool:
    """True when the predicate holds; NULL, false or no row mean skip."""
    await cur.execute(predicate.sql, prepare=False)  # simple protocol: pgBouncer too
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
    cur: psycopg.AsyncCursor[tuple[object, ...]], query: str
) -> AsyncGenerator[tuple[Sequence[str], list[tuple[object, ...]]], None]:
    """Run ``query`` and yield (column names, rows) in batches as rows arrive (D9).

    Rows are streamed, never buffered whole: a consumer that stops early (a series
    cap, a missing column) makes psycopg cancel the rest of the query in the server.
    An empty result yields nothing: psycopg does not keep its column names, and
    there is nothing to publish from it.
    """
    names: Sequence[str] = ()
    batch: list[tuple[object, ...]] = []
    # aclosing: when the consumer stops early, psycopg must cancel and drain the query
    # now, before the transaction is settled, not whenever the generator is collected.
    stream = cast(AsyncGenerator[tuple[object, ...], None], cur.stream(query, size=_STREAM_CHUNK))
    async with aclosing(stream) as rows:
        async for row in rows:
            if not batch and not names:
                names = [d.name for d in cur.description or ()]
            batch.append(row)
            if len(batch) >= FETCH_BATCH:
                yield names, batch
                batch = []
    if batch:
        yield names, batch


async def begin(
    cur: psycopg.AsyncCursor[tuple[object, ...]], collector: Collector, server_version: int
) -> None:
    """Open the collector's read-only transaction with its limits in one round trip
    (servers that do not report their read-only default: before PostgreSQL 14)."""
    await cur.execute(limits_sql(collector.timeout, server_version))


async def set_session(cur: psycopg.AsyncCursor[tuple[object, ...]], sql: str) -> None:
    """Apply session limits (session_sql) in one round trip."""
    await cur.execute(sql, prepare=False)


async def settle(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> bool:
    """End the collector's transaction; False when the connection is no longer usable (D7)."""
    if conn.closed or conn.broken:
        return False
    status = conn.info.transaction_status
    try:
        if status == TransactionStatus.INTRANS:
            await conn.execute("COMMIT")
        elif status == TransactionStatus.INERROR:
            await conn.execute("ROLLBACK")
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
