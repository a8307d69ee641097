"""Fleet-wide pages rendered once and shared (issue 25): :class:`Page` without a server."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import cast

from exporter.web.fleet import Fleet
from exporter.web.fleetpages import MAX_PAGE_AGE, PAGE_SHARE, Page
from exporter.web.metrics import Answer
from tests.clock import FakeClock


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
