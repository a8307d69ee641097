"""The process's own metrics: CPU, memory and descriptors from ``/proc``, the
interpreter, and its garbage collector.

These are the families client_python's process, platform and GC collectors give,
with their names, HELP texts, kinds and values, read here directly: importing
prometheus_client for them cost about 1.1 MiB of resident memory, 2 % of the
exporter's (issue 31). Sampled afresh on every call. Without ``/proc`` (not Linux)
the process families are left out, as client_python leaves them out.
"""

from __future__ import annotations

import gc
import os
import platform
from collections.abc import Sequence

from exporter.expose.exposition import Family, make_family

Labels = Sequence[tuple[str, str]]

_PROC = "/proc/self"
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _boot_time() -> float | None:
    """Seconds since the epoch at which the machine booted, or None without /proc."""
    try:
        with open("/proc/stat", "rb") as stat:
            for line in stat:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


_BOOT = _boot_time()
_PYTHON_INFO = (
    ("implementation", platform.python_implementation()),
    *zip(("major", "minor", "patchlevel"), platform.python_version_tuple(), strict=True),
    ("version", platform.python_version()),
)


def runtime_families(const_labels: Labels) -> list[Family]:
    """Process, interpreter and GC families, each sample carrying ``const_labels``."""
    labels = tuple(const_labels)
    return [
        *_process(labels),
        make_family(
            "python_info", "gauge", "Python platform information", [((*_PYTHON_INFO, *labels), 1)]
        ),
        *_gc(labels),
    ]


def _process(labels: Labels) -> list[Family]:
    """Memory, start time and CPU from /proc/self/stat, then the descriptors."""
    if _BOOT is None:
        return []
    try:
        with open(f"{_PROC}/stat", "rb") as stat:
            # Fields after the command, which may hold spaces and parentheses itself.
            fields = stat.read().rpartition(b")")[2].split()
    except OSError:
        return []
    # Counted from the state field, the third of stat(5): utime is the 14th, etc.
    utime, stime, start, vsize, rss = (float(fields[i]) for i in (11, 12, 19, 20, 21))
    families = [
        _gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", vsize, labels),
        _gauge(
            "process_resident_memory_bytes", "Resident memory size in bytes.", rss * _PAGE, labels
        ),
        _gauge(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            start / _TICKS + _BOOT,
            labels,
        ),
        make_family(
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            # Each divided first, as client_python does: the same value to the last bit.
            [(labels, utime / _TICKS + stime / _TICKS)],
        ),
    ]
    return families + _descriptors(labels)


def _descriptors(labels: Labels) -> list[Family]:
    """Open descriptors and their soft limit, or nothing when /proc does not say."""
    try:
        with open(f"{_PROC}/limits", "rb") as limits:
            soft = [line.split()[3] for line in limits if line.startswith(b"Max open files")]
        max_fds = float(soft[0])
        open_fds = len(os.listdir(f"{_PROC}/fd"))
    except (OSError, IndexError, ValueError):
        return []
    return [
        _gauge("process_open_fds", "Number of open file descriptors.", open_fds, labels),
        _gauge("process_max_fds", "Maximum number of open file descriptors.", max_fds, labels),
    ]


def _gc(labels: Labels) -> list[Family]:
    """Collected and uncollectable objects and collections, per generation."""
    stats = list(enumerate(gc.get_stats()))

    def counter(name: str, help: str, key: str) -> Family:
        samples = [((("generation", str(g)), *labels), s[key]) for g, s in stats]
        return make_family(name, "counter", help, samples)

    return [
        counter("python_gc_objects_collected_total", "Objects collected during gc", "collected"),
        counter(
            "python_gc_objects_uncollectable_total",
            "Uncollectable objects found during GC",
            "uncollectable",
        ),
        counter(
            "python_gc_collections_total",
            "Number of times this generation was collected",
            "collections",
        ),
    ]


def _gauge(name: str, help: str, value: float, labels: Labels) -> Family:
    return make_family(name, "gauge", help, [(labels, value)])
