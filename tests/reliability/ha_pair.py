"""A real HA pair: two Prometheus servers scraping one exporter every second.

Starts a throw-away PostgreSQL 18 (every statement logged), the exporter as a
process (``python -m exporter``) and two Debian ``prometheus`` servers, each with
its own storage, ``scrape_interval: 1s`` and ``scrape_timeout: 0.9s``. Each server
reaches the exporter through a recording pass-through proxy of its own, which
forwards every byte unchanged and notes, per scrape, the scrape-timeout header
Prometheus sent, the exporter's status and how long the exporter took.

Phase 1 (normal): a fast collector, a 0.6 s bounded collector with ttl 5 and an
unbounded one. The figures come from the Prometheus HTTP API (raw samples of
``up``, ``scrape_duration_seconds``, ``pg_up`` and the exporter's admission
counters as Prometheus stored them), the statement log and the proxies.

Phase 2 (overrun, a few seconds): ``/reload`` to the fast collector and an
unbounded 2 s one, slower than the scrape timeout. Prometheus gives up at 0.9 s and records
``up`` 0; the proxy keeps the exporter's side open, so the exporter's own answer
shows whether the header became its budget: 503 "budget ran out" after about
0.9 s, where a 30 s default budget would answer 200 after 2 s.

    .venv/bin/python -m tests.reliability.ha_pair --minutes 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import signal
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from exporter.collect.budget import SCRAPE_TIMEOUT_HEADER
from rigs.localpg import VERBOSE_LOG_SETTINGS, LocalCluster, free_port, pg18_bindir
from tests.fixtures.helpers import calls_in_log
from tests.fixtures.polling import poll_async

REPO = Path(__file__).resolve().parents[2]

INTERVAL = 1.0
SCRAPE_TIMEOUT = 0.9  # below the 1 s interval, with room for a 0.6 s collector on a busy machine
CACHED_TTL = 5.0
HEADER = SCRAPE_TIMEOUT_HEADER.lower()
OUT_OF_BUDGET = b"budget ran out"


# --- the recording proxy ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Exchange:
    """One scrape as seen at the exporter's socket."""

    wall: float  # when the request head arrived (Unix time)
    header: str | None  # X-Prometheus-Scrape-Timeout-Seconds as sent
    status: int  # the exporter's status code
    seconds: float  # request head forwarded → last byte of the exporter's answer
    client_left: bool  # Prometheus hung up before the exporter answered
    body_start: bytes  # the first bytes of the body (the reason of a 503)


def _headers(head: bytes) -> dict[str, str]:
    lines = head.decode("latin-1").split("\r\n")[1:]
    pairs = (line.split(":", 1) for line in lines if ":" in line)
    return {name.strip().lower(): text.strip() for name, text in pairs}


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    """One HTTP head up to the blank line; b"" when the peer closed first."""
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return b""


def _early(read: asyncio.Future[bytes]) -> bytes | None:
    """What the client sent while its answer was pending: None (nothing), b"" (it left)."""
    if not read.done() or read.cancelled():
        return None
    return b"" if read.exception() is not None else read.result()  # a reset is a hang-up


