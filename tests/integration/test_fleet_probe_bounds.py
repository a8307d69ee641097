"""The fleet's health probes within bounds, on real servers (issue 25, findings 1 and 2).

Any client can name any declared target on a health path (the names are public at
/sd). Naming hundreds of unreachable ones must not starve the loop, nor make the
healthy target's routing or scrapes wrong; past the probe ceiling a request gets an
honest "not probed", never a false "down"; a probe whose deadline the busy loop reached
late records no "down" either.

Unreachable targets are closed loopback ports. Tests wait on conditions with deadlines;
the timing bound on /alive is wide (the machine is shared).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import exporter.fleet.members as fleet_module
from exporter.config.settings import Settings
from exporter.health.probe import HealthProbe, Status
from exporter.health.probeslots import NOT_PROBED
from rigs.localpg import LocalCluster, free_port
from tests.fixtures.fleetrig import fleet_of, member, serving_fleet, write_targets
from tests.fixtures.helpers import REPO, http_get, terminate, value, write_collectors
from tests.fixtures.polling import wait_for
from tests.fixtures.rawhttp import Response, Served, get

pytestmark = pytest.mark.pg

COLLECTORS = """
bounds_quick:
  query: SELECT 1 AS bounds_one
  ttl: 0
  timeout: 5
  metrics:
    - bounds_one: {usage: GAUGE, description: one}
