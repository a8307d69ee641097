"""Budget arithmetic, the scrape-timeout header (B7, B10), and cancelling work that a
frozen server would hold (B9, B11, B12)."""

from __future__ import annotations

import asyncio

import pytest

from exporter.collect.budget import (
    DEFAULT_BUDGET,
    Budget,
    Interruption,
    budget_seconds,
    cancel_within,
    deadline,
)
from tests.fixtures.clock import FakeClock


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("0.3", 0.3),
        (" 12.5 ", 12.5),
        ("29.999", 29.999),
        ("1e-3", 0.001),
    ],
)
def test_valid_header_shortens_budget(header: str, expected: float) -> None:
    """A finite positive header value below the write limit becomes the budget (B7)."""
    assert budget_seconds(header) == pytest.approx(expected)


@pytest.mark.parametrize(
    "header",
    [None, "", "  ", "abc", "0", "-1", "nan", "NaN", "inf", "-inf", "1e400", "0x10", "1,5"],
)
def test_invalid_header_is_ignored(header: str | None) -> None:
    """Empty, text, zero, negative, NaN, infinite and overflowing values are ignored (B7)."""
    assert budget_seconds(header) == DEFAULT_BUDGET


def test_header_never_lengthens_budget() -> None:
    """A header above the write limit cannot extend the budget (B7)."""
    assert budget_seconds("120") == DEFAULT_BUDGET


def test_interruption_reports_budget_then_client() -> None:
    """The request stops when its budget is spent or its client has gone (B10)."""
    clock = FakeClock()
    gone = False
    budget = Budget.starting_now(5.0, client_gone=lambda: gone, clock=clock)
    assert budget.interruption() is None
    assert budget.remaining() == pytest.approx(5.0)
    clock.advance(5.0)
    assert budget.interruption() == "budget"
    assert budget.remaining() == 0.0
    gone = True
    assert budget.interruption() == "client"


def test_interruption_reasons_are_an_enum_of_label_values() -> None:
    """Interruption reasons are enum members whose values are the metric's label values."""
    clock = FakeClock()
    budget = Budget.starting_now(1.0, clock=clock)
    clock.advance(1.0)
    assert budget.interruption() is Interruption.BUDGET
    assert [r.value for r in Interruption] == ["budget", "client", "write_timeout"]


async def _stubborn(cleanups: list[str]) -> None:
    """Like psycopg cancelling a query: the first cancellation starts a long wait for
    the server; only a second one ends it."""
    try:
        await asyncio.sleep(100)
    except asyncio.CancelledError:
        try:
            await asyncio.sleep(100)  # waiting for a frozen server to confirm
        except asyncio.CancelledError:
            cleanups.append("connection closed")
            raise
        raise


async def test_cancel_within_interrupts_a_cancellation_that_lingers() -> None:
    cleanups: list[str] = []
    task = asyncio.ensure_future(_stubborn(cleanups))
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await cancel_within(task, grace=0.05)
    assert task.cancelled()
    assert cleanups == ["connection closed"]
    assert loop.time() - started < 5.0  # the grace, not the 100 s wait


async def test_cancel_within_lets_a_prompt_cancellation_end_by_itself() -> None:
    async def prompt() -> None:
        await asyncio.sleep(100)

    task = asyncio.ensure_future(prompt())
    await asyncio.sleep(0)
    await cancel_within(task, grace=30.0)
    assert task.cancelled()


async def test_deadline_interrupts_a_cancellation_that_lingers() -> None:
    cleanups: list[str] = []
    with pytest.raises(TimeoutError):
        async with deadline(0.01, grace=0.05):
            await _stubborn(cleanups)
    assert cleanups == ["connection closed"]
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_deadline_lets_a_prompt_cancellation_end_by_itself() -> None:
    with pytest.raises(TimeoutError):
        async with deadline(0.01, grace=30.0):
            await asyncio.sleep(100)


async def test_deadline_leaves_work_in_time_alone() -> None:
    async with deadline(5.0):
        await asyncio.sleep(0)
    async with deadline(None):
        await asyncio.sleep(0)