class RecordingProxy:
    """Forwards HTTP/1.1 exchanges to the exporter unchanged and records each one.

    A client that hangs up mid-scrape does not close the exporter's side: the
    exporter's answer is still read and recorded, then both sides are closed.
    """

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.exchanges: list[Exchange] = []
        self.server: asyncio.Server | None = None
        self.port = 0
        self.writers: set[asyncio.StreamWriter] = set()
        self.in_flight = 0  # requests forwarded and not answered yet

    async def start(self) -> None:
        """Listen on a random loopback port."""
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop listening and drop open connections."""
        if self.server is not None:
            self.server.close()
            for writer in list(self.writers):
                writer.close()
            await self.server.wait_closed()

    def since(self, wall: float) -> list[Exchange]:
        """Exchanges whose request arrived at or after ``wall``."""
        return [e for e in self.exchanges if e.wall >= wall]

    async def _serve(self, client: asyncio.StreamReader, to_client: asyncio.StreamWriter) -> None:
        try:
            upstream, to_upstream = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:
            to_client.close()
            return
        self.writers |= {to_client, to_upstream}
        try:
            while await self._exchange(client, to_client, upstream, to_upstream):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            for writer in (to_client, to_upstream):
                self.writers.discard(writer)
                writer.close()

    async def _exchange(
        self,
        client: asyncio.StreamReader,
        to_client: asyncio.StreamWriter,
        upstream: asyncio.StreamReader,
        to_upstream: asyncio.StreamWriter,
    ) -> bool:
        """Forward one request and its answer; False when the connection is over."""
        head = await _read_head(client)
        if not head:
            return False
        wall, start = time.time(), time.monotonic()
        to_upstream.write(head)  # Prometheus sends GET without a body
        self.in_flight += 1
        hang_up = asyncio.ensure_future(client.read(1))  # b"" when Prometheus gives up
        try:
            await to_upstream.drain()
            answer = await _read_head(upstream)
            length = int(_headers(answer).get("content-length", "0"))
            body = await upstream.readexactly(length)
        finally:
            early = _early(hang_up)
            hang_up.cancel()
            await asyncio.gather(hang_up, return_exceptions=True)  # the reader is free again
            self.in_flight -= 1
        if early:  # Prometheus never pipelines; a byte here would be lost, so stop
            raise ConnectionError("a request arrived before the previous answer")
        left = early == b""
        status = int(answer.split(b" ", 2)[1]) if answer else 0
        seconds = time.monotonic() - start
        header = _headers(head).get(HEADER)
        self.exchanges.append(Exchange(wall, header, status, seconds, left, body[:80]))
        if left or not answer:
            return False
        to_client.write(answer + body)
        await to_client.drain()
        return True


# --- Prometheus and the exporter as processes ---------------------------------------


def prometheus_config(replica: str, target: int, interval: float, timeout: float) -> str:
    """One scrape job for the exporter; the replica label sets this server's offset."""
    return (
        f"global:\n  scrape_interval: {interval * 1000:.0f}ms\n"
        f"  scrape_timeout: {timeout * 1000:.0f}ms\n"
        f"  evaluation_interval: 1m\n  external_labels: {{replica: {replica}}}\n"
        f"scrape_configs:\n  - job_name: pg\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{target}']}}]\n"
    )


@dataclass
class Prometheus:
    """A running Prometheus server and its HTTP API."""

    name: str
    port: int
    session: aiohttp.ClientSession
    log: Path

    async def ready(self) -> None:
        """Wait for ``/-/ready``; on failure, say why from the server's log."""
        try:
            await poll_async(lambda: _ready(self.port), f"prometheus {self.name} to be ready", 60)
        except TimeoutError as exc:
            tail = self.log.read_text(errors="replace")[-2000:]
            raise TimeoutError(f"{exc}; its log ends with:\n{tail}") from None

    async def api(self, path: str, **params: str) -> Any:
        """``/api/v1/<path>``'s data, failing on any error status."""
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        async with self.session.get(url, params=params) as response:
            payload = await response.json()
        if payload.get("status") != "success":
            raise RuntimeError(f"{self.name}: {path} {params}: {payload}")
        return payload["data"]

    async def raw(self, expr: str, start: float, end: float) -> list[tuple[float, float]]:
        """The stored samples of the single series ``expr`` with start ≤ t ≤ end."""
        span = max(1, int(end - start) + 2)
        data = await self.api("query", query=f"{expr}[{span}s]", time=f"{end:.3f}")
        assert len(data["result"]) == 1, f"{self.name}: {expr} matched {data['result']}"
        points = [(float(t), float(v)) for t, v in data["result"][0]["values"]]
        return [(t, v) for t, v in points if start <= t <= end]

    async def at(self, expr: str, when: float) -> list[tuple[dict[str, str], float]]:
        """Instant query: (labels, value) of every series of ``expr``."""
        data = await self.api("query", query=expr, time=f"{when:.3f}")
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]

    async def metrics(self) -> str:
        """Prometheus's own /metrics text."""
        async with self.session.get(f"http://127.0.0.1:{self.port}/metrics") as response:
            return await response.text()


