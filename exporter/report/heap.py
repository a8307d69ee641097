"""Giving the C heap's free memory back to the system after an answer (issue 31).

An exposition of a big database is megabytes of short-lived buffers: the rendered
families of an uncached pass, the pieces of the answer, its gzip output. glibc's
malloc keeps what they leave free in its heap and counts it in our resident memory
until something reuses it. After an answer is written, :meth:`Trimmer.after_answer`
asks glibc (``malloc_trim``) to hand the free pages back, when its main heap holds at
least :data:`TRIM_ABOVE` bytes free, at most once every :data:`MIN_INTERVAL` seconds
(an answer sooner has its trim when that interval is over). What it buys is measured in
bench/README.md ("Resident memory").

Where the C library is not glibc (musl has no ``malloc_trim``), nothing is done. A
trim takes a few milliseconds on the event loop; the pages it gave back are faulted
in again by the next pass that needs them.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

#: Free bytes in malloc's main heap worth a trim: less is not worth the page faults.
TRIM_ABOVE = 1 << 20
#: At most one trim every 0.1 s: answers sent at once (two Prometheus servers) share one.
MIN_INTERVAL = 0.1


_FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
           "fordblks", "keepcost")  # fmt: skip


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (2.33 and later)."""

    _fields_ = [(name, ctypes.c_size_t) for name in _FIELDS]


class _MallInfo(ctypes.Structure):
    """glibc's older ``struct mallinfo``, for glibc before 2.33 (RHEL 8 has 2.28)."""

    _fields_ = [(name, ctypes.c_uint) for name in _FIELDS]


class Allocator(Protocol):
    """What a trimmer needs of the C allocator."""

    def free_bytes(self) -> int:
        """Bytes malloc's main heap holds free."""
        ...

    def trim(self) -> None:
        """Give free heap pages back to the system."""
        ...


class Glibc:
    """glibc's ``mallinfo2`` (or ``mallinfo``) and ``malloc_trim``, through ctypes."""

    def __init__(self, libc: ctypes.CDLL) -> None:
        self._trim = libc.malloc_trim
        self._trim.argtypes, self._trim.restype = [ctypes.c_size_t], ctypes.c_int
        info = getattr(libc, "mallinfo2", None)
        if info is not None:
            info.restype = _MallInfo2
        else:
            info = libc.mallinfo
            info.restype = _MallInfo
        info.argtypes = []
        self._info = info

    @classmethod
    def load(cls) -> Glibc | None:
        """The running process's glibc, or None when its C library lacks these calls."""
        try:
            return cls(ctypes.CDLL(None))
        except (OSError, AttributeError):
            return None

    def free_bytes(self) -> int:
        return int(self._info().fordblks)

    def trim(self) -> None:
        self._trim(0)


def _call_later(delay: float, callback: Callable[[], object]) -> None:
    asyncio.get_running_loop().call_later(delay, callback)


class Trimmer:
    """Trims the C heap after answers, when it holds enough free and not too often: an
    answer within :data:`MIN_INTERVAL` of the last trim has one made when the interval
    is over, so the last answer's buffers are always given back."""

    def __init__(
        self,
        allocator: Allocator | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        later: Callable[[float, Callable[[], object]], object] = _call_later,
        above: int = TRIM_ABOVE,
        interval: float = MIN_INTERVAL,
    ) -> None:
        self.allocator = allocator
        self.clock = clock
        self.later = later  # (delay, callback): runs the callback after delay seconds
        self.above = above
        self.interval = interval
        self.trims = 0
        self._last = float("-inf")
        self._deferred = False

    def after_answer(self) -> bool:
        """Trim now if it is worth it, or once the interval is over; whether it trimmed
        now. Never raises."""
        if self.allocator is None:
            return False
        wait = self._last + self.interval - self.clock()
        if wait > 0:
            if not self._deferred:
                self._deferred = True
                self.later(wait, self._deferred_trim)
            return False
        return self._trim()

    def _deferred_trim(self) -> None:
        self._deferred = False
        self._trim()

    def _trim(self) -> bool:
        allocator = self.allocator
        if allocator is None:
            return False
        self._last = self.clock()
        try:
            if allocator.free_bytes() < self.above:
                return False
            allocator.trim()
        except (OSError, ValueError, ctypes.ArgumentError) as exc:  # never again, said once
            log.warning("giving free heap back to the system failed (%s); no longer tried", exc)
            self.allocator = None
            return False
        self.trims += 1
        return True


#: The process's trimmer: the web answers' one.
TRIMMER = Trimmer(Glibc.load())
