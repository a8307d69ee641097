"""Fleet pages under load (issue 25, finding 2): a large fleet's /targets, /sd and
/metrics cost the event loop little, sit under admission and write deadlines, and keep
memory flat under unread requests; a reload that changes every target does not stall
the loop. /alive, the liveness probe, keeps answering fast throughout.

No database is needed: pages never connect, so every target is a closed loopback port.
The fleet is served in-process with the production runner on a random port
(tests/integration/fleetrig); the attacking and measuring clients share its event loop,
so an /alive request's latency is the loop's own stall.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from exporter.config.settings import Settings
from exporter.config.targetsfile import load_targets
from exporter.fleet.members import APPLY_CHUNK
from exporter.web.fleetpages import FLEET_PAGES, Page
from rigs.localpg import free_port
from tests.fixtures.fleetrig import fleet_of, serving_fleet, write_targets
from tests.fixtures.helpers import write_collectors
from tests.fixtures.polling import poll
from tests.fixtures.rawhttp import Served, get

pytestmark = pytest.mark.usefixtures("enough_descriptors")

TARGETS = 3000  # big enough that rendering or rebuilding the fleet takes seconds unbounded
ALIVE_LIMIT = 0.5  # seconds: the issue asks for 0.1; a wide margin for a shared machine
COLLECTOR = """
pages_one:
  query: SELECT 1 AS one
  metrics:
    - one: {usage: GAUGE, description: one}
"""


def _targets(port: int) -> list[dict[str, str]]:
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres?sslmode=disable"
    return [{"name": f"t{i:05d}", "url": url} for i in range(TARGETS)]


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[tuple[Served, Path]]:
    """A fleet of TARGETS unreachable targets, served; and its targets file."""
    definitions = write_collectors(tmp_path, COLLECTOR)
    settings = Settings(auto_discovery=False, config=str(tmp_path / "collectors.yml"))
    targets_file = write_targets(tmp_path / "targets.yml", _targets(free_port()))
    async with serving_fleet(settings, definitions, targets_file) as served:
        yield served, targets_file


class AliveWatch:
    """Asks /alive on fresh connections, one after another, until stopped; each latency
    counts from when the request was due, so a stall of the shared event loop between
    two requests is seen too."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.latencies: list[float] = []
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        pause = 0.02
        while True:
            due = time.monotonic() + pause  # a stall during the pause delays this request too
            await asyncio.sleep(pause)
            response = await get(self.port, "/alive")
            assert response.status == 200
            self.latencies.append(time.monotonic() - due)

    async def stop(self) -> float:
        """The slowest /alive answer seen."""
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        assert len(self.latencies) >= 5, "too few /alive answers to judge"
        return max(self.latencies)


def _non_reader(port: int, path: str) -> socket.socket:
    """A plain socket that sends one request and never reads (nothing in this process
    buffers its answer, so the RSS measured is the server's)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)  # before the window is set
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return sock


def _asked(page: Page) -> int:
    return page.admission.admitted + page.admission.rejected


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def test_unread_page_requests_keep_alive_fast_and_memory_flat(
    fleet: tuple[Served, Path],
) -> None:
    """400 /targets and /sd requests whose answers are never read: each page is rendered
    once and shared, at most a few answers are written at once (the rest get 503 at
    once, and the kernel buffers little of each), memory stays flat, and /alive answers
    fast (before: /alive took seconds and memory grew by a page per request)."""
    served, _ = fleet
    port = served.port
    for path in ("/targets", "/sd"):  # warm: the first rendering is not the attack
        assert (await get(port, path)).status == 200
    before = _rss_mib()
    watch = AliveWatch(port)
    pages = served.app[FLEET_PAGES]
    clients = []
    for i in range(400):
        clients.append(_non_reader(port, ("/targets", "/sd")[i % 2]))
        await asyncio.sleep(0.005)  # the attack's pace: 400 requests in about 2 s
    await poll(lambda: _asked(pages.targets) + _asked(pages.sd) >= 402, "every request taken")
    grown = _rss_mib() - before
    slowest = await watch.stop()
    for sock in clients:
        sock.close()
    renderings = pages.targets.renderings, pages.sd.renderings
    print(f"\n400 unread page requests: /alive slowest {slowest * 1000:.0f} ms, "
          f"RSS +{grown:.0f} MiB, renderings {renderings}")  # fmt: skip
    assert slowest < ALIVE_LIMIT
    assert grown < 60  # before: +~250 MiB (a 700 KB page per unread request)
    assert pages.sd.renderings == 1  # /sd changes only with the fleet
    # The kernel holds little of each unread page (before: all of it, 1.5 GB for 2 000
    # requests at 10 000 targets): they stall, hold the few writer places, the rest 503.
    refused = pages.targets.admission.rejected + pages.sd.admission.rejected
    assert refused > 300
    assert pages.targets.renderings < 20  # a live page: again once stale
    assert pages.targets.admission.writing <= pages.targets.admission.write_limit


async def test_metrics_loops_share_renderings_and_alive_stays_fast(
    fleet: tuple[Served, Path],
) -> None:
    """Four clients asking /metrics of the fleet in a loop: renderings are shared, so
    /alive stays fast (before: each request rendered every target on the loop)."""
    served, _ = fleet
    port = served.port
    watch = AliveWatch(port)
    until = time.monotonic() + 4
    answered = 0

    async def loop() -> None:
        nonlocal answered
        while time.monotonic() < until:
            response = await get(port, "/metrics")
            assert response.status in (200, 503)
            answered += response.status == 200

    await asyncio.gather(*(loop() for _ in range(4)))
    slowest = await watch.stop()
    renderings = served.app[FLEET_PAGES].metrics.renderings
    print(f"\n/metrics x4: {answered} answers from {renderings} renderings, "
          f"/alive slowest {slowest * 1000:.0f} ms")  # fmt: skip
    assert slowest < ALIVE_LIMIT * 2  # the first rendering is one request's work
    assert answered > 20
    assert renderings < answered / 4


async def test_reload_changing_every_target_lets_the_loop_run(
    fleet: tuple[Served, Path], tmp_path: Path
) -> None:
    """Applying a targets file that changes every target builds the new members and
    closes the old ones a chunk at a time, the event loop running in between (before: the
    whole rebuild ran in one turn of the loop: at 10 000 targets /alive waited 7 s), and
    every target is served by its new settings afterwards."""
    served, targets_file = fleet
    the_fleet = fleet_of(served)
    old = the_fleet.member("t00000")
    write_targets(targets_file, _targets(free_port()))
    declared = load_targets(str(targets_file), the_fleet.settings)
    stalls: list[float] = []

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0)
            now = time.monotonic()
            stalls.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)  # the ticker runs before the reload starts
    started = time.monotonic()
    summary = await the_fleet.apply(declared, None)
    took = time.monotonic() - started
    ticker.cancel()
    longest = max(stalls)
    print(f"\napply of {TARGETS} changed targets: {took:.2f} s, {len(stalls)} turns of the "
          f"loop, longest stall {longest * 1000:.0f} ms; {summary}")  # fmt: skip
    assert f"{TARGETS} changed" in summary
    assert the_fleet.member("t00000") is not old
    assert len(the_fleet.members) == TARGETS
    # The loop ran between chunks (before: a handful of turns, all after the rebuild);
    # the longest stall left is a full garbage collection, not the rebuild.
    assert len(stalls) >= TARGETS // APPLY_CHUNK
    assert longest < ALIVE_LIMIT * 2
