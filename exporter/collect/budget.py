"""The request budget: how long one scrape may spend, and whether it should stop (B7–B10)."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")

#: The HTTP write limit: no scrape may take longer than this, header or not.
DEFAULT_BUDGET = 30.0
SCRAPE_TIMEOUT_HEADER = "X-Prometheus-Scrape-Timeout-Seconds"


class Interruption(enum.StrEnum):
    """Why a request ended before its answer; each value is a ``reason`` label value."""

    BUDGET = "budget"
    CLIENT = "client"
    WRITE_TIMEOUT = "write_timeout"

    @property
    def description(self) -> str:
        """The reason in words, for the log."""
        return _DESCRIPTIONS[self]


_DESCRIPTIONS = {
    Interruption.BUDGET: "the request's budget ran out",
    Interruption.CLIENT: "the client went away",
    Interruption.WRITE_TIMEOUT: "the client did not read its answer in time",
}


class RequestEnded(Exception):
    """The request ended (budget spent or client gone) before cancellable work finished.
    A signal between the budget and the pass, never shown to a user: it lives here, not
    in :mod:`exporter.errors`, which imports nothing from the package."""

    def __init__(self, reason: Interruption) -> None:
        super().__init__(f"request ended ({reason.value})")
        self.reason = reason


def budget_seconds(header: str | None, default: float = DEFAULT_BUDGET) -> float:
    """The budget for a request: the header's value when it is a finite positive number
    below ``default``, else ``default`` (B7). Never raises."""
    if header is None:
        return default
    try:
        value = float(header.strip())
    except ValueError:
        return default
    if not math.isfinite(value) or value <= 0:
        return default
    return min(value, default)


def _never() -> bool:
    return False


@dataclass(frozen=True, slots=True)
class Budget:
    """A request's deadline on the monotonic clock, and how to tell that its client left.

    ``ended`` is set when the request is over before its pass (the client hung up and
    the handler was cancelled): work that may be cancelled with the request (unbounded
    collectors, preflight) waits on it. It belongs to one request and is never stored
    on shared objects (B22).
    """

    deadline: float
    client_gone: Callable[[], bool] = field(default=_never)
    clock: Callable[[], float] = field(default=time.monotonic)
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    @classmethod
    def starting_now(
        cls,
        seconds: float,
        client_gone: Callable[[], bool] = _never,
        clock: Callable[[], float] = time.monotonic,
    ) -> Budget:
        """A budget of ``seconds`` from now."""
        return cls(deadline=clock() + seconds, client_gone=client_gone, clock=clock)

    def remaining(self) -> float:
        """Seconds left (never negative)."""
        return max(0.0, self.deadline - self.clock())

    def interruption(self) -> Interruption | None:
        """Why the request should stop now (its client left, or its budget ran out), or
        None (B10)."""
        if self.ended.is_set() or self.client_gone():
            return Interruption.CLIENT
        if self.clock() >= self.deadline:
            return Interruption.BUDGET
        return None


#: After cancelling work that talks to the server, how long to let psycopg wait for the
#: server to confirm (a cancel request, then the query's end) before it is interrupted
#: again and closes the connection instead. A frozen server never confirms; psycopg alone
#: would wait 5 s for the cancel request and 5 s more for the query. A live server under
#: load can take a second to fork for the cancel request, and a connection dropped
#: before the cancel arrives leaves its query running: so seconds, not milliseconds.
CANCEL_GRACE = 3.0


async def cancel_within(task: asyncio.Future[T], grace: float = CANCEL_GRACE) -> None:
    """Cancel ``task`` and wait until it has ended, at most about ``grace`` seconds.

    A query cancelled in a healthy server ends in milliseconds and its connection stays
    usable. If the task is still running after ``grace`` (the server does not answer),
    it is cancelled a second time: psycopg then closes the connection at once, and the
    caller sees a broken connection instead of waiting ten more seconds.
    """
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=grace)
    if not done:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@contextlib.asynccontextmanager
async def deadline(seconds: float | None, grace: float = CANCEL_GRACE) -> AsyncIterator[None]:
    """A client-side deadline for the block (None: none); TimeoutError once it passes.

    At ``seconds`` the block is cancelled in its own task, as ``asyncio.timeout`` does,
    so psycopg cancels the query in the server and settles the connection. If the block
    still runs ``grace`` seconds later (the server does not answer), it is cancelled
    again and psycopg closes the connection: even a frozen server cannot hold a bounded
    collector much past its own timeout (B11).
    """
    if seconds is None:
        yield
        return
    task = asyncio.current_task()
    assert task is not None, "deadline() needs a task"
    interrupted = False

    def interrupt() -> None:
        nonlocal interrupted
        interrupted = True
        task.cancel()

    async with asyncio.timeout(seconds):
        again = asyncio.get_running_loop().call_later(seconds + grace, interrupt)
        try:
            yield
        finally:
            again.cancel()
            if interrupted:
                task.uncancel()  # ours, not a caller's: the timeout still reads as one


async def until_request_ends(work: Awaitable[T], budget: Budget) -> T:
    """Run ``work`` until it finishes, or cancel it when the request ends first (B9, B12).

    The cancelled work is awaited (for at most :data:`CANCEL_GRACE` before its connection
    is dropped), so a query in flight is cancelled in the server and its connection
    settles before this returns.
    """
    task = asyncio.ensure_future(work)
    ended = asyncio.ensure_future(budget.ended.wait())
    try:
        await asyncio.wait(
            {task, ended}, timeout=budget.remaining(), return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        ended.cancel()
        if not task.done():
            await cancel_within(task)
    if task.cancelled():
        raise RequestEnded(budget.interruption() or Interruption.BUDGET)
    return task.result()
