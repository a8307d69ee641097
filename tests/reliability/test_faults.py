"""Faults (issue 8, item 2): the exporter keeps answering while its target misbehaves.

Every fault is made against a throw-away PostgreSQL 18 (and pgBouncer) of the test's
own, never the shared session fixtures. For each one the test checks:

- scrapes keep answering: 200 with ``pg_up 0`` while the target is gone (503 only by
  the bounded-scrape contract: busy or budget spent);
- health endpoints stay fast: ``/up`` is timed back to back during the fault;
- recovery within two passes after the fault ends (the time from the fault's end to
  the first ``pg_up 1`` is printed, ``pytest -s`` shows it);
- nothing leaks: the exporter's backends in pg_stat_activity stay within
  databases + 1 (the health probe), asyncio tasks (in-process) or open file
  descriptors (a real process) return to their baseline.

Waits are polled conditions with deadlines; sleeps only pace the load generators.
"""

from __future__ import annotations

import asyncio
import functools
import os
import statistics
import textwrap
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import psycopg
import pytest
from aiohttp import web

from exporter.config.loading import load_definitions
from exporter.config.settings import Settings
from exporter.web.appstate import STATE
from rigs.localbouncer import LocalPgBouncer
from rigs.localpg import VERBOSE_LOG_SETTINGS, LocalCluster, pg18_bindir
from tests.fixtures.polling import poll, wait_for
from tests.reliability.test_shutdown import backends, http_get, start_exporter

pytestmark = pytest.mark.pg

SCRAPE_LIMIT = 30.0  # seconds a single test scrape may take before the test gives up
HEALTH_MAX = 0.5  # seconds: /up answers from a snapshot, about 1 ms; a wide margin
REPO = Path(__file__).resolve().parents[2]
RECOVERY: dict[str, float] = {}  # fault → seconds from its end to the first pg_up 1


# --------------------------------------------------------------------------- helpers


def collectors(directory: Path, text: str) -> Path:
    path = directory / "collectors.yml"
    path.write_text(textwrap.dedent(text))
    return path


def quick(marker: str, *, ttl: float = 0, priority: int = 50) -> str:
    """A fast collector recognisable by ``marker`` (its sample is ``rel_<marker>_v``)."""
    return f"""
    rel_{marker}:
      query: SELECT 1 AS v, '{marker}' AS tag
      ttl: {ttl}
      priority: {priority}
      metrics:
        - tag: {{usage: LABEL, description: marker}}
        - v: {{usage: GAUGE, description: a fast collector}}
    """


def sleeper(
    marker: str, seconds: float, *, timeout: float, ttl: float = 0, priority: int = 10
) -> str:
    return f"""
    rel_{marker}:
      query: >-
        SELECT pg_catalog.current_database() AS datname, 1 AS v FROM pg_sleep({seconds})
         WHERE '{marker}' <> ''
      ttl: {ttl}
      timeout: {timeout}
      priority: {priority}
      metrics:
        - datname: {{usage: LABEL, description: each database runs it}}
        - v: {{usage: GAUGE, description: a slow collector}}
    """


def metric(body: str, name: str) -> float | None:
    """The first sample value of ``name`` (any labels), None when absent."""
    for line in body.splitlines():
        if line.startswith((f"{name} ", f"{name}{{")):
            return float(line.rsplit(" ", 1)[1])
    return None


def settings_for(dsn: str, **overrides: object) -> Settings:
    base = Settings(url=dsn, connect_timeout=2.0)
    return replace(base, **overrides)  # type: ignore[arg-type]


def new_marker() -> str:
    return f"m{uuid.uuid4().hex[:8]}"


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    """A PostgreSQL 18 of the test's own, free to stop, crash and restart."""
    with LocalCluster(pg18_bindir(), settings=VERBOSE_LOG_SETTINGS) as own:
        yield own


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    return tmp_path


