"""Server time per second against a budget, over a window (issue 31, item 2), for
``bench.bigdb --server.time-budget``.

On the big database, our exporter with its default TTLs is scraped every
``--budget-interval`` seconds for ``--budget-minutes``, twice: without a budget, then
with ``--server.time-budget`` passed through to it (``half``: half of what the first
phase measured, the issue's target). Every second a separate session reads the monitor
role's ``sum(total_exec_time)`` in ``pg_stat_statements``; per phase: the mean server
time per second over the whole window, the largest over one second and over any
``--budget-window`` seconds, the seconds above the budget, and from our self-metrics
(executions = ``scrape_total_count`` − ``scrape_hit_count`` per collector and
database) the longest any collector went without a refresh, beside its TTL. The
resolution of a gap is the scrape interval.

The exporter's flag comes from another change (issue 31, item 2): until it is there,
the budgeted phase ends with "pending" and the unbudgeted one still reports.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg

from bench import bigdb_build, library
from bench.exporters import ExporterFailed, running
from bench.measure import memory, percentile, process_cpu_seconds, scrape
from exporter.config.loading import load_definitions
from rigs.localpg import LocalCluster

if TYPE_CHECKING:
    from bench.bigdb import Options

FLAG = "--server.time-budget"  # the exporter's, passed through as given
HALF = "half"
_RUNS = re.compile(
    r'^pg_exporter_query_scrape_(total|hit)_count\{datname="([^"]*)",query="([^"]*)"\} (\S+)$',
    re.MULTILINE,
)


@dataclass(frozen=True, slots=True)
class Plan:
    """The budget mode's command line."""

    budget_ms: float | None  # ms of server time per second; None: half the unbudgeted rate
    minutes: float
    interval: float
    window: float


@dataclass(frozen=True, slots=True)
class Sample:
    """The role's cumulative execution time at one instant."""

    at: float  # monotonic seconds
    exec_ms: float


@dataclass(frozen=True, slots=True)
class Gap:
    """The longest a collector went unrefreshed in a phase."""

    collector: str  # database/collector
    seconds: float
    ttl: float

    @property
    def over_ttl(self) -> float:
        """The gap in TTLs (a collector without one counts as TTL 1 s)."""
        return self.seconds / (self.ttl or 1.0)


@dataclass(frozen=True, slots=True)
class Phase:
    """One window of scrapes."""

    name: str
    budget_ms: float | None = None
    seconds: float = 0.0
    mean_ms_per_s: float = 0.0
    max_second_ms: float = 0.0
    max_window_ms_per_s: float = 0.0
    seconds_over_budget: int = 0
    scrapes: int = 0
    failed_scrapes: int = 0
    scrape_p50_ms: float = 0.0
    scrape_max_ms: float = 0.0
    cpu_percent: float = 0.0
    rss_mib: float = 0.0
    gaps: list[Gap] = field(default_factory=list)  # the most TTLs first
    error: str = ""


@dataclass(frozen=True, slots=True)
class Scraped:
    """What the scrapes of one phase saw."""

    walls: list[float]  # seconds
    observed: list[tuple[float, dict[str, float]]]  # (monotonic time, runs per collector)
    failed: int


@dataclass(frozen=True, slots=True)
class Setting:
    """What both phases on one server share."""

    cluster: LocalCluster
    plan: Plan
    options: Options
    workdir: Path
    ttls: dict[str, float]


@dataclass(frozen=True, slots=True)
class Report:
    """Both phases on each server."""

    plan: Plan
    servers: list[tuple[int, str, list[Phase]]]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The budget mode's flags."""
    group = parser.add_argument_group("budget mode (instead of the trials)")
    group.add_argument(FLAG, metavar="MS|half",
                       help="ms of server time per second, passed to our exporter; 'half':"
                            " half of what the unbudgeted phase measured")  # fmt: skip
    group.add_argument("--budget-minutes", type=float, default=5.0, metavar="MIN",
                       help="length of each phase (5)")  # fmt: skip
    group.add_argument("--budget-interval", type=float, default=1.0, metavar="SECONDS",
                       help="time between scrapes (1)")  # fmt: skip
    group.add_argument("--budget-window", type=float, default=60.0, metavar="SECONDS",
                       help="the sliding window whose largest mean is reported (60)")  # fmt: skip


