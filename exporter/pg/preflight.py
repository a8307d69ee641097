"""What one round trip tells about a server before its collectors run: version,
recovery, database, extensions, schemas, the databases to discover, and whether the
session reaches PostgreSQL directly, so that session limits are safe (issue 22).
pgBouncer's admin console has a preflight of its own (D4).
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
from dataclasses import dataclass, field

import psycopg

from exporter.pg import guards as table
from exporter.pg import postgres
from exporter.pg.casting import Escaped
from exporter.pg.limits import NO_GUARDS, Guards, guarded_sql, session_read_only
from exporter.pg.searchpath import NO_PATH, PATH_COLUMNS, SearchPath

# Every name is qualified and every comparison names pg_catalog's operator: this runs
# under the session's own search_path, which a database's owner sets (searchpath).
# The backend's pid and the endpoint the server sees prove a direct session
# (own_transaction_reason). The socket directories only over a Unix socket, and only
# when the role may read them (else NULL, not an error): reading pg_settings instead
# would cost more than the rest together.
_PREFLIGHT_SQL = """
SELECT pg_catalog.current_setting('server_version_num')::int,
       pg_catalog.pg_is_in_recovery(),
       pg_catalog.current_database(),
       CURRENT_USER,
       ARRAY(SELECT extname::pg_catalog.text FROM pg_catalog.pg_extension),
       ARRAY(SELECT nspname::pg_catalog.text FROM pg_catalog.pg_namespace),
       ARRAY(SELECT datname::pg_catalog.text FROM pg_catalog.pg_database
             WHERE datallowconn AND NOT datistemplate ORDER BY datname),
       pg_catalog.host(pg_catalog.inet_server_addr()),
       coalesce(pg_catalog.inet_server_port(), pg_catalog.current_setting('port')::int),
       CASE WHEN pg_catalog.inet_server_addr() IS NULL
                 AND pg_catalog.pg_has_role('pg_read_all_settings', 'USAGE')
            THEN pg_catalog.current_setting('unix_socket_directories') END,
       pg_catalog.pg_backend_pid(),
       pg_catalog.current_setting('work_mem'),
       pg_catalog.current_setting('temp_file_limit'),
       {may_limit_temp},
       {may_read_plans},
       {reading}"""
# Whether our role may set temp_file_limit (issue 31): from PostgreSQL 15 it can be
# granted (GRANT SET ON PARAMETER); before, only a superuser may.
_MAY_LIMIT_TEMP = "pg_catalog.has_parameter_privilege('temp_file_limit', 'SET')"
_SUPERUSER = "pg_catalog.current_setting('is_superuser')::boolean"
# Whether our role may read its backend's memory contexts (prepared plans, issue 31):
# from PostgreSQL 15 pg_read_all_stats may, in 14 a superuser, before nobody.
_MAY_READ_PLANS = "pg_catalog.pg_has_role('pg_read_all_stats', 'USAGE')"


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """What planning needs to know about one server (or one discovered database)."""

    version: int  # server_version_num, or pgBouncer 1.22.1 → 12201
    in_recovery: bool
    datname: str
    username: str
    extensions: frozenset[str] = frozenset()
    schemas: frozenset[str] = frozenset()
    is_main: bool = True  # the URL's own database; False for discovered ones
    pgbouncer: bool = False
    # Why each collector runs in a read-only transaction of its own with local limits;
    # "" when the limits are session settings (a direct connection, issue 22).
    own_transaction: str = ""
    # What our collectors resolve unqualified names through (issue 36).
    search_path: SearchPath = NO_PATH
    # What every statement of ours there runs under: the path, no JIT, memory bounds.
    guards: Guards = NO_GUARDS
    may_read_plans: bool = False  # our role may read its backend's memory contexts
    # What the server reported for each guard (guards.names order) when read, and
    # whether the session logged in with them (libpq options, issue 36).
    reported: tuple[str, ...] = field(default=(), compare=False)
    login_guarded: bool = False
    direct: bool = False  # the session is proven to reach PostgreSQL itself

    @property
    def product(self) -> str:
        """The server kind, for messages."""
        return "pgBouncer" if self.pgbouncer else "PostgreSQL"


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
    backend_pid: int | None = None  # the backend's pid: as libpq got it at login, or the server's


async def preflight(
    conn: psycopg.AsyncConnection[tuple[object, ...]], *, is_main: bool
) -> Preflight:
    """Version, recovery, database, user, extensions, schemas and databases in one query,
    with the search_path our collectors are to run under and what the server reports for
    each guard (issue 36). A connection that did not log in with the guards asks inside a
    read-only transaction of its own with them local to it, rolled back after."""
    guarded = postgres.logged_in_guarded(conn)
    async with conn.cursor() as cur:
        if not guarded:
            await cur.execute(guarded_sql(conn.info.server_version), prepare=False)
        try:
            await cur.execute(_sql(conn.info.server_version))
            row = await cur.fetchone()
        finally:
            if not guarded and not conn.broken:
                await conn.execute("ROLLBACK")
    if row is None:  # pragma: no cover - the query always returns a row
        raise psycopg.DataError("preflight query returned no row")
    version, recovery, datname, user, exts, schemas, dbs, address, port, directories = row[:10]
    pid, work_mem, temp_file_limit, may_limit_temp, may_read_plans, reading = row[10:16]
    seen = Endpoint(str(address or ""), int(str(port)), _optional(directories), _pid(pid))
    path = SearchPath.of(row[16], row[17], user=str(user))
    number = int(str(version))
    guards = Guards.of(number, path.setting, str(work_mem), str(temp_file_limit),
                       may_limit_temp is True)  # fmt: skip
    facts = ServerFacts(
        version=number,
        in_recovery=bool(recovery),
        datname=str(datname),
        username=str(user),
        extensions=frozenset(_strings(exts)),
        schemas=frozenset(_strings(schemas)),
        is_main=is_main,
        own_transaction=own_transaction_reason(conn, seen),
        direct=not not_direct_reason(conn, seen),
        search_path=path,
        guards=guards,
        may_read_plans=may_read_plans is True,
        reported=tuple(str(v) for v in reading) if isinstance(reading, list) else (),
        login_guarded=guarded,
    )
    names = _strings(dbs)
    return Preflight(
        facts=facts,
        databases=tuple(n for n in names if not isinstance(n, Escaped)),
        unnamed=tuple(n for n in names if isinstance(n, Escaped)),
    )


@functools.cache
def _sql(version: int) -> str:
    """The preflight for a server of ``version`` (as libpq learnt it at login)."""
    new = version >= 150000
    plans = _MAY_READ_PLANS if new else _SUPERUSER if version >= 140000 else "false"
    temp = _MAY_LIMIT_TEMP if new else _SUPERUSER
    sql = _PREFLIGHT_SQL.format(
        may_limit_temp=temp, may_read_plans=plans, reading=table.reading_sql(version)
    )
    return f"{sql},{PATH_COLUMNS}"


def _pid(value: object) -> int | None:
    return value if isinstance(value, int) else None


def _optional(value: object) -> str | None:
    """A nullable text column (NULL: the role may not read the setting)."""
    return None if value is None else str(value)


def own_transaction_reason(
    conn: psycopg.AsyncConnection[tuple[object, ...]], seen: Endpoint
) -> str:
    """Why this connection's collectors each run in a read-only transaction of their own
    with limits local to it; "" when session limits are safe (issue 22).

    Session settings stay on the server's connection. Behind a pooler (pgBouncer in
    transaction or statement pooling, pgpool, Odyssey, a cloud proxy) that connection is
    next handed to an application, which would inherit our read-only default and our
    statement timeout. So session limits need proof that the session reaches PostgreSQL
    directly. A pooler answers the login itself, with a backend pid of its own making,
    so the server's ``pg_backend_pid()`` is another even where a redirect makes the
    server see the very address and port libpq dialed (issue 29); and the server sees
    the very endpoint libpq dialed (:func:`why_not_direct`).
    """
    if session_read_only(conn) is None:
        return "the server does not report its read-only default (before PostgreSQL 14)"
    return not_direct_reason(conn, seen)


def not_direct_reason(conn: psycopg.AsyncConnection[tuple[object, ...]], seen: Endpoint) -> str:
    """Why the session is not proven to reach PostgreSQL directly; "" when it is."""
    try:
        hostaddr = conn.info.hostaddr  # libpq 12+; "" over a Unix socket
    except psycopg.NotSupportedError:
        return "libpq is too old to tell which address it connected to (before 12)"
    unix = not hostaddr
    dialed = Endpoint(hostaddr, conn.info.port, conn.info.host if unix else None,
                      conn.info.backend_pid)  # fmt: skip
    if seen.backend_pid != dialed.backend_pid:
        return _answered_by_pooler(dialed, seen)
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


def _answered_by_pooler(dialed: Endpoint, seen: Endpoint) -> str:
    return (
        f"the server's backend pid ({seen.backend_pid}) is not the one libpq was given at "
        f"login ({dialed.backend_pid}): a pooler answered the login"
    )


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
