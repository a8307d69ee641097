"""Admission of telemetry requests: at most two at once, the third answered 503 (B1–B3)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

DEFAULT_LIMIT = 2


class Admission:
    """Counts admitted telemetry requests; never queues (D12)."""

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self.limit = limit
        self.active = 0
        self.admitted = 0
        self.rejected = 0

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
