"""Health and routing endpoints against real servers: roles, outages, promotion, hangs, pgBouncer.

Tests that stop, promote or reconfigure a server do it on clusters of their own;
the session's shared clusters are only read.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp.plugin import AiohttpClient

from exporter.config.settings import Settings
from exporter.health.probe import HealthProbe, Status
from exporter.web.appstate import STATE
from exporter.web.healthpages import (
    HEALTH_PROBE,
    PRIMARY_PATHS,
    REPLICA_PATHS,
    ROUTES,
    UP_PATHS,
    health_context,
    health_handler,
)
from rigs.localbouncer import LocalPgBouncer
from rigs.localpg import LocalCluster, pg18_bindir
from tests.fixtures.polling import poll
from tests.fixtures.rawhttp import Start, get

Client = TestClient[web.Request, web.Application]
INTERVAL = 0.2  # probe period in these tests: outcomes show up quickly


def _add_health_routes(app: web.Application) -> None:
    """Serve only the health and routing paths, every method, as the exporter does."""
    for path, want in ROUTES.items():
        app.router.add_route("*", path, health_handler(want))


async def _client(
    aiohttp_client: AiohttpClient,
    url: str,
    connect_timeout: float = 2.0,
    interval: float = INTERVAL,
) -> tuple[Client, HealthProbe]:
    """A minimal app serving only the health routes, probing ``url``."""
    app = web.Application()
    _add_health_routes(app)
    settings = Settings(url=url, connect_timeout=connect_timeout)
    app.cleanup_ctx.append(health_context(settings, interval=interval))
    client: Client = await aiohttp_client(app)
    return client, app[HEALTH_PROBE]


async def _codes(client: Client, paths: tuple[str, ...]) -> set[tuple[int, str]]:
    """The distinct (status, body) answers of GET on ``paths``; HEAD, OPTIONS and POST
    must agree on status."""
    seen = set()
    for path in paths:
        got = await client.get(path)
        for method in ("HEAD", "OPTIONS", "POST"):
            other = await client.request(method, path)
            assert other.status == got.status, (method, path)
        seen.add((got.status, await got.text()))
    return seen


@dataclass
class Sampler:
    """Requests one path back to back and records (monotonic time, latency, status)."""

    client: Client
    path: str
    samples: list[tuple[float, float, int]] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        """Sample until stopped."""
        while not self._stop.is_set():
            started = time.perf_counter()
            response = await self.client.get(self.path)
            await response.read()
            self.samples.append((time.monotonic(), time.perf_counter() - started, response.status))
            await asyncio.sleep(0.002)  # pacing: leave the loop to the probe between requests

    def stop(self) -> None:
        """Ask run() to return after the request in flight."""
        self._stop.set()

    def latencies(self, since: float = 0.0, until: float = float("inf")) -> list[float]:
        """Latencies of requests that completed in [since, until]."""
        return [lat for at, lat, _ in self.samples if since <= at <= until]


def _summary(latencies: list[float]) -> str:
    ms = sorted(x * 1000 for x in latencies)
    p99 = ms[int(len(ms) * 0.99) - 1]
    return f"n={len(ms)} p50={statistics.median(ms):.2f}ms p99={p99:.2f}ms max={ms[-1]:.2f}ms"


def _assert_never_waited(latencies: list[float], deadline: float) -> None:
    """Handlers answered from the snapshot: fast as a rule, and none waited for a probe.

    A handler that waited on the database would take up to the probe's deadline, so
    the bound on every request is the deadline itself; the median and the 99th
    percentile carry the speed claim. A single outlier of a few hundred ms on a busy
    shared machine (scheduling, a full garbage collection in a long test process) is
    noise, not a wait, and must not fail the suite.
    """
    ms = sorted(latencies)
    p99 = ms[int(len(ms) * 0.99) - 1]
    assert statistics.median(ms) < 0.010, _summary(latencies)
    assert p99 < 0.050, _summary(latencies)
    assert ms[-1] < deadline, f"a handler waited as long as a probe: {_summary(latencies)}"


async def test_each_route_on_a_primary_and_its_replica(
    aiohttp_client: AiohttpClient, pg18: LocalCluster, pg18_replica: LocalCluster
) -> None:
    """Every routing path answers its §2 code, with the role as body, on both servers."""
    primary, primary_probe = await _client(aiohttp_client, pg18.dsn())
    replica, replica_probe = await _client(aiohttp_client, pg18_replica.dsn())
    await poll(lambda: primary_probe.snapshot.status is Status.PRIMARY, "the primary")
    await poll(lambda: replica_probe.snapshot.status is Status.REPLICA, "the replica")
    assert await _codes(primary, UP_PATHS) == {(200, "primary")}
    assert await _codes(primary, PRIMARY_PATHS) == {(200, "primary")}
    assert await _codes(primary, REPLICA_PATHS) == {(404, "primary")}
    assert await _codes(replica, UP_PATHS) == {(200, "replica")}
    assert await _codes(replica, PRIMARY_PATHS) == {(404, "replica")}
    assert await _codes(replica, REPLICA_PATHS) == {(200, "replica")}


async def test_stopping_the_primary_flips_it_to_503_while_handlers_stay_fast(
    aiohttp_client: AiohttpClient,
) -> None:
    """A stopped primary reads as down within seconds, and the handlers stay fast meanwhile
    (that they never wait on a probe shows against a hung server, below)."""
    with LocalCluster(pg18_bindir()) as cluster:
        client, probe = await _client(aiohttp_client, cluster.dsn(), connect_timeout=1.0)
        await poll(lambda: probe.snapshot.status is Status.PRIMARY, "the primary")
        sampler = Sampler(client, "/primary")
        sampling = asyncio.create_task(sampler.run())
        await asyncio.to_thread(cluster.stop)
        stopped = time.monotonic()
        flip = await poll(lambda: any(s == 503 for *_, s in sampler.samples), "a 503", 5.0)
        # A few more probes fail against the stopped server while the handlers keep answering.
        await poll(lambda: probe.snapshot.checked_at > stopped + flip + 3 * INTERVAL, "probes")
        sampler.stop()
        await sampling
    assert await _codes(client, UP_PATHS + PRIMARY_PATHS + REPLICA_PATHS) == {(503, "down")}
    assert probe.snapshot.error
    latencies = sampler.latencies()
    print(f"\nstop: flipped {flip:.2f}s after the stop; {_summary(latencies)}")
    assert sampler.latencies(since=stopped), "no request completed after the stop"
    _assert_never_waited(latencies, deadline=1.0)


async def test_a_shutdown_reaches_the_probe_between_two_probes(
    aiohttp_client: AiohttpClient,
) -> None:
    """With the production pace (a probe a second), a primary that starts shutting down
    just after a probe reads as not up at once: the server ends the idle probe
    connection, which wakes the probe, instead of a second later."""
    with LocalCluster(pg18_bindir()) as cluster:
        client, probe = await _client(aiohttp_client, cluster.dsn(), 1.0, interval=1.0)
        await poll(
            lambda: probe.snapshot.status is Status.PRIMARY and probe.pace.spell is None,
            "a primary at the slow pace",
        )
        last = probe.snapshot.checked_at
        await poll(lambda: probe.snapshot.checked_at > last, "a probe")
        stopping = asyncio.create_task(asyncio.to_thread(cluster.stop))
        flip = await poll(lambda: probe.snapshot.status is not Status.PRIMARY, "503", 5.0)
        await stopping
    print(f"\nshutdown: not primary {flip * 1000:.0f} ms after pg_ctl stop was called")
    assert flip < 0.5
    assert (await client.get("/primary")).status == 503


async def test_promoting_the_replica_moves_the_primary_routes(
    aiohttp_client: AiohttpClient,
) -> None:
    """After pg_promote(), /primary answers 200 and /replica 404 on the former replica."""
    with LocalCluster(pg18_bindir()) as primary:
        replica = primary.make_replica()
        client, probe = await _client(aiohttp_client, replica.dsn())
        await poll(lambda: probe.snapshot.status is Status.REPLICA, "the replica")
        assert await _codes(client, PRIMARY_PATHS) == {(404, "replica")}
        assert await _codes(client, REPLICA_PATHS) == {(200, "replica")}
        await asyncio.to_thread(replica.psql, "SELECT pg_promote()")
        await poll(lambda: probe.snapshot.status is Status.PRIMARY, "the promotion", 5.0)
        assert await _codes(client, PRIMARY_PATHS) == {(200, "primary")}
        assert await _codes(client, REPLICA_PATHS) == {(404, "primary")}
        assert await _codes(client, UP_PATHS) == {(200, "primary")}


async def test_a_server_refusing_connections_reads_as_starting(
    aiohttp_client: AiohttpClient,
) -> None:
    """A standby without hot standby refuses with 57P03: every route 503, body 'starting'."""
    with LocalCluster(pg18_bindir()) as primary:
        replica = primary.make_replica()
        replica.psql("ALTER SYSTEM SET hot_standby = off")
        replica.restart()
        client, probe = await _client(aiohttp_client, replica.dsn())
        await poll(lambda: probe.snapshot.status is not Status.UNKNOWN, "a probe")
        paths = UP_PATHS + PRIMARY_PATHS + REPLICA_PATHS
        assert await _codes(client, paths) == {(503, "starting")}, probe.snapshot


async def test_a_lost_probe_connection_is_replaced_without_a_false_down(
    aiohttp_client: AiohttpClient, pg18: LocalCluster
) -> None:
    """When the probe's backend is terminated, the same probe reconnects: no 503 blip."""
    app_name = f"health_{uuid.uuid4().hex[:12]}"  # our backend, apart from other tests'
    client, probe = await _client(aiohttp_client, f"{pg18.dsn()}&application_name={app_name}")
    await poll(lambda: probe.snapshot.status is Status.PRIMARY, "the primary")
    pid_sql = f"SELECT pid FROM pg_stat_activity WHERE application_name = '{app_name}'"
    old_pid = pg18.psql(pid_sql)
    sampler = Sampler(client, "/up")
    sampling = asyncio.create_task(sampler.run())
    pg18.psql(f"SELECT pg_terminate_backend(pid) FROM ({pid_sql}) AS probe")
    terminated = time.monotonic()
    await poll(lambda: probe.snapshot.checked_at > terminated + 2 * INTERVAL, "two probes")
    sampler.stop()
    await sampling
    new_pid = pg18.psql(pid_sql)
    assert new_pid not in ("", old_pid)
    assert {status for *_, status in sampler.samples} == {200}