"""


def _closed_ports(count: int) -> list[int]:
    """Loopback ports nothing listens on (bound, then released): connections are refused."""
    ports: set[int] = set()
    while len(ports) < count:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            ports.add(sock.getsockname()[1])
    return sorted(ports)


def _fleet(healthy: dict[str, str], unreachable: int) -> list[dict[str, Any]]:
    """Targets: the healthy ones by name, then t0, t1, … on closed ports."""
    targets: list[dict[str, Any]] = [{"name": n, "url": url} for n, url in healthy.items()]
    for index, port in enumerate(_closed_ports(unreachable)):
        url = f"postgresql://postgres@127.0.0.1:{port}/postgres?sslmode=disable"
        targets.append({"name": f"t{index}", "url": url})
    return targets


@contextlib.contextmanager
def _fleet_process(tmp_path: Path, targets: list[dict[str, Any]]) -> Iterator[int]:
    """``python -m exporter --targets.file`` with the library's collectors and the default
    connect timeout (100 ms), as the review ran it; its port once it answers /alive."""
    targets_file = write_targets(tmp_path / "targets.yml", targets)
    port = free_port()
    log = tmp_path / "exporter.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "exporter", "--targets.file", str(targets_file),
             "-c", str(REPO / "collectors"), "--web.listen-address", f"127.0.0.1:{port}"],
            cwd=REPO, stdout=sink, stderr=sink,
        )  # fmt: skip
    try:
        wait_for(
            lambda: (
                process.poll() is not None or http_get(f"http://127.0.0.1:{port}/alive")[0] == 200
            ),
            "the fleet exporter",
        )
        assert process.poll() is None, log.read_text()
        yield port
    finally:
        terminate(process)


async def _timed(port: int, path: str) -> tuple[Response, float]:
    started = time.monotonic()
    response = await asyncio.wait_for(get(port, path), 30)
    return response, time.monotonic() - started


@pytest.mark.concurrency
async def test_health_requests_for_unreachable_targets_leave_the_healthy_one_served(
    pg18: LocalCluster, tmp_path: Path
) -> None:
    """Finding 1 at a reduced scale: 300 declared targets, 299 unreachable, and a client
    naming 200 of them on /up again and again. The healthy target keeps answering 200 on
    /probe and 'primary' on /primary, and /alive answers promptly (before: the probes of
    the unreachable targets spent the loop on connection attempts)."""
    with _fleet_process(tmp_path, _fleet({"a": pg18.dsn()}, 299)) as port:
        assert (await get(port, "/primary?target=a")).text == "primary"
        names = [f"t{i}" for i in range(200)]
        stop = time.monotonic() + 12.0
        alive: list[float] = []
        scrapes: list[int] = []
        routing: list[str] = []

        async def attacker(start: int) -> None:
            index = start
            while time.monotonic() < stop:
                answer = await asyncio.wait_for(get(port, f"/up?target={names[index % 200]}"), 30)
                assert answer.status == 503, answer.text  # down, unknown or not probed
                index += 20

        async def measure() -> None:
            while time.monotonic() < stop:
                alive.append((await _timed(port, "/alive"))[1])
                response, _ = await _timed(port, "/primary?target=a")
                routing.append(f"{response.status} {response.text}")
                if len(alive) % 4 == 0:
                    scrapes.append((await _timed(port, "/probe?target=a"))[0].status)
                await asyncio.sleep(0.2)

        await asyncio.gather(*(attacker(k) for k in range(20)), measure())
    assert set(routing) == {"200 primary"}, routing
    assert scrapes, "no scrape of a was measured"
    assert set(scrapes) == {200}, scrapes
    assert statistics.median(alive) < 0.5, sorted(alive)


def _hog_the_loop(seconds: float) -> None:
    """Keep the event loop from doing anything else for ``seconds`` (as a page built on
    it would)."""
    time.sleep(seconds)


@pytest.fixture
async def small_ceiling(
    monkeypatch: pytest.MonkeyPatch, pg18: LocalCluster, tmp_path: Path
) -> AsyncIterator[Served]:
    """A fleet in-process whose probe ceiling is 2 places, given up after 0.5 s unasked:
    targets a and b on PostgreSQL 18, t0…t2 unreachable."""
    monkeypatch.setattr(fleet_module, "DEFAULT_MAX_PROBES", 2)
    monkeypatch.setattr(fleet_module, "YIELD_AFTER", 0.5)
    definitions = write_collectors(tmp_path, COLLECTORS)
    targets_file = write_targets(
        tmp_path / "targets.yml", _fleet({"a": pg18.dsn(), "b": pg18.dsn()}, 3)
    )
    settings = Settings(auto_discovery=False, config=str(tmp_path / "collectors.yml"))
    async with serving_fleet(settings, definitions, targets_file) as served:
        yield served


async def test_past_the_ceiling_a_request_is_not_probed_and_no_probe_is_displaced(
    small_ceiling: Served,
) -> None:
    """With every place asked about recently, another name gets 503 'not probed' and
    starts nothing; the routed target's probe and answer are untouched."""
    port = small_ceiling.port
    assert (await get(port, "/primary?target=b")).text == "primary"
    assert (await get(port, "/up?target=t0")).text == Status.DOWN.value
    for name in ("t1", "a"):
        refused = await get(port, f"/primary?target={name}")
        assert (refused.status, refused.text) == (503, NOT_PROBED)
        assert not member(small_ceiling, name).probing
    assert (await get(port, "/primary?target=b")).text == "primary"
    assert member(small_ceiling, "b").probing
    assert fleet_of(small_ceiling).probes.alive == 2


async def _fleet_metric(port: int, name: str, want: float) -> None:
    """Wait until /metrics shows ``name`` at ``want`` (the page is shared while fresh)."""
    shown: list[float] = []

    async def check() -> bool:
        shown.append(value((await get(port, "/metrics")).text, name))
        return shown[-1] == want

    deadline = time.monotonic() + 20
    while not await check():
        assert time.monotonic() < deadline, f"{name} to reach {want}, shown {shown[-5:]}"
        await asyncio.sleep(0.05)