@asynccontextmanager
async def prometheus(
    name: str, target: int, session: aiohttp.ClientSession, workdir: Path
) -> AsyncIterator[Prometheus]:
    """Debian's prometheus with its own storage, scraping 127.0.0.1:``target`` (started,
    not yet ready: see ``Prometheus.ready``)."""
    home = workdir / name
    home.mkdir()
    (home / "prometheus.yml").write_text(prometheus_config(name, target, INTERVAL, SCRAPE_TIMEOUT))
    port = free_port()
    with (home / "prometheus.log").open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            "prometheus", f"--config.file={home / 'prometheus.yml'}",
            f"--storage.tsdb.path={home / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
            stdout=log, stderr=log,
        )  # fmt: skip
    try:
        yield Prometheus(name, port, session, home / "prometheus.log")
    finally:
        await _stop(process)


def _ready(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"GET /-/ready HTTP/1.0\r\n\r\n")
            return sock.recv(64).startswith(b"HTTP/1.0 200")
    except OSError:
        return False


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(30):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()


@asynccontextmanager
async def exporter_process(cluster: LocalCluster, config: Path, log: Path) -> AsyncIterator[int]:
    """``python -m exporter`` serving ``config`` against ``cluster``; yields its port."""
    port = free_port()
    with log.open("wb") as sink:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "exporter", "-u", cluster.dsn(), "-c", str(config),
            "--web.listen-address", f"127.0.0.1:{port}", "-T", "5000", "--no-auto-discovery",
            cwd=REPO, env={**os.environ}, stdout=sink, stderr=sink,
        )  # fmt: skip
    try:
        await poll_async(lambda: _ready_exporter(port), "the exporter to listen", 60)
        yield port
    finally:
        await _stop(process)


def _ready_exporter(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


# --- the collectors -----------------------------------------------------------------


@dataclass(frozen=True)
class Markers:
    """Column names that identify each collector's SQL in the statement log."""

    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    @property
    def fast(self) -> str:
        return f"hafast_{self.tag}"

    @property
    def cached(self) -> str:
        return f"hacached_{self.tag}"

    @property
    def unbounded(self) -> str:
        return f"haunbounded_{self.tag}"

    @property
    def overrun(self) -> str:
        return f"haoverrun_{self.tag}"


def _collector(key: str, column: str, sql: str, ttl: float, timeout: float) -> str:
    return (
        f"{key}:\n  query: SELECT 1 AS {column}{sql}\n  ttl: {ttl:g}\n  timeout: {timeout:g}\n"
        f"  metrics:\n    - {column}: {{usage: GAUGE, description: ha pair probe}}\n"
    )


def collectors(markers: Markers, *, overrun: bool = False) -> str:
    """Phase 1's three collectors; with ``overrun``, phase 2's fast one and one unbounded
    collector slower than the scrape timeout.

    Phase 2 leaves out the bounded 0.6 s collector on purpose: one that starts just
    before the budget ends finishes past it (B11), and since the proxy keeps abandoned
    scrapes open, a late answer would overlap both servers' next scrapes, a third
    request at once that Prometheus alone never causes (its hang-up frees the slot).
    """
    fast = _collector("ha_fast", markers.fast, "", 0, 0.5)
    if overrun:
        return fast + _collector("ha_overrun", markers.overrun, " FROM pg_sleep(2)", 0, -1)
    return (
        fast
        + _collector("ha_cached", markers.cached, " FROM pg_sleep(0.6)", CACHED_TTL, 2)
        + _collector("ha_unbounded", markers.unbounded, " FROM pg_sleep(0.05)", 0, -1)
    )


# --- the run ------------------------------------------------------------------------


@dataclass
class Window:
    """A stretch of wall-clock time."""

    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Run:
    """Everything measured; turned into figures by ``figures``."""

    markers: Markers
    normal: Window  # phase 1, from both servers' first scrape
    overrun: Window  # phase 2, from the reload's answer
    first_request: float  # the exporter's first scrape (statement counts start here)
    served: int  # scrapes answered from the first one to the end of phase 1
    calls: dict[str, int]  # statement-log executions per collector during phase 1
    overrun_calls: int
    cancelled_in_server: int  # 57014 lines from the exporter's sessions
    servers: dict[str, ServerRecord]
    exporter_counters: dict[str, float]  # the exporter's own /metrics after the run
    exporter_log: str


@dataclass
class ServerRecord:
    """What one Prometheus server stored and what its proxy saw."""

    up: list[tuple[float, float]]
    duration: list[tuple[float, float]]
    pg_up: list[tuple[float, float]]
    up_overrun: list[tuple[float, float]]
    range_up: list[float]  # query_range of up at the scrape interval over phase 1
    stored_counters: dict[str, float]  # the exporter's counters as this server stored them
    interval_quantiles: dict[str, float]  # prometheus_target_interval_length_seconds
    exchanges: list[Exchange]
    overrun_exchanges: list[Exchange]


async def run_pair(normal_scrapes: int, overrun_scrapes: int, workdir: Path) -> Run:
    """Both phases against a fresh PostgreSQL 18; ``*_scrapes`` per server."""
    markers = Markers()
    config = workdir / "collectors.yml"
    config.write_text(collectors(markers))
    with LocalCluster(pg18_bindir(), settings=VERBOSE_LOG_SETTINGS) as cluster:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
            exporter_process(cluster, config, workdir / "exporter.log") as port,
        ):
            proxies = {"a": RecordingProxy(port), "b": RecordingProxy(port)}
            for proxy in proxies.values():
                await proxy.start()
            try:
                return await _phases(
                    cluster=cluster, port=port, proxies=proxies, session=session,
                    workdir=workdir, markers=markers, config=config,
                    scrapes=(normal_scrapes, overrun_scrapes),
                )  # fmt: skip
            finally:
                for proxy in proxies.values():
                    await proxy.close()


