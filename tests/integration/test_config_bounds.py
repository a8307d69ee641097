"""/reload refuses an alias bomb as start-up does: quickly, in a short message, serving on."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from exporter.config.loading import load_definitions
from rigs.localpg import LocalCluster
from tests.fixtures.helpers import settings_for, value
from tests.fixtures.rawhttp import RawClient, get, serving
from tests.reliability.test_hostile_config import BOMB, SECONDS, VALID


async def test_reload_refuses_an_alias_bomb_and_keeps_serving(
    pg18: LocalCluster, tmp_path: Path
) -> None:
    """A bomb written over the config: /reload answers 500 in seconds with a short reason
    naming the file and line, and the running config serves on."""
    path = tmp_path / "collectors.yml"
    path.write_text(VALID)
    settings = replace(settings_for(pg18, auto_discovery=False), config=str(path))
    async with serving(settings, load_definitions(str(path))) as served:
        path.write_text(BOMB)
        started = time.monotonic()
        client = await RawClient.send(served.port, "/reload", method="POST")
        response = await client.response()
        assert time.monotonic() - started < SECONDS
        assert response.status == 500
        assert f"{path}:line 6: aliases expand the document" in response.text
        assert len(response.body) < 2000, response.text[:2000]
        assert value((await get(served.port)).text, "pg_ok_v") == 1
