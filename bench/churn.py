"""Series churn under a moving statement workload (issue 38): ours against the Go binary.

Run from the repository root::

    .venv/bin/python -m bench.churn                                   # ours only, 6 minutes
    .venv/bin/python -m bench.churn --go-binary PATH/pg_exporter [--go-config PATH/pg_exporter.yml]
    .venv/bin/python -m bench.churn --minutes 60 --json out.json      # the hour

One throw-away PostgreSQL 18 with ``pg_stat_statements`` preloaded (``max`` 10 000, so
nothing is deallocated) runs ``bench.churn_workload``'s moving workload as an
application role. Our exporter (the library ``collectors/``, default flags and TTLs) and,
when given, a Go pg_exporter binary with its own config, both logged in as a role in
``pg_monitor``, are scraped at the same moments every ``--interval`` seconds.

Once each exporter has run ``pg_query`` twice, the truth (``sum(calls)``,
``sum(total_exec_time)`` over all of ``pg_stat_statements``) is read, the workload runs
for the window, stops, the scrapes go on until each exporter has run ``pg_query`` twice
more, and the truth is read again. Per exporter: ``pg_query_*`` series per scrape and
distinct over the window, what share of the truth's increase the served counters add up
to (increase over consecutive scrapes where a series is in both, a drop counted as a
reset, as Prometheus' ``increase()`` does), named series alone and with the remainder
(``query="other"``), and when the heavy hitter's query ID first appeared as a label.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, astuple, dataclass, field, replace
from pathlib import Path

import psycopg

from bench import library
from bench.bigdb import _beside
from bench.budget_window import runs_of
from bench.churn_workload import APP, DATABASE, Plan, Workload, run_every_shape, setup_sql
from bench.cluster import REPO
from bench.exporters import ExporterFailed, Launch, running
from bench.library import _fmt, _progress
from bench.measure import scrape
from rigs.localpg import LocalCluster, pg18_bindir

OURS, GO = library.OURS, library.GO
TITLES = {OURS: "ours, own library", GO: "Go pg_exporter binary"}
TTL = 10.0  # pg_query's in both configs: how stale a served value may be
REMAINDER = "other"
SAMPLE = re.compile(r"^(pg_query_[A-Za-z0-9_]+)(?:\{(.*)\})? (\S+)$", re.MULTILINE)
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Options:
    """Parsed command line."""

    plan: Plan
    minutes: float
    interval: float
    go_binary: Path | None
    go_config: Path | None
    json_path: Path | None
    ready_timeout: float


@dataclass(frozen=True, slots=True)
class Served:
    """What one scrape of one exporter served of ``pg_query``."""

    at: float  # time.monotonic() when the request was sent
    calls: dict[Labels, float]
    exec_seconds: dict[Labels, float]
    series: frozenset[tuple[str, Labels]]  # every pg_query_* sample
    runs: float  # pg_query's executions so far, by the exporter's self-metrics


@dataclass(frozen=True, slots=True)
class Truth:
    """Every statement in ``pg_stat_statements``, summed; and the application's part."""

    calls: float
    exec_ms: float
    app_calls: float = 0.0
    app_exec_ms: float = 0.0

    def __sub__(self, before: Truth) -> Truth:
        """The increase since ``before``."""
        return Truth(*(a - b for a, b in zip(astuple(self), astuple(before), strict=True)))


@dataclass(frozen=True, slots=True)
class Figures:
    """One exporter over the window."""

    exporter: str
    scrapes: int
    failed: int
    calls_per_scrape: tuple[float, int]  # median, max
    all_per_scrape: tuple[float, int]
    distinct_calls: int
    distinct_all: int
    named_calls: float
    other_calls: float
    named_exec_ms: float
    other_exec_ms: float
    heavy_named_after: float | None  # seconds; None: never
    caught_up: bool = True


@dataclass(frozen=True, slots=True)
class Heavy:
    """The heavy hitter, from pg_stat_statements at the end."""

    queryid: str | None
    started: float | None  # seconds into the workload
    calls: float = 0.0
    exec_ms: float = 0.0
    share_active: float = 0.0  # of every statement's execution time while it ran
    share_window: float = 0.0  # of the window's


@dataclass(frozen=True, slots=True)
class Report:
    """Everything a run measured."""

    options: dict[str, object]
    load: list[str]
    commit: str
    seconds: float  # T0 → T1
    truth: Truth
    heavy: Heavy
    workload_calls: int
    figures: list[Figures] = field(default_factory=list)