@dataclass
class HealthTimer:
    """Times ``/up`` back to back (paced) while a fault lasts."""

    port: int
    path: str = "/up"
    latencies: list[float] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        for _ in range(20_000):  # bounded; cancelled long before
            start = time.monotonic()
            status = await asyncio.to_thread(
                http_get, f"http://127.0.0.1:{self.port}{self.path}", None, 10
            )
            self.latencies.append(time.monotonic() - start)
            self.statuses.append(status)
            await asyncio.sleep(0.02)  # pacing of the load generator

    def __enter__(self) -> HealthTimer:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()

    def check(self, what: str) -> None:
        assert self.latencies, f"{what}: no /up request completed"
        worst = max(self.latencies)
        p50 = statistics.median(self.latencies)
        print(f"  {what}: /up {len(self.latencies)} requests, p50 {p50 * 1000:.1f} ms, "
              f"max {worst * 1000:.1f} ms, statuses {sorted(set(self.statuses))}")  # fmt: skip
        assert worst < HEALTH_MAX, f"{what}: /up took {worst:.3f}s"
        assert set(self.statuses) <= {200, 503}, self.statuses


async def scrape(port: int, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """One scrape through a thread (urllib), so the event loop serving it stays free."""

    def fetch() -> tuple[int, str]:
        import urllib.error
        import urllib.request

        request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=SCRAPE_LIMIT) as response:
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    return await asyncio.to_thread(fetch)


async def recover(port: int, up: str, *, ready: Callable[[str], bool] = lambda _: True) -> int:
    """Scrape until ``up`` is 1 and ``ready(body)``; the number of scrapes it took (≤ 5)."""
    for attempt in range(1, 6):
        status, body = await scrape(port)
        assert status == 200, body
        if metric(body, up) == 1 and ready(body):
            return attempt
    raise AssertionError(f"{up} not 1 after 5 passes")


@asynccontextmanager
async def exporter_for(
    settings: Settings, config: Path
) -> AsyncIterator[tuple[int, web.Application]]:
    """The real app on a random port (production runner); yields (port, app)."""
    from tests.fixtures.rawhttp import serving

    async with serving(settings, load_definitions(str(config))) as served:
        yield served.port, served.app


async def settle_tasks(baseline: int, what: str) -> None:
    """asyncio tasks back to ``baseline`` (polled with a deadline)."""
    deadline = time.monotonic() + 10
    while len(asyncio.all_tasks()) > baseline:
        if time.monotonic() > deadline:
            names = sorted(t.get_name() for t in asyncio.all_tasks())
            raise AssertionError(f"{what}: tasks {len(names)} > baseline {baseline}: {names}")
        await asyncio.sleep(0.05)


def record(fault: str, seconds: float, passes: int) -> None:
    RECOVERY[fault] = seconds
    print(f"  {fault}: recovered {seconds:.2f}s after the fault ended, in {passes} pass(es)")


# --------------------------------------------------------------------------- stop / crash


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_stop_and_crash_then_start(cluster: LocalCluster, tmp: Path, mode: str) -> None:
    """pg_ctl stop -m fast (clean stop) and -m immediate (crash): 200 with pg_up 0 while
    down, /up fast and 503, back to pg_up 1 within two passes of the restart."""
    marker = new_marker()
    config = collectors(tmp, quick(marker))
    async with exporter_for(settings_for(cluster.dsn()), config) as (port, _app):
        status, body = await scrape(port)
        assert (status, metric(body, "pg_up")) == (200, 1)
        tasks = len(asyncio.all_tasks())
        with HealthTimer(port) as health:
            await asyncio.to_thread(cluster.stop, mode)
            for _ in range(3):
                status, body = await scrape(port)
                assert status == 200, body
                assert metric(body, "pg_up") == 0
                assert metric(body, f"rel_{marker}_v") is None
            await asyncio.to_thread(
                wait_for, lambda: health.statuses[-1:] == [503], "/up to say down", 10
            )
            await asyncio.to_thread(cluster.start)
            ended = time.monotonic()
            passes = await recover(port, "pg_up", ready=lambda b: metric(b, f"rel_{marker}_v") == 1)
            record(f"stop -m {mode}", time.monotonic() - ended, passes)
            await asyncio.to_thread(
                wait_for, lambda: health.statuses[-1:] == [200], "/up to say up again", 10
            )
        health.check(f"stop -m {mode}")
        assert passes <= 2
        assert await asyncio.to_thread(backends, cluster) <= 2  # 1 database + the probe
        await settle_tasks(tasks, f"stop -m {mode}")