def plan_of(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Plan | None:
    """The Plan, or None when no budget was asked for."""
    given = getattr(args, FLAG.lstrip("-").replace("-", "_"))
    if given is None:
        return None
    try:
        budget = None if given == HALF else float(given)
    except ValueError:
        parser.error(f"{FLAG} {given!r}: a number of ms per second, or {HALF!r}")
    if budget is not None and budget <= 0:
        parser.error(f"{FLAG} must be above 0")
    if args.budget_minutes <= 0 or args.budget_interval <= 0 or args.budget_window <= 0:
        parser.error("--budget-minutes, --budget-interval and --budget-window must be above 0")
    return Plan(budget, args.budget_minutes, args.budget_interval, args.budget_window)


def per_second(samples: Sequence[Sample]) -> list[float]:
    """Server ms per second between consecutive samples."""
    return [(b.exec_ms - a.exec_ms) / (b.at - a.at)
            for a, b in itertools.pairwise(samples) if b.at > a.at]  # fmt: skip


def window_rates(samples: Sequence[Sample], seconds: float) -> list[float]:
    """Server ms per second over each span from one sample to the first ``seconds`` later."""
    rates, j = [], 0
    for i, first in enumerate(samples):
        j = max(j, i + 1)
        while j < len(samples) and samples[j].at - first.at < seconds:
            j += 1
        if j == len(samples):
            break
        last = samples[j]
        rates.append((last.exec_ms - first.exec_ms) / (last.at - first.at))
    return rates


def runs_of(body: bytes) -> dict[str, float]:
    """Executions per ``database/collector`` in our self-metrics: total minus cache hits."""
    runs: dict[str, float] = {}
    for kind, datname, query, value in _RUNS.findall(body.decode("utf-8", errors="replace")):
        key = f"{datname}/{query}"
        runs[key] = runs.get(key, 0.0) + (float(value) if kind == "total" else -float(value))
    return runs


def longest_gaps(observed: Sequence[tuple[float, dict[str, float]]]) -> dict[str, float]:
    """Per collector, the longest time between two observed refreshes (its executions grew),
    counting from the first observation and up to the last one."""
    if not observed:
        return {}
    start, end = observed[0][0], observed[-1][0]
    last_seen: dict[str, tuple[float, float]] = {}  # key → (time of last refresh, runs)
    longest: dict[str, float] = {}
    for at, runs in observed:
        for key, count in runs.items():
            since, before = last_seen.get(key, (start, count))
            if count > before:
                longest[key] = max(longest.get(key, 0.0), at - since)
                since = at
            last_seen[key] = (since, count)
    return {key: max(longest.get(key, 0.0), end - since) for key, (since, _) in last_seen.items()}


def run(plan: Plan, options: Options, workdir: Path, progress: Callable[[str], None]) -> Report:
    """Both phases on each version, on the first settings variant."""
    servers = []
    ttls = _ttls(options.library.collectors)
    variant = options.variants[0]
    for version in options.versions:
        with bigdb_build.server(version, options.sizes, variant, options.cache, progress,
                                rebuild=options.rebuild) as cluster:  # fmt: skip
            setting = Setting(cluster, plan, options, workdir, ttls)
            free = _phase(setting, "no budget", None)
            progress(f"PostgreSQL {version}: {_brief(free)}")
            budget = plan.budget_ms if plan.budget_ms is not None else free.mean_ms_per_s / 2
            held = _phase(setting, f"budget {budget:.1f} ms/s", budget)
            progress(f"PostgreSQL {version}: {_brief(held)}")
            servers.append((version, variant, [free, held]))
    return Report(plan, servers)


def _brief(phase: Phase) -> str:
    if phase.error:
        return f"{phase.name}: {phase.error}"
    return (f"{phase.name}: {phase.mean_ms_per_s:.1f} ms/s on average, at most"
            f" {phase.max_second_ms:.1f} in a second, {phase.scrapes} scrapes"
            f" ({phase.failed_scrapes} failed)")  # fmt: skip


def _ttls(collectors: Path) -> dict[str, float]:
    """Collector name → its TTL (the shortest of its branches')."""
    ttls: dict[str, float] = {}
    for c in load_definitions(str(collectors)).collectors:
        ttls[c.name] = min(ttls.get(c.name, c.ttl), c.ttl)
    return ttls


def _phase(setting: Setting, name: str, budget: float | None) -> Phase:
    """Run our exporter with default TTLs (and the budget, if any) for one window."""
    cluster, options = setting.cluster, setting.options
    spec = library.launch(library.OURS, "cached", cluster.dsn(user=bigdb_build.MONITOR),
                          options.library)  # fmt: skip
    # Without a budget is with none at all (0), not with the exporter's default.
    spec = replace(spec, argv=(*spec.argv, FLAG, f"{budget:g}" if budget is not None else "0"))
    tag = "budget" if budget is not None else "free"
    log = setting.workdir / f"budget-pg{cluster.version // 10000}-{tag}.log"
    with running(spec, log) as proc:
        try:
            library.wait_ready(spec, lambda: proc.poll() is None,
                               time.monotonic() + options.library.ready_timeout)  # fmt: skip
        except ExporterFailed as exc:
            said = log.read_text(errors="replace")
            if f"unknown flag {FLAG}" in said or f"unrecognized arguments: {FLAG}" in said:
                return Phase(name, budget, error=f"pending: the exporter has no {FLAG} yet")
            return Phase(name, budget, error=str(exc))
        cluster.psql(f"SELECT pg_stat_statements_reset('{bigdb_build.MONITOR}'::regrole)")
        cpu0 = process_cpu_seconds(proc.pid)
        with _sampling(cluster) as samples:
            scraped = _scrape_for(spec.port, setting.plan)
        cpu = process_cpu_seconds(proc.pid) - cpu0
        rss = memory(proc.pid).rss_kib / 1024
    gaps = sorted(
        (Gap(key, gap, setting.ttls.get(key.split("/", 1)[1], 0.0))
         for key, gap in longest_gaps(scraped.observed).items()),
        key=lambda g: -g.over_ttl,
    )  # fmt: skip
    return replace(_summary(name, budget, setting.plan.window, samples, scraped),
                   cpu_percent=100 * cpu / (setting.plan.minutes * 60), rss_mib=rss,
                   gaps=gaps)  # fmt: skip


def _scrape_for(port: int, plan: Plan) -> Scraped:
    """Scrape every ``interval`` for ``minutes``: wall times, runs per collector, failures."""
    walls: list[float] = []
    observed: list[tuple[float, dict[str, float]]] = []
    failed = 0
    pace = threading.Event()  # never set: its wait() paces the scrapes
    start = time.monotonic()
    deadline = start + plan.minutes * 60
    due = start
    while due < deadline:
        pace.wait(max(0.0, due - time.monotonic()))
        answer = scrape(port, "/metrics", gzip_ok=True, timeout=60)
        walls.append(answer.seconds)
        if answer.status == 200:
            observed.append((time.monotonic(), runs_of(answer.body)))
        else:
            failed += 1
        due = max(due + plan.interval, time.monotonic())  # a slow scrape is not caught up
    return Scraped(walls, observed, failed)


class _Sampler(threading.Thread):
    """Reads the monitor role's cumulative execution time once a second."""

    def __init__(self, cluster: LocalCluster) -> None:
        super().__init__(name="server-time-sampler", daemon=True)
        self.samples: list[Sample] = []
        self.stopped = threading.Event()
        self._dsn = cluster.dsn()

    def run(self) -> None:
        sql = (b"SELECT coalesce(sum(total_exec_time), 0) FROM pg_stat_statements(false)"
               b" WHERE userid = %s::regrole")  # fmt: skip
        with psycopg.connect(self._dsn, autocommit=True) as conn:
            while not self.stopped.is_set():
                row = conn.execute(sql, [bigdb_build.MONITOR]).fetchone()
                self.samples.append(Sample(time.monotonic(), float(row[0]) if row else 0.0))
                self.stopped.wait(1.0)


@contextlib.contextmanager
def _sampling(cluster: LocalCluster) -> Iterator[list[Sample]]:
    """Samples of the role's execution time, once a second, while the block runs."""
    sampler = _Sampler(cluster)
    sampler.start()
    try:
        yield sampler.samples
    finally:
        sampler.stopped.set()
        sampler.join(timeout=30)


def _summary(
    name: str, budget: float | None, window: float, samples: list[Sample], scraped: Scraped
) -> Phase:
    """The server time and scrape figures of one phase (CPU, RSS and gaps added after)."""
    walls, failed = scraped.walls, scraped.failed
    seconds = samples[-1].at - samples[0].at if len(samples) > 1 else 0.0
    rates = per_second(samples)
    return Phase(
        name, budget, seconds=seconds,
        mean_ms_per_s=(samples[-1].exec_ms - samples[0].exec_ms) / seconds if seconds else 0.0,
        max_second_ms=max(rates, default=0.0),
        max_window_ms_per_s=max(window_rates(samples, window), default=0.0),
        seconds_over_budget=sum(1 for r in rates if budget is not None and r > budget),
        scrapes=len(walls), failed_scrapes=failed,
        scrape_p50_ms=percentile(walls, 0.5) * 1000 if walls else 0.0,
        scrape_max_ms=max(walls, default=0.0) * 1000,
    )  # fmt: skip


def render(report: Report) -> str:
    """Markdown: a row per phase and server, then the collectors that waited longest."""
    plan = report.plan
    out = [
        f"\n### Server time per second, {plan.minutes:g} minutes a phase, a scrape every"
        f" {plan.interval:g} s\n",
        f"| server | phase | mean ms/s | max over 1 s | max over {plan.window:g} s"
        " | seconds over budget | scrapes (failed) | scrape p50 / max ms | exporter CPU %"
        " | RSS MiB | longest unrefreshed |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for version, variant, phases in report.servers:
        for p in phases:
            where = f"PostgreSQL {version} {variant}"
            if p.error:
                out.append(f"| {where} | {p.name} | {p.error} |" + " |" * 8)
                continue
            top = p.gaps[0] if p.gaps else None
            longest = f"{top.collector} {top.seconds:.1f} s (TTL {top.ttl:g} s)" if top else ""
            out.append(
                f"| {where} | {p.name} | {p.mean_ms_per_s:.1f} | {p.max_second_ms:.1f}"
                f" | {p.max_window_ms_per_s:.1f} | {p.seconds_over_budget if p.budget_ms else ''}"
                f" | {p.scrapes} ({p.failed_scrapes})"
                f" | {p.scrape_p50_ms:.0f} / {p.scrape_max_ms:.0f}"
                f" | {p.cpu_percent:.1f} | {p.rss_mib:.1f} | {longest} |"
            )
    for version, _, phases in report.servers:
        for p in phases:
            if p.gaps:
                worst = ", ".join(f"{g.collector} {g.seconds:.1f} s (TTL {g.ttl:g})"
                                  for g in p.gaps[:6])  # fmt: skip
                out.append(f"\nPostgreSQL {version}, {p.name}, most TTLs unrefreshed: {worst}")
    return "\n".join(out)
