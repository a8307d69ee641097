"""A replica promoted under a running exporter: metrics and plan follow (§4 re-planning)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from exporter.config.loading import load_definitions
from rigs.localpg import LocalCluster, pg18_bindir
from tests.fixtures.helpers import settings_for, value
from tests.fixtures.polling import poll_async
from tests.fixtures.rawhttp import get, serving


async def test_promotion_is_followed_by_metrics_and_plan(tmp_path: Path) -> None:
    """After a replica is promoted, pg_in_recovery turns 0 and primary branches are planned."""
    text = (
        "role_primary:\n  name: role\n  query: SELECT 1 AS primary_side\n  timeout: 5\n"
        "  tags: [primary]\n  metrics:\n    - primary_side: {usage: GAUGE, description: p}\n"
        "role_replica:\n  name: role\n  query: SELECT 1 AS replica_side\n  timeout: 5\n"
        "  tags: [replica]\n  metrics:\n    - replica_side: {usage: GAUGE, description: r}\n"
    )
    (tmp_path / "roles.yml").write_text(text)
    with LocalCluster(pg18_bindir()) as primary:
        replica = primary.make_replica()
        try:
            settings = replace(settings_for(replica, auto_discovery=False), config=str(tmp_path))
            async with serving(settings, load_definitions(str(tmp_path))) as served:
                before = (await get(served.port)).text
                assert value(before, "pg_in_recovery") == 1
                assert value(before, "role_replica_side") == 1
                await asyncio.to_thread(replica.psql, "SELECT pg_promote()")
                await poll_async(
                    lambda: replica.psql("SELECT pg_is_in_recovery()").strip() == "f", "promotion"
                )
                after = (await get(served.port)).text
                assert value(after, "pg_in_recovery") == 0
                assert value(after, "role_primary_side") == 1
                assert "role_replica_side" not in after
        finally:
            replica.close()