def parse_args(argv: Sequence[str] | None = None) -> Options:
    """Command line → Options; a given path must exist."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    defaults = Plan()
    work = parser.add_argument_group("workload")
    work.add_argument("--shapes", type=int, default=defaults.shapes, help="distinct statements")
    work.add_argument("--tables", type=int, default=defaults.tables, help="tables they read")
    work.add_argument("--rows", type=int, default=defaults.rows, help="rows a table")
    work.add_argument("--hot", type=int, default=defaults.hot, help="shapes in the hot set")
    work.add_argument("--hot-share", type=float, default=defaults.hot_share, metavar="FRACTION",
                      help="of the calls that go to the hot set")  # fmt: skip
    work.add_argument("--move", type=float, default=defaults.move, metavar="SECONDS",
                      help="the hot set moves on every so often")  # fmt: skip
    work.add_argument("--rate", type=float, default=defaults.rate, help="calls a second")
    work.add_argument("--heavy-at", type=float, metavar="SECONDS",
                      help="when the heavy hitter begins (default: 2/3 of the window)")  # fmt: skip
    work.add_argument("--heavy-share", type=float, default=defaults.heavy_share,
                      metavar="FRACTION", help="of the execution time it holds")  # fmt: skip
    parser.add_argument("--minutes", type=float, default=6.0, help="the window")
    parser.add_argument("--interval", type=float, default=5.0, metavar="SECONDS",
                        help="between scrapes")  # fmt: skip
    parser.add_argument("--go-binary", type=Path, metavar="PATH", help="a Go pg_exporter binary")
    parser.add_argument("--go-config", type=Path, metavar="PATH",
                        help="its config (pg_exporter.yml beside it or in src/)")  # fmt: skip
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures")
    parser.add_argument("--ready-timeout", type=float, default=180.0, metavar="SECONDS")
    return _options(parser, parser.parse_args(argv))


def _options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Options:
    go_config = args.go_config or _beside(args.go_binary)
    for flag, path in (("--go-binary", args.go_binary), ("--go-config", go_config)):
        if path is not None and not path.is_file():
            parser.error(f"{flag} {path}: no such file")
    if args.go_binary is not None and go_config is None:
        parser.error("--go-binary needs --go-config: no pg_exporter.yml beside it or in its src/")
    if not 0 < args.hot <= args.shapes or not 0 < args.hot_share <= 1:
        parser.error("--hot must be 1 to --shapes, --hot-share above 0 and at most 1")
    if not 0 < args.heavy_share < 1 or args.minutes <= 0 or args.interval <= 0:
        parser.error("--heavy-share must be between 0 and 1, --minutes and --interval above 0")
    window = args.minutes * 60
    heavy_at = window * 2 / 3 if args.heavy_at is None else args.heavy_at
    plan = Plan(shapes=args.shapes, tables=max(1, args.tables), rows=max(1, args.rows),
                hot=args.hot, hot_share=args.hot_share, move=max(1.0, args.move),
                rate=max(1.0, args.rate), heavy_at=heavy_at,
                heavy_share=args.heavy_share)  # fmt: skip
    return Options(plan, args.minutes, args.interval, args.go_binary, go_config, args.json,
                   args.ready_timeout)  # fmt: skip


# -- pure: what a scrape served, and what the scrapes add up to ------------------------


def labels_of(text: str) -> Labels:
    """The label pairs of a sample, in name order."""
    return tuple(sorted(LABEL.findall(text)))


def parse_served(body: bytes, at: float) -> Served:
    """The ``pg_query_*`` samples of an exposition, and pg_query's executions so far."""
    text = body.decode("utf-8", errors="replace")
    calls: dict[Labels, float] = {}
    exec_seconds: dict[Labels, float] = {}
    series: set[tuple[str, Labels]] = set()
    for name, inside, value in SAMPLE.findall(text):
        labels = labels_of(inside)
        series.add((name, labels))
        if name == "pg_query_calls":
            calls[labels] = float(value)
        elif name == "pg_query_exec_time":
            exec_seconds[labels] = float(value)
    runs = sum(n for key, n in runs_of(body).items() if _is_pg_query(key.split("/", 1)[1]))
    return Served(at, calls, exec_seconds, frozenset(series), runs)


def _is_pg_query(collector: str) -> bool:
    """pg_query, or one of its branches as the Go config names them (pg_query_17)."""
    return collector == "pg_query" or collector.startswith("pg_query_")


