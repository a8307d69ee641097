"""What a scrape costs the installed exporter, beside the venv's in the same run (issue 37).

The packages once shipped pure-Python wheels and cost 1.6x the venv's CPU per
uncached scrape. Both exporters here serve the same collector library from the
test cluster with every collector on every pass (``--disable-cache``), running
side by side, and are scraped in alternating blocks, so that whatever else loads
the machine falls on both alike; the figure compared is a ratio, not a time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from rigs.localpg import LocalCluster, free_port
from tests.packaging.conftest import REPO, TIMEOUT

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
BLOCKS = 6  # alternations
SCRAPES = 10  # per block and exporter: 60 each, ~1.5 s of CPU, so a 10 ms tick is < 1 %
WARMUP = 3
LIMIT = 1.15  # measured 0.93-1.0; the margin is for a noisy shared machine


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process, all threads, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _scrape(port: int) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as response:
        assert response.status == 200
        body: bytes = response.read()
        return body


def _wait_ready(process: subprocess.Popen[bytes], port: int) -> None:
    """Until /metrics answers twice with the same number of lines, as bench.library waits."""
    deadline, last = time.monotonic() + 60, -1
    while time.monotonic() < deadline:
        assert process.poll() is None, f"exited with {process.returncode}"
        with contextlib.suppress(OSError):
            lines = _scrape(port).count(b"\n")
            if lines == last:
                return
            last = lines
        time.sleep(0.2)  # polling a condition with a deadline
    raise AssertionError("the exporter did not serve /metrics within 60 s")


@contextlib.contextmanager
def _serving(command: list[str], url: str) -> Iterator[tuple[int, int]]:
    """(pid, port) of an exporter serving ``url`` uncached; stopped with SIGTERM after."""
    port = free_port()
    argv = [*command, "--url", url, "--web.listen-address", f"127.0.0.1:{port}",
            "--disable-cache", "--server-time-budget", "0", "--log.level", "warn"]  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(argv, env=env, cwd=REPO, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        _wait_ready(process, port)
        for _ in range(WARMUP):
            _scrape(port)
        yield process.pid, port
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(TIMEOUT)
        finally:
            process.kill()


def _block(pid: int, port: int) -> float:
    """CPU seconds the exporter spends on SCRAPES scrapes in a row."""
    before = _cpu_seconds(pid)
    for _ in range(SCRAPES):
        _scrape(port)
    return _cpu_seconds(pid) - before


def test_installed_scrape_cpu_is_within_115_percent_of_the_venv(
    installed: None, cluster: LocalCluster
) -> None:
    """Uncached, the installed exporter's CPU per scrape is at most 1.15x the venv's."""
    url = cluster.dsn()
    installed_command = ["/usr/bin/pg_exporter", "--config", "/etc/pg_exporter"]
    venv_command = [sys.executable, "-m", "exporter", "--config", str(REPO / "collectors")]
    spent = {"installed": 0.0, "venv": 0.0}
    with _serving(installed_command, url) as mine, _serving(venv_command, url) as theirs:
        for _ in range(BLOCKS):
            spent["installed"] += _block(*mine)
            spent["venv"] += _block(*theirs)
    per_scrape = {key: 1000 * seconds / (BLOCKS * SCRAPES) for key, seconds in spent.items()}
    ratio = per_scrape["installed"] / per_scrape["venv"]
    print(f"CPU per uncached scrape, ms: {per_scrape}; installed / venv {ratio:.2f}")
    assert ratio <= LIMIT, per_scrape
