"""Drop-in, judged by real clients: a Prometheus with default scrape settings stores our
names as the Go exporter's dashboards know them, and a real HAProxy routes writes the
way its health checks against the Go exporter would (issue 11)."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from rigs.localpg import LocalCluster, pg18_bindir
from tests.fixtures.helpers import http_get, samples
from tests.fixtures.polling import wait_for
from tests.fixtures.processes import Backend, exporter, haproxy, prometheus, settles

# --- Prometheus -------------------------------------------------------------------------

# Only the interval is shortened, so the test need not wait minutes; the scrape protocol
# (Accept header asking for OpenMetrics first, gzip) is Prometheus's default.
_PROMETHEUS_CONFIG = """
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: pg
    static_configs: [{targets: ['127.0.0.1:%d']}]
"""
# Series Prometheus makes itself for every target.
_SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped",
              "scrape_samples_post_metric_relabeling", "scrape_series_added"}  # fmt: skip


def _api(base: str, path: str, **params: str) -> object:
    query = urllib.parse.urlencode(params)
    status, text = http_get(f"{base}/api/v1/{path}?{query}")
    assert status == 200, text
    return json.loads(text)["data"]


def _scrapes(base: str) -> int:
    data = _api(base, "query", query="count_over_time(up[1h])")
    assert isinstance(data, dict)
    result = data["result"]
    return int(float(result[0]["value"][1])) if result else 0


def _types(exposition: str) -> dict[str, str]:
    return {
        line.split()[2]: line.split()[3]
        for line in exposition.splitlines()
        if line.startswith("# TYPE ")
    }


def test_prometheus_stores_every_name_as_exposed(
    pg18: LocalCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real Prometheus with default scrape settings stores exactly the names of our
    text exposition, with their types: no counter gains ``_total`` (pg_db_xact_commit
    stays pg_db_xact_commit), so dashboards written for the Go exporter find them."""
    with (
        exporter(pg18.dsn(), tmp_path / "exporter.log") as port,
        prometheus(tmp_path, _PROMETHEUS_CONFIG % port) as api,
    ):
        wait_for(lambda: _scrapes(api) >= 3, "three scrapes by prometheus")
        _, exposition = http_get(f"http://127.0.0.1:{port}/metrics")
        stored = _api(api, "label/__name__/values")
        metadata = _api(api, "metadata")
    assert isinstance(stored, list)
    assert isinstance(metadata, dict)
    exposed = {name for name, _ in samples(exposition)}
    ours = set(stored) - _SYNTHETIC
    assert ours - exposed == set(), "stored under names the exposition does not have"
    assert {"pg_up", "pg_db_xact_commit", "pg_exporter_scrape_total_count"} <= ours
    assert not {n for n in ours if n.endswith("_total") and n[: -len("_total")] in exposed}
    types = _types(exposition)
    mistyped = {
        name: (entries[0]["type"], types.get(name))
        for name, entries in metadata.items()
        if name in types and entries[0]["type"] != types[name]
    }
    assert mistyped == {}
    with capsys.disabled():
        pg_names = sorted(n for n in ours if n.startswith("pg_"))
        print(f"\nprometheus stored {len(ours)} names of ours, {len(pg_names)} pg_*")


# --- HAProxy ----------------------------------------------------------------------------


@pytest.fixture
def pair() -> Iterator[tuple[LocalCluster, LocalCluster]]:
    """A primary (a) and its streaming replica (b) of our own: this test stops one."""
    with LocalCluster(pg18_bindir()) as primary:
        yield primary, primary.make_replica()


def test_haproxy_routes_writes_to_the_primary_only(
    pair: tuple[LocalCluster, LocalCluster], tmp_path: Path
) -> None:
    """HAProxy in front of a primary's and a replica's exporters: OPTIONS /primary marks
    only the primary UP for writes, GET /replica only the replica UP for reads; once the
    primary stops, both checks mark it DOWN and the replica keeps serving reads."""
    primary, replica = pair
    logs = tmp_path / "logs"
    logs.mkdir()
    with (
        exporter(primary.dsn(), logs / "a.log", "--no-auto-discovery") as exp_a,
        exporter(replica.dsn(), logs / "b.log", "--no-auto-discovery") as exp_b,
    ):
        backends = [Backend("a", primary.port, exp_a), Backend("b", replica.port, exp_b)]
        with haproxy(tmp_path, backends) as stats:
            both_up = {
                ("writes", "a"): "UP", ("writes", "b"): "DOWN",
                ("reads", "a"): "DOWN", ("reads", "b"): "UP",
            }  # fmt: skip
            wait_for(lambda: settles(stats, both_up), f"checks to settle as {both_up}")
            assert http_get(f"http://127.0.0.1:{exp_b}/primary", "OPTIONS")[0] == 404
            primary.stop()
            primary_down = {**both_up, ("writes", "a"): "DOWN"}
            wait_for(lambda: settles(stats, primary_down), f"checks to settle as {primary_down}")
            assert http_get(f"http://127.0.0.1:{exp_a}/primary", "OPTIONS") == (503, "down")
