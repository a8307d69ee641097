"""Where the exporter's resident memory goes (issue 31).

Run from the repository root::

    .venv/bin/python -m bench.memory floor [--runs 3]
    .venv/bin/python -m bench.memory run [--scrapes 50] [--flavours cached,uncached]
        [--dsn URL] [--tree DIR] [--trace FRAMES] [--top 25] [--json out.json]

``floor``: the import floor, each step in a fresh interpreter (median of ``--runs``):
resident memory after importing our heavy dependencies one by one, in the order the
serving code imports them, then the serving code itself, and what the modules serving
leaves out would add.

``run``: the exporter as a process with the default library against a throw-away
PostgreSQL 18 holding ``bench.library``'s workload (or the server of ``--dsn``, e.g. a
big database), one fresh process per flavour (default TTLs, ``--disable-cache``):
``VmRSS`` and ``VmHWM`` after the scrapes, resident memory split into anonymous (the
Python heap, C allocations) and file-backed (libraries), and the series served.
``--env NAME=VALUE`` (repeatable) gives the exporter more environment, e.g.
``GLIBC_TUNABLES=glibc.malloc.mmap_threshold=131072`` or ``PSYCOPG_IMPL=python`` (as the
distribution packages run it); ``--trim`` has glibc give its free heap back
(``malloc_trim(0)``) after every answer, always (the exporter of a tree that has
``exporter/report/heap.py`` trims by itself, when 1 MiB is free, every 0.1 s at most).
``--tree DIR`` runs the exporter of another checkout (``git worktree add DIR COMMIT``)
with this venv, for a before/after in one session. ``--trace N`` starts it under
tracemalloc (N frames; it slows the exporter and adds its own memory, so RSS is not
comparable then) and lists what the Python heap holds after the scrapes beyond the
imports, by the line of ours that allocated it and by module.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.cluster import REPO
from bench.library import ROLE, SERVER_SETTINGS, populate
from bench.measure import process_cpu_seconds
from bench.memory_probe import Probe, attribute, by_module, resident
from rigs.localpg import LocalCluster, pg18_bindir

FLAVOURS = ("cached", "uncached")

#: Import steps of ``floor``: what the serving code imports, heaviest dependencies first,
#: each step on top of the previous ones. ``exporter.web`` imports aiohttp as serving does.
FLOOR_STEPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("interpreter", ()),
    ("asyncio, ssl", ("asyncio", "ssl")),
    ("PyYAML", ("yaml",)),
    ("psycopg (binary)", ("psycopg",)),
    ("aiohttp, as exporter.web imports it", ("exporter.web",)),
    ("the serving code", ("exporter.cli", "exporter.web.routes", "exporter.serve")),
)
#: What serving does not import, and what each would add on top of the floor.
LEFT_OUT: tuple[tuple[str, str], ...] = (
    ("prometheus_client", "prometheus_client"),
    ("bcrypt (basic auth only)", "bcrypt"),
    ("difflib (mistyped flags only)", "difflib"),
)
_RSS_AFTER = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
for line in open("/proc/self/status"):
    if line.startswith("VmRSS:"):
        print(int(line.split()[1]), len(sys.modules))
"""


@dataclass(frozen=True, slots=True)
class FloorStep:
    """Resident memory once a step's modules are imported on top of the earlier ones."""

    label: str
    rss_mib: float
    modules: int


def floor(runs: int, tree: Path = REPO) -> list[FloorStep]:
    """Each step of :data:`FLOOR_STEPS` then each of :data:`LEFT_OUT`, medians of ``runs``."""
    steps: list[FloorStep] = []
    imported: list[str] = []
    for label, names in FLOOR_STEPS:
        imported += names
        steps.append(_median_step(label, imported, runs, tree))
    for label, name in LEFT_OUT:
        steps.append(_median_step(f"+ {label}", [*imported, name], runs, tree))
    return steps


def _median_step(label: str, names: list[str], runs: int, tree: Path) -> FloorStep:
    readings = [_rss_after(names, tree) for _ in range(max(1, runs))]
    rss = statistics.median(r[0] for r in readings) / 1024
    return FloorStep(label, round(rss, 2), readings[0][1])


def _rss_after(names: list[str], tree: Path) -> tuple[int, int]:
    argv = [sys.executable, "-c", _RSS_AFTER, *names]
    out = subprocess.run(argv, cwd=tree, capture_output=True, text=True, check=True, timeout=120)
    kib, modules = out.stdout.split()
    return int(kib), int(modules)


def render_floor(steps: list[FloorStep]) -> str:
    """The floor as a Markdown table: each step, its RSS and what it added (a module
    serving leaves out: what it would add to the whole floor)."""
    lines = ["| import step | RSS MiB | added MiB | modules |", "|---|---:|---:|---:|"]
    whole = steps[len(FLOOR_STEPS) - 1]
    for n, step in enumerate(steps):
        before = steps[n - 1] if 0 < n < len(FLOOR_STEPS) else whole if n else None
        added = f"{step.rss_mib - before.rss_mib:+.2f}" if before is not None else ""
        lines.append(f"| {step.label} | {step.rss_mib:.2f} | {added} | {step.modules} |")
    return "\n".join(lines)


# --- the running exporter ------------------------------------------------------------


@dataclass
class Run:
    """One exporter process, one flavour: its memory after the scrapes."""

    flavour: str
    scrapes: int
    series: int
    rss_mib: float
    hwm_mib: float
    anonymous_mib: float
    file_mib: float
    cpu_ms: float = 0.0  # exporter CPU per measured scrape
    traced: dict[str, float] = field(default_factory=dict)  # KiB by line, with --trace
    modules: dict[str, float] = field(default_factory=dict)  # KiB by module, with --trace