async def _phases(
    *,
    cluster: LocalCluster,
    port: int,
    proxies: dict[str, RecordingProxy],
    session: aiohttp.ClientSession,
    workdir: Path,
    markers: Markers,
    config: Path,
    scrapes: tuple[int, int],
) -> Run:
    async with (
        prometheus("a", proxies["a"].port, session, workdir) as prom_a,
        prometheus("b", proxies["b"].port, session, workdir) as prom_b,
    ):
        proms = {"a": prom_a, "b": prom_b}
        await asyncio.gather(prom_a.ready(), prom_b.ready())
        await _scrapes_since(proxies, 0.0, 1)
        first = min(p.exchanges[0].wall for p in proxies.values())
        normal = Window(time.time(), 0.0)
        await _scrapes_since(proxies, normal.start, scrapes[0])
        normal.end = time.time()
        served = sum(1 for p in proxies.values() for e in p.exchanges if e.wall <= normal.end)
        log = cluster.log_text()
        calls = {k: _calls(log, getattr(markers, k)) for k in ("fast", "cached", "unbounded")}
        await asyncio.to_thread(config.write_text, collectors(markers, overrun=True))
        async with session.post(f"http://127.0.0.1:{port}/reload") as answer:
            assert answer.status == 200, await answer.text()
        overrun = Window(time.time(), 0.0)
        await _scrapes_since(proxies, overrun.start, scrapes[1])
        overrun.end = time.time()
        await _scrapes_since(proxies, overrun.end, 1)  # everything up to the end is stored
        servers = {k: await _record(proms[k], proxies[k], normal, overrun) for k in proms}
    # Scrapes Prometheus abandoned at its stop are still answered through the proxies;
    # our own request must not be a third one at once.
    await poll_async(lambda: not any(p.in_flight for p in proxies.values()), "idle proxies", 30)
    log = cluster.log_text()
    return Run(
        markers=markers, normal=normal, overrun=overrun, first_request=first, served=served,
        calls=calls,
        overrun_calls=_calls(log, markers.overrun),
        cancelled_in_server=sum(
            1 for line in log.splitlines()
            if " 57014 " in line and "app=pg_exporter" in line and "ERROR:" in line
        ),
        servers=servers,
        exporter_counters=await _exporter_counters(session, port),
        exporter_log=(workdir / "exporter.log").read_text(errors="replace"),
    )  # fmt: skip


def _calls(log: str, marker: str) -> int:
    """Executions of ``marker``'s SQL by the exporter in a snapshot of the statement log,
    prepared ones included (``tests.fixtures.helpers.calls_in_log``)."""
    return calls_in_log(log, marker)


async def _scrapes_since(proxies: dict[str, RecordingProxy], wall: float, count: int) -> None:
    """Wait until every proxy has recorded ``count`` finished scrapes that began after ``wall``."""
    await poll_async(
        lambda: all(len(p.since(wall)) >= count for p in proxies.values()),
        f"{count} scrapes per Prometheus server",
        within=count * INTERVAL * 2 + 30,
    )


