"""Hostile clients against a real exporter process (issue 17): clients that never read a
multi-megabyte answer, and a flood of /reload requests, must not stop scrapes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from rigs.localpg import VERBOSE_LOG_SETTINGS, LocalCluster, free_port, pg18_bindir
from tests.fixtures.helpers import COLLECTORS, REPO, statement_calls, terminate, value
from tests.fixtures.polling import wait_for

pytestmark = pytest.mark.pg

# About 6 MB of text: far more than a socket's buffers hold for a client that reads nothing.
BIG = """
hostile_big:
  query: >-
    SELECT g::text AS id, repeat('x', 160) AS pad, g AS v FROM generate_series(1, 30000) g
  ttl: 300
  timeout: 10
  max_series: 50000
  metrics:
    - id: {usage: LABEL, description: row}
    - pad: {usage: LABEL, description: padding}
    - v: {usage: GAUGE, description: a value}
"""
CACHED = """
hostile_cached:
  query: SELECT 1 AS {marker}
  ttl: 300
  timeout: 5
  metrics:
    - {marker}: {{usage: GAUGE, description: a value}}
"""
WRITE_STALL = 5.0  # exporter.web.metrics.WRITE_STALL_SECONDS: a stalled answer is cut then


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(pg18_bindir(), settings=VERBOSE_LOG_SETTINGS) as own:
        yield own


@contextlib.contextmanager
def exporter(cluster: LocalCluster, config: Path, log: Path) -> Iterator[int]:
    """``python -m exporter`` serving ``config``; yields its port once it answers."""
    port = free_port()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "exporter", "-u", cluster.dsn(), "-c", str(config),
             "--web.listen-address", f"127.0.0.1:{port}", "-T", "5000", "--no-auto-discovery"],
            cwd=REPO, stdout=sink, stderr=sink, env={**os.environ},
        )  # fmt: skip
    try:
        wait_for(lambda: _status(port, "/version") == 200, "the exporter to listen")
        yield port
    finally:
        terminate(process)


def _status(port: int, path: str) -> int:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
            return int(sock.recv(64).split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _non_reader(port: int) -> socket.socket:
    """A client with a tiny receive buffer and no scrape-timeout header (the 30 s budget),
    admitted for the metrics, that reads no more than its status line (retried while the
    slots are still busy with an earlier one)."""
    request = "GET /metrics HTTP/1.1\r\nHost: exporter\r\n\r\n"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        sock.settimeout(10)
        sock.connect(("127.0.0.1", port))
        sock.sendall(request.encode())
        if sock.recv(12) == b"HTTP/1.1 200":
            return sock
        sock.close()
    raise AssertionError("a non-reading client was never admitted")


async def _scrape(session: aiohttp.ClientSession, port: int) -> tuple[int, str, float]:
    started = time.monotonic()
    async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
        return response.status, await response.text(), time.monotonic() - started


async def _first(session: aiohttp.ClientSession, port: int, status: int, within: float) -> float:
    """Scrape until one answers ``status``; when (monotonic). Fails after ``within`` s."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if (await _scrape(session, port))[0] == status:
            return time.monotonic()
        await asyncio.sleep(0.05)
    raise AssertionError(f"no scrape answered {status} within {within} s")


async def test_clients_that_never_read_hold_no_slot_and_are_cut_off(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Two clients that never read a ~6 MB answer and send no scrape-timeout header: a
    scrape is answered 200 while they hold their connections (B2: a slot is given back
    once its answer is rendered; writing holds only a writer's place), and each is cut off
    once its answer makes no progress for a few seconds, not after the 30 s budget
    (issue 25; before: every scrape got 503 for 30 s, and again as they asked again)."""
    config = tmp_path / "big.yml"
    config.write_text(BIG)
    with exporter(cluster, config, tmp_path / "exporter.log") as port:
        async with aiohttp.ClientSession() as session:
            status, body, _ = await _scrape(session, port)  # warm the cache: 6 MB
            assert status == 200
            assert len(body) > 5_000_000
            started = time.monotonic()
            hostile = [_non_reader(port) for _ in range(2)]
            try:
                for _ in range(3):
                    assert (await _scrape(session, port))[0] == 200
                while True:
                    after = (await _scrape(session, port))[1]
                    cut = value(after, "pg_exporter_requests_interrupted_total",
                                reason="write_timeout")  # fmt: skip
                    if cut == 2 or time.monotonic() - started > 25:
                        break
                    await asyncio.sleep(0.2)
            finally:
                for sock in hostile:
                    sock.close()
    took = time.monotonic() - started
    print(f"\ntwo non-reading clients: scrapes answered 200; cut off within {took:.1f} s")
    assert cut == 2
    assert took < WRITE_STALL + 10  # far below the 30 s budget
    assert value(after, "pg_exporter_requests_in_flight") == 1  # this scrape alone


async def _reload_loop(session: aiohttp.ClientSession, port: int, until: float) -> int:
    count = 0
    while time.monotonic() < until:
        async with session.get(f"http://127.0.0.1:{port}/reload") as response:
            assert response.status == 200, await response.text()
            await response.read()
        count += 1
    return count


async def test_reload_flood_leaves_scrapes_within_budget(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Twenty concurrent GET /reload loops (what a cross-site <img> could send) while
    Prometheus scrapes the default library: reloads are serialised and find the files
    unchanged, so plans and caches stay, every scrape is 200 and fast, and a cached
    collector ran once."""
    marker = f"flood_{os.getpid()}"
    config = tmp_path / "library"  # the default library: every reload would parse ~50 files
    shutil.copytree(COLLECTORS, config)
    (config / "9990-cached.yml").write_text(CACHED.format(marker=marker))
    with exporter(cluster, config, tmp_path / "exporter.log") as port:
        async with aiohttp.ClientSession() as session:
            assert (await _scrape(session, port))[0] == 200
            until = time.monotonic() + 6
            flood = [asyncio.create_task(_reload_loop(session, port, until)) for _ in range(20)]
            latencies = []
            while time.monotonic() < until:
                status, body, seconds = await _scrape(session, port)
                assert status == 200
                assert value(body, f"hostile_cached_{marker}") == 1
                latencies.append(seconds)
                await asyncio.sleep(0.2)
            reloads = sum(await asyncio.gather(*flood))
    print(f"\nreload flood: {reloads} reloads answered, {len(latencies)} scrapes served, "
          f"slowest {max(latencies) * 1000:.0f} ms")  # fmt: skip
    assert reloads > 100, "the flood was too thin to prove anything"
    assert len(latencies) >= 20
    assert max(latencies) < 3.0  # alone a cached scrape takes ~0.1 s; a wide margin
    assert statement_calls(cluster, marker) == 1  # caches survived every reload
