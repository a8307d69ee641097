"""Admission of telemetry requests: at most two at once, the third answered 503 (B1–B3)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from exporter.budget import Interruption

DEFAULT_LIMIT = 2


class Admission:
    """Counts admitted telemetry requests; never queues (D12)."""

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self.limit = limit
        self.active = 0
        self.admitted = 0
        self.rejected = 0
        # write_timeout appears once it happens; the other two are always exported.
        self.interrupted = {Interruption.BUDGET: 0, Interruption.CLIENT: 0}
        self.wait_seconds = 0.0  # total time admitted requests waited for the pass
        self.last_shared = False  # whether the last pass waited behind another request's

    def note_interrupted(self, reason: Interruption) -> None:
        """Count a request that ended before its answer."""
        self.interrupted[reason] = self.interrupted.get(reason, 0) + 1

    def note_wait(self, seconds: float, *, shared: bool) -> None:
        """Record how long an admitted request waited for the collection lock."""
        self.wait_seconds += seconds
        self.last_shared = shared

    @contextmanager
    def slot(self) -> Iterator[bool]:
        """Yield True with a slot held until the block exits, or False when full.

        The slot is released by ``finally``, so every exit path (return, error,
        cancellation) gives it back (B3).
        """
        if self.active >= self.limit:
            self.rejected += 1
            yield False
            return
        self.active += 1
        self.admitted += 1
        try:
            yield True
        finally:
            self.active -= 1
