"""A wrong password for real: the failed logins it costs PostgreSQL 18 (issue 25).

Clients hammer a target whose password is wrong (a rotation in progress); each failed
login is a ``password authentication failed`` line in the server's log, which lockout
and fail2ban-style tools count against the exporter's address. Passes and the health
probe share one back-off per target, so the server sees a few, not hundreds; pg_up and
health stay truthful, and a reload after the fix logs in at once.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest

from rigs.localpg import LocalCluster, pg18_bindir
from tests.fixtures.fleetrig import serving_fleet, write_targets
from tests.fixtures.helpers import settings_for, value, write_collectors
from tests.fixtures.rawhttp import serving

HAMMER_SECONDS = 6.0
CLIENTS = 4
# Without the back-off these 6 s cost hundreds of failed logins; with it, attempts at about
# 0, 1, 3 and 7 s (less jitter), one at a time: a handful. Wide margin for slow machines.
MOST_FAILED_LOGINS = 12
COLLECTORS = """
one:
  query: SELECT 1 AS one
  timeout: 5
  metrics:
    - one: {usage: GAUGE, description: one}
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """A PostgreSQL 18 cluster of this module's own, so its pg_hba.conf is ours to change."""
    with LocalCluster(pg18_bindir()) as cluster:
        yield cluster


@pytest.fixture
def role(cluster: LocalCluster) -> str:
    """A pg_monitor role that must log in over TCP with its password (scram-sha-256)."""
    name = f"mon_{uuid.uuid4().hex[:8]}"
    cluster.psql(f"CREATE ROLE {name} LOGIN PASSWORD 'right' IN ROLE pg_monitor")
    hba = cluster.data_dir / "pg_hba.conf"
    hba.write_text(f"host all {name} 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
    cluster.psql("SELECT pg_reload_conf()")
    return name


def _url(cluster: LocalCluster, role: str, password: str) -> str:
    return f"postgresql://{role}:{password}@127.0.0.1:{cluster.port}/postgres?sslmode=disable"


def _failed_logins(cluster: LocalCluster, role: str) -> int:
    return cluster.log_text().count(f'password authentication failed for user "{role}"')


async def _hammer(urls: list[str], seconds: float = HAMMER_SECONDS) -> int:
    """CLIENTS clients asking ``urls`` in turn, back to back, for ``seconds``; requests made."""
    done = 0
    stop = time.monotonic() + seconds

    async def client(index: int, session: aiohttp.ClientSession) -> None:
        nonlocal done
        while time.monotonic() < stop:
            async with session.get(urls[(index + done) % len(urls)]) as response:
                await response.read()
            done += 1

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(i, session) for i in range(CLIENTS)))
    return done


async def _get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


async def _eventually(
    check: Callable[[], Awaitable[bool]], what: str, within: float = 15.0
) -> None:
    """Poll ``check`` until it returns True."""
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def test_single_target_wrong_password_costs_a_few_failed_logins(
    cluster: LocalCluster, role: str, tmp_path: Path
) -> None:
    """4 clients scraping /metrics and asking /up for 6 s: a handful of failed logins, not
    hundreds; pg_up 0 and /up 503 throughout; fixed password + /reload: up at once."""
    settings = replace(settings_for(cluster), url=_url(cluster, role, "wrong"))
    definitions = write_collectors(tmp_path, COLLECTORS)
    async with serving(settings, definitions) as served:
        base = f"http://127.0.0.1:{served.port}"
        start = _failed_logins(cluster, role)
        requests = await _hammer([f"{base}/metrics", f"{base}/metrics", f"{base}/up"])
        failed = _failed_logins(cluster, role) - start
        assert requests > 100, requests  # the clients really hammered
        assert 1 <= failed <= MOST_FAILED_LOGINS, failed
        body = (await _get(f"{base}/metrics"))[1]
        assert value(body, "pg_up") == 0
        assert value(body, "pg_exporter_connections_logins_held_total") > 100
        assert 0 < value(body, "pg_exporter_connections_login_wait_seconds") <= 60
        assert (await _get(f"{base}/up"))[0] == 503
        cluster.psql(f"ALTER ROLE {role} PASSWORD 'wrong'")  # the rotation completes
        assert (await _get(f"{base}/reload"))[0] == 200

        async def up_again() -> bool:
            scraped = value((await _get(f"{base}/metrics"))[1], "pg_up") == 1
            return scraped and (await _get(f"{base}/up"))[0] == 200

        began = time.monotonic()
        await _eventually(up_again, "pg_up 1 and /up 200 after the fix and a reload")
        assert time.monotonic() - began < 5.0  # not the back-off's ceiling of 60 s


async def test_fleet_wrong_password_costs_a_few_failed_logins(
    cluster: LocalCluster, role: str, tmp_path: Path
) -> None:
    """The same in fleet mode, /probe and /up of the one target hammered: its passes and
    its health probe share the back-off; pg_up 0 and /up 503 stay truthful."""
    targets = write_targets(
        tmp_path / "targets.yml", [{"name": "a", "url": _url(cluster, role, "wrong")}]
    )
    definitions = write_collectors(tmp_path, COLLECTORS)
    async with serving_fleet(settings_for(cluster), definitions, targets) as served:
        base = f"http://127.0.0.1:{served.port}"
        start = _failed_logins(cluster, role)
        requests = await _hammer([f"{base}/probe?target=a", f"{base}/up?target=a"])
        failed = _failed_logins(cluster, role) - start
        assert requests > 100, requests
        assert 1 <= failed <= MOST_FAILED_LOGINS, failed
        assert value((await _get(f"{base}/probe?target=a"))[1], "pg_up") == 0
        assert (await _get(f"{base}/up?target=a"))[0] == 503
