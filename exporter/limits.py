"""The server-side limits of a collector's statement (D1), as SQL: plain text, no I/O.

Each collector's statement runs read only, under limits that match its client-side
deadline, so whichever fires first leaves the same state: as session settings
changed only where a collector's differ from the last one's (one round trip per
collector, issue 22), or with ``SET LOCAL`` in a read-only transaction of its own
(:func:`limits_sql`) where session settings are not safe (``preflight``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import psycopg

LOCK_TIMEOUT_CAP = 1.0  # seconds; lock waits are a small fraction of the statement limit (D3)

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
    @functools.cache
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
