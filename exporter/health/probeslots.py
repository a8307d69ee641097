"""The fleet's ceilings on health probes (issue 25).

Any client may name any declared target on a health path, and the names are public
at ``/sd``; each name asked about starts a probe that lives five minutes after its last
request. Without a ceiling a client could start one for every target, and a fleet of
unreachable ones would spend the event loop on connection attempts until the healthy
targets' probes, passes and ``/alive`` starved.

Two ceilings bound them, as ``--targets.max-concurrent`` bounds passes:

- *probes alive*: at most ``limit`` targets are probed at once. A target asked about
  when every place is taken gets the place of the least recently asked one, if nobody
  has asked about that one for ``idle`` seconds; otherwise its request is answered
  "not probed" (503) and nothing starts. A probe in use is never displaced, so
  requests for other names cannot make a routed target's answer wrong.
- *connecting at once*: a probe that has to open a connection takes one of
  ``connecting`` places first, outside its deadline (waiting for a place is not the
  server's fault). Probes on a kept connection need none.

The bookkeeping is pure: times are passed in, nothing here awaits but the places.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Literal

DEFAULT_MAX_PROBES = 256  # targets probed at once (a constant: no flag sets it)
CONNECTING = 16  # probes opening a connection at once, over the whole fleet
# A probe nobody has asked about for this long may give its place to another target's.
# Load balancers ask every few seconds (HAProxy 2 s, Kubernetes and cloud balancers
# 10-30 s), so a target being routed by keeps its probe.
YIELD_AFTER = 60.0  # seconds


class ConnectingPlaces(asyncio.Semaphore):
    """The places for opening a connection, saying how many are held (for /metrics)."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit = limit
        self.held = 0

    async def acquire(self) -> Literal[True]:
        """Wait for a place, then count it held."""
        await super().acquire()
        self.held += 1  # no await since the place was taken: the count cannot lag it
        return True

    def release(self) -> None:
        """Give a place back."""
        self.held -= 1
        super().release()


class CeilingReached(Exception):
    """Every probe place is taken by a target asked about recently."""


NOT_PROBED = "not probed: the fleet's health probe ceiling is reached"


class ProbeSlots:
    """Places for health probes: at most ``limit`` alive, ``connecting`` connecting."""

    def __init__(
        self, limit: int, *, connecting: int = CONNECTING, idle: float = YIELD_AFTER
    ) -> None:
        if limit < 1 or connecting < 1 or idle < 0:
            raise ValueError("the probe ceilings must be at least 1, the idle time not negative")
        self.limit = limit
        self.idle = idle
        self.connecting = ConnectingPlaces(connecting)
        self._asked: OrderedDict[str, float] = OrderedDict()  # name: last ask, oldest first
        # Counted here, where the decisions are made; /metrics shows them (issue 25).
        self.refused = 0  # health requests answered "not probed"
        self.displaced = 0  # probes stopped to make room for another target's

    @property
    def alive(self) -> int:
        """Targets holding a place."""
        return len(self._asked)

    def holds(self, name: str) -> bool:
        """True while ``name`` holds a place."""
        return name in self._asked

    def ask(self, name: str, now: float) -> str | None:
        """Note a health request for ``name`` at ``now``, giving it a place if it has none.

        Returns the name whose probe must stop to make room, if one must. Raises
        :class:`CeilingReached` when every place is held by a target asked about within
        ``idle`` seconds.
        """
        if name in self._asked:
            self._asked[name] = now
            self._asked.move_to_end(name)
            return None
        displaced = None
        if len(self._asked) >= self.limit:
            oldest, asked_at = next(iter(self._asked.items()))
            if now - asked_at < self.idle:
                self.refused += 1
                raise CeilingReached(NOT_PROBED)
            del self._asked[oldest]
            displaced = oldest
            self.displaced += 1
        self._asked[name] = now
        return displaced

    def leave(self, name: str) -> None:
        """Give ``name``'s place back (its probe stopped)."""
        self._asked.pop(name, None)
