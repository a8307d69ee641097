"""Benchmark: one workload served by ours and two peer exporters, on one throw-away PostgreSQL.

Run from the repository root: ``.venv/bin/python -m bench.run_bench [--quick] [--json out.json]``.
See bench/README.md for what is measured and how to read the table.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench import exporters
from bench.cluster import Server, throwaway_postgres
from bench.measure import (
    Scrape,
    memory,
    percentile,
    postgres_cpu_seconds,
    process_cpu_seconds,
    scrape,
)
from bench.report import Result, render, write_json
from bench.workload import ConfigFiles, Workload, write_configs
from exporter.config.settings import DEFAULT_MAX_SERIES

SMALL = Workload("16k", rows=2_000, scrapes=30)
BIG = Workload("200k", rows=25_000, scrapes=8)
QUICK = Workload("16k", rows=2_000, scrapes=3)
#: Our default series cap (Settings.max_series) is below the big workload.
MIB = 1024.0


@dataclass(frozen=True, slots=True)
class Options:
    """Parsed command line."""

    workloads: tuple[Workload, ...]
    exporters: tuple[str, ...]
    warmup: int
    gzip: bool
    ready_timeout: float
    scrape_timeout: float
    json_path: Path | None
    keep: bool


def parse_args(argv: list[str] | None = None) -> Options:
    """Command line → Options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16k series only, 3 scrapes")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write results as JSON")
    parser.add_argument(
        "--exporters",
        default=",".join(exporters.ALL),
        help="comma list among ours,go,qe (default: all)",
    )
    parser.add_argument("--workloads", default="16k,200k", help="comma list among 16k,200k")
    parser.add_argument(
        "--scrapes", type=int, default=SMALL.scrapes, help="measured scrapes for 16k series"
    )
    parser.add_argument(
        "--big-scrapes", type=int, default=BIG.scrapes, help="measured scrapes for 200k series"
    )
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured scrapes first")
    parser.add_argument("--no-gzip", action="store_true", help="ask for identity encoding")
    parser.add_argument("--ready-timeout", type=float, default=180.0, metavar="SECONDS")
    parser.add_argument("--scrape-timeout", type=float, default=120.0, metavar="SECONDS")
    parser.add_argument("--keep", action="store_true", help="keep configs and logs")
    args = parser.parse_args(argv)
    return Options(
        workloads=_workloads(parser, args.workloads, args.scrapes, args.big_scrapes, args.quick),
        exporters=_exporters(parser, args.exporters),
        warmup=1 if args.quick else max(0, args.warmup),
        gzip=not args.no_gzip,
        ready_timeout=args.ready_timeout,
        scrape_timeout=args.scrape_timeout,
        json_path=args.json,
        keep=args.keep,
    )


def _workloads(
    parser: argparse.ArgumentParser, names: str, scrapes: int, big_scrapes: int, quick: bool
) -> tuple[Workload, ...]:
    """Workloads asked for; --quick overrides the rest."""
    if quick:
        return (QUICK,)
    table = {
        "16k": Workload(SMALL.name, SMALL.rows, max(1, scrapes)),
        "200k": Workload(BIG.name, BIG.rows, max(1, big_scrapes)),
    }
    keys = tuple(n.strip() for n in names.split(",") if n.strip())
    unknown = [k for k in keys if k not in table]
    if unknown:
        parser.error(f"unknown workload(s): {', '.join(unknown)} (known: {', '.join(table)})")
    return tuple(table[k] for k in keys)


def _exporters(parser: argparse.ArgumentParser, names: str) -> tuple[str, ...]:
    """Validated exporter keys."""
    keys = tuple(n.strip() for n in names.split(",") if n.strip())
    unknown = [k for k in keys if k not in exporters.ALL]
    if unknown:
        parser.error(f"unknown exporter(s): {', '.join(unknown)}")
    return keys


@dataclass(frozen=True, slots=True)
class Bench:
    """What every trial of one run shares."""

    server: Server
    options: Options
    workdir: Path  # configs and exporter logs


@dataclass(frozen=True, slots=True)
class Trial:
    """One exporter serving one workload flavour."""

    key: str
    workload: Workload
    cached: bool
    configs: ConfigFiles

    @property
    def label(self) -> str:
        """Short name for progress lines and log files."""
        flavour = "cached" if self.cached else "uncached"
        return f"{self.workload.name}-{flavour}-{self.key}"


def main(argv: list[str] | None = None) -> int:
    """Run every (workload, flavour, exporter) trial, print the table; always exit 0."""
    options = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="pgx-bench-run-"))
    results: list[Result] = []
    with throwaway_postgres() as server:
        bench = Bench(server, options, workdir)
        environment = _environment(server, options)
        for workload in options.workloads:
            for cached in (False, True):
                configs = write_configs(workload, cached, server.url, workdir)
                for key in options.exporters:
                    results.append(_run_trial(Trial(key, workload, cached, configs), bench))
    print(render(results))
    print(f"\nload average at start: {environment['loadavg_at_start']}")
    if options.json_path:
        write_json(options.json_path, results, environment)
        print(f"\nJSON written to {options.json_path}")
    _tidy(workdir, keep=options.keep or any(r.error for r in results))
    return 0


