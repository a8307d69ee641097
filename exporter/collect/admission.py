"""Admission of telemetry requests: at most two rendered at once, the third answered 503
(B1–B3); answers being written are bounded apart, so a client that does not read holds
no place a scrape needs (issue 25)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from exporter.collect.budget import Interruption

DEFAULT_LIMIT = 2
# Answers handed to clients and not yet taken. Each holds at most its body (shared when
# the page is cached) and a socket buffer; past this many, new requests get 503 at once.
DEFAULT_WRITE_LIMIT = 8


class Admission:
    """Counts admitted telemetry requests; never queues (D12).

    A request holds a *slot* while it waits, collects and renders; then it gives the slot
    back and holds a *writer* place until its answer is out or cut off.
    """

    def __init__(self, limit: int = DEFAULT_LIMIT, write_limit: int = DEFAULT_WRITE_LIMIT) -> None:
        self.limit = limit
        self.write_limit = write_limit
        self.collecting = 0  # requests holding a slot
        self.writing = 0  # answers being written
        self.admitted = 0
        self.rejected = 0
        # write_timeout appears once it happens; the other two are always exported.
        self.interrupted = {Interruption.BUDGET: 0, Interruption.CLIENT: 0}
        self.wait_seconds = 0.0  # total time admitted requests waited for the pass
        self.last_shared = False  # whether the last pass waited behind another request's

    @property
    def active(self) -> int:
        """Admitted requests not answered yet: collecting or being written."""
        return self.collecting + self.writing

    def note_interrupted(self, reason: Interruption) -> None:
        """Count a request that ended before its answer."""
        self.interrupted[reason] = self.interrupted.get(reason, 0) + 1

    def note_wait(self, seconds: float, *, shared: bool) -> None:
        """Record how long an admitted request waited for the collection lock."""
        self.wait_seconds += seconds
        self.last_shared = shared

    @contextmanager
    def slot(self) -> Iterator[bool]:
        """Yield True with a slot held until the block exits, or False when full (both
        slots taken, or as many answers being written as allowed).

        The slot is released by ``finally``, so every exit path (return, error,
        cancellation) gives it back (B3).
        """
        if self.collecting >= self.limit or self.writing >= self.write_limit:
            self.rejected += 1
            yield False
            return
        self.collecting += 1
        self.admitted += 1
        try:
            yield True
        finally:
            self.collecting -= 1

    @contextmanager
    def writer(self) -> Iterator[None]:
        """A place among the answers being written, held until the block exits."""
        self.writing += 1
        try:
            yield
        finally:
            self.writing -= 1
