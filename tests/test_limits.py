"""A collector's server-side limits as SQL, without a database (D1, D3, issue 22)."""

from __future__ import annotations

from exporter.limits import MAX_LIMIT_MS, SERVER_DEFAULT, Limits, limits_sql, session_sql


def test_limits_follow_the_collector_timeout() -> None:
    """D1, D3: the statement limit is the timeout, lock waits a quarter of it (at most 1 s),
    and from PostgreSQL 17 a transaction backstop comes after the statement limit."""
    assert dict(Limits.of(2.0, 180000).settings) == {
        "statement_timeout": 2000,
        "lock_timeout": 500,
        "idle_in_transaction_session_timeout": 2000,
        "transaction_timeout": 5000,
    }
    assert "transaction_timeout" not in dict(Limits.of(2.0, 160000).settings)


def test_an_unbounded_collector_leaves_the_statement_limit_to_the_server() -> None:
    """D1: without a timeout the statement limit is the server's own; a huge one is capped
    at what PostgreSQL accepts."""
    unbounded = dict(Limits.of(None, 180000).settings)
    assert unbounded["statement_timeout"] is SERVER_DEFAULT
    assert unbounded["transaction_timeout"] is SERVER_DEFAULT
    assert dict(Limits.of(10.0**9, 150000).settings)["statement_timeout"] == MAX_LIMIT_MS


def test_a_transaction_of_its_own_sets_only_what_it_limits() -> None:
    """D1: BEGIN READ ONLY with SET LOCAL for every limit the collector sets."""
    sql = limits_sql(None, 150000)
    assert sql.startswith("BEGIN READ ONLY; ")
    assert "statement_timeout" not in sql
    assert "SET LOCAL lock_timeout = 1000" in sql


def test_session_settings_are_sent_whole_once_then_only_where_they_differ() -> None:
    """Issue 22: a new session gets the read-only default and every limit; the next
    collector only what differs, and nothing when nothing does."""
    short, long = Limits.of(1.0, 180000), Limits.of(4.0, 180000)
    first = session_sql(short, None)
    assert first.startswith("SELECT set_config('default_transaction_read_only', 'on', false)")
    assert first.count("set_config(") == 1 + len(short.settings)
    assert session_sql(short, short) == ""
    changed = session_sql(long, short)
    assert "default_transaction_read_only" not in changed
    assert "set_config('statement_timeout', '4000', false)" in changed
    unbounded = session_sql(Limits.of(None, 180000), short)
    assert "(SELECT reset_val FROM pg_settings WHERE name = 'statement_timeout')" in unbounded