def _run_trial(trial: Trial, bench: Bench) -> Result:
    """Start one exporter, wait for the workload, warm up, measure, stop it."""
    reason = exporters.missing(trial.key)
    if reason:
        _progress(f"{trial.label}: skipped, {reason}")
        return Result(trial.key, trial.workload.name, trial.cached, error=reason)
    spec = exporters.launch(trial.key, trial.configs, bench.server.url, _extra_args(trial))
    log = bench.workdir / f"{trial.label}.log"
    _progress(f"{trial.label}: starting on port {spec.port}")
    try:
        with exporters.running(spec, log) as proc:
            deadline = time.monotonic() + bench.options.ready_timeout
            exporters.wait_ready(
                spec, proc, trial.workload.series, gzip_ok=bench.options.gzip, deadline=deadline
            )
            for _ in range(bench.options.warmup):
                _checked(spec, trial.workload, bench.options)
            result = _measure(trial, proc.pid, spec, bench)
    except (exporters.ExporterFailed, OSError) as exc:
        _progress(f"{trial.label}: FAILED {exc}; log {log} ends with:\n{_tail(log)}")
        error = str(exc).splitlines()[0][:120]
        return Result(trial.key, trial.workload.name, trial.cached, error=error)
    _progress(
        f"{trial.label}: cpu {result.cpu_ms:.1f} ms/scrape,"
        f" p50 {result.p50_ms:.1f} ms, RSS {result.rss_mib:.1f} MiB"
    )
    return result


def _measure(trial: Trial, pid: int, spec: exporters.Launch, bench: Bench) -> Result:
    """The measured window: CPU deltas around N sequential scrapes, then memory."""
    postmaster = bench.server.postmaster_pid()
    cpu0, pg0 = process_cpu_seconds(pid), postgres_cpu_seconds(postmaster)
    scrapes = [_checked(spec, trial.workload, bench.options) for _ in range(trial.workload.scrapes)]
    cpu1, pg1 = process_cpu_seconds(pid), postgres_cpu_seconds(postmaster)
    mem = memory(pid)
    n = len(scrapes)
    seconds = [s.seconds for s in scrapes]
    last = scrapes[-1]
    return Result(
        exporter=trial.key,
        workload=trial.workload.name,
        cached=trial.cached,
        scrapes=n,
        cpu_ms=(cpu1 - cpu0) * 1000 / n,
        pg_cpu_ms=(pg1 - pg0) * 1000 / n,
        p50_ms=percentile(seconds, 0.5) * 1000,
        p90_ms=percentile(seconds, 0.9) * 1000,
        rss_mib=mem.rss_kib / MIB,
        hwm_mib=mem.hwm_kib / MIB,
        workload_series=last.workload_series,
        other_series=last.all_series - last.workload_series,
        body_kib=len(last.body) / 1024,
        wire_kib=last.wire_bytes / 1024,
    )


def _checked(spec: exporters.Launch, workload: Workload, options: Options) -> Scrape:
    """A scrape that must answer 200 with the whole workload."""
    result = scrape(spec.port, spec.path, gzip_ok=options.gzip, timeout=options.scrape_timeout)
    if result.status != 200 or result.workload_series != workload.series:
        raise exporters.ExporterFailed(
            f"{spec.key}: HTTP {result.status},"
            f" {result.workload_series}/{workload.series} workload series"
        )
    return result


def _extra_args(trial: Trial) -> tuple[str, ...]:
    """Raise our series cap above the big workload (our default cap is 100 000)."""
    if trial.key != exporters.OURS or trial.workload.series <= DEFAULT_MAX_SERIES:
        return ()
    return ("--max-series", str(trial.workload.series * 2))


def _environment(server: Server, options: Options) -> dict[str, str]:
    """Versions and machine facts recorded with the results."""
    import psycopg

    with psycopg.connect(server.url) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    env = {
        "postgresql": str(row[0]) if row else "unknown",
        "python": platform.python_version(),
        "machine": f"{platform.machine()} {platform.system()} {platform.release()}",
        "cpus": str(len(os.sched_getaffinity(0))),
        # Other work on the machine shows in latencies far more than in CPU per scrape.
        "loadavg_at_start": Path("/proc/loadavg").read_text().split(" ", 1)[0],
        "gzip": str(options.gzip),
        "warmup": str(options.warmup),
    }
    for key in options.exporters:
        if not exporters.missing(key):
            env[key] = exporters.version_of(key)
    for name, value in env.items():
        _progress(f"{name}: {value}")
    return env


def _tail(log: Path, lines: int = 15) -> str:
    """Last lines of an exporter's log, indented, to show why it failed."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "    (no log)"
    return "\n".join(f"    {line}" for line in text.splitlines()[-lines:])


def _tidy(workdir: Path, *, keep: bool) -> None:
    """Remove configs and logs unless asked to keep them (or something failed)."""
    if keep:
        print(f"configs and logs kept in {workdir}")
        return
    shutil.rmtree(workdir, ignore_errors=True)


def _progress(message: str) -> None:
    """Progress goes to stderr so stdout carries only the table."""
    print(message, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