def increases(samples: Sequence[Mapping[Labels, float]]) -> dict[Labels, float]:
    """Per series, the sum of its increases between consecutive samples that both hold
    it; a value below the one before is a reset, and counts from zero."""
    total: dict[Labels, float] = {}
    for before, after in itertools.pairwise(samples):
        for labels, value in after.items():
            last = before.get(labels)
            if last is None:
                continue
            total[labels] = total.get(labels, 0.0) + (value - last if value >= last else value)
    return total


def is_remainder(labels: Labels) -> bool:
    """The series of the statements not named: ``query="other"``."""
    return dict(labels).get("query") == REMAINDER


def split(totals: Mapping[Labels, float]) -> tuple[float, float]:
    """(named, remainder) sums of per-series totals."""
    named = sum(v for labels, v in totals.items() if not is_remainder(labels))
    return named, sum(totals.values()) - named


def first_named(served: Sequence[Served], queryid: str | None, since: float | None) -> float | None:
    """Seconds from ``since`` to the first scrape at or after it that names ``queryid``
    in a ``query`` label; None when none does."""
    if queryid is None or since is None:
        return None
    for seen in served:
        if seen.at >= since and any(dict(labels).get("query") == queryid for labels in seen.calls):
            return seen.at - since
    return None


def per_scrape(counts: Sequence[int]) -> tuple[float, int]:
    """(median, max) of series counts; (0, 0) without scrapes."""
    return (statistics.median(counts), max(counts)) if counts else (0.0, 0)


def figures_of(
    key: str, served: Sequence[Served], failed: int, heavy: Heavy, started: float
) -> Figures:
    """One exporter's series and accounting over its scrapes of the window."""
    named_calls, other_calls = split(increases([s.calls for s in served]))
    named_s, other_s = split(increases([s.exec_seconds for s in served]))
    heavy_at = None if heavy.started is None else started + heavy.started
    return Figures(
        key, len(served), failed,
        per_scrape([len(s.calls) for s in served]), per_scrape([len(s.series) for s in served]),
        len({labels for s in served for labels in s.calls}),
        len({one for s in served for one in s.series}),
        named_calls, other_calls, named_s * 1000, other_s * 1000,
        first_named(served, heavy.queryid, heavy_at),
    )  # fmt: skip


# -- I/O: the cluster, the exporters, the scrapes ---------------------------------------


def populate(cluster: LocalCluster, plan: Plan) -> None:
    """Roles, the application's database and tables, every shape run once."""
    cluster.psql(
        f"CREATE ROLE {library.ROLE} LOGIN IN ROLE pg_monitor; CREATE ROLE {APP} LOGIN;"
        f" CREATE EXTENSION IF NOT EXISTS pg_stat_statements;"
        f" CREATE DATABASE {DATABASE} OWNER {APP}"
    )
    app = cluster.dsn(DATABASE, user=APP)
    with psycopg.connect(app, autocommit=True) as conn:
        conn.execute(setup_sql(plan).encode())
    cluster.psql("SELECT pg_stat_statements_reset()")  # the DDL is not the workload
    run_every_shape(app, plan)


def truth(cluster: LocalCluster) -> Truth:
    """Every statement's calls and execution time (ms), every database and role, and
    those of the application role."""
    app = f"FILTER (WHERE userid = '{APP}'::regrole)"
    row = cluster.psql(
        "SELECT coalesce(sum(calls), 0), coalesce(sum(total_exec_time), 0),"
        f" coalesce(sum(calls) {app}, 0), coalesce(sum(total_exec_time) {app}, 0)"
        " FROM pg_stat_statements(false)"
    ).split("|")
    return Truth(*map(float, row))


class Scraper:
    """Scrapes every exporter at the same moment, and keeps what each served."""

    def __init__(self, ports: Mapping[str, int]) -> None:
        self.ports = dict(ports)
        self.served: dict[str, list[Served]] = {key: [] for key in ports}
        self.failed = dict.fromkeys(ports, 0)
        self._pool = ThreadPoolExecutor(max_workers=len(ports))

    def close(self) -> None:
        """Let the scraping threads go."""
        self._pool.shutdown(wait=True)

    def tick(self) -> None:
        """One scrape of each exporter, all sent at once."""
        futures = {key: self._pool.submit(_one, port) for key, port in self.ports.items()}
        for key, future in futures.items():
            seen = future.result()
            if seen is None:
                self.failed[key] += 1
            else:
                self.served[key].append(seen)

    def runs(self, key: str) -> float:
        """pg_query's executions by the exporter's last answer."""
        return self.served[key][-1].runs if self.served[key] else 0.0

    def forget(self) -> None:
        """Start the window: drop what was served before."""
        self.served = {key: [] for key in self.ports}
        self.failed = dict.fromkeys(self.ports, 0)


