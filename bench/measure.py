"""What the bench measures: process CPU and memory from /proc, and timed scrapes.

CPU is read as utime+stime ticks, so it counts every thread of the exporter
and nothing of the client that scrapes it. PostgreSQL's CPU is the
postmaster's own and waited-for children's time plus its live children's, so
backends that exit during the window are still counted.
"""

from __future__ import annotations

import gzip
import http.client
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: Workload samples of every exporter: ``bench_c3{…`` (ours, Go peer) or ``c3{…`` (query-exporter).
WORKLOAD_SAMPLE = re.compile(rb"^(?:bench_)?c[1-8]\{", re.MULTILINE)
ANY_SAMPLE = re.compile(rb"^[a-zA-Z_:]", re.MULTILINE)
#: What Prometheus sends when it scrapes (text format, gzip accepted).
ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"


@dataclass(frozen=True, slots=True)
class Scrape:
    """One GET of the telemetry path."""

    status: int
    seconds: float  # request sent → last body byte read (wire form)
    wire_bytes: int
    body: bytes  # decompressed

    @property
    def workload_series(self) -> int:
        """Samples of the workload metrics in the body."""
        return len(WORKLOAD_SAMPLE.findall(self.body))

    @property
    def all_series(self) -> int:
        """Every sample line in the body (comments excluded)."""
        return len(ANY_SAMPLE.findall(self.body))


@dataclass(frozen=True, slots=True)
class Memory:
    """Resident memory of a process, in KiB: now and its peak."""

    rss_kib: int
    hwm_kib: int


def scrape(port: int, path: str, *, gzip_ok: bool, timeout: float) -> Scrape:
    """GET ``path`` on 127.0.0.1 with a fresh connection, the way a scraper would."""
    headers = {"Accept": ACCEPT, "Accept-Encoding": "gzip" if gzip_ok else "identity"}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        started = time.perf_counter()
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        raw = response.read()
        elapsed = time.perf_counter() - started
    finally:
        conn.close()
    body = gzip.decompress(raw) if response.getheader("Content-Encoding") == "gzip" else raw
    return Scrape(response.status, elapsed, len(raw), body)


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process (all its threads) so far."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def postgres_cpu_seconds(postmaster_pid: int) -> float:
    """CPU of a whole PostgreSQL cluster: postmaster, exited children, live children."""
    fields = _stat_fields(postmaster_pid)
    total = sum(int(fields[i]) for i in (11, 12, 13, 14))
    for pid in _children(postmaster_pid):
        try:
            child = _stat_fields(pid)
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited between listing and reading; counted in cutime next time
        total += int(child[11]) + int(child[12])
    return total / CLOCK_TICKS


def memory(pid: int) -> Memory:
    """VmRSS and VmHWM of a process."""
    values: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0])
    return Memory(values["VmRSS"], values["VmHWM"])


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile: the smallest value with ``fraction`` of values at or below."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def _stat_fields(pid: int) -> list[str]:
    """Fields of /proc/<pid>/stat after the command name, so index 0 is the state."""
    text = Path(f"/proc/{pid}/stat").read_text()
    # The command name may hold spaces and parentheses; it ends at the last ')'.
    return text[text.rindex(")") + 2 :].split()


def _children(parent: int) -> list[int]:
    """Pids whose parent is ``parent``."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if int(_stat_fields(int(entry.name))[1]) == parent:
                children.append(int(entry.name))
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
    return children
