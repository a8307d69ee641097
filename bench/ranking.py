"""Exporter CPU of a ``top`` collector's ranking (issue 38), without PostgreSQL.

Rows shaped as the library's pg_query returns them (two labels, twelve float8
counters) go through :func:`exporter.collect.topn.rank_rows` run after run; between
runs a share of the keys moves (their counters grow), the rest read as before::

    .venv/bin/python -m bench.ranking                       # 10 000 keys; 0, 10 and 100 % moving
    .venv/bin/python -m bench.ranking --keys 5000 --moving 0.25 --runs 20

Prints the median process CPU per run (ms) and the state kept per key, after the
first run (which meets every key for the first time) and two more.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Sequence

from exporter.collect import topn
from exporter.collect.ranking import Ranking
from exporter.config.definitions import Collector, Column, Top, Usage

TEXT, FLOAT8 = 25, 701
COUNTERS = (
    "calls", "rows", "exec_time", "plan_time", "io_time", "sblk_hit", "sblk_read",
    "sblk_dirtied", "sblk_written", "temp_blks_written", "wal_records", "wal_bytes",
)  # fmt: skip
NAMES = ("datname", "query", *COUNTERS)
TYPES = (TEXT, TEXT) + (FLOAT8,) * len(COUNTERS)


def collector(limit: int) -> Collector:
    """pg_query's shape, ranked as the library ranks it."""
    labels = (Column("datname", Usage.LABEL), Column("query", Usage.LABEL))
    counters = tuple(Column(name, Usage.COUNTER) for name in COUNTERS)
    top = Top("exec_time", limit, 2 * limit, 600, limit / 4, ("datname",))
    return Collector(key="pg_query", name="pg_query", query="-", columns=labels + counters, top=top)


def measure(keys: int, moving: float, runs: int, limit: int, seed: int = 1) -> tuple[float, float]:
    """Median CPU ms of a run after the third, and bytes of state per key."""
    rng = random.Random(seed)
    ranked = collector(limit)
    shape = topn.shape_of(ranked, NAMES, TYPES)
    ranking = Ranking(ranked.top, len(shape.counters), shape.by, len(shape.key))  # type: ignore[arg-type]
    values = [[float(rng.randint(5, 1000)) for _ in COUNTERS] for _ in range(keys)]
    labels = [(f"db{n % 3}", str(rng.getrandbits(63))) for n in range(keys)]
    times: list[float] = []
    tracemalloc.start()
    held = 0
    for run in range(runs):
        for n in rng.sample(range(keys), int(keys * moving)):
            row = values[n]
            for m in range(len(row)):
                row[m] += rng.randint(1, 50)
        rows: list[tuple[object, ...]] = [
            (*label, *row) for label, row in zip(labels, values, strict=True)
        ]
        started = time.process_time()
        topn.rank_rows(ranking, shape, rows, 10.0 * run, ranked)
        if run >= 3:
            times.append(time.process_time() - started)
        if run == 2:
            del rows
            held = tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
    return 1000 * statistics.median(times), held / keys


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--moving", type=float, action="append", help="share of keys moving a run")
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--limit", type=int, default=100)
    options = parser.parse_args(argv)
    print("| keys | moving a run | CPU ms a run (median) | state bytes a key |")
    print("|---|---|---|---|")
    for moving in options.moving or [0.0, 0.1, 1.0]:
        cpu, per_key = measure(options.keys, moving, max(options.runs, 5), options.limit)
        print(f"| {options.keys} | {moving:.0%} | {cpu:.1f} | {per_key:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
