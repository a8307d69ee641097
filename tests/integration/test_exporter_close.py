"""Shutdown of the exporter's connections: a pass in flight ends or is cancelled (D7)."""

from __future__ import annotations

import time
import uuid

from exporter.collect.cache import Outcome
from exporter.web.appstate import STATE
from rigs.localpg import LocalCluster
from tests.fixtures.helpers import exporter_backends
from tests.fixtures.polling import poll, poll_async
from tests.fixtures.rawhttp import RawClient, Start


def _sleeper(key: str, marker: str, seconds: float, timeout: float) -> str:
    return (
        f"{key}:\n  query: SELECT 1 AS {marker} FROM pg_sleep({seconds})\n"
        f"  timeout: {timeout}\n  metrics:\n    - {marker}: {{usage: GAUGE, description: x}}\n"
    )


async def test_close_waits_for_a_bounded_pass_then_closes(pg18: LocalCluster, start: Start) -> None:
    """Closing during a bounded collector lets it finish, then closes every connection."""
    m = f"m{uuid.uuid4().hex[:8]}"
    served = await start(pg18, _sleeper("slow", m, 1.0, timeout=5))
    exporter = served.app[STATE].exporter
    client = await RawClient.send(served.port)
    await poll(exporter.lock.locked, "the pass to start")
    await exporter.close(grace=10)
    client.hang_up()
    assert exporter.main.runtimes["slow"].outcome is Outcome.OK
    assert exporter.main.conn is None
    await poll_async(lambda: exporter_backends(pg18, "state = 'active'") == 0, "no busy backend")


async def test_close_cancels_a_pass_that_outlives_the_grace(
    pg18: LocalCluster, start: Start
) -> None:
    """An unbounded collector still running after the grace is cancelled in the server."""
    m = f"m{uuid.uuid4().hex[:8]}"
    served = await start(pg18, _sleeper("forever", m, 30, timeout=-1))
    exporter = served.app[STATE].exporter
    client = await RawClient.send(served.port)
    await poll(exporter.lock.locked, "the pass to start")
    began = time.monotonic()
    await exporter.close(grace=0.5)
    client.hang_up()
    assert time.monotonic() - began < 10  # not the 30 s query
    assert exporter.main.conn is None
    assert exporter.lock.locked(), "no pass may start on a closed exporter"
    busy = f"state = 'active' AND query LIKE '%{m}%'"
    await poll_async(lambda: exporter_backends(pg18, busy) == 0, "the query to be cancelled")
