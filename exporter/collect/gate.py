"""The fleet's ceiling on targets collected at once.

A fleet-wide scrape wave (every target's scrape due in the same second, as after
a Prometheus restart) must not start hundreds of passes and connections in one
instant. A pass takes a place before it starts and gives it back when it ends; a
pass that finds no place waits within its request's budget, then its request gets
503, as a scrape behind another pass does (B1, B5).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

# A wait cancelled this close to its deadline was cut short by the budget, not a client.
SAME_MOMENT = 0.01  # seconds


class Gate:
    """At most ``limit`` holders at once; waiters are served first come, first served."""

    def __init__(self, limit: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.clock = clock
        self._places = asyncio.Semaphore(limit)
        self.active = 0
        self.waiting = 0
        self.entered = 0  # passes that took a place
        self.refused = 0  # passes whose budget ran out waiting
        self.waited = 0  # passes that found every place taken
        self.wait_seconds = 0.0  # total time spent waiting for a place

    def enter(self, seconds: float) -> Coroutine[Any, Any, bool]:
        """Take a place within ``seconds`` of this call: True when taken (call
        :meth:`leave` after), False when the time ran out. Cancelling the wait takes no
        place; a wait cancelled once its time is up counts as refused all the same (the
        request's deadline, the same moment, may cancel it before its own timeout does)."""
        return self._enter(self.clock() + max(seconds, 0.0))

    async def _enter(self, deadline: float) -> bool:
        if not self._places.locked():
            await self._places.acquire()  # a free place: no wait, no suspension
            self._took()
            return True
        self.waiting += 1
        self.waited += 1
        start = self.clock()
        try:
            async with asyncio.timeout(max(deadline - self.clock(), 0.0)):
                await self._places.acquire()
        except TimeoutError:
            self.refused += 1
            return False
        except asyncio.CancelledError:
            if self.clock() >= deadline - SAME_MOMENT:
                self.refused += 1
            raise
        finally:
            self.waiting -= 1
            self.wait_seconds += self.clock() - start
        self._took()
        return True

    def _took(self) -> None:
        self.active += 1
        self.entered += 1

    def leave(self) -> None:
        """Give a place back."""
        self.active -= 1
        self._places.release()