def _one(port: int) -> Served | None:
    at = time.monotonic()
    try:
        answer = scrape(port, "/metrics", gzip_ok=True, timeout=60)
    except OSError:
        return None
    return parse_served(answer.body, at) if answer.status == 200 else None


def every(interval: float, scraper: Scraper, done: Callable[[], bool], deadline: float) -> bool:
    """Scrape every ``interval`` seconds until ``done()`` (True) or the deadline (False)."""
    planned = time.monotonic()
    while True:
        scraper.tick()
        if done():
            return True
        planned += interval
        if planned > deadline:
            return False
        time.sleep(max(0.0, planned - time.monotonic()))  # the scrape interval: pacing


def launches(options: Options, url: str) -> list[Launch]:
    """Ours with its defaults; the Go binary with its config when given."""
    lib = library.Options(scrapes=1, warmup=0, rounds=1, flavours=("cached",),
                          go_config=options.go_config, go_binary=options.go_binary,
                          json_path=None, ready_timeout=options.ready_timeout)  # fmt: skip
    keys = [OURS] + ([GO] if options.go_binary is not None else [])
    return [library.launch(key, "cached", url, lib) for key in keys]


def run(options: Options, workdir: Path) -> Report:
    """Cluster, exporters, warm-up, T0, the window, catch-up, T1."""
    plan, load = options.plan, Path("/proc/loadavg").read_text().split()[:3]
    with LocalCluster(pg18_bindir(), settings=library.SERVER_SETTINGS) as cluster:
        _progress(f"PostgreSQL {cluster.version}: {plan.tables} tables, {plan.shapes} shapes")
        populate(cluster, plan)
        specs = launches(options, cluster.dsn("postgres", user=library.ROLE))
        with contextlib.ExitStack() as stack:
            for spec in specs:
                proc = stack.enter_context(running(spec, workdir / f"{spec.key}.log"))
                deadline = time.monotonic() + options.ready_timeout
                library.wait_ready(spec, _alive(proc), deadline)
            scraper = Scraper({spec.key: spec.port for spec in specs})
            stack.callback(scraper.close)
            return _window(cluster, options, scraper, load)


def _alive(proc: subprocess.Popen[bytes]) -> Callable[[], bool]:
    return lambda: proc.poll() is None


def _window(cluster: LocalCluster, options: Options, scraper: Scraper, load: list[str]) -> Report:
    keys, interval = list(scraper.ports), options.interval
    warm = every(interval, scraper, lambda: all(scraper.runs(k) >= 2 for k in keys),
                 time.monotonic() + options.ready_timeout)  # fmt: skip
    if not warm:
        raise ExporterFailed("pg_query did not run twice in each exporter before the deadline")
    scraper.forget()
    t0, began = truth(cluster), time.monotonic()
    workload = Workload(options.plan, cluster.dsn(DATABASE, user=APP), cluster.dsn())
    workload.start()
    _progress(f"window open: {options.minutes} min, truth {t0}")
    every(interval, scraper, lambda: False, workload.started + options.minutes * 60)
    workload.stop()
    _progress(f"workload stopped after {workload.calls} calls; waiting for pg_query to run twice")
    after = {key: scraper.runs(key) + 2 for key in keys}
    caught = every(interval, scraper, lambda: all(scraper.runs(k) >= after[k] for k in keys),
                   time.monotonic() + 6 * (TTL + interval))  # fmt: skip
    scraper.tick()  # one answer more: what the last run read, whoever serves it when
    t1, seconds = truth(cluster), time.monotonic() - began
    heavy = _heavy(cluster, workload, t0, t1)
    figures = [replace(figures_of(key, scraper.served[key], scraper.failed[key], heavy,
                                  workload.started), caught_up=caught) for key in keys]  # fmt: skip
    return Report(_options_record(options), load, _commit(), seconds,
                  t1 - t0, heavy, workload.calls,
                  figures)  # fmt: skip