async def _record(
    prom: Prometheus, proxy: RecordingProxy, normal: Window, overrun: Window
) -> ServerRecord:
    start, end = normal.start, normal.end
    data = await prom.api("query_range", query="up", start=f"{start:.3f}", end=f"{end:.3f}",
                          step=f"{INTERVAL:g}")  # fmt: skip
    stored = await prom.at('{__name__=~"pg_exporter_requests_.*"}', end)
    return ServerRecord(
        up=await prom.raw("up", start, end),
        duration=await prom.raw("scrape_duration_seconds", start, end),
        pg_up=await prom.raw("pg_up", start, end),
        up_overrun=await prom.raw("up", overrun.start, overrun.end),
        range_up=[float(v) for series in data["result"] for _, v in series["values"]],
        stored_counters={_series_name(labels): value for labels, value in stored},
        interval_quantiles=_interval_quantiles(await prom.metrics()),
        exchanges=[e for e in proxy.exchanges if start <= e.wall <= end],
        overrun_exchanges=[e for e in proxy.exchanges if overrun.start <= e.wall <= overrun.end],
    )


def _series_name(labels: dict[str, str]) -> str:
    name = labels["__name__"]
    return f"{name}{{reason={labels['reason']}}}" if "reason" in labels else name


def _interval_quantiles(text: str) -> dict[str, float]:
    prefix = 'prometheus_target_interval_length_seconds{interval="1s",quantile="'
    return {
        line[len(prefix) :].split('"', 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix)
    }


async def _exporter_counters(session: aiohttp.ClientSession, port: int) -> dict[str, float]:
    """The exporter's admission counters, read directly once the Prometheus servers stopped."""
    async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
        text = await response.text()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("pg_exporter_requests_") and " " in line:
            name, number = line.rsplit(" ", 1)
            out[name.replace('"', "")] = float(number)
    return out


# --- figures ------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One line of the table: a claim, what it needs, what was measured."""

    key: str
    check: str
    expected: str
    measured: str
    ok: bool