# --------------------------------------------------------------------------- terminate


async def test_terminate_backends_between_passes(cluster: LocalCluster, tmp: Path) -> None:
    """pg_terminate_backend of every exporter connection while idle: the next pass may say
    pg_up 0 (its kept connection is dead), the one after is whole again."""
    marker = new_marker()
    config = collectors(tmp, quick(marker))
    async with exporter_for(settings_for(cluster.dsn()), config) as (port, _app):
        status, body = await scrape(port)
        assert (status, metric(body, "pg_up")) == (200, 1)
        tasks = len(asyncio.all_tasks())
        # Both connections exist before the kill: the health probe's may still be opening.
        await asyncio.to_thread(wait_for, lambda: backends(cluster) == 2, "two backends", 10)
        with HealthTimer(port) as health:
            killed = await asyncio.to_thread(
                cluster.psql,
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = 'pg_exporter' AND pid <> pg_backend_pid()",
            )
            assert int(killed) == 2  # the pass's connection and the health probe's
            ended = time.monotonic()
            passes = await recover(port, "pg_up", ready=lambda b: metric(b, f"rel_{marker}_v") == 1)
            record("pg_terminate_backend (idle)", time.monotonic() - ended, passes)
        health.check("pg_terminate_backend")
        assert passes <= 2
        await asyncio.to_thread(wait_for, lambda: backends(cluster) <= 2, "backends ≤ 2", 10)
        await settle_tasks(tasks, "terminate")


async def test_terminate_backend_mid_collector_recovers_within_two_passes(
    cluster: LocalCluster, tmp: Path
) -> None:
    """The connection is killed while a collector runs. The collectors after it in that pass
    must not be cached as failed for their TTL: within two passes every collector is back.

    The regression it guards: every later collector found no connection, and each "no
    connection" failure was cached for its TTL (60 s here), so the series stayed missing
    while pg_up said 1.
    """
    slow, later = new_marker(), new_marker()
    config = collectors(tmp, sleeper(slow, 1.5, timeout=5) + quick(later, ttl=60, priority=90))
    async with exporter_for(settings_for(cluster.dsn()), config) as (port, _app):
        pending = asyncio.ensure_future(scrape(port))
        running = f"state = 'active' AND query LIKE '%{slow}%'"
        await asyncio.to_thread(wait_for, lambda: backends(cluster, running) == 1, "the slow query")
        await asyncio.to_thread(
            cluster.psql,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE application_name = 'pg_exporter' AND {running}",
        )
        ended = time.monotonic()
        status, _ = await pending
        assert status == 200
        passes = await recover(port, "pg_up", ready=lambda b: metric(b, f"rel_{later}_v") == 1)
        record("pg_terminate_backend (mid-collector)", time.monotonic() - ended, passes)
        assert passes <= 2


# --------------------------------------------------------------------------- dropped database


