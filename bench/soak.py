"""The long soak (issue 31): one exporter with the default library, scraped at a steady
pace, its resident memory sampled; flat or not by the slope of a least-squares line
over the last part of the run.

Run from the repository root::

    .venv/bin/python -m bench.soak                       # 60 min, uncached, every 2 s
    .venv/bin/python -m bench.soak --minutes 20 --interval 0.5 --cached
    .venv/bin/python -m bench.soak [--fit-minutes 40] [--sample-every 10]
        [--report-every 300] [--trace FRAMES] [--dsn URL] [--json out.json]

A throw-away PostgreSQL 18 holds ``bench.library``'s workload (or ``--dsn`` names a
server); the exporter runs the default library with auto-discovery, with
``--disable-cache`` unless ``--cached``. Scrapes go one at a time every
``--interval`` seconds, in turn text with gzip, text, OpenMetrics with gzip. Every
``--sample-every`` seconds: VmRSS and VmHWM. Every ``--report-every`` seconds the
exporter reports (SIGUSR2, see ``bench.memory_probe``) the objects its garbage
collector tracks by type, its asyncio tasks and timers, and with ``--trace`` the
bytes tracemalloc counts (which slows it and adds to its RSS). Any scrape that is not
a 200 or fails counts as an error. It exits 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.measure import memory
from bench.memory import server
from bench.memory_probe import Probe, ProbeError, Report
from tests.reliability.soak import least_squares_slope


@dataclass(frozen=True, slots=True)
class SoakOptions:
    """How long, how fast, and what to watch."""

    minutes: float = 60.0
    interval: float = 2.0
    uncached: bool = True
    fit_minutes: float = 40.0
    sample_every: float = 10.0
    report_every: float = 300.0
    trace: int = 0


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading of the process."""

    minute: float
    scrapes: int
    rss_kib: int
    hwm_kib: int


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One report of the exporter about itself."""

    minute: float
    objects: int
    tasks: int
    timers: int
    traced_kib: float
    # MiB: glibc's heap and mmapped chunks, what of them is in use; pymalloc's arenas
    # and what of them holds objects.
    malloc_mib: float = 0.0
    malloc_in_use_mib: float = 0.0
    pymalloc_mib: float = 0.0
    pymalloc_in_use_mib: float = 0.0


@dataclass
class SoakResult:
    """What the soak observed."""

    options: SoakOptions
    samples: list[Sample] = field(default_factory=list)
    checkpoints: list[Checkpoint] = field(default_factory=list)
    grown_types: dict[str, int] = field(default_factory=dict)  # first → last report
    scrapes: int = 0
    errors: list[str] = field(default_factory=list)
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load average at start and end

    def slope(self, last_minutes: float) -> float:
        """MiB per minute of the least-squares line through the samples of the last
        ``last_minutes`` of the run."""
        if not self.samples:
            return 0.0
        start = self.samples[-1].minute - last_minutes
        points = [(s.minute, s.rss_kib / 1024) for s in self.samples if s.minute >= start]
        return least_squares_slope(points)

    def rss_at(self, minute: float) -> float:
        """RSS in MiB of the first sample at or after ``minute``."""
        found = next((s for s in self.samples if s.minute >= minute), self.samples[-1])
        return found.rss_kib / 1024


def soak(options: SoakOptions, url: str, workdir: Path) -> SoakResult:
    """Run one soak against ``url``; never raises on figures."""
    result = SoakResult(options, load=(os.getloadavg()[0], 0.0))
    # Uncached: every collector on every pass for the hour, no server-time budget
    # stretching the costliest (issue 31), so the query path is what soaks.
    extra = ("--disable-cache", "--server.time-budget", "0") if options.uncached else ()
    log = workdir / "exporter.log"
    with Probe.start(url, extra, log, trace=options.trace, snapshots=False) as probe:
        probe.wait_ready()
        started = time.monotonic()
        first = _drive(probe, result)
        last = _report(probe, result, (time.monotonic() - started) / 60)
        result.grown_types = _grown(last.types if first is None else first.types, last.types)
    result.load = (result.load[0], os.getloadavg()[0])
    return result


def _drive(probe: Probe, result: SoakResult) -> Report | None:
    """The scrapes at their pace, with samples and reports; the report that ended the
    first ``report_every`` seconds (the baseline of the types that grew), if any."""
    options, first = result.options, None
    t0 = time.monotonic()
    next_sample = next_report = 0.0
    while (elapsed := time.monotonic() - t0) < options.minutes * 60:
        if elapsed >= next_sample:
            found = memory(probe.pid)
            result.samples.append(Sample(round(elapsed / 60, 3), result.scrapes,
                                         found.rss_kib, found.hwm_kib))  # fmt: skip
            next_sample += options.sample_every
        if elapsed >= next_report:
            report = _report(probe, result, elapsed / 60)
            first = report if len(result.checkpoints) == 2 else first
            next_report += options.report_every
        _scrape(probe, result)
        pause = t0 + result.scrapes * options.interval - time.monotonic()
        time.sleep(max(0.0, pause))  # the pace of the load, not a synchronisation
    return first


def _scrape(probe: Probe, result: SoakResult) -> None:
    try:
        probe.scrape(result.scrapes)
    except (OSError, ProbeError) as exc:
        result.errors.append(f"scrape {result.scrapes}: {type(exc).__name__}: {exc}"[:300])
    result.scrapes += 1


def _report(probe: Probe, result: SoakResult, minute: float) -> Report:
    report = probe.report()
    objects = sum(report.types.values())
    traced = report.traced / 1024 if report.traced >= 0 else -1.0
    mib = 1024 * 1024
    heap = report.malloc.get("heap", 0) + report.malloc.get("mmapped", 0)
    in_use = report.malloc.get("in_use", 0) + report.malloc.get("mmapped", 0)
    pymalloc = report.pymalloc.get("arenas", 0) * mib  # 1 MiB arenas (3.10 and later)
    result.checkpoints.append(Checkpoint(
        round(minute, 2), objects, report.tasks, report.timers, round(traced, 1),
        round(heap / mib, 2), round(in_use / mib, 2), round(pymalloc / mib, 2),
        round(report.pymalloc.get("in_use", 0) / mib, 2)))  # fmt: skip
    return report


def _grown(first: dict[str, int], last: dict[str, int], top: int = 10) -> dict[str, int]:
    """The types whose count changed most between two reports, signed."""
    changed = {k: last.get(k, 0) - first.get(k, 0) for k in first.keys() | last.keys()}
    ordered = sorted(changed.items(), key=lambda kv: -abs(kv[1]))
    return {k: v for k, v in ordered[:top] if v}


def report(result: SoakResult) -> str:
    """The figures: RSS at a few points, slopes, checkpoints, errors."""
    options, samples = result.options, result.samples
    minutes = samples[-1].minute if samples else 0.0
    fit = min(options.fit_minutes, minutes)
    lines = [
        f"soak: {result.scrapes} scrapes in {minutes:.1f} min, every {options.interval:g} s, "
        f"{'uncached (--disable-cache)' if options.uncached else 'default TTLs'}, "
        f"load average {result.load[0]:.2f} at start, {result.load[1]:.2f} at end",
        f"errors: {len(result.errors)}",
        *(f"  {e}" for e in result.errors[:5]),
        "",
        "| minute | RSS MiB |",
        "|---:|---:|",
        *(f"| {m:g} | {result.rss_at(m):.2f} |" for m in _marks(minutes)),
        "",
        f"HWM {samples[-1].hwm_kib / 1024:.2f} MiB" if samples else "no samples",
        f"slope over the last {fit:g} min: {result.slope(fit):+.4f} MiB/min",
        f"slope over the last {fit / 2:g} min: {result.slope(fit / 2):+.4f} MiB/min",
        "",
        "| minute | gc objects | tasks | timers | traced KiB | malloc MiB (in use) "
        "| pymalloc MiB (in use) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {c.minute:g} | {c.objects} | {c.tasks} | {c.timers} | {c.traced_kib:g} "
            f"| {c.malloc_mib:.2f} ({c.malloc_in_use_mib:.2f}) "
            f"| {c.pymalloc_mib:.2f} ({c.pymalloc_in_use_mib:.2f}) |"
            for c in result.checkpoints
        ),
        "",
        f"types that changed most, first to last report: {result.grown_types or 'none'}",
    ]
    return "\n".join(lines)


def _marks(minutes: float) -> list[float]:
    """The minutes to show: start, then every tenth of the run, then the end."""
    step = max(1.0, round(minutes / 10))
    marks = [0.0]
    while marks[-1] + step < minutes:
        marks.append(marks[-1] + step)
    return [*marks, round(minutes, 1)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between scrapes")
    parser.add_argument("--cached", action="store_true", help="default TTLs, not uncached")
    parser.add_argument("--fit-minutes", type=float, default=40.0)
    parser.add_argument("--sample-every", type=float, default=10.0, metavar="SECONDS")
    parser.add_argument("--report-every", type=float, default=300.0, metavar="SECONDS")
    parser.add_argument("--trace", type=int, default=0, metavar="FRAMES")
    parser.add_argument("--dsn", help="an existing server instead of a throw-away one")
    parser.add_argument("--json", type=Path, metavar="PATH")
    args = parser.parse_args(argv)
    options = SoakOptions(args.minutes, args.interval, not args.cached, args.fit_minutes,
                          args.sample_every, args.report_every, args.trace)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="pgx-bench-soak-") as workdir, server(args.dsn) as url:
        print(f"soaking for {options.minutes:g} min ...", file=sys.stderr, flush=True)
        result = soak(options, url, Path(workdir))
    print(report(result))
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(result), indent=2))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