def _q(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _gap(points: list[tuple[float, float]]) -> float:
    times = [t for t, _ in points]
    return max((b - a for a, b in itertools.pairwise(times)), default=float("inf"))


def _each(run: Run, show: Callable[[ServerRecord], str]) -> str:
    return "; ".join(f"{name}: {show(record)}" for name, record in run.servers.items())


def _samples_row(run: Run) -> Row:
    expected = run.normal.seconds / INTERVAL

    def ok(r: ServerRecord) -> bool:
        return len(r.up) >= int(expected) - 1 and _gap(r.up) <= 1.5 * INTERVAL

    return Row(
        "samples",
        "no missing samples",
        f"≈ {expected:.0f} per server, gaps ≈ {INTERVAL:g} s",
        _each(run, lambda r: f"{len(r.up)} samples, max gap {_gap(r.up):.3f} s"),
        all(ok(r) for r in run.servers.values()),
    )


def _up_rows(run: Run) -> list[Row]:
    def up_ok(r: ServerRecord) -> bool:
        return bool(r.up) and all(v == 1 for _, v in r.up) and all(v == 1 for v in r.range_up)

    def pg_up_ok(r: ServerRecord) -> bool:
        return len(r.pg_up) == len(r.up) and all(v == 1 for _, v in r.pg_up)

    def zeros(r: ServerRecord) -> int:
        return sum(1 for _, v in r.up if v != 1)

    return [
        Row(
            "up",
            "`up` = 1 throughout (raw samples, query_range)",
            "no 0 sample",
            _each(
                run,
                lambda r: (
                    f"{zeros(r)} zeros of {len(r.up)}, range min "
                    f"{min(r.range_up, default=float('nan')):g}"
                ),
            ),
            all(up_ok(r) for r in run.servers.values()),
        ),
        _samples_row(run),
        Row(
            "pg_up",
            "`pg_up` = 1 in every scrape",
            "1 in every sample",
            _each(
                run,
                lambda r: (
                    f"min {min((v for _, v in r.pg_up), default=float('nan')):g}"
                    f" over {len(r.pg_up)}"
                ),
            ),
            all(pg_up_ok(r) for r in run.servers.values()),
        ),
    ]


def _duration_rows(run: Run) -> list[Row]:
    def show(r: ServerRecord) -> str:
        values = [v for _, v in r.duration]
        return f"p50 {_q(values, 0.5):.3f} s, max {max(values, default=float('nan')):.3f} s"

    def proxy(r: ServerRecord) -> str:
        values = [e.seconds for e in r.exchanges]
        return f"p50 {_q(values, 0.5) * 1000:.0f} ms, p99 {_q(values, 0.99) * 1000:.0f} ms"

    def quantiles(r: ServerRecord) -> str:
        q = r.interval_quantiles
        return f"p1 {q.get('0.01', float('nan')):.3f} s, p99 {q.get('0.99', float('nan')):.3f} s"

    within = all(v < SCRAPE_TIMEOUT for r in run.servers.values() for _, v in r.duration)
    return [
        Row(
            "duration",
            "`scrape_duration_seconds` within the timeout",
            f"< {SCRAPE_TIMEOUT:g} s",
            _each(run, show),
            within and all(r.duration for r in run.servers.values()),
        ),
        Row(
            "latency",
            "exporter's answer time at its socket (proxy)",
            "report",
            _each(run, proxy),
            True,
        ),
        Row(
            "interval",
            "Prometheus's actual scrape interval",
            f"≈ {INTERVAL:g} s",
            _each(run, quantiles),
            True,
        ),
    ]


def _sql_rows(run: Run) -> list[Row]:
    span = run.normal.end - run.first_request
    ceiling = span / CACHED_TTL + 1
    # Refreshed once expired: at the next scrape of either server, then 0.6 s to run.
    floor = max(1, int(span / (CACHED_TTL + 2 * INTERVAL)))
    scrapes = run.served
    cached, fast, unbounded = (run.calls[k] for k in ("cached", "fast", "unbounded"))
    return [
        Row(
            "cached",
            f"cached 0.6 s collector (ttl {CACHED_TTL:g}) runs once per TTL window",
            f"{floor} ≤ runs ≤ {ceiling:.1f} ({span:.0f} s / ttl + 1); once per scraper "
            f"would be ≈ {2 * span / CACHED_TTL:.0f}",
            f"{cached} runs in {span:.0f} s",
            floor <= cached <= ceiling,
        ),
        Row(
            "per_pass",
            "fast and unbounded collectors (ttl 0) run on every pass",
            "≈ one per scrape",
            f"fast {fast}, unbounded {unbounded}, for {scrapes} scrapes",
            min(fast, unbounded) >= 0.9 * scrapes,
        ),
    ]


def _no_503_rows(run: Run) -> list[Row]:
    def statuses(r: ServerRecord) -> str:
        codes = sorted({e.status for e in r.exchanges})
        left = sum(e.client_left for e in r.exchanges)
        return f"{len(r.exchanges)} scrapes, status {codes}, hung up {left}"

    def stored(r: ServerRecord) -> str:
        c = r.stored_counters
        return ", ".join(
            f"{k.removeprefix('pg_exporter_requests_')} {v:g}"
            for k, v in sorted(c.items())
            if "rejected" in k or "interrupted" in k
        )

    def stored_ok(r: ServerRecord) -> bool:
        bad = [v for k, v in r.stored_counters.items() if "rejected" in k or "interrupted" in k]
        return len(bad) >= 2 and all(v == 0 for v in bad)

    proxies_ok = all(
        r.exchanges and all(e.status == 200 and not e.client_left for e in r.exchanges)
        for r in run.servers.values()
    )
    return [
        Row(
            "no_503",
            "no 503 in normal operation (proxy)",
            "every scrape 200, none abandoned",
            _each(run, statuses),
            proxies_ok,
        ),
        Row(
            "counters",
            "exporter's rejected/interrupted counters (as stored by Prometheus)",
            "all 0",
            _each(run, stored),
            all(stored_ok(r) for r in run.servers.values()),
        ),
    ]


def _budget_rows(run: Run) -> list[Row]:
    headers = {e.header for r in run.servers.values() for e in r.exchanges}
    overrun = [e for r in run.servers.values() for e in r.overrun_exchanges]
    logged = run.exporter_log.count("collection round interrupted: the request's budget ran out")

    def answered(r: ServerRecord) -> str:
        codes = sorted({e.status for e in r.overrun_exchanges})
        took = [e.seconds for e in r.overrun_exchanges]
        left = sum(e.client_left for e in r.overrun_exchanges)
        return (
            f"{codes} after {min(took, default=0):.2f}–{max(took, default=0):.2f} s "
            f"({left} of {len(took)} after Prometheus gave up)"
        )

    # Until the breaker sheds the slow collector (two passes past their budget, D16),
    # every answer is 503 "budget ran out" at the scrape timeout; after, a quick 200.
    out_of_budget = [e for e in overrun if e.status == 503 and OUT_OF_BUDGET in e.body_start]
    shed = [e for e in overrun if e.status == 200]
    budget_ok = len(out_of_budget) >= 2 and len(out_of_budget) + len(shed) == len(overrun)
    times = [e.seconds for e in out_of_budget] or [0.0]
    up_zero = all(
        r.up_overrun and any(v == 0 for _, v in r.up_overrun) for r in run.servers.values()
    )
    return [
        Row(
            "header",
            "scrape-timeout header reached the exporter",
            f"{SCRAPE_TIMEOUT:g} on every scrape",
            f"values seen: {sorted(map(str, headers))}",
            headers == {f"{SCRAPE_TIMEOUT:g}"},
        ),
        Row(
            "budget",
            "…and became its budget (2 s unbounded collector)",
            "503 'budget ran out' ≈ 0.9 s until the breaker sheds the collector, then 200 "
            "at once (30 s default: 200 after 2 s); logged as budget",
            _each(run, answered) + f"; exporter log: {logged} rounds out of budget",
            budget_ok
            and min(times) >= SCRAPE_TIMEOUT - 0.05
            and max(e.seconds for e in overrun) < 1.8
            and logged >= len(out_of_budget),
        ),
        Row(
            "overrun",
            "overrun phase seen by Prometheus",
            "`up` 0 until the breaker sheds it, SQL cancelled (57014)",
            _each(run, lambda r: f"up {sorted({v for _, v in r.up_overrun})}")
            + f"; {run.overrun_calls} runs, {run.cancelled_in_server} cancelled",
            up_zero and run.cancelled_in_server >= 1,
        ),
    ]


def _exporter_rows(run: Run) -> list[Row]:
    rejected = run.exporter_counters.get("pg_exporter_requests_rejected_total", float("nan"))
    tracebacks = run.exporter_log.count("Traceback")
    return [
        Row(
            "exporter",
            "exporter after both phases",
            "0 rejected, no traceback",
            f"rejected {rejected:g}, tracebacks {tracebacks}",
            rejected == 0 and tracebacks == 0,
        )
    ]


def figures(run: Run) -> list[Row]:
    """Every claim of the HA pair with its measurement."""
    return [
        *_up_rows(run),
        *_duration_rows(run),
        *_sql_rows(run),
        *_no_503_rows(run),
        *_budget_rows(run),
        *_exporter_rows(run),
    ]


def table(rows: list[Row]) -> str:
    """A Markdown table of the rows."""
    lines = ["| check | expected | measured | ok |", "|---|---|---|---|"]
    lines += [
        f"| {r.check} | {r.expected} | {r.measured} | {'yes' if r.ok else 'NO'} |" for r in rows
    ]
    return "\n".join(lines)


async def main(argv: list[str] | None = None) -> int:
    """Run the pair for ``--minutes`` and print the table; exit 1 if any check failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="length of phase 1")
    parser.add_argument("--overrun-seconds", type=float, default=10.0, help="length of phase 2")
    parser.add_argument("--keep", type=Path, help="keep the logs in this new directory")
    args = parser.parse_args(argv)
    scrapes = int(args.minutes * 60 / INTERVAL), max(2, int(args.overrun_seconds / INTERVAL))
    started = time.monotonic()
    if args.keep is not None:
        args.keep.mkdir(parents=True)
        run = await run_pair(*scrapes, args.keep)
    else:
        with tempfile.TemporaryDirectory(prefix="ha-pair-") as tmp:
            run = await run_pair(*scrapes, Path(tmp))
    rows = figures(run)
    print(
        f"phase 1: {run.normal.seconds:.0f} s, phase 2: {run.overrun.seconds:.0f} s, "
        f"wall {time.monotonic() - started:.0f} s; interval {INTERVAL:g} s, "
        f"scrape_timeout {SCRAPE_TIMEOUT:g} s\n"
    )
    print(table(rows))
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(asyncio.run(main()))
