"""A collector's server-side limits (D1) and the guards every statement of ours runs
under, as SQL: plain text, no I/O.

The guards (``guards.GUARDS``) are put in force at login on a connection proven direct
(libpq ``options``, issue 36); what differs from one collector to the next (its
statement, lock, idle and transaction limits, and the database's search_path) is a
session setting changed only where a collector's differ from the last one's (one round
trip per collector, issue 22). Where session settings are not safe (a pooler, a server
that does not report them) or a collector may reach code a tenant wrote (``planning``),
the collector runs in a read-only transaction of its own with every guard and limit
local to it (:func:`limits_sql`), ended by ``ROLLBACK``: whatever a function it called
set for the session is undone with it, by the server.

Every call is qualified with ``pg_catalog.``: these statements may run before our
search_path is in force.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import psycopg

from exporter.pg import guards as table
from exporter.pg.guards import (
    LOCK_TIMEOUT_MS,
    LOGIN_SEARCH_PATH,
    TEMP_FILE_CAP_KB,
    WORK_MEM_CAP_KB,
    Shape,
)
from exporter.pg.searchpath import quote_literal

__all__ = ["TEMP_FILE_CAP_KB", "WORK_MEM_CAP_KB"]

LOCK_TIMEOUT_CAP = LOCK_TIMEOUT_MS / 1000  # seconds; lock waits are a small fraction (D3)

#: The largest value of PostgreSQL's millisecond limits (INT_MAX, about 24.8 days). A
#: longer timeout, which Go allows, is kept by the client-side deadline alone.
MAX_LIMIT_MS = 2**31 - 1


@dataclass(frozen=True, slots=True)
class Guards:
    """What every statement of ours on one server runs under, whatever its collector."""

    version: int  # server_version_num
    search_path: str = LOGIN_SEARCH_PATH  # the database's (searchpath)
    work_mem_kb: int = WORK_MEM_CAP_KB
    temp_file_limit_kb: int | None = None  # None: not ours to set, the server's applies

    @classmethod
    def of(
        cls, version: int, search_path: str, work_mem: str, temp_file_limit: str, may_set: bool
    ) -> Guards:
        """From the server's settings as ``current_setting`` prints them."""
        work = min(kilobytes(work_mem) or WORK_MEM_CAP_KB, WORK_MEM_CAP_KB)
        server_temp = kilobytes(temp_file_limit)  # -1: no limit
        temp = None
        if may_set:
            temp = TEMP_FILE_CAP_KB if server_temp < 0 else min(server_temp, TEMP_FILE_CAP_KB)
        return cls(version, search_path, max(work, 64), temp)

    @property
    def shape(self) -> Shape:
        """What the guards' values depend on."""
        return Shape(self.version, self.work_mem_kb, self.temp_file_limit_kb)

    def login_options(self) -> str:
        """libpq ``options`` putting every guard in force at login."""
        return table.login_options(self.shape)


NO_GUARDS = Guards(0)  # a server not read yet, or pgBouncer's console


@dataclass(frozen=True, slots=True)
class Limits:
    """The server-side settings of one collector (D1): name → value as the setting's
    text; ``guards`` are the ones every statement of ours shares."""

    settings: tuple[tuple[str, str], ...]
    guards: tuple[tuple[str, str], ...] = ()

    @classmethod
    @functools.cache
    def of(cls, timeout: float | None, guards: Guards) -> Limits:
        """Limits derived from a collector's timeout (None: unbounded) and the guards."""
        ms = 0 if timeout is None else max(1, min(int(timeout * 1000), MAX_LIMIT_MS))
        lock = LOCK_TIMEOUT_CAP if timeout is None else min(timeout / 4, LOCK_TIMEOUT_CAP)
        settings: list[tuple[str, str]] = [
            ("search_path", guards.search_path),
            # Unbounded: no server limit at all (its request's end cancels it, B12); not
            # the reset value, which is now the login's.
            ("statement_timeout", str(ms)),
            ("lock_timeout", str(max(1, int(lock * 1000)))),
            ("idle_in_transaction_session_timeout", str(max(1000, ms))),
        ]
        if guards.version >= 170000:
            # A backstop only: when it fires the server ends the whole session, so it must
            # come after the statement limit, which merely cancels the statement.
            txn = min(2 * ms + 1000, MAX_LIMIT_MS) if timeout is not None else 0
            settings.append(("transaction_timeout", str(txn)))
        own = {name for name, _ in settings}
        shared = tuple(item for item in table.settings(guards.shape) if item[0] not in own)
        return cls(tuple(settings), shared)

    def value(self, name: str) -> str:
        """One setting's value, a collector's or a guard's (KeyError when neither sets it)."""
        return dict(self.guards + self.settings)[name]


def limits_sql(limits: Limits) -> str:
    """Our own read-only transaction with every guard and the collector's limits local to
    it, in one round trip (D1, issue 36). JIT goes off first (``BEGIN_GUARDED``): the
    SELECT of set_config calls after it is no candidate for JIT (nor, being parallel
    unsafe, for parallel workers) whatever the owner's defaults."""
    items = [*limits.guards, *limits.settings]
    calls = [_call(name, value, local=True) for name, value in items]
    return f"{table.BEGIN_GUARDED}; SELECT {', '.join(calls)}"


def session_sql(
    limits: Limits, previous: Limits | None, login: frozenset[str] = frozenset()
) -> str:
    """One statement that brings a session from ``previous`` limits to ``limits`` (issue
    22): on a session not yet set up (``previous`` None) the collector's limits and the
    guards its login did not carry (``login``: the names it did; a first login carries
    only those every major has, issue 36); else only the limits that differ; "" when
    none does. One SELECT of set_config() rather than a SET each: one statement for the
    server to run and count, and, like any statement that fails, it changes nothing when
    cancelled."""
    if previous is None:
        missing = [item for item in limits.guards if item[0] not in login]
        changed = [*missing, *limits.settings]
    else:
        changed = [item for item in limits.settings if item not in previous.settings]
    calls = ", ".join(_call(name, value, local=False) for name, value in changed)
    return f"SELECT {calls}" if calls else ""


def guarded_sql(version: int) -> str:
    """Our own read-only transaction with every guard local to it, for a statement of ours
    on a connection that did not log in with them (a first one, or through a pooler)."""
    guards = Guards(version)
    return limits_sql(Limits((), table.settings(guards.shape)))


def _call(name: str, value: str, *, local: bool) -> str:
    """``pg_catalog.set_config`` of one setting."""
    text = quote_literal(value)
    return f"pg_catalog.set_config('{name}', {text}, {'true' if local else 'false'})"


def kilobytes(text: str) -> int:
    """A memory setting as ``current_setting`` prints it (``4MB``, ``-1``) in kB; 0 when
    it cannot be read."""
    return table.parse_amount(text) or 0


def session_read_only(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> bool | None:
    """The session's read-only default as the server last reported it (PostgreSQL 14+
    reports every change, whoever made it); None when the server does not report it."""
    value = conn.info.parameter_status("default_transaction_read_only")
    return None if value is None else value == "on"
