"""Backend memory held by the prepared collector queries (issue 22).

Run from the repository root::

    .venv/bin/python -m bench.plan_memory [--scrapes 4]

Serves the workload of ``bench.library`` with our exporter and its default library,
uncached, so that every collector runs on every pass and is prepared from its second
pass on; then asks PostgreSQL to log the memory contexts of the exporter's backend on
the main database (``pg_log_backend_memory_contexts``) and sums the plan cache's
contexts (``CachedPlan``, ``CachedPlanSource``, ``CachedPlanQuery``) against the
backend's total. Prints one line per backend.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Sequence

from bench import library
from bench.exporters import running
from bench.measure import scrape
from exporter.health.probe import PROBE_SQL
from rigs.localpg import LocalCluster, pg18_bindir

# A memory context line: "[pid] ... level: N; Name: 123 total in ..."
_CONTEXT = re.compile(r"\[(\d+)\].*level: \d+; (\w+): (\d+) total in")
_PLANS = ("CachedPlan", "CachedPlanSource", "CachedPlanQuery")


def contexts(log: str) -> dict[int, dict[str, int]]:
    """Bytes per memory context name, per backend, from the logged context lines."""
    found: dict[int, dict[str, int]] = {}
    for match in map(_CONTEXT.search, log.splitlines()):
        if match is not None:
            pid, name, size = int(match[1]), match[2], int(match[3])
            per_name = found.setdefault(pid, {})
            per_name[name] = per_name.get(name, 0) + size
    return found


def _finished(log: str) -> int:
    """How many memory context dumps in ``log`` have reached their last line."""
    return log.count("Grand total:")


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and print; exits 0 whatever the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scrapes", type=int, default=4, help="uncached scrapes first")
    scrapes = parser.parse_args(argv).scrapes
    options = library.parse_args(["--rounds", "1"])
    with LocalCluster(pg18_bindir(), settings=library.SERVER_SETTINGS) as cluster:
        library.populate(cluster)
        spec = library.launch(library.OURS, "uncached", cluster.dsn(user=library.ROLE), options)
        with running(spec, cluster.base_dir / "exporter.log") as proc:
            library.wait_ready(spec, lambda: proc.poll() is None, time.monotonic() + 60)
            for _ in range(scrapes):
                scrape(spec.port, "/metrics", gzip_ok=True, timeout=60)
            before = len(cluster.log_text())
            # The pass's backend on the main database, not the health probe's.
            probe = PROBE_SQL.replace("'", "''")
            pids = cluster.psql(
                "SELECT string_agg(pid::text, ' ') FROM pg_stat_activity"
                " WHERE application_name = 'pg_exporter' AND datname = 'postgres'"
                f" AND query <> '{probe}'"
            ).split()
            for pid in pids:
                cluster.psql(f"SELECT pg_log_backend_memory_contexts({pid})")
            deadline = time.monotonic() + 10
            while _finished(cluster.log_text()[before:]) < len(pids):
                if time.monotonic() > deadline:
                    raise SystemExit("the backends did not log their memory contexts in 10 s")
                time.sleep(0.1)  # polling the log for the dumps' last lines, under a deadline
            logged = contexts(cluster.log_text()[before:])
    for backend, sizes in sorted(logged.items()):
        plans = sum(size for name, size in sizes.items() if name in _PLANS)
        print(f"backend {backend}: prepared plans {plans / 2**20:.1f} MiB"
              f" of {sum(sizes.values()) / 2**20:.1f} MiB in all")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
