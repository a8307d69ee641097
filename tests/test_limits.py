"""A collector's server-side limits as SQL, without a database (D1, D3, issues 22, 29, 31)."""

from __future__ import annotations

import pytest

from exporter.pg.limits import (
    MAX_LIMIT_MS,
    TEMP_FILE_CAP_KB,
    WORK_MEM_CAP_KB,
    Guards,
    Limits,
    kilobytes,
    limits_sql,
    session_sql,
)

PG18, PG16, PG15 = Guards(180000), Guards(160000), Guards(150000)


def test_limits_follow_the_collector_timeout() -> None:
    """D1, D3: the statement limit is the timeout, lock waits a quarter of it (at most 1 s),
    and from PostgreSQL 17 a transaction backstop comes after the statement limit."""
    limits = dict(Limits.of(2.0, PG18).settings)
    assert {name: limits[name] for name in limits if name.endswith("timeout")} == {
        "statement_timeout": "2000",
        "lock_timeout": "500",
        "idle_in_transaction_session_timeout": "2000",
        "transaction_timeout": "5000",
    }
    assert "transaction_timeout" not in dict(Limits.of(2.0, PG16).settings)


def test_every_statement_runs_without_jit_or_parallel_workers_and_bounded_memory() -> None:
    """Issue 31: JIT off, no parallel workers, work_mem at most PostgreSQL's default (a
    server set lower keeps its value), temp_file_limit only where our role may set it."""
    limits = Limits.of(2.0, PG18)
    assert limits.value("jit") == "off"
    assert limits.value("max_parallel_workers_per_gather") == "0"
    assert limits.value("work_mem") == f"{WORK_MEM_CAP_KB}kB"
    assert "temp_file_limit" not in dict(limits.guards)
    assert (limits.value("DateStyle"), limits.value("extra_float_digits")) == ("ISO, MDY", "2")
    big = Guards.of(180000, '"pg_catalog"', "1GB", "-1", may_set=True)
    assert big.work_mem_kb == WORK_MEM_CAP_KB
    assert big.temp_file_limit_kb == TEMP_FILE_CAP_KB
    small = Guards.of(180000, '"pg_catalog"', "1MB", "10MB", may_set=True)
    assert (small.work_mem_kb, small.temp_file_limit_kb) == (1024, 10240)
    assert Guards.of(180000, '"pg_catalog"', "4MB", "-1", may_set=False).temp_file_limit_kb is None
    assert Limits.of(2.0, big).value("temp_file_limit") == f"{TEMP_FILE_CAP_KB}kB"


@pytest.mark.parametrize(
    ("text", "kb"),
    [("4MB", 4096), ("64kB", 64), ("1GB", 1024**2), ("-1", -1), ("2048", 2048), ("x", 0)],
)
def test_memory_settings_read_as_current_setting_prints_them(text: str, kb: int) -> None:
    """current_setting('work_mem') and friends, in kB."""
    assert kilobytes(text) == kb


def test_an_unbounded_collector_has_no_statement_limit_on_the_server() -> None:
    """D1, B12: without a timeout the statement has no server limit (its request's end
    cancels it), not the login's; a huge one is capped at what PostgreSQL accepts."""
    unbounded = dict(Limits.of(None, PG18).settings)
    assert unbounded["statement_timeout"] == "0"
    assert unbounded["transaction_timeout"] == "0"
    assert Limits.of(10.0**9, PG15).value("statement_timeout") == str(MAX_LIMIT_MS)


def test_a_transaction_of_its_own_carries_every_guard_and_limit() -> None:
    """D1, issue 36: a read-only, read committed, not deferrable transaction whatever the
    owner's defaults, then every guard and the collector's limits local to it, each once,
    in one statement of pg_catalog.set_config calls."""
    sql = limits_sql(Limits.of(None, PG15))
    assert sql.startswith(
        "BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY NOT DEFERRABLE; SET LOCAL jit = off; "
        "SELECT pg_catalog.set_config("
    )
    assert "pg_catalog.set_config('lock_timeout', E'1000', true)" in sql
    assert "pg_catalog.set_config('jit', E'off', true)" in sql
    assert "pg_catalog.set_config('hash_mem_multiplier', E'1', true)" in sql
    assert sql.count("'statement_timeout'") == 1
    assert sql.count("'search_path'") == 1
    assert ", false)" not in sql


def test_session_settings_are_sent_whole_once_then_only_where_they_differ() -> None:
    """Issue 22: a new session gets the collector's limits and the guards its login did
    not carry (issue 36: a first login carries those every major has); the next
    collector only what differs, nothing when nothing does."""
    short, long = Limits.of(1.0, PG18), Limits.of(4.0, PG18)
    every = frozenset(name for name, _ in short.guards)
    first = session_sql(short, None, every)
    assert first.startswith("SELECT pg_catalog.set_config('search_path', ")
    assert "default_transaction_read_only" not in first
    assert first.count("set_config(") == len(short.settings)
    lacking = session_sql(short, None, every - {"transaction_timeout", "idle_session_timeout"})
    assert lacking.startswith("SELECT pg_catalog.set_config('idle_session_timeout', E'0', ")
    assert lacking.count("set_config(") == len(short.settings) + 1  # transaction_timeout: ours
    assert session_sql(short, None).count("set_config(") == len(short.settings) + len(
        [n for n, _ in short.guards]
    )
    assert session_sql(short, short) == ""
    changed = session_sql(long, short)
    assert "default_transaction_read_only" not in changed
    assert "search_path" not in changed
    assert "pg_catalog.set_config('statement_timeout', E'4000', false)" in changed
    unbounded = session_sql(Limits.of(None, PG18), short)
    assert "pg_catalog.set_config('statement_timeout', E'0', false)" in unbounded


def test_the_search_path_goes_as_a_literal_whatever_the_schema_names_hold() -> None:
    """Issue 29: schema names come from the server; quotes and backslashes in them cannot
    end the literal, whatever standard_conforming_strings says."""
    guards = Guards(180000, search_path='"pg_catalog", "we\'ird\\""", "pg_temp"')
    sql = session_sql(Limits.of(1.0, guards), None)
    assert 'pg_catalog.set_config(\'search_path\', E\'"pg_catalog", "we\'\'ird\\\\""", ' in sql