class FreezableProxy:
    """A TCP proxy to a server that can stop relaying, so the server looks hung."""

    def __init__(self, port: int) -> None:
        self.upstream_port = port
        self.relaying = asyncio.Event()
        self.relaying.set()
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        """Listen on a free local port and return it."""
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def close(self) -> None:
        """Stop listening and cut every relayed connection."""
        self.relaying.set()
        for writer in self._writers:
            writer.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        await self.relaying.wait()  # while frozen, a new client is accepted and ignored
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers.append(up_writer)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                await self.relaying.wait()
                writer.write(data)
                await writer.drain()
        except OSError:
            pass  # the other side went away: close ours too
        finally:
            writer.close()


async def test_a_hung_server_reads_as_down_while_handlers_stay_fast(
    aiohttp_client: AiohttpClient, pg18: LocalCluster
) -> None:
    """A server that stops answering is down after the connect timeout; handlers stay fast."""
    timeout = 1.0  # the probe deadline, and so the bound on every handler's latency
    app_name = f"health_{uuid.uuid4().hex[:12]}"  # our backends, apart from other tests'
    proxy = FreezableProxy(pg18.port)
    port = await proxy.start()
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres?application_name={app_name}"
    try:
        client, probe = await _client(aiohttp_client, url, connect_timeout=timeout)
        await poll(lambda: probe.snapshot.status is Status.PRIMARY, "the primary")
        sampler = Sampler(client, "/up")
        sampling = asyncio.create_task(sampler.run())
        proxy.relaying.clear()
        frozen = time.monotonic()
        flip = await poll(lambda: probe.snapshot.status is Status.DOWN, "down", 5.0)
        # Several probes run into the hang while the handlers keep answering.
        await poll(lambda: probe.snapshot.checked_at > frozen + 4 * timeout, "more probes")
        thawed = time.monotonic()
        proxy.relaying.set()
        await poll(lambda: probe.snapshot.status is Status.PRIMARY, "the recovery", 5.0)
        sampler.stop()
        await sampling
        count_sql = f"SELECT count(*) FROM pg_stat_activity WHERE application_name = '{app_name}'"
        # Connections abandoned in the hang close as the server notices: slow on a busy host.
        await poll(lambda: pg18.psql(count_sql) == "1", "one probe connection", 30.0)
    finally:
        await proxy.close()
    hung = sampler.latencies(since=frozen, until=thawed)
    print(f"\nhang: down {flip:.2f}s after the freeze; during the hang {_summary(hung)}")
    assert flip < timeout + INTERVAL + 1.0
    assert {s for at, _, s in sampler.samples if frozen + flip < at < thawed} == {503}
    assert len(hung) >= 50
    _assert_never_waited(hung, deadline=timeout)


