"""Many databases on a connection budget (issue 13): what a pass costs as databases grow.

Run from the repository root::

    .venv/bin/python -m bench.many_databases                 # 1, 10, 50 databases
    .venv/bin/python -m bench.many_databases --databases 1,10,50,200 --scrapes 10

For each count, one throw-away PostgreSQL 18 holds that many databases of 20
tables each (copies of one template); our exporter serves the default library
with auto-discovery and ``--disable-cache``, once with the default budget and
once with one connection per database (``--max-connections`` = databases + 2).
Printed per row: series, pass wall p50/p99, exporter CPU per scrape, RSS, peak
exporter backends seen in ``pg_stat_activity`` and connections opened per scrape.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench.exporters import Launch, ours_python, running
from bench.measure import memory, percentile, process_cpu_seconds, scrape
from rigs.localpg import LocalCluster, free_port, pg18_bindir

REPO = Path(__file__).resolve().parent.parent
TABLES = 20
POPULATE_BATCH = 20  # databases created per psql call


@dataclass(frozen=True, slots=True)
class Row:
    databases: int
    budget: int
    series: int
    wall_p50: float
    wall_p99: float
    cpu_per_scrape: float
    rss_mib: float
    peak_backends: int
    opened_per_scrape: float


def _populate(cluster: LocalCluster, count: int) -> None:
    tables = "\n".join(
        f"CREATE TABLE t{n} (id int PRIMARY KEY, v text); INSERT INTO t{n} VALUES (1, 'x');"
        for n in range(TABLES)
    )
    cluster.psql("CREATE DATABASE bench_template;")
    cluster.psql(tables, dbname="bench_template")
    # In batches: one psql call for 200 databases outlasts its timeout on a loaded machine.
    for start in range(0, count, POPULATE_BATCH):
        names = range(start, min(start + POPULATE_BATCH, count))
        statements = (f"CREATE DATABASE db{n:03d} TEMPLATE bench_template;" for n in names)
        cluster.psql("\n".join(statements))


class Sampler(threading.Thread):
    """The most exporter backends seen at once, polled while the scrapes run."""

    def __init__(self, cluster: LocalCluster) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.peak = 0
        self.stop = threading.Event()

    def run(self) -> None:
        sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg_exporter'"
        while not self.stop.is_set():
            self.peak = max(self.peak, int(self.cluster.psql(sql)))


def _opened(body: bytes) -> float:
    for line in body.decode().splitlines():
        if line.startswith("pg_exporter_connections_opened_total "):
            return float(line.split()[1])
    return 0.0


def measure(cluster: LocalCluster, databases: int, budget: int, scrapes: int) -> Row:
    port = free_port()
    argv = (ours_python(), "-m", "exporter", "--url", cluster.dsn(), "--disable-cache",
            "--server.time-budget", "0",  # every collector on every pass, as measured before
            "--config", str(REPO / "collectors"),
            "--exclude-database", "template0,template1,postgres,bench_template",
            "--max-connections", str(budget), "--web.listen-address", f"127.0.0.1:{port}",
            "--log.level", "warn")  # fmt: skip
    with (
        tempfile.TemporaryDirectory() as tmp,
        running(Launch("ours", argv, port), Path(tmp) / "log") as proc,
    ):
        deadline = time.monotonic() + 60
        while True:
            try:
                first = scrape(port, "/metrics", gzip_ok=False, timeout=60)
                if first.status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"exporter not ready: {(Path(tmp) / 'log').read_text()}")
            time.sleep(0.2)  # polling interval of a condition with a deadline
        sampler = Sampler(cluster)
        sampler.start()
        cpu_before, opened_before = process_cpu_seconds(proc.pid), _opened(first.body)
        walls, last = [], first
        for _ in range(scrapes):
            last = scrape(port, "/metrics", gzip_ok=False, timeout=60)
            walls.append(last.seconds)
        cpu = process_cpu_seconds(proc.pid) - cpu_before
        sampler.stop.set()
        sampler.join()
        return Row(
            databases, budget, last.all_series, statistics.median(walls), percentile(walls, 0.99),
            cpu / scrapes, memory(proc.pid).rss_kib / 1024, sampler.peak,
            (_opened(last.body) - opened_before) / scrapes,
        )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--databases", default="1,10,50")
    parser.add_argument("--scrapes", type=int, default=10)
    args = parser.parse_args()
    print("| databases | budget | series | pass wall p50 / p99 | CPU per scrape | RSS | "
          "peak backends | opened per scrape |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for count in (int(n) for n in args.databases.split(",")):
        # Room for one connection per database (the second budget) and the sampler's.
        settings = {"max_connections": str(max(100, count + 20))}
        with LocalCluster(pg18_bindir(), settings=settings) as cluster:
            print(f"populating {count} databases", file=sys.stderr)
            _populate(cluster, count)
            for budget in sorted({4, count + 2}):
                r = measure(cluster, count, budget, args.scrapes)
                print(f"| {r.databases} | {r.budget} | {r.series} | {r.wall_p50 * 1000:.0f} / "
                      f"{r.wall_p99 * 1000:.0f} ms | {r.cpu_per_scrape * 1000:.0f} ms | "
                      f"{r.rss_mib:.0f} MiB | {r.peak_backends} | {r.opened_per_scrape:.1f} |",
                      flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
