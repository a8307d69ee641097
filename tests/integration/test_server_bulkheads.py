"""Per-server bulkheads on a real PostgreSQL (issue 29, finding 4).

A fleet of thousands of targets that all live on one small PostgreSQL (max_connections
40), half of them with a wrong password, half named ``localhost`` and half
``127.0.0.1``, is hammered by hundreds of anonymous health requests and some probes.
What the exporter holds there (pg_stat_activity, application_name pg_exporter) stays
within the per-server cap, its failed logins (the server's log) within the per-server
bound, and an application's connection still gets in. Before the bulkheads the health
probes alone took every slot the server had and failed logins ran at dozens a second.

The exporter runs as a process with its defaults (20 connections, 60 failed logins a
minute per server); the watcher and the application run in threads of their own, so
that the test's busy event loop cannot hide a moment over the cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest

from exporter.config.settings import DEFAULT_SERVER_MAX_CONNECTIONS as CAP
from exporter.config.settings import DEFAULT_SERVER_MAX_FAILED_LOGINS as FAILED_A_MINUTE
from rigs.localpg import LocalCluster, free_port, pg18_bindir
from tests.fixtures.fleetrig import write_targets
from tests.fixtures.helpers import REPO, http_get, terminate, value, write_collectors
from tests.fixtures.polling import wait_for

pytestmark = pytest.mark.pg

SERVER_MAX_CONNECTIONS = 40  # the server's: 37 for ordinary roles, 3 kept for superusers
TARGETS = 1500  # of each kind: right and wrong password
NAMED = 400  # of each kind, named by the clients
CLIENTS = 300  # anonymous health clients at once
PROBE_CLIENTS = 10  # clients scraping /probe of right targets
HAMMER_SECONDS = 10.0
PACE = 0.1  # seconds between two requests of one health client
# A login takes a few milliseconds, but the loaded exporter and machine make it slow at
# times; with the default 100 ms many would be given up on, which the bulkheads count
# as failed (the server may have judged them) and the review's probes held backends.
CONNECT_TIMEOUT_MS = "1000"
ROLE = "bulk_mon"
APP_ROLE = "bulk_app"
COLLECTORS = """
bulk_one:
  query: SELECT 1 AS bulk_one
  ttl: 0
  timeout: 2
  metrics:
    - bulk_one: {usage: GAUGE, description: one}
"""
# The exporter's backends, and every client backend but the application's and the
# watcher's (those still authenticating have no name yet).
_BACKENDS = f"""
SELECT count(*) FILTER (WHERE application_name = 'pg_exporter'),
       count(*) FILTER (WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
                        AND usename IS DISTINCT FROM '{APP_ROLE}')
