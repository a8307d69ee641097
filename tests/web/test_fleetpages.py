"""Fleet-wide pages rendered once and shared (issue 25): :class:`Page` without a server."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import cast

import pytest

from exporter.expose.exposition import Format, encode
from exporter.fleet.members import Fleet
from exporter.health.probeslots import CeilingReached, ProbeSlots
from exporter.pg.addresses import ServerKey
from exporter.pg.bulkheads import Bulkheads
from exporter.web.fleetpages import (
    MAX_PAGE_AGE,
    PAGE_SHARE,
    Page,
    probe_families,
    server_families,
    servers_summary,
)
from exporter.web.metrics import Answer
from tests.fixtures.clock import FakeClock
from tests.fixtures.helpers import samples


@dataclass
class FakeFleet:
    """All a page looks at: the declared targets, replaced by a reload."""

    declared: object = field(default_factory=object)


class Renderer:
    """Counts renderings; each moves ``clock`` by ``took`` and waits for ``release``
    when set."""

    def __init__(self, clock: FakeClock | None = None, took: float = 0.0) -> None:
        self.clock = clock
        self.took = took
        self.calls = 0
        self.release: asyncio.Event | None = None

    async def __call__(self, fleet: Fleet, variant: str) -> Answer:
        self.calls += 1
        if self.release is not None:
            await self.release.wait()
        if self.clock is not None:
            self.clock.advance(self.took)
        return Answer(f"{variant} {self.calls}".encode(), "text/plain")


def _fleet() -> tuple[FakeFleet, Fleet]:
    fake = FakeFleet()
    return fake, cast(Fleet, fake)


async def test_requests_during_a_rendering_share_it() -> None:
    """Five requests while the page renders get the one answer it makes."""
    render = Renderer()
    render.release = asyncio.Event()
    page = Page(render, live=True)
    _, fleet = _fleet()
    waiting = [asyncio.create_task(page.answer(fleet, "text")) for _ in range(5)]
    await asyncio.sleep(0)
    render.release.set()
    answers = await asyncio.gather(*waiting)
    assert render.calls == 1
    assert all(answer is answers[0] for answer in answers)


async def test_a_hang_up_does_not_stop_the_rendering_for_others() -> None:
    """One requester cancelled while the page renders: the others still get it."""
    render = Renderer()
    render.release = asyncio.Event()
    page = Page(render, live=False)
    _, fleet = _fleet()
    first = asyncio.create_task(page.answer(fleet, ""))
    second = asyncio.create_task(page.answer(fleet, ""))
    await asyncio.sleep(0)
    first.cancel()
    render.release.set()
    assert (await second).body == b" 1"
    assert render.calls == 1


async def test_a_page_without_live_values_changes_only_with_the_fleet() -> None:
    """/sd is rendered again only when a reload replaced the declared targets."""
    render = Renderer()
    page = Page(render, live=False)
    fake, fleet = _fleet()
    first = await page.answer(fleet, "")
    assert await page.answer(fleet, "") is first
    fake.declared = object()  # a reload
    assert (await page.answer(fleet, "")).body == b" 2"


async def test_a_live_page_is_rendered_again_once_stale() -> None:
    """A live page is shared for its rendering time divided by PAGE_SHARE (at most
    MAX_PAGE_AGE), then made again; each variant apart."""
    clock = FakeClock()
    render = Renderer(clock, took=0.02)  # fresh for 0.4 s
    page = Page(render, live=True, clock=clock)
    _, fleet = _fleet()
    first = await page.answer(fleet, "text")
    clock.advance(0.02 / PAGE_SHARE - 0.01)
    assert await page.answer(fleet, "text") is first
    assert (await page.answer(fleet, "html")).body == b"html 2"
    clock.advance(0.02)
    assert (await page.answer(fleet, "text")).body == b"text 3"


async def test_a_live_page_is_never_older_than_its_limit() -> None:
    """However long a rendering took, a live page is made again after MAX_PAGE_AGE."""
    clock = FakeClock()
    page = Page(Renderer(clock, took=MAX_PAGE_AGE), live=True, clock=clock)
    _, fleet = _fleet()
    first = await page.answer(fleet, "")
    clock.advance(MAX_PAGE_AGE - 0.1)
    assert await page.answer(fleet, "") is first
    clock.advance(0.2)
    assert await page.answer(fleet, "") is not first


async def test_the_probe_ceilings_figures_are_shown() -> None:
    """The probe ceilings' use, limits and counters, each one sample with the const
    labels: what an operator watches to see the ceiling at work."""
    slots = ProbeSlots(2, connecting=3, idle=60.0)
    slots.ask("a", 0.0)
    slots.ask("b", 0.0)
    with pytest.raises(CeilingReached):
        slots.ask("c", 1.0)
    slots.ask("c", 60.0)  # a, idle, gives its place
    async with slots.connecting:
        text = encode(probe_families("pg_exporter_fleet", [("env", "x")], slots), Format.TEXT)
    lines = text.decode().splitlines()
    shown = {k: float(v) for k, v in (line.split(" ") for line in lines if line[0] != "#")}
    assert shown == {
        f'pg_exporter_fleet_{name}{{env="x"}}': value
        for name, value in [("probes", 2), ("probes_max", 2), ("probes_connecting", 1),
                            ("probes_connecting_max", 3), ("probes_refused_total", 1),
                            ("probes_displaced_total", 1)]
    }  # fmt: skip
    assert "# TYPE pg_exporter_fleet_probes_refused_total counter" in lines
    assert "# TYPE pg_exporter_fleet_probes gauge" in lines


@dataclass
class ServersFleet:
    """All the server figures look at: the fleet's bulkheads."""

    servers: Bulkheads


async def test_each_servers_bulkhead_is_shown_on_metrics_and_the_fleet_page() -> None:
    """/metrics carries one sample per server and figure, with the const labels; the
    fleet page names the busiest servers with what they hold (issue 29)."""
    servers = Bulkheads(4, 30)
    for key in (ServerKey("10.0.0.5", 5432), ServerKey("10.0.0.6", 5432)):
        bulkhead = servers.of(key)
        await bulkhead.take(probe=True)
    await servers.of(ServerKey("10.0.0.6", 5432)).take(probe=False)
    fleet = cast(Fleet, ServersFleet(servers))
    text = encode(await server_families("pg", [("env", "x")], fleet), Format.TEXT).decode()
    shown = samples(text)
    held = "pg_exporter_server_connections"
    assert shown[(held, (("env", "x"), ("server", "10.0.0.6:5432")))] == 2
    assert shown[(held, (("env", "x"), ("server", "10.0.0.5:5432")))] == 1
    rate = ("pg_exporter_server_failed_logins_max", (("env", "x"), ("server", "10.0.0.5:5432")))
    assert shown[rate] == 30
    line = servers_summary(list(servers), fleet)
    assert line.splitlines() == [
        "2 servers, each at most 4 connections and 30 failed logins a minute",
        "  server 10.0.0.6:5432: 2 of 4 connections held (1 by health probes), 0 passes "
        "waiting, 0 probes not probed, 0 idle closed, 0 failed logins, 0 held back",
        "  server 10.0.0.5:5432: 1 of 4 connections held (1 by health probes), 0 passes "
        "waiting, 0 probes not probed, 0 idle closed, 0 failed logins, 0 held back",
    ]
