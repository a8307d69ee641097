"""Comparing what a scrape costs two exporters in one run (issue 37): the package's or
the image's beside the venv's.

Both serve the same collector library from the test cluster with every collector on
every pass (``--disable-cache``), run side by side, and are scraped in alternating
blocks, so that whatever else loads the machine falls on both alike; what is compared
is a ratio, not a time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from rigs.localpg import free_port
from tests.packaging.conftest import REPO, TIMEOUT

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
BLOCKS = 6  # alternations
SCRAPES = 10  # per block and exporter: 60 each, ~1.5 s of CPU, so a 10 ms tick is < 1 %
WARMUP = 3
LIMIT = 1.15  # measured 0.93-1.0; the margin is for a noisy shared machine


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, all threads, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def scrape(port: int) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as response:
        assert response.status == 200
        body: bytes = response.read()
        return body


def wait_ready(process: subprocess.Popen[bytes], port: int) -> None:
    """Until /metrics answers twice with the same number of lines, as bench.library waits."""
    deadline, last = time.monotonic() + 60, -1
    while time.monotonic() < deadline:
        assert process.poll() is None, f"exited with {process.returncode}"
        with contextlib.suppress(OSError):
            lines = scrape(port).count(b"\n")
            if lines == last:
                return
            last = lines
        time.sleep(0.2)  # polling a condition with a deadline
    raise AssertionError("the exporter did not serve /metrics within 60 s")


#: Every collector on every pass, with no server-time budget holding the dearest back.
UNCACHED = ("--disable-cache", "--server.time-budget", "0", "--log.level", "warn")


@contextlib.contextmanager
def serving(command: list[str], url: str) -> Iterator[tuple[int, int]]:
    """(pid, port) of an exporter serving ``url`` uncached; stopped with SIGTERM after."""
    port = free_port()
    argv = [*command, "--url", url, "--web.listen-address", f"127.0.0.1:{port}", *UNCACHED]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(argv, env=env, cwd=REPO, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        wait_ready(process, port)
        for _ in range(WARMUP):
            scrape(port)
        yield process.pid, port
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(TIMEOUT)
        finally:
            process.kill()


def block(pid: int, port: int) -> float:
    """CPU seconds the exporter spends on SCRAPES scrapes in a row."""
    before = cpu_seconds(pid)
    for _ in range(SCRAPES):
        scrape(port)
    return cpu_seconds(pid) - before


def cpu_ratio(mine: tuple[int, int], theirs: tuple[int, int]) -> tuple[float, dict[str, float]]:
    """mine / theirs of CPU per scrape over BLOCKS alternating blocks, and both in ms."""
    spent = {"mine": 0.0, "theirs": 0.0}
    for _ in range(BLOCKS):
        spent["mine"] += block(*mine)
        spent["theirs"] += block(*theirs)
    per_scrape = {key: 1000 * seconds / (BLOCKS * SCRAPES) for key, seconds in spent.items()}
    return per_scrape["mine"] / per_scrape["theirs"], per_scrape
