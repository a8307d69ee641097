"""What a user upgrading from the Go exporter's 1.6 line expects, on a real server.

The Go releases after 1.4.1 changed how a collector's result and its timings are
judged (compatibility §8): repeated label sets fail a GAUGE or COUNTER collector
(1.6.1), a declared LABEL column missing from the result fails it (1.4.1), and a
ttl or timeout is any finite number of seconds a Go duration can hold (1.5.0).
"""

from __future__ import annotations

import math
import platform
import re
import subprocess
import sys
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp.plugin import AiohttpClient

from exporter.web.app import create_app
from rigs.localpg import LocalCluster
from tests.fixtures.helpers import (
    COLLECTORS,
    REPO,
    http_get,
    samples,
    settings_for,
    terminate,
    value,
    write_collectors,
)
from tests.fixtures.polling import wait_for

Client = TestClient[web.Request, web.Application]


async def _scrape(
    aiohttp_client: AiohttpClient, cluster: LocalCluster, text: str, tmp_path: Path
) -> str:
    """One scrape of ``text``'s collectors against the cluster's main database."""
    definitions = write_collectors(tmp_path, text)
    settings = settings_for(cluster, auto_discovery=False)
    client: Client = await aiohttp_client(create_app(settings, definitions))
    response = await client.get("/metrics")
    assert response.status == 200, await response.text()
    return await response.text()


def _errors(body: str, query: str) -> float:
    return value(body, "pg_exporter_query_scrape_error_count", query=query)


REPEATED = """
repeated:
  query: SELECT * FROM (VALUES ('a', 1), ('b', 2), ('a', 3)) AS t(k, v)
  timeout: 5
  metrics:
    - k: {usage: LABEL, description: a label whose values repeat}
    - v: {usage: GAUGE, description: a value}
unlabelled:
  query: SELECT * FROM (VALUES (1), (2)) AS t(v)
  timeout: 5
  metrics:
    - v: {usage: COUNTER, description: two rows and no label}
unique:
  query: SELECT * FROM (VALUES ('a', 1), ('b', 2)) AS t(k, v)
  priority: 200
  timeout: 5
  metrics:
    - k: {usage: LABEL, description: a label}
    - v: {usage: GAUGE, description: a value}
"""


async def test_repeated_label_sets_fail_a_gauge_or_counter_collector_alone(
    aiohttp_client: AiohttpClient, pg18: LocalCluster, tmp_path: Path
) -> None:
    """Rows repeating a label set fail their collector as a whole (Go 1.6.1): none of its
    series, an error counted; the next collector and pg_up are untouched."""
    body = await _scrape(aiohttp_client, pg18, REPEATED, tmp_path)
    names = {name for name, _ in samples(body)}
    assert not names & {"repeated_v", "unlabelled_v"}, names
    assert _errors(body, "repeated") == 1
    assert _errors(body, "unlabelled") == 1
    assert value(body, "unique_v", k="b") == 2
    assert value(body, "pg_up") == 1
    assert value(body, "pg_exporter_scrape_error_count") == 0


async def test_repeated_label_sets_in_a_fatal_collector_fail_the_pass(
    aiohttp_client: AiohttpClient, pg18: LocalCluster, tmp_path: Path
) -> None:
    """A ``fatal`` collector with repeated label sets fails the pass, as any fatal error."""
    text = REPEATED.replace("  timeout: 5\n", "  timeout: 5\n  fatal: true\n", 1)
    body = await _scrape(aiohttp_client, pg18, text, tmp_path)
    assert value(body, "pg_up") == 0
    assert math.isnan(value(body, "unique_v", k="a"))
    assert value(body, "pg_exporter_scrape_error_count") == 1


async def test_histogram_only_collector_still_merges_repeated_label_sets(
    aiohttp_client: AiohttpClient, pg15: LocalCluster, tmp_path: Path
) -> None:
    """A collector of HISTOGRAM columns only folds rows of one label set into one
    distribution; one that also has a GAUGE fails on the same rows."""
    rows = "SELECT * FROM (VALUES ('a', 0.2, 1), ('a', 0.7, 1), ('b', 0.1, 1)) AS t(grp, v, n)"
    text = f"""
    lat:
      query: {rows}
      timeout: 5
      metrics:
        - grp: {{usage: LABEL, description: group}}
        - v: {{usage: HISTOGRAM, bucket: [0.5, 1], description: latency}}
    mixed:
      query: {rows}
      timeout: 5
      metrics:
        - grp: {{usage: LABEL, description: group}}
        - v: {{usage: HISTOGRAM, bucket: [0.5, 1], description: latency}}
        - n: {{usage: GAUGE, description: a scalar beside the histogram}}
    """
    body = await _scrape(aiohttp_client, pg15, text, tmp_path)
    assert value(body, "lat_v_count", grp="a") == 2
    assert value(body, "lat_v_bucket", grp="a", le="0.5") == 1
    assert _errors(body, "lat") == 0
    assert math.isnan(value(body, "mixed_v_count", grp="a"))
    assert _errors(body, "mixed") == 1


