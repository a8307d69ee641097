"""bench.ranking runs the library's ranking over pg_query-shaped rows and reports a CPU
time and a state size per key (issue 38)."""

from __future__ import annotations

import pytest

from bench import ranking


def test_measure_reports_cpu_per_run_and_state_per_key() -> None:
    cpu, per_key = ranking.measure(keys=300, moving=0.5, runs=5, limit=10)
    assert cpu >= 0
    assert 100 < per_key < 10_000  # a _Key, its last values and its cells at least


def test_the_table_has_a_row_per_share_moving(capsys: pytest.CaptureFixture[str]) -> None:
    assert ranking.main(["--keys", "200", "--runs", "5", "--moving", "0", "--moving", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 200 |")]
    assert [row.split("|")[2].strip() for row in rows] == ["0%", "100%"]