FROM pg_stat_activity
"""
_FAILED = re.compile(
    rf'^(\S+ \S+) \S+ \[\d+\] .*password authentication failed for user "{ROLE}"', re.M
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """A PostgreSQL 18 of this module's own with room for 40 connections, where the
    monitoring role must log in with its password (scram-sha-256) over TCP."""
    settings = {"max_connections": str(SERVER_MAX_CONNECTIONS)}
    with LocalCluster(pg18_bindir(), settings=settings) as cluster:
        cluster.psql(f"CREATE ROLE {ROLE} LOGIN PASSWORD 'right' IN ROLE pg_monitor")
        cluster.psql(f"CREATE ROLE {APP_ROLE} LOGIN NOSUPERUSER")
        hba = cluster.data_dir / "pg_hba.conf"
        rules = (
            f"host all {ROLE} 127.0.0.1/32 scram-sha-256\nhost all {ROLE} ::1/128 scram-sha-256\n"
        )
        hba.write_text(rules + hba.read_text())
        cluster.psql("SELECT pg_reload_conf()")
        yield cluster


def _targets(cluster: LocalCluster) -> list[dict[str, Any]]:
    """r0… with the right password and w0… with a wrong one, every other one naming the
    server ``localhost`` (which also resolves to ::1, where nothing listens)."""
    targets = []
    for kind, password in (("r", "right"), ("w", "wrong")):
        for index in range(TARGETS):
            host = "localhost" if index % 2 else "127.0.0.1"
            url = f"postgresql://{ROLE}:{password}@{host}:{cluster.port}/postgres?sslmode=disable"
            targets.append({"name": f"{kind}{index}", "url": url})
    return targets


@contextlib.contextmanager
def _exporter(tmp_path: Path, cluster: LocalCluster) -> Iterator[int]:
    """The fleet exporter as a process, with its defaults; its port once it answers."""
    targets = write_targets(
        tmp_path / "targets.yml", _targets(cluster), defaults={"auto_discovery": False}
    )
    write_collectors(tmp_path, COLLECTORS)
    port = free_port()
    log = tmp_path / "exporter.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "exporter", "--targets.file", str(targets),
             "-c", str(tmp_path / "collectors.yml"), "--web.listen-address", f"127.0.0.1:{port}",
             "--connect-timeout", CONNECT_TIMEOUT_MS],
            cwd=REPO, stdout=sink, stderr=sink,
        )  # fmt: skip
    try:
        wait_for(
            lambda: (
                process.poll() is not None or http_get(f"http://127.0.0.1:{port}/alive")[0] == 200
            ),
            "the fleet exporter",
            within=60,
        )
        assert process.poll() is None, log.read_text()
        yield port
    finally:
        terminate(process)


@dataclass
class _Watch:
    """What the watcher and the application saw, from threads of their own."""

    peak: int = 0  # most exporter backends seen at once
    any_peak: int = 0  # most client backends but the application's, logins included
    samples: int = 0
    app_tries: int = 0
    app_failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)


def _watch_backends(cluster: LocalCluster, watch: _Watch) -> None:
    """Count the exporter's backends every few milliseconds (a superuser's connection)."""
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        while not watch.stop.is_set():
            row = conn.execute(_BACKENDS).fetchone()
            assert row is not None
            watch.peak = max(watch.peak, int(row[0]))
            watch.any_peak = max(watch.any_peak, int(row[1]))
            watch.samples += 1
            watch.stop.wait(0.01)


def _application(cluster: LocalCluster, watch: _Watch) -> None:
    """An application (an ordinary role) connecting and querying every 100 ms."""
    while not watch.stop.is_set():
        watch.app_tries += 1
        try:
            with psycopg.connect(cluster.dsn(user=APP_ROLE), connect_timeout=5) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error as exc:
            watch.app_failures.append(str(exc).strip().splitlines()[0])
        watch.stop.wait(0.1)


@dataclass
class _Hammer:
    """What the clients got back."""

    answers: dict[str, int] = field(default_factory=dict)  # "status body" -> count
    slowest: float = 0.0
    probes_ok: int = 0
    probes: int = 0


async def _hammer(port: int, seconds: float) -> _Hammer:
    """CLIENTS clients asking /primary of right targets and /up of wrong ones, each a name
    after another; PROBE_CLIENTS scraping right targets with a 3 s budget."""
    got = _Hammer()
    stop = time.monotonic() + seconds
    base = f"http://127.0.0.1:{port}"
    timeout = aiohttp.ClientTimeout(total=30)

    async def health(index: int, session: aiohttp.ClientSession) -> None:
        k = index
        while time.monotonic() < stop:
            path = f"/primary?target=r{k % NAMED}" if k % 2 else f"/up?target=w{k % NAMED}"
            started = time.monotonic()
            async with session.get(base + path) as response:
                key = f"{response.status} {(await response.text())[:40]}"
            got.slowest = max(got.slowest, time.monotonic() - started)
            got.answers[key] = got.answers.get(key, 0) + 1
            k += CLIENTS
            await asyncio.sleep(PACE)  # a crowd of routers, not a benchmark of the loop

    async def scrape(index: int, session: aiohttp.ClientSession) -> None:
        k = index
        headers = {"X-Prometheus-Scrape-Timeout-Seconds": "3"}
        while time.monotonic() < stop:
            async with session.get(f"{base}/probe?target=r{k % 50}", headers=headers) as response:
                await response.read()
                got.probes += 1
                got.probes_ok += response.status == 200
            k += PROBE_CLIENTS

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(
            *(health(i, session) for i in range(CLIENTS)),
            *(scrape(i, session) for i in range(PROBE_CLIENTS)),
        )
    return got


def _failed_logins(cluster: LocalCluster, since: int) -> list[datetime]:
    """When the server refused the monitoring role's password, from its log."""
    text = cluster.log_text()[since:]
    return [datetime.fromisoformat(m.group(1)) for m in _FAILED.finditer(text)]


