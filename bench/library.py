"""Benchmark of the whole collector library (issue 22): ours against the Go pg_exporter's.

Run from the repository root::

    .venv/bin/python -m bench.library                          # ours only
    .venv/bin/python -m bench.library --go-config PATH/pg_exporter.yml \\
        [--go-binary PATH/pg_exporter] [--rounds 3] [--scrapes 20] [--json out.json] \\
        [--top-branches 12] [--collectors DIR]

One throw-away PostgreSQL 18 primary holds the workload of issue 22: one extra
database with 30 indexed tables, ``pg_stat_statements``, and a login role in
``pg_monitor`` that every exporter connects as. Each exporter serves it with
its own default settings (auto-discovery on), once uncached (``--disable-cache``)
and once with default TTLs, scraped back to back. Exporters run one at a time,
interleaved round by round, so machine noise falls on all of them alike; the
ratios of one round are what to compare, their spread across rounds is printed.

Exporters (``key``: what runs):

- ``ours``: this repository's exporter with its own library (``collectors/``);
- ``ours-go-config``: this repository's exporter running the Go exporter's shipped
  config (``--go-config``, a path outside the repository; skipped without it);
- ``go``: a Go pg_exporter binary given by ``--go-binary`` (never built or fetched
  here; skipped without it), with the config of ``--go-config``.

Per pass (one scrape): exporter CPU (utime+stime), wall time of the scrape, database
time and statements (``pg_stat_statements`` of the role: total_exec_time and calls,
utility statements included), PostgreSQL CPU (the whole cluster's utime+stime over the
scrapes: parsing, planning and the protocol, which total_exec_time leaves out), series
(sample lines), RSS after the scrapes. Below the tables, the branches of our library
that cost the most database time in the uncached passes (``bench.statements``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from bench import statements as per_branch
from bench.cluster import REPO
from bench.exporters import ExporterFailed, Launch, ours_python, running
from bench.measure import ANY_SAMPLE, memory, postgres_cpu_seconds, process_cpu_seconds, scrape
from rigs.localpg import LocalCluster, free_port, pg18_bindir

ROLE = "bench_monitor"
EXTRA_DATABASE = "benchdb"
TABLES = 30
ROWS_PER_TABLE = 1000
OURS, OURS_GO_CONFIG, GO = "ours", "ours-go-config", "go"
TITLES = {
    OURS: "ours, own library",
    OURS_GO_CONFIG: "ours, Go config",
    GO: "Go pg_exporter binary",
}
FLAVOURS = ("uncached", "cached")
SERVER_SETTINGS = {"max_connections": "60", "pg_stat_statements.max": "10000"}


@dataclass(frozen=True, slots=True)
class Options:
    """Parsed command line."""

    scrapes: int
    warmup: int
    rounds: int
    flavours: tuple[str, ...]
    go_config: Path | None
    go_binary: Path | None
    json_path: Path | None
    ready_timeout: float
    top_branches: int = 12
    collectors: Path = REPO / "collectors"


@dataclass(frozen=True, slots=True)
class Pass:
    """Per-pass figures of one exporter, one flavour, one round."""

    exporter: str
    flavour: str
    round: int
    cpu_ms: float
    wall_ms: float  # median scrape
    db_ms: float
    statements: float
    series: int
    rss_mib: float
    pg_cpu_ms: float = 0.0  # the whole cluster's CPU: parse, plan and protocol included
    error: str = ""
    branches: tuple[per_branch.Cost, ...] = ()  # ours, uncached: database time per branch


def parse_args(argv: Sequence[str] | None = None) -> Options:
    """Command line → Options; a given path must exist."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=20, help="measured scrapes per trial")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured scrapes first")
    parser.add_argument("--rounds", type=int, default=2, help="trials per exporter and flavour")
    parser.add_argument("--flavours", default=",".join(FLAVOURS), help="uncached,cached")
    parser.add_argument(
        "--go-config",
        type=Path,
        metavar="PATH",
        help="the Go exporter's shipped config (pg_exporter.yml of its source)",
    )
    parser.add_argument("--go-binary", type=Path, metavar="PATH",
                        help="a Go pg_exporter binary (needs --go-config)")  # fmt: skip
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write every pass as JSON")
    parser.add_argument("--ready-timeout", type=float, default=120.0, metavar="SECONDS")
    parser.add_argument("--top-branches", type=int, default=12, metavar="N",
                        help="list our N costliest branches, uncached (0: none)")  # fmt: skip
    parser.add_argument("--collectors", type=Path, metavar="DIR", default=REPO / "collectors",
                        help="our library (default: collectors/)")  # fmt: skip
    args = parser.parse_args(argv)
    flavours = tuple(f.strip() for f in args.flavours.split(",") if f.strip())
    if not flavours or any(f not in FLAVOURS for f in flavours):
        parser.error(f"--flavours: choose among {', '.join(FLAVOURS)}")
    for flag, path in (("--go-config", args.go_config), ("--go-binary", args.go_binary)):
        if path is not None and not path.is_file():
            parser.error(f"{flag} {path}: no such file")
    if not args.collectors.is_dir():
        parser.error(f"--collectors {args.collectors}: no such directory")
    if args.go_binary is not None and args.go_config is None:
        parser.error("--go-binary needs --go-config (the Go binary has no built-in library)")
    return Options(
        scrapes=max(1, args.scrapes), warmup=max(0, args.warmup), rounds=max(1, args.rounds),
        flavours=flavours, go_config=args.go_config, go_binary=args.go_binary,
        json_path=args.json, ready_timeout=args.ready_timeout,
        top_branches=max(0, args.top_branches), collectors=args.collectors,
    )  # fmt: skip


