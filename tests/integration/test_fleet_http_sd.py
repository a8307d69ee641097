"""A real Prometheus discovers a fleet's targets from the exporter itself (``/sd``,
``http_sd_configs``): the targets are declared once, in the targets file, and a reload
that adds one reaches Prometheus without touching its config."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

import pytest

from rigs.localpg import LocalCluster
from tests.fixtures.helpers import COLLECTORS, http_get
from tests.fixtures.polling import wait_for
from tests.fixtures.processes import fleet_exporter, prometheus

pytestmark = pytest.mark.pg

_CONFIG = """
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: pg-fleet
    metrics_path: /probe
    http_sd_configs:
      - url: http://127.0.0.1:{port}/sd
        refresh_interval: 1s
    relabel_configs:
      - source_labels: [__address__]
        target_label: __param_target
      - source_labels: [__param_target]
        target_label: instance
      - target_label: __address__
        replacement: 127.0.0.1:{port}
"""


def _targets(cluster: LocalCluster, names: list[str]) -> str:
    entries = "".join(
        f"  - name: {name}\n    url: {cluster.dsn()}\n    auto_discovery: false\n" for name in names
    )
    return "targets:\n" + entries


def _up_by_instance(base: str) -> dict[str, float]:
    query = urllib.parse.urlencode({"query": 'up{job="pg-fleet"}'})
    status, body = http_get(f"{base}/api/v1/query?{query}")
    assert status == 200, body
    return {
        row["metric"]["instance"]: float(row["value"][1])
        for row in json.loads(body)["data"]["result"]
    }


def test_prometheus_discovers_the_declared_targets_from_the_exporter(
    pg18: LocalCluster, tmp_path: Path
) -> None:
    targets = tmp_path / "targets.yml"
    targets.write_text(_targets(pg18, ["alpha", "beta"]))
    with fleet_exporter(targets, COLLECTORS, tmp_path / "exporter.log") as port:
        status, body = http_get(f"http://127.0.0.1:{port}/sd")
        assert status == 200
        groups = json.loads(body)
        assert [group["targets"] for group in groups] == [["alpha"], ["beta"]]
        assert pg18.dsn() not in body  # names only, never a URL
        home = tmp_path / "prometheus"
        home.mkdir()
        with prometheus(home, _CONFIG.format(port=port)) as base:
            wait_for(
                lambda: _up_by_instance(base) == {"alpha": 1.0, "beta": 1.0},
                "Prometheus to scrape both declared targets through /probe",
                within=30,
            )
            targets.write_text(_targets(pg18, ["alpha", "beta", "gamma"]))
            assert http_get(f"http://127.0.0.1:{port}/reload", "POST")[0] == 200
            wait_for(
                lambda: _up_by_instance(base).get("gamma") == 1.0,
                "Prometheus to discover and scrape the target added by a reload",
                within=30,
            )
