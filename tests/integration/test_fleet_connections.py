"""What a fleet holds open on its targets: nothing until a target is asked about, a
health probe only while load balancers ask, and a target's connections given back once
no pass collects it any more (a sharded replica never connects to the others' targets)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from exporter.config.settings import Settings
from exporter.fleet import members as fleet_module
from rigs.localpg import LocalCluster
from tests.fixtures.fleetrig import member, serving_fleet, write_targets
from tests.fixtures.helpers import write_collectors
from tests.fixtures.polling import poll_async
from tests.fixtures.rawhttp import get

pytestmark = pytest.mark.pg

_COLLECTORS = """
fleet_conn:
  query: "SELECT 1 AS v, '{marker}' AS m"
  ttl: 0
  metrics:
    - v: {{usage: GAUGE, description: one}}
    - m: {{usage: LABEL, description: marker}}
"""


def _backends(cluster: LocalCluster, application: str) -> int:
    """This test's exporter's connections: its targets' URLs name ``application``."""
    out = cluster.psql(
        f"SELECT count(*) FROM pg_stat_activity WHERE application_name = '{application}'"
    )
    return int(out.strip())


async def _count(cluster: LocalCluster, application: str) -> int:
    return await asyncio.to_thread(_backends, cluster, application)


async def test_a_fleet_connects_only_to_what_it_is_asked_about(
    pg18: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No connection at start; a probe opens the target's one (D5: opened on first use);
    a health request starts its probe (one more); both are given back once nobody asks
    (idle limits shortened)."""
    monkeypatch.setattr(fleet_module, "HEALTH_IDLE", 1.0)
    monkeypatch.setattr(fleet_module, "CONNECTIONS_IDLE", 1.0)
    monkeypatch.setattr(fleet_module, "JANITOR_PERIOD", 0.2)
    application = f"fleet_{uuid.uuid4().hex[:8]}"
    dsn = f"{pg18.dsn()}&application_name={application}"
    definitions = write_collectors(tmp_path, _COLLECTORS.format(marker=application))
    settings = Settings(connect_timeout=5.0, auto_discovery=False, config=str(tmp_path))
    targets = write_targets(
        tmp_path / "targets.yml", [{"name": "asked", "url": dsn}, {"name": "never", "url": dsn}]
    )
    async with serving_fleet(settings, definitions, targets) as served:
        # Serving has started: nothing is probing, nothing connected or connecting.
        for name in ("asked", "never"):
            assert not member(served, name).probing, name
            assert member(served, name).state.exporter.main.conn is None, name
        assert await _count(pg18, application) == 0, "connected before anything was asked"

        response = await get(served.port, "/probe?target=asked")
        assert response.status == 200
        assert await _count(pg18, application) == 1  # the pass's connection, kept

        health = await get(served.port, "/primary?target=asked")
        assert (health.status, health.text) == (200, "primary")  # the first answer waited for
        assert member(served, "asked").probing
        assert not member(served, "never").probing
        assert await _count(pg18, application) == 2  # and the probe's

        # Nobody asks any more: the probe stops, then the janitor closes the pass's one.
        await poll_async(lambda: _backends(pg18, application) == 0, "connections given back")
        assert not member(served, "asked").probing

        again = await get(served.port, "/probe?target=asked")  # and it connects again
        assert again.status == 200
        assert "fleet_conn_v" in again.text