def populate(cluster: LocalCluster) -> None:
    """The workload: an extra database of indexed tables, pg_stat_statements, a monitor role."""
    cluster.psql(
        f"CREATE ROLE {ROLE} LOGIN IN ROLE pg_monitor;"
        "CREATE EXTENSION IF NOT EXISTS pg_stat_statements;"
        f"CREATE DATABASE {EXTRA_DATABASE};"
    )
    tables = "\n".join(
        f"CREATE TABLE t{n} (id int PRIMARY KEY, v text, w int);"
        f"CREATE INDEX t{n}_w ON t{n} (w);"
        f"INSERT INTO t{n} SELECT i, md5(i::text), i % 17"
        f" FROM generate_series(1, {ROWS_PER_TABLE}) AS i;"
        for n in range(TABLES)
    )
    cluster.psql(tables + "CREATE EXTENSION IF NOT EXISTS pg_stat_statements; ANALYZE;",
                 dbname=EXTRA_DATABASE)  # fmt: skip


def launch(key: str, flavour: str, url: str, options: Options) -> Launch:
    """The command line of one exporter on a fresh port, with its default settings."""
    port = free_port()
    listen = f"127.0.0.1:{port}"
    uncached = ("--disable-cache",) if flavour == "uncached" else ()
    if key == GO:
        assert options.go_binary is not None
        assert options.go_config is not None
        argv = (str(options.go_binary), f"--url={url}", f"--config={options.go_config}",
                f"--web.listen-address={listen}", "--log.level=warn",
                # 100 ms by default: too tight for a machine loaded by other work.
                "--connect-timeout=2000", *uncached)  # fmt: skip
        return Launch(key, argv, port)
    config = options.go_config if key == OURS_GO_CONFIG else options.collectors
    # Uncached means every collector on every pass, as the Go binary runs them: no
    # server-time budget stretching the costliest after 30 s of back-to-back passes.
    unbudgeted = ("--server.time-budget", "0") if uncached else ()
    argv = (ours_python(), "-m", "exporter", "--url", url, "--config", str(config),
            "--web.listen-address", listen, "--log.level", "warn", *uncached,
            *unbudgeted)  # fmt: skip
    return Launch(key, argv, port)


def role_totals(cluster: LocalCluster) -> tuple[float, float]:
    """(calls, total_exec_time ms) of the monitor role in pg_stat_statements, all databases."""
    row = cluster.psql(
        "SELECT coalesce(sum(calls), 0), coalesce(sum(total_exec_time), 0)"
        f" FROM pg_stat_statements WHERE userid = '{ROLE}'::regrole"
    )
    calls, ms = row.split("|")
    return float(calls), float(ms)