@contextmanager
def _pgbouncer(cluster: LocalCluster) -> Iterator[tuple[str, Path]]:
    """A pgBouncer in front of ``cluster``: its console URL and its log."""
    with LocalPgBouncer(cluster) as bouncer:
        yield bouncer.dsn(), bouncer.log_path


async def test_pgbouncer_console_reads_as_up(
    aiohttp_client: AiohttpClient, pg18: LocalCluster
) -> None:
    """In pgBouncer mode SHOW VERSION on the console makes the target up, as a primary."""
    with _pgbouncer(pg18) as (url, log):
        assert Settings(url=url).is_pgbouncer
        client, probe = await _client(aiohttp_client, url)
        await poll(lambda: probe.snapshot.status is not Status.UNKNOWN, "a probe")
        assert probe.snapshot.status is Status.PRIMARY, probe.snapshot
        # Past psycopg's prepare threshold (5) on one connection: the console would reject
        # a prepared statement, and the probe must neither fail nor reconnect.
        first = probe.snapshot.checked_at
        await poll(lambda: probe.snapshot.checked_at > first + 6 * INTERVAL, "six probes")
        assert probe.snapshot.status is Status.PRIMARY, probe.snapshot
        assert log.read_text().count("login attempt: db=pgbouncer") == 1
        assert await _codes(client, UP_PATHS) == {(200, "primary")}
        assert await _codes(client, PRIMARY_PATHS) == {(200, "primary")}
        assert await _codes(client, REPLICA_PATHS) == {(404, "primary")}


_ONE_COLLECTOR = """
one:
  query: SELECT 1 AS one
  timeout: 5
  metrics:
    - one: {usage: GAUGE, description: one}
"""


async def test_each_pass_tells_the_probe_the_role_it_read(
    start: Start, pg18_replica: LocalCluster
) -> None:
    """The app hands each pass's preflight recovery state to the health probe, which
    quickens when it disagrees (tests/web/test_probe.py)."""
    served = await start(pg18_replica, _ONE_COLLECTOR)
    exporter = served.app[STATE].exporter
    assert exporter.recovery_seen == served.app[HEALTH_PROBE].recovery_seen
    seen: list[bool] = []
    exporter.recovery_seen = seen.append
    assert (await get(served.port)).status == 200
    assert seen == [True]
