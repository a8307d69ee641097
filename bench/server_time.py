"""What the default library costs the server per second at real scrape intervals (issue 31).

Run from the repository root::

    .venv/bin/python -m bench.server_time                    # 15, 30 and 60 s, 10 scrapes each
    .venv/bin/python -m bench.server_time --intervals 15 --scrapes 20 [--budget MS] \
        [--databases N] [--json PATH]

One throw-away PostgreSQL 18 primary holds the workload of ``bench.library`` (an extra
database of 30 indexed tables, ``pg_stat_statements``). For each scrape interval and
flavour (``--disable-cache``, or the default TTLs) one exporter of ours runs with its
default settings and the library (``collectors/``), logged in as a ``pg_monitor`` role of
its own, and is scraped every interval, the way Prometheus would. The trials run side by
side, each with its own role, so that the whole bench takes the longest trial's time.
``--databases N`` adds N empty databases, which auto-discovery scrapes too.

Per trial, over the measured scrapes, after ``--warmup`` on schedule (the caches and the
interval between passes settle) and one to count from:

- ``client``: the exporter's own measure, ``pg_exporter_server_time_seconds_total``: what
  the server-time budget counts (each statement as long as the client waited for it);
- ``server``: ``pg_stat_statements.total_exec_time`` of the trial's role: the server's
  execution alone, without the protocol, parsing, planning or the network;
- ``demand``: the largest ``pg_exporter_server_time_demand_ratio`` seen, what the budget
  predicts the collectors take unstretched; ``stretched``: the largest
  ``pg_exporter_server_time_stretched_collectors`` seen (0 means the budget never acted).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.cluster import REPO
from bench.exporters import ExporterFailed, Launch, ours_python, running
from bench.library import SERVER_SETTINGS, populate, wait_ready
from bench.measure import scrape
from rigs.localpg import LocalCluster, free_port, pg18_bindir

FLAVOURS = ("uncached", "cached")
_SAMPLE = re.compile(
    rb"^pg_exporter_server_time_(seconds_total|demand_ratio|stretched_collectors) (\S+)$",
    re.MULTILINE,
)


@dataclass(frozen=True, slots=True)
class Trial:
    """One exporter scraped every ``interval`` seconds."""

    interval: float
    flavour: str
    scrapes: int
    client_ms_per_s: float
    server_ms_per_s: float
    client_ms_per_pass: float
    demand_ms_per_s: float
    stretched: int
    error: str = ""


def _figures(body: bytes) -> dict[str, float]:
    return {m.group(1).decode(): float(m.group(2)) for m in _SAMPLE.finditer(body)}


def _exec_ms(cluster: LocalCluster, role: str) -> float:
    row = cluster.psql(
        "SELECT coalesce(sum(total_exec_time), 0) FROM pg_stat_statements"
        f" WHERE userid = '{role}'::regrole"
    )
    return float(row)


@dataclass(frozen=True, slots=True)
class Setup:
    """What every trial shares."""

    cluster: LocalCluster
    args: argparse.Namespace
    workdir: Path  # exporter logs


def _launch(setup: Setup, role: str, interval: float, flavour: str) -> Launch:
    port = free_port()
    argv: tuple[str, ...] = (
        ours_python(), "-m", "exporter", "--url", setup.cluster.dsn("postgres", user=role),
        "--config", str(REPO / "collectors"), "--web.listen-address", f"127.0.0.1:{port}",
        "--log.level", "warn",
    )  # fmt: skip
    if flavour == "uncached":
        argv += ("--disable-cache",)
    if setup.args.budget is not None:
        argv += (f"--server.time-budget={setup.args.budget:g}",)
    return Launch(f"{flavour}-{interval:g}", argv, port)


def _on_schedule(port: int, interval: float, count: int) -> list[dict[str, float]]:
    """``count`` scrapes ``interval`` apart, the first one interval from now (back to back
    when a pass takes longer): the figures of each."""
    started, figures = time.monotonic(), []
    for n in range(1, count + 1):
        time.sleep(max(0.0, started + n * interval - time.monotonic()))  # the schedule
        answer = scrape(port, "/metrics", gzip_ok=True, timeout=60)
        if answer.status != 200:
            raise ExporterFailed(f"HTTP {answer.status}")
        figures.append(_figures(answer.body))
    return figures


def trial(setup: Setup, interval: float, flavour: str, index: int) -> Trial:
    """Start one exporter; scrape it on schedule: ``--warmup`` scrapes (the interval
    between passes settles), then one to start from, then ``--scrapes`` measured."""
    cluster, args = setup.cluster, setup.args
    role = f"bench_st_{index}"
    cluster.psql(f"CREATE ROLE {role} LOGIN IN ROLE pg_monitor")
    spec = _launch(setup, role, interval, flavour)
    with running(spec, setup.workdir / f"{spec.key}.log") as proc:
        wait_ready(spec, lambda: proc.poll() is None, time.monotonic() + 120)
        first = _on_schedule(spec.port, interval, args.warmup + 1)[-1]
        cluster.psql(f"SELECT pg_stat_statements_reset('{role}'::regrole)")
        started = time.monotonic()
        measured = _on_schedule(spec.port, interval, args.scrapes)
        elapsed = time.monotonic() - started  # longer than planned when passes are
    client = (measured[-1]["seconds_total"] - first["seconds_total"]) * 1000
    demand = max(f["demand_ratio"] for f in measured) * 1000
    stretched = max(f["stretched_collectors"] for f in [first, *measured])
    return Trial(interval, flavour, args.scrapes, client / elapsed,
                 _exec_ms(cluster, role) / elapsed, client / args.scrapes, demand,
                 int(stretched))  # fmt: skip


def run(args: argparse.Namespace) -> list[Trial]:
    """Every trial side by side on one cluster."""
    plans = [(interval, flavour) for interval in args.intervals for flavour in args.flavours]
    results: list[Trial | None] = [None] * len(plans)
    with LocalCluster(pg18_bindir(), settings=SERVER_SETTINGS) as cluster, \
            tempfile.TemporaryDirectory(prefix="pgx-bench-st-") as tmp:  # fmt: skip
        populate(cluster)
        for n in range(args.databases):  # more databases for auto-discovery to scrape
            cluster.psql(f"CREATE DATABASE bench_extra_{n}")
        setup = Setup(cluster, args, Path(tmp))

        def one(index: int) -> None:
            interval, flavour = plans[index]
            try:
                results[index] = trial(setup, interval, flavour, index)
            except (ExporterFailed, OSError, KeyError) as exc:
                results[index] = Trial(interval, flavour, 0, 0, 0, 0, 0, 0, error=str(exc))
            print(f"done: {results[index]}", file=sys.stderr, flush=True)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(plans))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return [r for r in results if r is not None]


def render(trials: Sequence[Trial], args: argparse.Namespace) -> str:
    """A Markdown table, one row a trial."""
    chosen = "the default" if args.budget is None else f"{args.budget:g} ms/s"
    out = [
        f"\nserver-time budget: {chosen}; {args.databases + 2} databases scraped\n",
        "| interval | flavour | scrapes | client ms/s | server ms/s | client ms a pass "
        "| demand ms/s (max) | stretched (max) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in trials:
        if t.error:
            out.append(f"| {t.interval:g} s | {t.flavour} | failed: {t.error} | | | | | |")
            continue
        out.append(f"| {t.interval:g} s | {t.flavour} | {t.scrapes} | {t.client_ms_per_s:.2f} "
                   f"| {t.server_ms_per_s:.2f} | {t.client_ms_per_pass:.1f} "
                   f"| {t.demand_ms_per_s:.2f} | {t.stretched} |")  # fmt: skip
    return "\n".join(out)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--intervals", default="15,30,60", help="scrape intervals, seconds")
    parser.add_argument("--flavours", default=",".join(FLAVOURS), help="uncached,cached")
    parser.add_argument("--scrapes", type=int, default=10, help="measured scrapes a trial")
    parser.add_argument("--warmup", type=int, default=8, help="scrapes on schedule first")
    parser.add_argument("--budget", type=float, metavar="MS", help="--server.time-budget")
    parser.add_argument("--databases", type=int, default=0, metavar="N",
                        help="empty databases to add beside the workload's")  # fmt: skip
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the trials")
    args = parser.parse_args(argv)
    args.intervals = [float(i) for i in args.intervals.split(",") if i.strip()]
    args.flavours = [f.strip() for f in args.flavours.split(",") if f.strip()]
    if any(f not in FLAVOURS for f in args.flavours):
        parser.error(f"--flavours: choose among {', '.join(FLAVOURS)}")
    args.scrapes, args.warmup = max(1, args.scrapes), max(0, args.warmup)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run every trial, print the table; exit 0 whatever the figures."""
    args = parse_args(argv)
    trials = run(args)
    print(render(trials, args))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(t) for t in trials], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