async def test_a_storm_of_health_requests_keeps_within_the_servers_bulkhead(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """3 000 targets on one server of 40 connections, 300 clients naming 800 of them on
    health paths for 10 s: at most 20 exporter backends at any moment, failed logins
    within 20 at once then one a second, an application always gets in, every health
    answer comes promptly, and some probes of right targets are still collected."""
    watch = _Watch()
    log_start = len(cluster.log_text())
    with _exporter(tmp_path, cluster) as port:
        threads = [
            threading.Thread(target=_watch_backends, args=(cluster, watch), daemon=True),
            threading.Thread(target=_application, args=(cluster, watch), daemon=True),
        ]
        for thread in threads:
            thread.start()
        began = time.monotonic()
        try:
            got = await _hammer(port, HAMMER_SECONDS)
        finally:
            watch.stop.set()
            for thread in threads:
                thread.join(timeout=10)
        took = time.monotonic() - began
        failed = _failed_logins(cluster, log_start)  # probes go on after the clients stop
        server = f"localhost:{cluster.port}"  # both names, and ::1, are this host's
        # Ours also counts the logins it gave up on, which the server may not have judged;
        # /metrics is rendered at most every few seconds, so its count may lag a little.
        wait_for(
            lambda: _counted_failures(port, server) >= len(failed), "our count of failed logins"
        )
        metrics = http_get(f"http://127.0.0.1:{port}/metrics")[1]
        page = http_get(f"http://127.0.0.1:{port}/targets")[1]
        log = (tmp_path / "exporter.log").read_text()
    assert watch.samples > 100, watch.samples  # the watcher really watched
    assert watch.peak <= CAP, (watch.peak, watch.any_peak, got.answers)
    assert not watch.app_failures, (watch.app_failures[:3], watch.any_peak)
    assert watch.app_tries > 20, watch.app_tries
    for seconds in (1.0, 5.0, took + 2):  # a burst of CAP at most, then the bucket's pace
        most = _most_within(failed, seconds)
        assert most <= CAP + FAILED_A_MINUTE / 60 * seconds, (most, seconds, len(failed))
    assert failed, "no wrong password reached the server: the test did not bite"
    assert sum(got.answers.values()) > 1000, got.answers  # the clients really hammered
    assert got.slowest < 10, got.slowest  # nothing hangs, nothing queues without bound
    assert {int(key.split()[0]) for key in got.answers} <= {200, 503}, got.answers
    held_back = [k for k in got.answers if k.startswith("503 not probed") and "fleet" not in k]
    assert held_back, got.answers  # the server's bulkhead, not only the fleet's ceiling
    assert got.probes_ok > 0, (got.probes_ok, got.probes)
    assert value(metrics, "pg_exporter_server_connections_max", server=server) == CAP
    assert f"server {server}: " in page, page[:500]
    warnings = [line for line in log.splitlines() if f'msg="server {server}: ' in line]
    assert 1 <= len(warnings) <= 2, warnings  # once per strain, not per request


def _counted_failures(port: int, server: str) -> float:
    """The exporter's count of failed logins at ``server``, from its /metrics."""
    metrics = http_get(f"http://127.0.0.1:{port}/metrics")[1]
    return value(metrics, "pg_exporter_server_failed_logins_total", server=server)


def _most_within(times: list[datetime], seconds: float) -> int:
    """The most of ``times`` within any window of ``seconds``."""
    ordered = sorted(times)
    return max(
        (sum(1 for t in ordered[i:] if (t - start).total_seconds() <= seconds)
         for i, start in enumerate(ordered)),
        default=0,
    )  # fmt: skip