def wait_ready(spec: Launch, alive: Callable[[], bool], deadline: float) -> None:
    """Scrape until two answers in a row are 200 with the same number of series."""
    last = -1
    while time.monotonic() < deadline:
        try:
            answer = scrape(spec.port, "/metrics", gzip_ok=True, timeout=60)
        except OSError:
            answer = None
        if answer is not None and answer.status == 200:
            if answer.all_series == last:
                return
            last = answer.all_series
        if not alive():
            raise ExporterFailed(f"{spec.key} exited before it was ready")
        time.sleep(0.2)  # polling interval of a condition with a deadline
    raise ExporterFailed(f"{spec.key} not ready before the deadline")


@dataclass(frozen=True, slots=True)
class Bench:
    """What every trial of one run shares."""

    cluster: LocalCluster
    options: Options
    workdir: Path  # exporter logs
    queries: dict[str, frozenset[str]]  # branch key → words of its SQL, to name statements


#: How a trial gets the command line of an exporter: (key, flavour, url, options) → Launch.
Launcher = Callable[[str, str, str, Options], Launch]


def trial(bench: Bench, key: str, flavour: str, rnd: int, launcher: Launcher = launch) -> Pass:
    """Start one exporter, warm it up, measure ``options.scrapes`` passes, stop it."""
    cluster, options, workdir = bench.cluster, bench.options, bench.workdir
    url = cluster.dsn("postgres", user=ROLE)
    spec = launcher(key, flavour, url, options)
    log = workdir / f"{key}-{flavour}-{rnd}.log"
    with running(spec, log) as proc:
        wait_ready(spec, lambda: proc.poll() is None, time.monotonic() + options.ready_timeout)
        for _ in range(options.warmup):
            scrape(spec.port, "/metrics", gzip_ok=True, timeout=60)
        cluster.psql(f"SELECT pg_stat_statements_reset('{ROLE}'::regrole)")
        postmaster = _postmaster_pid(cluster)
        cpu0, pg0 = process_cpu_seconds(proc.pid), postgres_cpu_seconds(postmaster)
        walls, last = [], None
        for _ in range(options.scrapes):
            last = scrape(spec.port, "/metrics", gzip_ok=True, timeout=60)
            if last.status != 200:
                raise ExporterFailed(f"{key}: HTTP {last.status}")
            walls.append(last.seconds)
        cpu = process_cpu_seconds(proc.pid) - cpu0
        pg_cpu = postgres_cpu_seconds(postmaster) - pg0
        rss = memory(proc.pid).rss_kib / 1024
    calls, db_ms = role_totals(cluster)
    n = options.scrapes
    series = len(ANY_SAMPLE.findall(last.body)) if last is not None else 0
    branches: tuple[per_branch.Cost, ...] = ()
    if key == OURS and flavour == "uncached" and options.top_branches:
        branches = tuple(per_branch.measure(cluster, ROLE, bench.queries, n))
    return Pass(key, flavour, rnd, cpu * 1000 / n, statistics.median(walls) * 1000,
                db_ms / n, calls / n, series, rss, pg_cpu * 1000 / n,
                branches=branches)  # fmt: skip


def _postmaster_pid(cluster: LocalCluster) -> int:
    """The postmaster's pid: the first line of ``postmaster.pid``."""
    return int((cluster.data_dir / "postmaster.pid").read_text().split()[0])


def exporters_of(options: Options) -> list[str]:
    """What runs: ours always, the Go config and the Go binary when given."""
    keys = [OURS]
    if options.go_config is not None:
        keys.append(OURS_GO_CONFIG)
    if options.go_binary is not None:
        keys.append(GO)
    return keys


def run(options: Options) -> list[Pass]:
    """Every round of every flavour of every exporter, on one cluster."""
    passes: list[Pass] = []
    with LocalCluster(pg18_bindir(), settings=SERVER_SETTINGS) as cluster, _workdir() as workdir:
        populate(cluster)
        bench = Bench(cluster, options, workdir, per_branch.branch_queries(options.collectors))
        for rnd in range(1, options.rounds + 1):
            for flavour in options.flavours:
                for key in exporters_of(options):
                    passes.append(_one(bench, key, flavour, rnd))
    return passes