async def test_database_dropped_during_its_pass(cluster: LocalCluster, tmp: Path) -> None:
    """DROP DATABASE … WITH (FORCE) while the exporter's pass is inside it: that scrape
    still answers 200 with pg_up 1, the database is forgotten on the next pass, and the
    exporter holds no connection to it afterwards."""
    await asyncio.to_thread(cluster.psql, "CREATE DATABASE reldrop")
    slow, marker = new_marker(), new_marker()
    config = collectors(tmp, sleeper(slow, 1.0, timeout=5) + quick(marker))
    async with exporter_for(settings_for(cluster.dsn(), auto_discovery=True), config) as (
        port,
        app,
    ):
        status, body = await scrape(port)
        assert (status, metric(body, "pg_up")) == (200, 1)
        assert 'datname="reldrop"' in body
        tasks = len(asyncio.all_tasks())
        assert await asyncio.to_thread(backends, cluster) <= 3  # 2 databases + the probe
        with HealthTimer(port) as health:
            pending = asyncio.ensure_future(scrape(port))
            inside = f"datname = 'reldrop' AND state = 'active' AND query LIKE '%{slow}%'"
            await asyncio.to_thread(
                wait_for, lambda: backends(cluster, inside) == 1, "pass in reldrop"
            )
            await asyncio.to_thread(cluster.psql, "DROP DATABASE reldrop WITH (FORCE)")
            ended = time.monotonic()
            status, body = await pending
            assert status == 200, body
            assert metric(body, "pg_up") == 1
            passes = await recover(port, "pg_up", ready=lambda b: 'datname="reldrop"' not in b)
            record("database dropped (FORCE) mid-pass", time.monotonic() - ended, passes)
        health.check("database dropped")
        assert passes <= 2
        exporter = app[STATE].exporter
        assert "reldrop" not in exporter.discovered
        assert await asyncio.to_thread(backends, cluster) <= 2
        await settle_tasks(tasks, "dropped database")


# --------------------------------------------------------------------------- lock-blocked


async def test_lock_blocked_collector(cluster: LocalCluster, tmp: Path) -> None:
    """Another session holds ACCESS EXCLUSIVE on the table a collector reads: the collector
    gives up at its lock_timeout (never queues), the scrape answers 200 quickly with the
    other collectors and pg_up 1, and the collector is back within two passes of its TTL
    once the lock is released."""
    await asyncio.to_thread(
        cluster.psql, "CREATE TABLE rel_locked (x int); INSERT INTO rel_locked VALUES (1)"
    )
    marker = new_marker()
    blocked = """
    rel_blocked:
      query: SELECT count(*) AS n FROM rel_locked
      ttl: 1
      timeout: 2
      metrics:
        - n: {usage: GAUGE, description: rows of the locked table}
    """
    config = collectors(tmp, blocked + quick(marker))
    async with exporter_for(settings_for(cluster.dsn()), config) as (port, app):
        status, body = await scrape(port)
        assert metric(body, "rel_blocked_n") == 1
        tasks = len(asyncio.all_tasks())
        holder = await psycopg.AsyncConnection.connect(cluster.dsn(), autocommit=False)
        try:
            with HealthTimer(port) as health:
                await holder.execute("LOCK TABLE rel_locked IN ACCESS EXCLUSIVE MODE")
                server = app[STATE].exporter.main
                entry = server.runtimes["rel_blocked"].entry
                assert entry is not None
                await poll(lambda: server.clock() - entry.finished_at >= 1, "the 1 s TTL")
                started = time.monotonic()
                status, body = await scrape(port)
                took = time.monotonic() - started
                assert status == 200, body
                assert metric(body, "pg_up") == 1
                assert metric(body, f"rel_{marker}_v") == 1
                assert metric(body, "rel_blocked_n") is None
                # lock_timeout = min(2/4, 1) = 0.5 s; far below the collector's timeout
                assert took < 2.0, f"the scrape queued behind the lock for {took:.2f}s"
                print(f"  lock-blocked scrape answered in {took:.2f}s")
            health.check("lock-blocked")
        finally:
            await holder.close()  # the fault ends: the lock is released
        ended = time.monotonic()
        # Its failure is cached for its 1 s TTL, after which the next pass runs it again.
        deadline = time.monotonic() + 10
        passes = 0
        while True:
            passes += 1
            status, body = await scrape(port)
            if metric(body, "rel_blocked_n") == 1:
                break
            assert time.monotonic() < deadline, "the blocked collector never came back"
            await asyncio.sleep(0.25)  # pacing: a scraper every 0.25 s
        record("lock-blocked collector", time.monotonic() - ended, passes)
        assert time.monotonic() - ended < 1.0 + 3.0  # its TTL plus margin
        assert await asyncio.to_thread(backends, cluster) <= 2
        await settle_tasks(tasks, "lock-blocked")


