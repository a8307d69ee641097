"""Collector queries prepared once per connection, so the server plans them once (issue 22).

A collector's query has no parameters and the same text pass after pass, yet sent
as text it is parsed, analysed and planned again every time: on the default
library that was about half of PostgreSQL's CPU for a pass (41 → 20 ms in
``bench.library``). Prepared with ``PREPARE``, it is planned once per connection
(PostgreSQL keeps a query without parameters on its generic plan and plans it again
by itself when an object it reads changes), and each later run is a one-line
``EXECUTE``.

Only on connections with session limits (D1: proven direct, PostgreSQL 14+): a
pooler could run our ``EXECUTE`` on a server connection that never saw the
``PREPARE``. A query is prepared on its second run on a connection, never its
first, so a connection that lives one pass (a database closed again for the
connection budget) costs no extra round trip; the limits of D1 apply to
``PREPARE`` and ``EXECUTE`` as to any statement, and ``pg_stat_statements``
counts each ``EXECUTE`` under the prepared query's text.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass, field

import psycopg

# One plain query: optional comments, then a keyword that PREPARE accepts and that
# cannot write by itself (a data-modifying WITH is refused by the read-only default).
_PLAIN_QUERY = re.compile(
    r"\A(?:\s+|--[^\n]*(?:\n|\Z)|/\*.*?\*/)*(?:SELECT|WITH|VALUES|TABLE)\b",
    re.IGNORECASE | re.DOTALL,
)

_NOT_NAME = re.compile(r"[^a-z0-9_]")  # what an unquoted name may not hold
_KEY_CHARS = 42  # 4 + 42 + 1 + 12 characters: within PostgreSQL's 63 for a name

#: SQLSTATE classes of a refusal that will not change by trying again: syntax or
#: access rule (42), feature not supported (0A). Anything else fails the collector.
REFUSED_CLASSES = ("42", "0A")

#: The most statements one connection prepares (issue 31): each keeps its plan in the
#: backend's memory (the default library's 51 take 5.0 MiB on PostgreSQL 18), so a
#: config of hundreds of collectors would make the backend grow with it. Beyond it,
#: queries keep running as text, in run order: the first ones are prepared.
MAX_PREPARED = 64

# The plan cache's memory in our own backend (PostgreSQL 14+; readable by a superuser,
# and from 15 by pg_read_all_stats, which pg_monitor holds).
PLAN_MEMORY_SQL = (
    "SELECT pg_catalog.sum(total_bytes)::bigint FROM pg_catalog.pg_backend_memory_contexts "
    "WHERE name OPERATOR(pg_catalog.=) ANY (ARRAY['CachedPlan', 'CachedPlanSource', "
    "'CachedPlanQuery'])"
)


@functools.lru_cache(maxsize=4096)
def preparable(query: str, key: str) -> tuple[str, str] | None:
    """(name, statement) for ``PREPARE name AS statement``, or None to send ``query`` as
    text. Remembered per text: a pass asks for each collector's.

    Only a single plain query qualifies: it starts with ``SELECT``, ``WITH``,
    ``VALUES`` or ``TABLE`` and holds no semicolon but a trailing one. The test is
    cautious (a semicolon inside a string also rules it out): a query left out
    merely keeps its old cost.

    The name carries the collector's key (``pg_stat_activity`` shows ``EXECUTE
    pgx_pg_table_…``, so a DBA still sees which collector runs) and a digest of the
    text, so a reloaded collector with new SQL never meets the old plan.
    """
    text = query.strip().rstrip(";").rstrip()
    if not text or ";" in text or _PLAIN_QUERY.match(text) is None:
        return None
    digest = hashlib.blake2b(text.encode(), digest_size=6).hexdigest()
    readable = _NOT_NAME.sub("_", key.lower())[:_KEY_CHARS]
    return f"pgx_{readable}_{digest}", text


@dataclass(slots=True)
class Prepared:
    """What one connection has prepared, and what it has seen run once (by name)."""

    connection: object  # the connection these names live on (compared by identity)
    names: set[str] = field(default_factory=set)  # prepared: run them with EXECUTE
    seen: set[str] = field(default_factory=set)  # ran once as text on this connection
    refused: set[str] = field(default_factory=set)  # PREPARE said no for good: text
    obsolete: bool = False  # a reload changed the collectors: deallocate before use

    def due(self, name: str) -> bool:
        """Whether to PREPARE ``name`` before this run: on its second run here, unless it is
        prepared already, PostgreSQL refused it, or MAX_PREPARED are. The first run goes
        as text, so a connection that lives one pass pays no extra round trip."""
        if name in self.names or name in self.refused:
            return False
        if name not in self.seen:
            self.seen.add(name)
            return False
        return len(self.names) < MAX_PREPARED

    def refuse(self, name: str) -> None:
        """Run ``name``'s query as text from now on, on this connection."""
        self.names.discard(name)
        self.refused.add(name)


async def prepare(cur: psycopg.AsyncCursor[tuple[object, ...]], name: str, statement: str) -> bool:
    """``PREPARE name AS statement``; False when the server refuses it for good (a syntax
    or access rule, an unsupported feature), so the query keeps running as text."""
    try:
        await cur.execute(f"PREPARE {name} AS {statement}", prepare=False)
    except psycopg.errors.DuplicatePreparedStatement:
        return True  # already there: names follow the text, so it is this statement
    except psycopg.Error as exc:
        if (exc.sqlstate or "")[:2] in REFUSED_CLASSES:
            return False
        raise
    return True


async def plan_memory(cur: psycopg.AsyncCursor[tuple[object, ...]]) -> int:
    """Bytes the plan cache holds in our backend (PLAN_MEMORY_SQL)."""
    await cur.execute(PLAN_MEMORY_SQL, prepare=False)
    row = await cur.fetchone()
    return int(str(row[0])) if row is not None and row[0] is not None else 0


async def deallocate_all(cur: psycopg.AsyncCursor[tuple[object, ...]]) -> None:
    """Drop every prepared statement of the session (psycopg forgets its own too)."""
    await cur.execute("DEALLOCATE ALL", prepare=False)
