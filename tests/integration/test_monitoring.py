"""The monitoring mixin against a real Prometheus (issue 15): with the exporter scraped
every second on a loaded primary and its replica, every rule loads healthy, and every
expression of the recording rules and dashboards is valid PromQL that returns data."""

from __future__ import annotations

import contextlib
import json
import subprocess
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from rigs.localpg import LocalCluster, pg18_bindir
from tests.fixtures.helpers import http_get, terminate
from tests.fixtures.monitoring import RULE_FILES, Expression, dashboard_expressions, recording_rules
from tests.fixtures.polling import wait_for
from tests.fixtures.processes import exporter, prometheus

# Scrapes and rule evaluations every second, so that rates over the dashboards' 10 s
# window and the rules' 5 m windows have samples within seconds. extra-scrape-metrics
# gives scrape_timeout_seconds, the budget the exporter dashboard draws.
_CONFIG = """
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [%s]
scrape_configs:
  - job_name: pg
    static_configs: [{targets: ['127.0.0.1:%d', '127.0.0.1:%d']}]
"""
# Expressions that cannot return data in this set-up, each with the reason. Empty: the
# primary has a streaming replica and both are scraped, so every panel has series.
NO_DATA_HERE: dict[str, str] = {}
_LOAD_SECONDS = 40
_TPS = "max(pg:xact_total:rate5m)"


def _prometheus(home: Path, targets: tuple[int, int]) -> contextlib.AbstractContextManager[str]:
    """Debian's prometheus with the mixin's rule files, scraping ``targets``."""
    rules = ", ".join(f"'{path}'" for path in RULE_FILES)
    # The budget line of the exporter dashboard reads scrape_timeout_seconds.
    return prometheus(home, _CONFIG % (rules, *targets), "--enable-feature=extra-scrape-metrics")


@contextlib.contextmanager
def _pgbench(cluster: LocalCluster, seconds: int, log: Path) -> Iterator[None]:
    """pgbench writing to ``cluster`` for ``seconds`` (in a database of its own)."""
    cluster.psql("CREATE DATABASE bench")
    pgbench = str(cluster.bindir / "pgbench")
    dsn = cluster.dsn("bench")
    subprocess.run([pgbench, "-i", "-q", "-s", "1", dsn], capture_output=True, check=True)
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [pgbench, "-c", "2", "-T", str(seconds), "-n", dsn], stdout=sink, stderr=sink
        )
    try:
        yield
    finally:
        terminate(process)


def _api(base: str, path: str, **params: str) -> tuple[int, dict[str, object]]:
    status, text = http_get(f"{base}/api/v1/{path}?{urllib.parse.urlencode(params)}")
    return status, json.loads(text) if text else {}


def _problem(base: str, expression: Expression) -> str | None:
    """Why ``expression`` fails here: invalid PromQL or no data; None when it has data."""
    status, answer = _api(base, "query", query=expression.promql)
    if status != 200:
        return f"{expression.where}: {answer.get('error', status)}"
    data = answer["data"]
    assert isinstance(data, dict)
    if not data["result"]:
        return f"{expression.where}: no data for {expression.promql}"
    return None


def _value(base: str, promql: str) -> float:
    """The single value ``promql`` evaluates to now."""
    _, answer = _api(base, "query", query=promql)
    data = answer["data"]
    assert isinstance(data, dict)
    assert len(data["result"]) == 1, data
    return float(data["result"][0]["value"][1])


def _unhealthy_rules(base: str) -> list[str]:
    _, answer = _api(base, "rules")
    data = answer["data"]
    assert isinstance(data, dict)
    rules = [rule for group in data["groups"] for rule in group["rules"]]
    assert rules, "prometheus loaded no rules"
    not_ok = [f"{r['name']}: {r['health']} {r.get('lastError', '')}" for r in rules]
    return [line for rule, line in zip(rules, not_ok, strict=True) if rule["health"] != "ok"]


@pytest.fixture
def pair() -> Iterator[tuple[LocalCluster, LocalCluster]]:
    """A PostgreSQL 18 primary and its streaming replica, ours alone: pgbench loads it.
    pg_stat_statements holds more statements than pg_query names (100), so that the
    Statements row and its rules have named series and a query="other" remainder."""
    with LocalCluster(pg18_bindir()) as primary:
        primary.psql("CREATE EXTENSION pg_stat_statements")
        primary.psql("; ".join(f"CREATE TABLE shape{n} (x int)" for n in range(150)))
        yield primary, primary.make_replica()


def test_mixin_on_a_real_prometheus(
    pair: tuple[LocalCluster, LocalCluster], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every rule of monitoring/rules loads and evaluates healthy, and every expression of
    the recording rules and both dashboards returns data from a loaded primary and its
    replica, except those NO_DATA_HERE names with the reason."""
    primary, replica = pair
    expressions = [*recording_rules(), *dashboard_expressions()]
    assert {e.where for e in expressions} >= NO_DATA_HERE.keys(), "NO_DATA_HERE is stale"
    expected = [e for e in expressions if e.where not in NO_DATA_HERE]
    with (
        _pgbench(primary, _LOAD_SECONDS, tmp_path / "pgbench.log"),
        exporter(primary.dsn(), tmp_path / "primary.log") as on_primary,
        exporter(replica.dsn(), tmp_path / "replica.log") as on_replica,
        _prometheus(tmp_path, (on_primary, on_replica)) as prometheus,
    ):

        def all_answer() -> bool:
            return not [e for e in expected if _problem(prometheus, e)]

        with contextlib.suppress(AssertionError):
            wait_for(all_answer, "every expression to return data", within=_LOAD_SECONDS - 10)
        problems = [p for e in expected if (p := _problem(prometheus, e))]
        unhealthy = _unhealthy_rules(prometheus)
        # pg_db's ttl is 10 s: the rate shows the load once its counters were read twice.
        with contextlib.suppress(AssertionError):
            wait_for(lambda: _value(prometheus, _TPS) > 10, "the load to show", within=25)
        tps = _value(prometheus, _TPS)
    assert problems == []
    assert unhealthy == []
    assert tps > 10, "pgbench's load did not show in the recorded transaction rate"
    with capsys.disabled():
        print(f"\n{len(expected)} mixin expressions returned data; recorded {tps:.0f} tps")
