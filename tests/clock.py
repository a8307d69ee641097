"""A clock that tests move by hand, for code that takes an injected clock."""

from __future__ import annotations


class FakeClock:
    """Monotonic seconds that only change when the test says so."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        self.now += seconds
