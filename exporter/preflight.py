"""What one round trip tells about a server before its collectors run: version,
recovery, database, extensions, schemas, the databases to discover, and whether the
session reaches PostgreSQL directly, so that session limits are safe (issue 22).
pgBouncer's admin console has a preflight of its own (D4).
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass

import psycopg

from exporter.casting import Escaped
from exporter.limits import session_read_only
from exporter.planning import ServerFacts

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
