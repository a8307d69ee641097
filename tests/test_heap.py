"""The heap trimmer: when it asks glibc to give free memory back, and when not."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

import pytest

from exporter.report.heap import TRIMMER, Glibc, Trimmer
from tests.fixtures.clock import FakeClock


class FakeAllocator:
    def __init__(self, free: int) -> None:
        self.free = free
        self.trims = 0
        self.fail: Exception | None = None

    def free_bytes(self) -> int:
        if self.fail is not None:
            raise self.fail
        return self.free

    def trim(self) -> None:
        self.trims += 1
        self.free = 0


class Later:
    """Callbacks a trimmer asked to run later, run when the test says."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.due: list[tuple[float, Callable[[], object]]] = []

    def __call__(self, delay: float, callback: Callable[[], object]) -> None:
        self.due.append((self.clock() + delay, callback))

    def run_due(self) -> int:
        ready = [c for at, c in self.due if at <= self.clock()]
        self.due = [(at, c) for at, c in self.due if at > self.clock()]
        for callback in ready:
            callback()
        return len(ready)


def _trimmer(allocator: FakeAllocator) -> tuple[Trimmer, FakeClock, Later]:
    clock = FakeClock()
    later = Later(clock)
    return Trimmer(allocator, clock=clock, later=later, above=1 << 20, interval=1.0), clock, later


def test_trims_only_when_enough_is_free() -> None:
    allocator = FakeAllocator(free=512 * 1024)
    trimmer, clock, _ = _trimmer(allocator)
    assert not trimmer.after_answer()
    clock.advance(2.0)
    allocator.free = 3 << 20
    assert trimmer.after_answer()
    assert allocator.trims == 1
    assert trimmer.trims == 1


def test_at_most_one_trim_an_interval_and_the_last_answer_gets_one() -> None:
    allocator = FakeAllocator(free=8 << 20)
    trimmer, clock, later = _trimmer(allocator)
    assert trimmer.after_answer()
    allocator.free = 8 << 20
    clock.advance(0.4)
    assert not trimmer.after_answer()  # a second scraper's answer, soon after
    clock.advance(0.2)
    assert not trimmer.after_answer()  # and a third: still one trim to come
    assert len(later.due) == 1
    clock.advance(0.3)
    assert later.run_due() == 0  # not before the interval is over
    clock.advance(0.1)
    assert later.run_due() == 1
    assert allocator.trims == 2
    clock.advance(0.5)
    assert not trimmer.after_answer()  # the deferred trim started a new interval
    assert len(later.due) == 1


def test_a_failing_allocator_is_given_up_once(caplog: pytest.LogCaptureFixture) -> None:
    allocator = FakeAllocator(free=8 << 20)
    allocator.fail = OSError("no such call")
    trimmer, clock, _ = _trimmer(allocator)
    assert not trimmer.after_answer()
    clock.advance(5.0)
    assert not trimmer.after_answer()
    assert trimmer.allocator is None
    assert sum("no longer tried" in r.getMessage() for r in caplog.records) == 1


def test_no_c_library_calls_means_no_trims() -> None:
    assert not Trimmer(None).after_answer()


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_glibc_gives_free_heap_back_to_the_system() -> None:
    """On this machine's glibc: 4 MiB freed below a chunk still in use stay resident
    until a trim, which gives them back (the figure the benchmark reads is RSS)."""
    glibc = Glibc.load()
    assert glibc is not None, "glibc's malloc_trim and mallinfo should load on Debian"
    assert TRIMMER.allocator is not None
    held = [ctypes.create_string_buffer(64 * 1024 - 64) for _ in range(64)]  # heap, not mmap
    keep = ctypes.create_string_buffer(64 * 1024 - 64)  # above them: no trim of the top
    del held
    assert glibc.free_bytes() >= 3 << 20
    before = _resident_bytes()
    glibc.trim()
    given_back = before - _resident_bytes()
    assert given_back >= 2 << 20, f"a trim gave back {given_back} bytes"
    assert keep.raw[:1] == b"\0"  # what is in use stays usable