def _one(bench: Bench, key: str, flavour: str, rnd: int) -> Pass:
    try:
        result = trial(bench, key, flavour, rnd)
    except (ExporterFailed, OSError) as exc:
        log = bench.workdir / f"{key}-{flavour}-{rnd}.log"
        tail = log.read_text(errors="replace").splitlines()[-10:] if log.exists() else []
        _progress(f"round {rnd} {flavour} {key}: FAILED {exc}; its log ends with:")
        _progress("\n".join(f"    {line}" for line in tail))
        return Pass(key, flavour, rnd, 0, 0, 0, 0, 0, 0, error=str(exc))
    _progress(
        f"round {rnd} {flavour} {key}: cpu {result.cpu_ms:.1f} ms, wall {result.wall_ms:.1f} ms,"
        f" db {result.db_ms:.1f} ms, PostgreSQL CPU {result.pg_cpu_ms:.1f} ms,"
        f" {result.statements:.0f} statements,"
        f" {result.series} series, RSS {result.rss_mib:.1f} MiB"
    )
    return result


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="pgx-bench-library-") as tmp:
        yield Path(tmp)


FIELDS = (("cpu_ms", "CPU ms"), ("wall_ms", "wall ms"), ("db_ms", "db ms"),
          ("pg_cpu_ms", "PostgreSQL CPU ms"),
          ("statements", "statements"), ("series", "series"), ("rss_mib", "RSS MiB"))  # fmt: skip


def render(passes: list[Pass], options: Options) -> str:
    """Per flavour: each exporter's median over rounds, then ours/peer ratios with spread."""
    out: list[str] = []
    for flavour in options.flavours:
        rows = [p for p in passes if p.flavour == flavour and not p.error]
        out.append(f"\n### {flavour} ({options.scrapes} scrapes a round, {options.rounds} rounds)")
        out.append("\n| per pass | " + " | ".join(title for _, title in FIELDS) + " |")
        out.append("|---|" + "---|" * len(FIELDS))
        for key in exporters_of(options):
            mine = [p for p in rows if p.exporter == key]
            if not mine:
                out.append(f"| {TITLES[key]} | failed |" + " |" * (len(FIELDS) - 1))
                continue
            cells = [_fmt(statistics.median(float(getattr(p, f)) for p in mine)) for f, _ in FIELDS]
            out.append(f"| {TITLES[key]} | " + " | ".join(cells) + " |")
        for peer in exporters_of(options)[1:]:
            out.append(_ratios(rows, peer))
    trials = [list(p.branches) for p in passes if p.branches]
    if trials:
        out.append(f"\n### database time per branch, ours, uncached ({len(trials)} rounds)\n")
        out.append(per_branch.render(trials, options.top_branches))
    return "\n".join(out)


def _ratios(rows: list[Pass], peer: str) -> str:
    """ours/peer per field, round by round: median [min–max]."""
    cells = []
    for field, _ in FIELDS:
        ratios = []
        for ours in (p for p in rows if p.exporter == OURS):
            theirs = [p for p in rows if p.exporter == peer and p.round == ours.round]
            value = float(getattr(theirs[0], field)) if theirs else 0.0
            if value:
                ratios.append(float(getattr(ours, field)) / value)
        cells.append(
            f"{statistics.median(ratios):.2f}× [{min(ratios):.2f}–{max(ratios):.2f}]"
            if ratios else "n/a"
        )  # fmt: skip
    return f"| ours / {TITLES[peer]} | " + " | ".join(cells) + " |"


def _fmt(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run, print the Markdown tables; exit 0 whatever the figures."""
    options = parse_args(argv)
    _progress(f"load average at start: {Path('/proc/loadavg').read_text().split()[0]}")
    passes = run(options)
    print(render(passes, options))
    if options.json_path is not None:
        options.json_path.write_text(json.dumps([asdict(p) for p in passes], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