@dataclass(frozen=True, slots=True)
class RunOptions:
    """Parsed ``run`` options."""

    scrapes: int
    flavours: tuple[str, ...]
    dsn: str | None
    tree: Path
    trace: int
    top: int
    env: dict[str, str] = field(default_factory=dict)  # more environment of the exporter
    trim: bool = False  # malloc_trim(0) after every answer (bench.memory_probe)


def run(options: RunOptions, workdir: Path) -> list[Run]:
    """Each flavour in a fresh exporter process, on the given server or a throw-away one."""
    with server(options.dsn) as url:
        return [_one(options, url, flavour, workdir) for flavour in options.flavours]


@contextlib.contextmanager
def server(dsn: str | None) -> Iterator[str]:
    """``dsn`` as given, else a throw-away PostgreSQL 18 with bench.library's workload."""
    if dsn is not None:
        yield dsn
        return
    with LocalCluster(pg18_bindir(), settings=SERVER_SETTINGS) as cluster:
        populate(cluster)
        yield cluster.dsn("postgres", user=ROLE)


def _one(options: RunOptions, url: str, flavour: str, workdir: Path) -> Run:
    extra = ("--disable-cache", "--server.time-budget", "0") if flavour == "uncached" else ()
    log = workdir / f"{flavour}.log"
    with Probe.start(url, extra, log, tree=options.tree, trace=options.trace,
                     env=options.env, trim=options.trim) as probe:  # fmt: skip
        probe.wait_ready()
        series = 0
        cpu = process_cpu_seconds(probe.pid)
        for _ in range(options.scrapes):
            series = probe.scrape(0)  # as Prometheus asks with OpenMetrics off: text, gzip
        cpu = process_cpu_seconds(probe.pid) - cpu
        memory = resident(probe.pid)
        result = Run(flavour, options.scrapes, series, *memory,
                     cpu_ms=round(cpu * 1000 / options.scrapes, 1))  # fmt: skip
        if options.trace:
            report = probe.report()
            assert report.snapshot is not None
            result.traced = attribute(report.snapshot, options.top)
            result.modules = by_module(report.snapshot)
    _progress(f"{flavour}: RSS {result.rss_mib:.1f} MiB, {series} series")
    return result


def render_runs(runs: list[Run], top: int) -> str:
    """A table of the runs, then the traced attribution of each run that has one."""
    lines = [
        "| flavour | scrapes | series | RSS MiB | HWM MiB | anonymous MiB | file-backed MiB"
        " | CPU ms/scrape |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r.flavour} | {r.scrapes} | {r.series} | {r.rss_mib:.2f} | {r.hwm_mib:.2f} "
        f"| {r.anonymous_mib:.2f} | {r.file_mib:.2f} | {r.cpu_ms:.1f} |"
        for r in runs
    ]
    for r in runs:
        if r.traced:
            lines += ["", f"{r.flavour}: Python heap beyond the imports, KiB, by module:"]
            lines += [f"  {kib:9.1f}  {name}" for name, kib in list(r.modules.items())[:top]]
            lines += ["", f"{r.flavour}: by the line of ours that allocated it (top {top}):"]
            lines += [f"  {kib:9.1f}  {where}" for where, kib in r.traced.items()]
    return "\n".join(lines)


# --- command line --------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    floor_cmd = sub.add_parser("floor", help="the import floor, step by step")
    floor_cmd.add_argument("--runs", type=int, default=3)
    floor_cmd.add_argument("--tree", type=Path, default=REPO)
    run_cmd = sub.add_parser("run", help="the exporter after N scrapes")
    run_cmd.add_argument("--scrapes", type=int, default=50)
    run_cmd.add_argument("--flavours", default=",".join(FLAVOURS))
    run_cmd.add_argument("--dsn", help="an existing server instead of a throw-away one")
    run_cmd.add_argument("--tree", type=Path, default=REPO, help="another checkout to run")
    run_cmd.add_argument("--trace", type=int, default=0, metavar="FRAMES")
    run_cmd.add_argument("--top", type=int, default=25)
    run_cmd.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="more environment of the exporter, e.g. GLIBC_TUNABLES=...",
    )
    run_cmd.add_argument(
        "--trim",
        action="store_true",
        help="glibc's malloc_trim(0) after every answer, always",
    )
    for command in (floor_cmd, run_cmd):
        command.add_argument("--json", type=Path, metavar="PATH")
    args = parser.parse_args(argv)
    if args.command == "floor":
        steps = floor(args.runs, args.tree.resolve())
        print(render_floor(steps))
        _dump(args.json, [asdict(s) for s in steps])
        return 0
    flavours = tuple(f for f in args.flavours.split(",") if f)
    if not flavours or any(f not in FLAVOURS for f in flavours):
        parser.error(f"--flavours: choose among {', '.join(FLAVOURS)}")
    env: dict[str, str] = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            parser.error(f"--env {item!r}: give NAME=VALUE")
        env[name] = value
    options = RunOptions(max(1, args.scrapes), flavours, args.dsn, args.tree.resolve(),
                         max(0, args.trace), max(1, args.top), env, args.trim)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="pgx-bench-memory-") as workdir:
        runs = run(options, Path(workdir))
    print(render_runs(runs, options.top))
    _dump(args.json, [asdict(r) for r in runs])
    return 0


def _dump(path: Path | None, data: object) -> None:
    if path is not None:
        path.write_text(json.dumps(data, indent=2))


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