async def test_metrics_show_the_probe_ceiling_refusing_and_displacing(
    small_ceiling: Served,
) -> None:
    """/metrics shows the two places held, the ceiling, each health request answered
    "not probed" and each idle probe displaced: an operator sees the ceiling at work."""
    port = small_ceiling.port
    await _fleet_metric(port, "pg_exporter_fleet_probes_max", 2)
    await _fleet_metric(port, "pg_exporter_fleet_probes_connecting_max", 16)
    await _fleet_metric(port, "pg_exporter_fleet_probes_refused_total", 0)
    assert (await get(port, "/primary?target=b")).text == "primary"
    assert (await get(port, "/up?target=t0")).text == Status.DOWN.value
    refused = [(await get(port, f"/up?target={name}")).text for name in ("t1", "t2", "a")]
    assert refused == [NOT_PROBED] * 3
    await _fleet_metric(port, "pg_exporter_fleet_probes", 2)
    await _fleet_metric(port, "pg_exporter_fleet_probes_refused_total", 3)
    await _fleet_metric(port, "pg_exporter_fleet_probes_displaced_total", 0)
    deadline = time.monotonic() + 20
    while (await get(port, "/primary?target=a")).status != 200:  # once b idled 0.5 s
        assert time.monotonic() < deadline, "b's place to be given up"
        await asyncio.sleep(0.05)
    await _fleet_metric(port, "pg_exporter_fleet_probes_displaced_total", 1)
    await _fleet_metric(port, "pg_exporter_fleet_probes", 2)


async def test_an_idle_probe_gives_its_place_and_comes_back_without_a_false_down(
    small_ceiling: Served,
) -> None:
    """Once the least recently asked probe has gone unasked for the idle time, a new name
    takes its place; the displaced healthy target, asked again, takes back a place and
    answers 'primary' after its first probe, never 'down'."""
    port = small_ceiling.port
    fleet = fleet_of(small_ceiling)
    assert (await get(port, "/primary?target=b")).text == "primary"
    assert (await get(port, "/up?target=t0")).text == Status.DOWN.value
    deadline = time.monotonic() + 20
    while (answer := await get(port, "/primary?target=a")).status != 200:
        assert answer.text == NOT_PROBED  # refused until b has been idle for 0.5 s
        assert time.monotonic() < deadline, "b's place to be given up"
        await asyncio.sleep(0.05)
    assert answer.text == "primary"
    assert not member(small_ceiling, "b").probing  # b, asked longest ago, was displaced
    assert fleet.probes.holds("t0")
    assert fleet.probes.displaced == 1
    while (answer := await get(port, "/primary?target=b")).status != 200:
        assert answer.text == NOT_PROBED  # until t0 has been idle in turn
        assert time.monotonic() < deadline, "t0's place to be given up"
        await asyncio.sleep(0.05)
    assert answer.text == "primary"
    assert not member(small_ceiling, "t0").probing
    assert sum(m.probing for m in fleet.members.values()) <= 2


async def test_a_busy_loop_never_makes_a_healthy_primary_read_down(pg18: LocalCluster) -> None:
    """Finding 2's probe half: the loop blocked for 200 ms at every turn (pages built on
    it, say) while the probe asks a healthy primary with the default 100 ms connect
    timeout. The probe takes no reading it could not hear; it never says 'down', and
    says 'primary' again once the loop is free."""
    loop = asyncio.get_running_loop()
    probe = HealthProbe(pg18.dsn(), 0.1)
    seen: set[Status] = set()
    stop = loop.time() + 4.0

    async def block() -> None:
        while loop.time() < stop:
            _hog_the_loop(0.2)
            await asyncio.sleep(0)

    async def watch() -> None:
        while True:
            seen.add(probe.snapshot.status)
            await asyncio.sleep(0.005)

    running = asyncio.create_task(probe.run())
    watching = asyncio.create_task(watch())
    try:
        await block()
        wait_until = loop.time() + 10
        while probe.current().status is not Status.PRIMARY:
            assert loop.time() < wait_until, "the probe to read the primary again"
            await asyncio.sleep(0.05)
    finally:
        for task in (running, watching):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await probe.close()
    assert Status.DOWN not in seen, seen
    assert probe.late_probes > 0  # the loop was late at some deadline: the test bit


async def test_a_member_a_reload_removed_starts_no_probe(small_ceiling: Served) -> None:
    """A request that reaches a target just as a reload removes it (it waited for a
    displaced probe to close, say) starts no probe that nobody could stop."""
    fleet = fleet_of(small_ceiling)
    gone = member(small_ceiling, "a")
    await gone.close()
    await fleet.health(gone)
    assert not gone.probing
