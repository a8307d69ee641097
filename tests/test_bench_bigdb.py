"""bench.bigdb and its helpers: the workload's SQL, what the server log says about our
sessions, server time per second and collectors' refreshes (issue 31)."""

from __future__ import annotations

import re
from dataclasses import asdict, replace

import pytest

from bench.bigdb import parse_args, spread
from bench.bigdb_build import Sizes, giant_rows, giant_sql, statement_sql
from bench.budget_window import Sample, longest_gaps, per_second, runs_of, window_rates
from bench.footprint import grand_totals, parallel_workers, role_pids


def _normalized(sql: str) -> str:
    """Integer constants as pg_stat_statements keeps them: $1, $2, … in order."""
    counter = iter(range(1, 10**7))
    return re.sub(r"\b\d+\b", lambda _: f"${next(counter)}", sql)


def test_a_giant_has_the_normalized_text_asked_for() -> None:
    """A giant of 600 KB is 600 KB once its constants are $n, within a row's width."""
    text = _normalized(giant_sql(0, 600))
    assert 600 * 1024 <= len(text) < 600 * 1024 + 200
    assert giant_rows(1) < giant_rows(2)


def test_each_giant_and_each_statement_is_its_own_entry() -> None:
    """Giants differ in their number of rows, statements in their table or predicates,
    so that none shares a pg_stat_statements entry with another."""
    giants = {_normalized(giant_sql(g, 1)).count("$") for g in range(20)}
    assert len(giants) == 20
    statements = [_normalized(statement_sql(k, tables=7)) for k in range(30)]
    assert len(set(statements)) == 30
    assert statement_sql(9, tables=7) == "SELECT count(*) FROM t2 WHERE w = %s AND id <> %s"


def test_the_cache_directory_changes_with_every_size() -> None:
    """A cached cluster is reused only for the same sizes."""
    base = Sizes()
    tags = {replace(base, **{name: value + 1}).tag for name, value in asdict(base).items()}
    assert base.tag not in tags
    assert len(tags) == len(asdict(base))


_LOG = """\
2026-12-03 07:04:38.900 UTC [16713] 00000 bench_monitor@postgres app=pg_exporter: LOG:  connection authorized: user=bench_monitor database=postgres
2026-12-03 07:04:38.901 UTC [16714] 00000 bench_app@bigdb app=: LOG:  connection authorized: user=bench_app database=bigdb
2026-12-03 07:04:38.921 UTC [16575] 00000 @ app=: DEBUG:  registering background worker "parallel worker for PID 16713"
2026-12-03 07:04:38.921 UTC [16575] 00000 @ app=: DEBUG:  starting background worker process "parallel worker for PID 16713"
2026-12-03 07:04:38.922 UTC [16575] 00000 @ app=: DEBUG:  starting background worker process "parallel worker for PID 16713"
2026-12-03 07:04:38.923 UTC [16575] 00000 @ app=: DEBUG:  starting background worker process "parallel worker for PID 16714"
2026-12-03 07:04:39.000 UTC [16713] 00000 bench_monitor@postgres app=pg_exporter: LOG:  level: 1; CachedPlan: 4096 total in 3 blocks; 100 free (0 chunks); 3996 used
2026-12-03 07:04:39.001 UTC [16713] 00000 bench_monitor@postgres app=pg_exporter: LOG:  Grand total: 1048576 bytes in 120 blocks; 20000 free (30 chunks); 1028576 used
"""  # noqa: E501  (real log lines, prefix %m [%p] %e %u@%d app=%a)


def test_parallel_workers_are_counted_for_the_roles_backends_only() -> None:
    """Started workers count, registrations do not, nor other roles' workers."""
    ours = role_pids(_LOG, "bench_monitor")
    assert ours == {16713}
    assert parallel_workers(_LOG, ours) == 2
    assert parallel_workers(_LOG, role_pids(_LOG, "bench_app")) == 1
    assert parallel_workers(_LOG, set()) == 0


def test_grand_totals_are_read_per_backend() -> None:
    """The last line of a backend's memory dump gives its total."""
    assert grand_totals(_LOG) == {16713: 1048576}


def test_server_time_per_second_and_over_windows() -> None:
    """Rates between samples, and over spans of at least the window."""
    samples = [Sample(0.0, 0.0), Sample(1.0, 10.0), Sample(2.0, 10.0), Sample(4.0, 50.0)]
    assert per_second(samples) == [10.0, 0.0, 20.0]
    assert window_rates(samples, 2.0) == [5.0, 40 / 3, 20.0]
    assert window_rates(samples, 10.0) == []


_SELF_METRICS = b"""\
# TYPE pg_exporter_query_scrape_total_count gauge
pg_exporter_query_scrape_total_count{datname="postgres",query="pg_db"} 12
pg_exporter_query_scrape_hit_count{datname="postgres",query="pg_db"} 9
pg_exporter_query_scrape_total_count{datname="bigdb",query="pg_table"} 4
pg_exporter_query_scrape_hit_count{datname="bigdb",query="pg_table"} 0
pg_db_numbackends{datname="postgres"} 3
"""


def test_runs_are_executions_not_cache_hits() -> None:
    """A collector's runs: its scrapes minus those served from its cache."""
    assert runs_of(_SELF_METRICS) == {"postgres/pg_db": 3.0, "bigdb/pg_table": 4.0}


def test_longest_gap_counts_the_wait_after_the_last_refresh() -> None:
    """Gaps run from refresh to refresh, the first from the window's start, the last to
    its end; a collector never refreshed waited the whole window."""
    runs = [(1.0, 5.0, 0.0), (2.0, 5.0, 1.0), (3.0, 5.0, 1.0), (3.0, 5.0, 2.0)]
    observed = [(at, dict(zip("abc", counts, strict=True)))
                for at, counts in zip((0.0, 2.0, 3.0, 8.0), runs, strict=True)]  # fmt: skip
    assert longest_gaps(observed) == {"a": 5.0, "b": 8.0, "c": 6.0}
    assert longest_gaps([]) == {}


def test_ratios_show_median_and_spread_and_skip_a_zero_peer() -> None:
    """ours/peer per round: median [min–max]; a round whose peer is 0 has no ratio."""
    assert spread([(1.0, 2.0), (3.0, 2.0), (2.0, 2.0)]) == "1.00× [0.50–1.50]"
    assert spread([(1.0, 0.0)]) == "n/a"


def test_the_budget_flag_takes_a_number_or_half() -> None:
    """``half`` is kept for later; a number passes through; anything else is refused."""
    plan = parse_args(["--server.time-budget", "half"]).budget
    assert plan is not None
    assert plan.budget_ms is None
    given = parse_args(["--server.time-budget", "150", "--budget-minutes", "1"]).budget
    assert given is not None
    assert (given.budget_ms, given.minutes) == (150.0, 1.0)
    assert parse_args([]).budget is None
    with pytest.raises(SystemExit):
        parse_args(["--server.time-budget", "lots"])
