"""The OCI image: built by scripts/image, run under podman against a real PostgreSQL."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rigs.localpg import LocalCluster
from tests.fixtures.helpers import value
from tests.packaging.conftest import REPO, assert_compiled_paths, run
from tests.packaging.containers import UID, Podman, Running, start
from tests.packaging.cost import LIMIT, UNCACHED, WARMUP, cpu_ratio, scrape, serving


@pytest.fixture
def exporter(podman: Podman, image: str, cluster: LocalCluster) -> Iterator[Running]:
    """The image scraping the test cluster; killed if a test left it running."""
    running = start(podman, image, {"PG_EXPORTER_URL": cluster.dsn()})
    yield running
    if running.process.poll() is None:
        running.process.kill()
        running.process.wait()


def test_the_image_serves_pg_up_1_as_a_non_root_user_and_exits_0_on_sigterm(
    exporter: Running, podman: Podman
) -> None:
    """Read-only root, host network: /metrics says pg_up 1, the uid is 9630, SIGTERM exits 0."""
    seconds = exporter.wait_for("/metrics")
    print(f"start-up to first successful scrape: {seconds:.2f} s")
    status, body = exporter.get("/metrics")
    assert status == 200, body
    assert value(body, "pg_up") == 1, body[:2000]
    inspect = run(*podman.prefix, "inspect", exporter.name).stdout
    pid = json.loads(inspect)[0]["State"]["Pid"]
    uids = Path(f"/proc/{pid}/status").read_text().split("Uid:")[1].split()[:4]
    assert uids == [str(UID)] * 4
    code, took = exporter.stop()
    assert code == 0, exporter.output()
    assert took < 15, f"{took:.1f} s from SIGTERM to exit"
    assert "Traceback" not in exporter.output()


def test_the_image_logs_to_stderr_and_takes_the_packages_environment(
    podman: Podman, image: str, cluster: LocalCluster
) -> None:
    """PG_EXPORTER_* variables apply (a constant label); logs go to stderr, not stdout."""
    env = {"PG_EXPORTER_URL": cluster.dsn(), "PG_EXPORTER_LABEL": "pod=db-0"}
    running = start(podman, image, env)
    try:
        running.wait_for("/metrics")
        assert value(running.get("/metrics")[1], "pg_up", pod="db-0") == 1
    finally:
        assert running.stop()[0] == 0
    out, err = running.process.communicate()
    assert out == ""
    assert "level=info" in err, err


def test_the_image_runs_the_compiled_code_paths(podman: Podman, image: str) -> None:
    """Debian 12's python3 in the image loads psycopg's C implementation against the
    image's libpq5, aiohttp's C parser, multidict's and yarl's C extensions."""
    assert_compiled_paths(run(*podman.run_argv(image, "--version")).stdout)


def test_the_image_scrape_cpu_is_within_115_percent_of_the_venv(
    podman: Podman, image: str, cluster: LocalCluster
) -> None:
    """Uncached, the image's exporter (its pid seen from here) costs at most 1.15x the
    venv's CPU per scrape, measured side by side as for the installed package."""
    running = start(podman, image, {"PG_EXPORTER_URL": cluster.dsn()}, *UNCACHED)
    try:
        running.wait_for("/metrics")
        for _ in range(WARMUP):
            scrape(running.port)
        inspect = run(*podman.prefix, "inspect", running.name).stdout
        mine = (int(json.loads(inspect)[0]["State"]["Pid"]), running.port)
        venv = [sys.executable, "-m", "exporter", "--config", str(REPO / "collectors")]
        with serving(venv, cluster.dsn()) as theirs:
            ratio, per_scrape = cpu_ratio(mine, theirs)
    finally:
        assert running.stop()[0] == 0
    print(f"CPU per uncached scrape, ms, image / venv: {per_scrape}; {ratio:.2f}")
    assert ratio <= LIMIT, per_scrape
