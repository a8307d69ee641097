"""A real HA pair: two Debian Prometheus servers scrape one exporter process every second.

One run (about 40 s) of ``ha_pair.py`` (next to this file) with a shortened first
phase: 22 scrapes per server of a fast, a 0.6 s bounded (ttl 5) and an unbounded
collector, then 3 per server with a collector slower than the 0.9 s scrape timeout.
Each test checks one claim against the Prometheus HTTP API, the statement log or what
the recording proxies saw at the exporter's socket;
``python -m tests.reliability.ha_pair --minutes N`` runs the same checks for longer
and prints them as a table.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.fixtures.programs import required
from tests.reliability.ha_pair import Row, figures, run_pair, table

pytestmark = pytest.mark.pg  # it starts its own PostgreSQL 18
NORMAL_SCRAPES = 22  # per server: about four TTL windows of the cached collector
OVERRUN_SCRAPES = 3


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Row]:
    """The checks of one HA-pair run, by key; the whole table is printed for the log."""
    required("prometheus", package="prometheus")
    workdir: Path = tmp_path_factory.mktemp("ha-pair")
    run = asyncio.run(run_pair(NORMAL_SCRAPES, OVERRUN_SCRAPES, workdir))
    measured = figures(run)
    print(table(measured))
    return {row.key: row for row in measured}


def _holds(rows: dict[str, Row], *keys: str) -> None:
    failed = [rows[key] for key in keys if not rows[key].ok]
    assert not failed, "\n" + table(failed)


def test_up_is_1_on_both_servers_throughout(rows: dict[str, Row]) -> None:
    """Every stored `up` and `pg_up` sample of both servers is 1, also at query_range steps."""
    _holds(rows, "up", "pg_up")


def test_no_sample_is_missing(rows: dict[str, Row]) -> None:
    """Each server stored one sample per second of the run, with no gap over 1.5 s."""
    _holds(rows, "samples")


def test_scrape_duration_stays_within_the_timeout(rows: dict[str, Row]) -> None:
    """`scrape_duration_seconds` stays under the 0.9 s scrape timeout, even when the
    0.6 s collector is refreshed."""
    _holds(rows, "duration")


def test_cached_collector_runs_once_per_ttl_window_not_per_scraper(rows: dict[str, Row]) -> None:
    """The statement log shows the ttl-5 collector at most once per 5 s for both servers
    together, while the ttl-0 collectors run on every pass."""
    _holds(rows, "cached", "per_pass")


def test_no_503_in_normal_operation(rows: dict[str, Row]) -> None:
    """Every scrape got 200, none was abandoned, and the exporter's rejected and
    interrupted counters stayed 0 (as Prometheus stored them, and at the end)."""
    _holds(rows, "no_503", "counters", "exporter")


def test_prometheus_scrape_timeout_becomes_the_budget(rows: dict[str, Row]) -> None:
    """Prometheus's 0.9 s header reaches the exporter on every scrape, and a 2 s collector
    then gets 503 'budget ran out' after about 0.9 s (not 200 after 2 s): `up` 0, SQL
    cancelled in the server."""
    _holds(rows, "header", "budget", "overrun")