async def test_missing_label_column_fails_the_collector_as_a_whole(
    aiohttp_client: AiohttpClient, pg15: LocalCluster, tmp_path: Path
) -> None:
    """A declared LABEL column absent from the result fails its collector: no series
    with an empty label, an error counted (Go 1.4.1); the others go on."""
    text = """
    nolabel:
      query: SELECT 1 AS v
      timeout: 5
      metrics:
        - k: {usage: LABEL, description: never returned}
        - v: {usage: GAUGE, description: a value}
    fine:
      query: SELECT 1 AS v
      timeout: 5
      metrics:
        - v: {usage: GAUGE, description: a value}
    """
    body = await _scrape(aiohttp_client, pg15, text, tmp_path)
    assert not [name for name, _ in samples(body) if name == "nolabel_v"]
    assert _errors(body, "nolabel") == 1
    assert value(body, "fine_v") == 1


async def test_timeouts_a_go_duration_holds_run(
    aiohttp_client: AiohttpClient, pg18: LocalCluster, tmp_path: Path
) -> None:
    """A timeout and ttl of a year (more than PostgreSQL's statement_timeout can hold)
    are accepted, as Go 1.6 accepts them, and the collector runs."""
    text = """
    patient:
      query: SELECT 1 AS v
      ttl: 31536000
      timeout: 31536000
      predicate_queries:
        - {name: yes, predicate_query: SELECT true, ttl: 31536000}
      metrics:
        - v: {usage: GAUGE, description: a value}
    """
    body = await _scrape(aiohttp_client, pg18, text, tmp_path)
    assert value(body, "patient_v") == 1
    assert _errors(body, "patient") == 0


ONE = """
one:
  query: SELECT 1 AS v
  metrics:
    - v: {usage: GAUGE, description: one}
"""

#: Go's names for the machines Python calls otherwise (runtime.GOARCH).
GO_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64", "amd64": "amd64"}


async def test_build_info_has_the_go_exporter_labels(
    aiohttp_client: AiohttpClient, pg18: LocalCluster, tmp_path: Path
) -> None:
    """pg_exporter_build_info carries Go's goversion, goos and goarch, with values true
    for this process, beside the labels it had."""
    body = await _scrape(aiohttp_client, pg18, ONE, tmp_path)
    (labels,) = [dict(lbls) for name, lbls in samples(body) if name == "pg_exporter_build_info"]
    assert labels["goversion"] == f"python{platform.python_version()}"
    assert labels["goos"] == "linux"
    assert labels["goarch"] == GO_ARCH.get(platform.machine(), platform.machine())
    assert {"version", "revision", "branch", "builddate", "pyversion", "os", "arch"} < set(labels)


_LISTENING = re.compile(r"msg=listening address=127\.0\.0\.1:(\d+)")


def test_port_zero_listens_on_a_free_port_and_logs_it(pg18: LocalCluster, tmp_path: Path) -> None:
    """``--web.listen-address 127.0.0.1:0`` serves on a port the system picks, and the
    start-up log names that port, which answers scrapes."""
    log = tmp_path / "exporter.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "exporter", "-u", pg18.dsn(), "-c", str(COLLECTORS),
             "--web.listen-address", "127.0.0.1:0", "-T", "5000", "--no-auto-discovery"],
            cwd=REPO, stdout=sink, stderr=sink,
        )  # fmt: skip
    try:
        wait_for(lambda: _LISTENING.search(log.read_text()) is not None, "the listening line")
        found = _LISTENING.search(log.read_text())
        assert found is not None
        port = int(found.group(1))
        assert port > 0
        status, body = http_get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        assert value(body, "pg_up") == 1
    finally:
        assert terminate(process) == 0, log.read_text()
