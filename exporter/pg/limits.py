"""The server-side limits of a collector's statement (D1), as SQL: plain text, no I/O.

Each collector's statement runs read only, under limits that match its client-side
deadline, so whichever fires first leaves the same state, and under guards every
statement of ours shares: the search_path we chose (``searchpath``, issue 29), no JIT,
no parallel workers, a bounded ``work_mem`` and, where our role may set it, a bounded
``temp_file_limit`` (issue 31). They are put in force as session settings changed only
where a collector's differ from the last one's (one round trip per collector, issue
22), or in a read-only transaction of the collector's own (:func:`limits_sql`) where
session settings are not safe (``preflight``).

Every call is qualified with ``pg_catalog.``: these statements run before our
search_path is in force, under the one a database's owner chose.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import psycopg

from exporter.pg.searchpath import quote_literal

LOCK_TIMEOUT_CAP = 1.0  # seconds; lock waits are a small fraction of the statement limit (D3)

#: The largest value of PostgreSQL's millisecond limits (INT_MAX, about 24.8 days). A
#: longer timeout, which Go allows, is kept by the client-side deadline alone.
MAX_LIMIT_MS = 2**31 - 1

#: Memory a sort or hash of ours may take before spilling, at most (kB): PostgreSQL's own
#: default. A server configured lower keeps its lower value (issue 31).
WORK_MEM_CAP_KB = 4096
#: Temporary disk one statement of ours may fill, at most (kB), where our role may set
#: ``temp_file_limit`` (a superuser, or granted SET on it from PostgreSQL 15).
TEMP_FILE_CAP_KB = 64 * 1024

#: A limit left to the server's own default (the role's, the database's or the config's).
SERVER_DEFAULT = None


@dataclass(frozen=True, slots=True)
class Guards:
    """What every statement of ours on one server runs under, whatever its collector."""

    version: int  # server_version_num
    search_path: str = '"pg_catalog", "pg_temp"'  # the setting's value (searchpath)
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


NO_GUARDS = Guards(0)  # a server not read yet, or pgBouncer's console


@dataclass(frozen=True, slots=True)
class Limits:
    """The server-side settings of one collector (D1): name → value as the setting's
    text, or SERVER_DEFAULT where the collector sets nothing (an unbounded collector's
    statement)."""

    settings: tuple[tuple[str, str | None], ...]

    @classmethod
    @functools.cache
    def of(cls, timeout: float | None, guards: Guards) -> Limits:
        """Limits derived from a collector's timeout (None: unbounded) and the guards."""
        ms = 0 if timeout is None else max(1, min(int(timeout * 1000), MAX_LIMIT_MS))
        lock = LOCK_TIMEOUT_CAP if timeout is None else min(timeout / 4, LOCK_TIMEOUT_CAP)
        settings: list[tuple[str, str | None]] = [
            ("search_path", guards.search_path),
            ("statement_timeout", str(ms) if timeout is not None else SERVER_DEFAULT),
            ("lock_timeout", str(max(1, int(lock * 1000)))),
            ("idle_in_transaction_session_timeout", str(max(1000, ms))),
        ]
        if guards.version >= 170000:
            # A backstop only: when it fires the server ends the whole session, so it must
            # come after the statement limit, which merely cancels the statement.
            txn = min(2 * ms + 1000, MAX_LIMIT_MS) if timeout is not None else None
            settings.append(("transaction_timeout", SERVER_DEFAULT if txn is None else str(txn)))
        settings += [
            ("jit", "off"),  # compiling our short catalog queries costs more than it saves
            ("max_parallel_workers_per_gather", "0"),
            ("work_mem", f"{guards.work_mem_kb}kB"),
            # PostgreSQL's text of dates and floats as the Go exporter's driver asks for
            # it at login, whatever the database's owner set (issue 30).
            ("DateStyle", "ISO, MDY"),
            ("extra_float_digits", "2"),
        ]
        if guards.temp_file_limit_kb is not None:
            settings.append(("temp_file_limit", f"{guards.temp_file_limit_kb}kB"))
        return cls(tuple(settings))

    def value(self, name: str) -> str | None:
        """One setting's value (KeyError when the limits do not set it)."""
        return dict(self.settings)[name]


def limits_sql(limits: Limits) -> str:
    """``BEGIN READ ONLY`` and the collector's limits local to it, in one round trip (D1)."""
    calls = [_call(name, value, local=True) for name, value in limits.settings if value is not None]
    return f"BEGIN READ ONLY; SELECT {', '.join(calls)}"


def session_sql(limits: Limits, previous: Limits | None) -> str:
    """One statement that brings a session from ``previous`` limits to ``limits`` (issue
    22): everything, read-only default first, on a session not yet set up (``previous``
    None); otherwise only the settings that differ; "" when none does. One SELECT of
    set_config() rather than a SET each: one statement for the server to run and count,
    and, like any statement that fails, it changes nothing when it is cancelled."""
    if previous is None:
        changed = [("default_transaction_read_only", "on"), *limits.settings]
    else:
        changed = [item for item in limits.settings if item not in previous.settings]
    calls = ", ".join(_call(name, value, local=False) for name, value in changed)
    return f"SELECT {calls}" if calls else ""


def _call(name: str, value: str | None, *, local: bool) -> str:
    """``pg_catalog.set_config`` of one setting; SERVER_DEFAULT: what RESET would restore."""
    if value is SERVER_DEFAULT:
        text = (
            "(SELECT reset_val FROM pg_catalog.pg_settings "
            f"WHERE name OPERATOR(pg_catalog.=) '{name}')"
        )
    else:
        text = quote_literal(value)
    return f"pg_catalog.set_config('{name}', {text}, {'true' if local else 'false'})"


_UNITS = {"kb": 1, "mb": 1024, "gb": 1024**2, "tb": 1024**3}
_AMOUNT = re.compile(r"^\s*(-?\d+)\s*([kmgt]b)?\s*$", re.IGNORECASE)


def kilobytes(text: str) -> int:
    """A memory setting as ``current_setting`` prints it (``4MB``, ``-1``) in kB; 0 when
    it cannot be read."""
    found = _AMOUNT.match(text)
    if found is None:
        return 0
    amount, unit = int(found.group(1)), (found.group(2) or "kb").lower()
    return amount if amount < 0 else amount * _UNITS[unit]


def session_read_only(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> bool | None:
    """The session's read-only default as the server last reported it (PostgreSQL 14+
    reports every change, whoever made it); None when the server does not report it."""
    value = conn.info.parameter_status("default_transaction_read_only")
    return None if value is None else value == "on"