# --------------------------------------------------------------------------- pgBouncer


class RestartableBouncer(LocalPgBouncer):
    """A LocalPgBouncer that can be stopped and started again on the same port."""

    def halt(self) -> None:
        process = self._process
        assert process is not None
        process.terminate()
        process.wait(timeout=30)


async def test_pgbouncer_restart(cluster: LocalCluster, tmp: Path) -> None:
    """pgBouncer stops and starts again on the same port: pgbouncer_up 0 meanwhile (200),
    /up fast, back within two passes."""
    bouncer = RestartableBouncer(cluster)
    with bouncer:
        settings = settings_for(bouncer.dsn())
        assert settings.is_pgbouncer
        async with exporter_for(settings, REPO / "collectors") as (port, _app):
            status, body = await scrape(port)
            assert (status, metric(body, "pgbouncer_up")) == (200, 1)
            tasks = len(asyncio.all_tasks())
            with HealthTimer(port) as health:
                await asyncio.to_thread(bouncer.halt)
                for _ in range(2):
                    status, body = await scrape(port)
                    assert (status, metric(body, "pgbouncer_up")) == (200, 0), body[:300]
                await asyncio.to_thread(bouncer.launch)
                ended = time.monotonic()
                passes = await recover(port, "pgbouncer_up")
                record("pgBouncer restart", time.monotonic() - ended, passes)
            health.check("pgBouncer restart")
            assert passes <= 2
            await settle_tasks(tasks, "pgBouncer restart")


# --------------------------------------------------------------------------- real processes


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_unreachable_at_startup_then_appears(tmp: Path) -> None:
    """The exporter starts while its target does not exist yet: it serves 200 with pg_up 0
    and /up 503 at once; when the server appears it is scraped within two passes, with the
    same number of open file descriptors as before."""
    marker = new_marker()
    config = collectors(tmp, quick(marker))
    cluster = LocalCluster(pg18_bindir(), settings=VERBOSE_LOG_SETTINGS)  # not started yet
    try:
        process = start_exporter(cluster.dsn(), config)
        try:
            url = process.url()
            for _ in range(3):
                assert http_get(process.url("/up"), limit=5) == 503
            fds = []
            for _ in range(5):  # failing passes leak nothing: scrape, then count
                status, body = _get_text(url)
                assert (status, metric(body, "pg_up")) == (200, 0)
                fds.append(fd_count(process.popen.pid))
            pid = process.popen.pid
            # ±1 is the scrape's own socket being closed; settled, nothing has grown.
            wait_for(lambda: fd_count(pid) <= min(fds), f"descriptors flat while down: {fds}", 10)
            latency = _time_up(process.url("/up"))
            assert latency < HEALTH_MAX, f"/up took {latency:.3f}s while the target was down"
            cluster.start()
            ended = time.monotonic()
            passes = 0
            for attempt in range(1, 6):
                status, body = _get_text(url)
                passes = attempt
                if metric(body, "pg_up") == 1 and metric(body, f"rel_{marker}_v") == 1:
                    break
            record("unreachable at start-up, then appears", time.monotonic() - ended, passes)
            assert passes <= 2
            wait_for(lambda: http_get(process.url("/up"), limit=5) == 200, "/up 200", 10)
            # Connected now: one socket for the database, one for the probe.
            wait_for(lambda: fd_count(pid) <= min(fds) + 2, "descriptors: +2 sockets at most", 10)
            for _ in range(20):
                assert _get_text(url)[0] == 200
            wait_for(lambda: fd_count(pid) <= min(fds) + 2, "descriptors flat over 20 scrapes", 10)
            print(f"  fds while unreachable {min(fds)}, after recovery {fd_count(pid)}")
            assert backends(cluster) <= 2
        finally:
            process.stop()
    finally:
        cluster.close()


