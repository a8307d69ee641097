"""The exporter as a process whose memory can be read from outside and asked about.

``Probe`` starts ``exporter.cli.main`` in a small wrapper: optionally under
tracemalloc, and answering SIGUSR2 with a report written to a file (objects the
garbage collector tracks, counted by type; asyncio tasks and timers; what glibc's
malloc and Python's pymalloc hold, in use and free; a tracemalloc snapshot when
tracing). A Python-level signal handler runs in the main thread, where
the event loop runs, between two of its callbacks. Used by ``bench.memory`` and
``bench.soak``.
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import signal
import subprocess
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.cluster import REPO
from bench.measure import ANY_SAMPLE, memory
from rigs.localpg import free_port

_WRAPPER = """
import asyncio, collections, ctypes, gc, json, os, signal, sys, tempfile, tracemalloc
frames = int(os.environ.get("PROBE_TRACE_FRAMES", "0"))
if frames:
    tracemalloc.start(frames)

class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]

def _malloc():
    try:
        libc = ctypes.CDLL(None)
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):
        return {}
    info = libc.mallinfo2()
    return {"heap": info.arena, "mmapped": info.hblkhd, "in_use": info.uordblks,
            "free": info.fordblks}

def _pymalloc():
    wanted = {"# arenas allocated current": "arenas", "# bytes in allocated blocks": "in_use",
              "# bytes in available blocks": "free_blocks"}
    saved = os.dup(2)
    with tempfile.TemporaryFile() as out:
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        lines = out.read().decode(errors="replace").splitlines()
    found = {}
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() in wanted:
            found[wanted[key.strip()]] = int(value.strip().replace(",", ""))
        elif "unused pools" in key:
            found["unused_pools"] = int(value.strip().replace(",", ""))
    return found

def _report(signum, frame):
    path = os.environ["PROBE_REPORT"]
    types = collections.Counter(
        f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())
    found = {"types": types, "malloc": _malloc(), "pymalloc": _pymalloc()}
    try:
        loop = asyncio.get_running_loop()
        found["tasks"] = len(asyncio.all_tasks(loop))
        found["timers"] = len(loop._scheduled)
    except RuntimeError:
        pass
    if frames:
        found["traced"] = tracemalloc.get_traced_memory()[0]
        if os.environ.get("PROBE_SNAPSHOTS") == "1":
            tracemalloc.take_snapshot().dump(path + ".snapshot")
    with open(path + ".tmp", "w") as out:
        json.dump(found, out)
    os.replace(path + ".tmp", path)

signal.signal(signal.SIGUSR2, _report)
if os.environ.get("PROBE_FREEZE") == "1":
    gc.freeze()
if os.environ.get("PROBE_TRIM") == "1":  # what giving glibc's free heap back would buy
    import exporter.web.metrics as _metrics
    _libc, _write = ctypes.CDLL(None), _metrics.write
    async def _trimming_write(*args, **kwargs):
        try:
            return await _write(*args, **kwargs)
        finally:
            _libc.malloc_trim(0)
    _metrics.write = _trimming_write