def _heavy(cluster: LocalCluster, workload: Workload, t0: Truth, t1: Truth) -> Heavy:
    queryid = workload.heavy_queryid
    if queryid is None or workload.heavy_started is None:
        return Heavy(None, None)
    calls, ms = cluster.psql(
        "SELECT coalesce(sum(calls), 0), coalesce(sum(total_exec_time), 0)"
        f" FROM pg_stat_statements(false) WHERE queryid::text = '{queryid}'"
    ).split("|")
    total_end, heavy_end = workload.heavy_end
    active = total_end - workload.heavy_base_ms
    window = t1.exec_ms - t0.exec_ms
    return Heavy(queryid, workload.heavy_started - workload.started, float(calls), float(ms),
                 heavy_end / active if active else 0.0,
                 float(ms) / window if window else 0.0)  # fmt: skip


def _options_record(options: Options) -> dict[str, object]:
    record = asdict(options)
    return {key: str(value) if isinstance(value, Path) else value for key, value in record.items()}


def _commit() -> str:
    done = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    return done.stdout.strip() or "unknown"


# -- the report --------------------------------------------------------------------------

COLUMNS = (
    "exporter", "scrapes (failed)", "pg_query_calls per scrape, median / max",
    "pg_query_* per scrape, median / max", "distinct pg_query_calls", "distinct pg_query_*",
    "distinct / per scrape (calls; all)", "calls accounted: named / + other",
    "exec time accounted: named / + other", "heavy hitter named after",
)  # fmt: skip


def render(report: Report) -> str:
    """The Markdown table, one row per exporter, and the truth it is measured against."""
    t, h = report.truth, report.heavy
    out = [
        f"Window {report.seconds:.0f} s (T0 → T1), commit {report.commit}, load average at"
        f" start {' '.join(report.load)}. Truth: {t.calls:,.0f} calls,"
        f" {t.exec_ms / 1000:,.1f} s of execution, the application's"
        f" {_part(t.app_calls, t.calls)} and {_part(t.app_exec_ms, t.exec_ms)} of them (it sent"
        f" {report.workload_calls:,} calls). {_heavy_line(h)}",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|---|" + "---|" * (len(COLUMNS) - 1),
    ]
    out += [_row(f, t) for f in report.figures]
    return "\n".join(out)


def _part(part: float, whole: float) -> str:
    return f"{part / whole:.1%}" if whole else "n/a"


def _heavy_line(h: Heavy) -> str:
    if h.started is None:
        return "The heavy hitter never ran."
    return (f"Heavy hitter (query ID {h.queryid}) from {h.started:.0f} s: {h.calls:,.0f} calls,"
            f" {h.exec_ms / 1000:,.1f} s, {h.share_active:.1%} of the execution time while it"
            f" ran, {h.share_window:.1%} of the window's.")  # fmt: skip


def _row(f: Figures, t: Truth) -> str:
    pairs = ((f.distinct_calls, f.calls_per_scrape[0]), (f.distinct_all, f.all_per_scrape[0]))
    ratios = "; ".join(f"{d / c:.2f}×" if c else "n/a" for d, c in pairs)
    heavy = "never" if f.heavy_named_after is None else f"{f.heavy_named_after:.0f} s"
    cells = [
        TITLES.get(f.exporter, f.exporter) + ("" if f.caught_up else " (not caught up)"),
        f"{f.scrapes} ({f.failed})",
        f"{_fmt(f.calls_per_scrape[0])} / {f.calls_per_scrape[1]}",
        f"{_fmt(f.all_per_scrape[0])} / {f.all_per_scrape[1]}",
        f"{f.distinct_calls}",
        f"{f.distinct_all}",
        ratios,
        _shares(f.named_calls, f.other_calls, t.calls),
        _shares(f.named_exec_ms, f.other_exec_ms, t.exec_ms),
        heavy,
    ]
    return "| " + " | ".join(cells) + " |"


def _shares(named: float, other: float, whole: float) -> str:
    if not whole:
        return "n/a"
    return f"{named / whole:.1%} / {(named + other) / whole:.1%}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run, print the Markdown; exit 0 whatever the figures."""
    options = parse_args(argv)
    _progress(f"load average at start: {Path('/proc/loadavg').read_text().strip()}")
    with _logs() as workdir:
        report = run(options, workdir)
    _progress(f"load average at end: {Path('/proc/loadavg').read_text().strip()}")
    print(render(report))
    if options.json_path is not None:
        options.json_path.write_text(json.dumps(asdict(report), indent=1))
    return 0


@contextlib.contextmanager
def _logs() -> Iterator[Path]:
    """A directory for the exporters' logs, kept after the run and named on stderr."""
    path = Path(tempfile.mkdtemp(prefix="pgx-bench-churn-"))
    _progress(f"exporter logs: {path}")
    yield path


if __name__ == "__main__":
    sys.exit(main())