def _get_text(url: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=SCRAPE_LIMIT) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _time_up(url: str) -> float:
    worst = 0.0
    for _ in range(20):
        start = time.monotonic()
        http_get(url, limit=5)
        worst = max(worst, time.monotonic() - start)
    return worst


@dataclass
class Load:
    """Concurrent scrapers and a /up timer against a real process, in threads."""

    port: int
    stop: threading.Event = field(default_factory=threading.Event)
    results: list[tuple[float, int, float | None]] = field(default_factory=list)  # t, status, up
    health: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def scraper(self) -> None:
        url = f"http://127.0.0.1:{self.port}/metrics"
        for _ in range(10_000):  # bounded; stopped long before
            if self.stop.is_set():
                return
            status, body = _get_text(url)
            with self.lock:
                self.results.append((time.monotonic(), status, metric(body, "pg_up")))
            time.sleep(0.05)  # pacing of the load generator

    def up_since(self, moment: float) -> bool:
        with self.lock:
            return any(t > moment and up == 1 for t, _, up in self.results)

    def timer(self) -> None:
        url = f"http://127.0.0.1:{self.port}/up"
        for _ in range(50_000):
            if self.stop.is_set():
                return
            start = time.monotonic()
            http_get(url, limit=5)
            self.health.append(time.monotonic() - start)
            time.sleep(0.02)


def test_restart_under_load(tmp: Path) -> None:
    """Two scrapers loop and /up is timed while PostgreSQL restarts (pg_ctl restart -m fast):
    every scrape answers 200 (pg_up 0 during the restart), pg_up 1 again within two passes,
    no backend or file descriptor leaked."""
    marker = new_marker()
    config = collectors(tmp, quick(marker))
    with LocalCluster(pg18_bindir(), settings=VERBOSE_LOG_SETTINGS) as cluster:
        process = start_exporter(cluster.dsn(), config)
        load = Load(process.port)
        threads = [
            threading.Thread(target=f, daemon=True)
            for f in (load.scraper, load.scraper, load.timer)
        ]
        try:
            wait_for(lambda: _get_text(process.url())[0] == 200, "a first scrape")
            wait_for(lambda: http_get(process.url("/up"), limit=5) == 200, "/up 200", 10)
            fds_before = fd_count(process.popen.pid)
            for thread in threads:
                thread.start()
            wait_for(lambda: len(load.results) >= 6, "scrapers running")
            for restart in (1, 2):
                cluster.restart()
                ended = time.monotonic()
                wait_for(functools.partial(load.up_since, ended), "pg_up 1 after the restart", 15)
                after = [r for r in list(load.results) if r[0] > ended]
                first_up = next(i for i, r in enumerate(after) if r[2] == 1)
                record(
                    f"restart -m fast under load #{restart}",
                    after[first_up][0] - ended,
                    first_up + 1,
                )
                assert first_up + 1 <= 2 * 2  # two passes, each seen by both scrapers
            wait_for(lambda: len(load.results) >= 10, "more scrapes")
        finally:
            load.stop.set()
            for thread in threads:
                thread.join(timeout=60)
        statuses = {status for _, status, _ in load.results}
        print(f"  restart under load: {len(load.results)} scrapes, statuses {statuses}, "
              f"/up max {max(load.health) * 1000:.1f} ms over {len(load.health)}")  # fmt: skip
        try:
            assert statuses == {200}
            assert 0 in {up for _, _, up in load.results}, "the restart was never seen"
            assert max(load.health) < HEALTH_MAX
            wait_for(lambda: backends(cluster) <= 2, "backends ≤ 2", 10)
            wait_for(lambda: fd_count(process.popen.pid) <= fds_before, "fds back to baseline", 10)
        finally:
            process.stop()