from exporter.cli import main
sys.exit(main(sys.argv[1:]))
"""
#: What a scrape asks for, by its number: Prometheus' text with gzip, plain text, and
#: OpenMetrics with gzip, in turn.
FORMATS: tuple[dict[str, str], ...] = (
    {"Accept": "text/plain;version=0.0.4", "Accept-Encoding": "gzip"},
    {"Accept": "text/plain;version=0.0.4"},
    {"Accept": "application/openmetrics-text; version=1.0.0", "Accept-Encoding": "gzip"},
)


class ProbeError(RuntimeError):
    """The exporter exited, answered an error, or did not report in time."""


@dataclass(frozen=True, slots=True)
class Report:
    """What the exporter said about itself on SIGUSR2."""

    types: dict[str, int]
    tasks: int
    timers: int
    traced: int  # bytes tracemalloc counts (-1 when not tracing)
    snapshot: tracemalloc.Snapshot | None
    malloc: dict[str, int]  # glibc's mallinfo2: heap, mmapped, in_use, free (bytes)
    pymalloc: dict[str, int]  # arenas, in_use, free_blocks, unused_pools (bytes but arenas)


class Probe:
    """One exporter process serving the default library on a free port."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, report_path: Path) -> None:
        self.process = process
        self.port = port
        self._report_path = report_path

    @classmethod
    @contextmanager
    def start(cls, url: str, extra: Sequence[str], log: Path, *, tree: Path = REPO,
              trace: int = 0, snapshots: bool = True, env: Mapping[str, str] | None = None,
              trim: bool = False) -> Iterator[Probe]:  # fmt: skip
        """The exporter of ``tree`` on ``url`` with ``extra`` flags, stopped on exit;
        ``trace``: tracemalloc's frames (0: off), ``snapshots``: a report dumps one;
        ``env``: more environment (e.g. ``GLIBC_TUNABLES``); ``trim``: glibc's
        ``malloc_trim(0)`` after every answer to /metrics, always (the exporter's own
        trim, where it has one, waits for 1 MiB free)."""
        port = free_port()
        argv = [sys.executable, "-c", _WRAPPER, "--url", url, "--config", str(tree / "collectors"),
                "--web.listen-address", f"127.0.0.1:{port}", "--log.level", "warn",
                "--web.enable-openmetrics", *extra]  # fmt: skip
        report = log.with_suffix(".report")
        env = {**os.environ, "PROBE_TRACE_FRAMES": str(trace), "PROBE_REPORT": str(report),
               "PROBE_SNAPSHOTS": "1" if snapshots else "0", "PROBE_TRIM": "1" if trim else "0",
               **(env or {})}  # fmt: skip
        with log.open("wb") as sink:
            process = subprocess.Popen(argv, cwd=tree, env=env, stdout=sink, stderr=sink)
        try:
            yield cls(process, port, report)
        finally:
            _stop(process)

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_ready(self, within: float = 600.0) -> int:
        """Scrape until two answers in a row are 200 with as many series; that count."""
        deadline, last, why = time.monotonic() + within, -1, "no answer"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ProbeError(f"the exporter exited with {self.process.returncode}")
            try:
                series = self.scrape(0)
            except (OSError, ProbeError) as exc:
                series, why = -2, str(exc)
            if series == last and series >= 0:
                return series
            last = series
            time.sleep(0.2)  # polling interval of a condition with a deadline
        raise ProbeError(f"the exporter was not ready before the deadline: {why}")

    def scrape(self, n: int, timeout: float = 60.0) -> int:
        """Scrape ``n`` in the rotation of :data:`FORMATS`; the series in the answer."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("GET", "/metrics", headers=FORMATS[n % len(FORMATS)])
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        if response.status != 200:
            raise ProbeError(f"HTTP {response.status}: {raw[:200]!r}")
        gzipped = response.getheader("Content-Encoding") == "gzip"
        body = gzip.decompress(raw) if gzipped else raw
        return len(ANY_SAMPLE.findall(body))

    def report(self, within: float = 120.0) -> Report:
        """Ask the exporter for a report (SIGUSR2) and read it."""
        self._report_path.unlink(missing_ok=True)
        os.kill(self.pid, signal.SIGUSR2)
        deadline = time.monotonic() + within
        while not self._report_path.exists():
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise ProbeError("the exporter did not answer SIGUSR2 with a report")
            time.sleep(0.05)  # polling a file with a deadline: nothing to wait on
        found = json.loads(self._report_path.read_text())
        snapshot_path = self._report_path.with_name(self._report_path.name + ".snapshot")
        snapshot = tracemalloc.Snapshot.load(str(snapshot_path)) if snapshot_path.exists() else None
        return Report(found["types"], found.get("tasks", -1), found.get("timers", -1),
                      found.get("traced", -1), snapshot, found["malloc"],
                      found["pymalloc"])  # fmt: skip


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after a grace period: only the process we started."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def resident(pid: int) -> tuple[float, float, float, float]:
    """(VmRSS, VmHWM, anonymous, file-backed) of ``pid`` in MiB (smaps_rollup)."""
    found = memory(pid)
    rollup: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, rest = line.partition(":")
        rollup[key] = int(rest.split()[0])
    anonymous = rollup.get("Anonymous", 0)
    return (round(found.rss_kib / 1024, 2), round(found.hwm_kib / 1024, 2),
            round(anonymous / 1024, 2), round((rollup["Rss"] - anonymous) / 1024, 2))  # fmt: skip


# --- what a tracemalloc snapshot says ------------------------------------------------

_IMPORTING = "<frozen importlib._bootstrap"


def _runtime_traces(snapshot: tracemalloc.Snapshot) -> Iterator[tracemalloc.Trace]:
    """Traces not made while importing a module (code, module dicts, class bodies)."""
    for trace in snapshot.traces:
        if not any(frame.filename.startswith(_IMPORTING) for frame in trace.traceback):
            yield trace


def _ours(trace: tracemalloc.Trace) -> str | None:
    """``module.py:line`` of the innermost frame of ours in the trace, if any."""
    for frame in reversed(trace.traceback):  # oldest first: walk from the newest
        _, sep, rest = frame.filename.rpartition("/exporter/")
        if sep:
            return f"{rest}:{frame.lineno}"
    return None


def attribute(snapshot: tracemalloc.Snapshot, top: int) -> dict[str, float]:
    """KiB held, by the line of ours that allocated it (else the allocating file)."""
    held: Counter[str] = Counter()
    for trace in _runtime_traces(snapshot):
        newest = trace.traceback[-1].filename.rpartition("/")[2]
        held[_ours(trace) or f"(not ours) {newest}"] += trace.size
    return {where: round(size / 1024, 1) for where, size in held.most_common(top)}


def by_module(snapshot: tracemalloc.Snapshot) -> dict[str, float]:
    """KiB held beyond the imports by module of ours, largest first."""
    held: Counter[str] = Counter()
    for trace in _runtime_traces(snapshot):
        where = _ours(trace)
        held[where.partition(":")[0] if where else "(not ours)"] += trace.size
    return {name: round(size / 1024, 1) for name, size in held.most_common()}
