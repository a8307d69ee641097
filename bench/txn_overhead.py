"""What the per-collector transaction and limits (D1) cost, in microseconds.

Runs the same trivial collector query on one throw-away PostgreSQL 18 connection
two ways, many times: bare (autocommit), and the way the exporter runs a collector
where the limits cannot be session settings (PostgreSQL 13, or a pooler between):
``BEGIN READ ONLY`` + ``SET LOCAL`` limits in one round trip, the query, ``COMMIT``.
Prints the median per execution and the difference.

    .venv/bin/python -m bench.txn_overhead [--runs 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

import psycopg

from exporter.config.definitions import Collector, Column, Usage
from exporter.pg import postgres
from exporter.pg.limits import Guards, Limits, limits_sql
from rigs.localpg import LocalCluster, pg18_bindir

QUERY = "SELECT 1 AS v"
COLLECTOR = Collector(
    key="probe", name="probe", query=QUERY, columns=(Column("v", Usage.GAUGE),), timeout=1.0
)


async def _bare(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> None:
    async with conn.cursor() as cur:
        async for _ in postgres.stream_batches(cur, QUERY):
            pass


async def _guarded(conn: psycopg.AsyncConnection[tuple[object, ...]], version: int) -> None:
    async with conn.cursor() as cur:
        await postgres.send_limits(cur, limits_sql(Limits.of(COLLECTOR.timeout, Guards(version))))
        async for _ in postgres.stream_batches(cur, QUERY):
            pass
    await postgres.settle(conn)


async def _median_us(run: Callable[[], Awaitable[object]], runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        await run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


async def main(runs: int) -> None:
    """Measure both ways, interleaved in rounds so machine noise hits both alike."""
    with LocalCluster(pg18_bindir()) as cluster:
        conn = await psycopg.AsyncConnection.connect(cluster.dsn(), autocommit=True)
        bare: list[float] = []
        guarded: list[float] = []
        for _ in range(5):
            bare.append(await _median_us(lambda: _bare(conn), runs // 5))
            guarded.append(await _median_us(lambda: _guarded(conn, cluster.version), runs // 5))
        await conn.close()
    b, g = statistics.median(bare), statistics.median(guarded)
    print("| execution | median per collector (µs) |")
    print("|---|---|")
    print(f"| bare query (autocommit) | {b:.0f} |")
    print(f"| read-only transaction + SET LOCAL limits + COMMIT | {g:.0f} |")
    print(f"| overhead | {g - b:.0f} ({g / b:.2f}x) |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--runs", type=int, default=3000)
    asyncio.run(main(parser.parse_args().runs))
