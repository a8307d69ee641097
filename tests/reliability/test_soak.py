"""Soak: thousands of mixed scrapes against one exporter process leave nothing behind.

The load, the sampling and the figures are those of ``soak.py`` next to this file
(the long run is ``.venv/bin/python -m tests.reliability.soak``); here a short run
asserts flatness with wide margins: resident memory, file descriptors, asyncio tasks
and database connections come back to their baseline, and no admission slot leaks.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rigs.localpg import LocalCluster, pg18_bindir
from tests.reliability.soak import CONNECTION_CAP, MIX, SoakConfig, SoakResult, report, soak

pytestmark = pytest.mark.pg


@pytest.fixture(scope="module")
def soak_cluster() -> Iterator[LocalCluster]:
    """A cluster of our own (statement logging off: thousands of statements)."""
    with LocalCluster(pg18_bindir()) as cluster:
        yield cluster


def check_flat(result: SoakResult, *, rss_growth_mib: float) -> None:
    """The assertions shared by the short and the long run."""
    print(report(result))  # the figures, in the test's output (-s) or on failure
    base, end = result.baseline, result.idle_end
    assert base is not None
    assert end is not None
    assert result.unexpected == [], result.unexpected
    assert result.log_errors == [], result.log_errors[:3]
    # Every kind of request was sent, and the mix reached both answers.
    assert set(result.outcomes) >= {action.__name__ for action, _ in MIX}
    assert result.outcomes["normal"].get("200", 0) > 0
    assert result.outcomes["burst"].get("503", 0) > 0  # admission refused the excess
    assert result.outcomes["budget"].get("tiny:503", 0) > 0  # tiny budgets ran out
    # Flat: memory, descriptors, tasks, connections.
    assert (end.rss_kib - base.rss_kib) / 1024 < rss_growth_mib
    assert abs(end.fds - base.fds) <= 5
    assert end.tasks <= base.tasks + 2
    assert result.max_connections <= CONNECTION_CAP
    assert end.connections <= CONNECTION_CAP
    # No slot leaked: idle, the gauge counts only the scrape reading it, and two
    # scrapes at once are both admitted.
    assert result.idle_in_flight == 1
    assert result.final_statuses == [200, 200]


async def test_short_soak_stays_flat(soak_cluster: LocalCluster, tmp_path: Path) -> None:
    """~3000 mixed scrapes (about 25 s): flat memory, fds, tasks, connections; no slot leak."""
    config = SoakConfig(scrapes=3000, sample_every=1.0, warmup=300, max_seconds=90, seed=3)
    result = await soak(config, soak_cluster, tmp_path)
    check_flat(result, rss_growth_mib=20)


@pytest.mark.slow
async def test_long_soak_stays_flat(soak_cluster: LocalCluster, tmp_path: Path) -> None:
    """20 000 mixed scrapes (a few minutes): the same, and after the warm-up RSS grows by
    less than 200 KiB per 1000 scrapes by its least-squares slope (measured: +37 KiB)."""
    config = SoakConfig(scrapes=20_000, sample_every=5.0, warmup=500, max_seconds=900)
    result = await soak(config, soak_cluster, tmp_path)
    check_flat(result, rss_growth_mib=20)
    assert result.slope("rss_kib") < 200  # KiB per 1000 scrapes
    assert abs(result.slope("fds")) < 1
