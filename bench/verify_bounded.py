"""Reproduce the bounded-scrape figures an operator wants before trusting the exporter.

Runs the real exporter (``python -m exporter``) against a throw-away PostgreSQL 18
and measures, with real sockets: shared passes, admission, the budget header, and
the cancellation of an unbounded collector whose client hangs up. Prints a table.

    .venv/bin/python -m bench.verify_bounded
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from exporter.collect.budget import SCRAPE_TIMEOUT_HEADER
from rigs.localpg import VERBOSE_LOG_SETTINGS, LocalCluster, free_port, pg18_bindir
from tests.fixtures.helpers import statement_calls, value
from tests.fixtures.polling import poll_async
from tests.fixtures.rawhttp import RawClient, get

REPO = Path(__file__).resolve().parents[1]

BUDGET_HEADER = SCRAPE_TIMEOUT_HEADER


@dataclass
class Row:
    """One line of the verification table."""

    clause: str
    scenario: str
    expected: str
    measured: str
    ok: bool


def _sleeper(key: str, marker: str, seconds: float, timeout: float, ttl: float) -> str:
    return (
        f"{key}:\n  query: SELECT 1 AS {marker} FROM pg_sleep({seconds})\n"
        f"  ttl: {ttl}\n  timeout: {timeout}\n  metrics:\n"
        f"    - {marker}: {{usage: GAUGE, description: probe}}\n"
    )


def _active(cluster: LocalCluster, marker: str) -> bool:
    out = cluster.psql(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg_exporter' "
        f"AND state = 'active' AND query LIKE '%{marker}%' AND pid <> pg_backend_pid()"
    )
    return out.strip() != "0"


@asynccontextmanager
async def exporter(cluster: LocalCluster, config: str) -> AsyncIterator[int]:
    """The exporter as a process serving ``config``; yields its port."""
    port = free_port()
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as handle:
        handle.write(config)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "exporter", "-u", cluster.dsn(), "-c", handle.name,
        "--web.listen-address", f"127.0.0.1:{port}", "-T", "5000", "--no-auto-discovery",
        "--log.level", "warn",
        cwd=REPO, env={**os.environ},
    )  # fmt: skip
    try:
        await poll_async(lambda: _listening(port), "the exporter to listen", 30.0, 0.01)
        yield port
    finally:
        process.terminate()
        async with asyncio.timeout(30):
            await process.wait()
        os.unlink(handle.name)


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


async def shared_pass(cluster: LocalCluster) -> list[Row]:
    """Two overlapping scrapes and a third one (B1, B4–B6)."""
    m = f"m{uuid.uuid4().hex[:8]}"
    async with exporter(cluster, _sleeper("slow", m, 0.8, 5, 60)) as port:
        start = time.monotonic()
        first = await RawClient.send(port)
        await poll_async(lambda: _active(cluster, m), "the query to be active", 30.0, 0.01)
        second = await RawClient.send(port)
        await asyncio.sleep(0.05)  # let the second request reach its wait (not an assertion)
        t3 = time.monotonic()
        third = await get(port)
        third_latency = time.monotonic() - t3
        a, b = await first.response(), await second.response()
        both = time.monotonic() - start
    runs = statement_calls(cluster, m)
    return [
        Row("B4–B6", "2 overlapping scrapes, 0.8 s collector, ttl 60", "both 200, SQL run once",
            f"{a.status}/{b.status}, SQL run {runs}x, both done in {both:.2f} s",
            (a.status, b.status, runs) == (200, 200, 1)),
        Row("B1", "3rd concurrent scrape", "503 at once, no SQL",
            f"{third.status} in {third_latency * 1000:.1f} ms", third.status == 503),
    ]  # fmt: skip


async def short_budget(cluster: LocalCluster) -> list[Row]:
    """A 0.3 s budget against a 0.8 s bounded collector (B7, B11, B21)."""
    m = f"m{uuid.uuid4().hex[:8]}"
    async with exporter(cluster, _sleeper("slow", m, 0.8, 5, 60)) as port:
        start = time.monotonic()
        short = await get(port, **{BUDGET_HEADER: "0.3"})
        took = time.monotonic() - start
        start = time.monotonic()
        after = await get(port)
        cached = time.monotonic() - start
    runs = statement_calls(cluster, m)
    return [
        Row("B7, B11, B21", "header 0.3 s, 0.8 s bounded collector",
            "503 after the collector (~0.8 s)", f"{short.status} after {took:.2f} s",
            short.status == 503 and 0.7 <= took < 4),
        Row("B6, B11", "next scrape", "200 from cache, not re-run",
            f"{after.status} in {cached * 1000:.0f} ms, SQL run {runs}x",
            after.status == 200 and runs == 1 and value(after.text, f"slow_{m}") == 1),
    ]  # fmt: skip


async def unbounded_hang_up(cluster: LocalCluster) -> list[Row]:
    """A 3 s unbounded collector whose client leaves 1.5 s in (B12, B14, B18)."""
    m = f"m{uuid.uuid4().hex[:8]}"
    ttl = 5.0
    async with exporter(cluster, _sleeper("forever", m, 3, -1, ttl)) as port:
        leaver = await RawClient.send(port)
        await poll_async(lambda: _active(cluster, m), "the query to be active", 30.0, 0.01)
        await asyncio.sleep(1.5)  # the scenario: the client leaves 1.5 s into the query
        left = time.monotonic()
        leaver.hang_up()
        gone = await poll_async(lambda: not _active(cluster, m), "the query to end", 30.0, 0.01)
        cancelled = "57014" in cluster.log_text()
        within = await get(port)
        runs_within = statement_calls(cluster, m)
        await asyncio.sleep(max(0.0, ttl - (time.monotonic() - left)) + 0.2)  # let the TTL pass
        retried = await get(port)
    runs_after = statement_calls(cluster, m)
    errors = value(retried.text, "pg_exporter_scrape_error_count")
    return [
        Row("B12", "client leaves 1.5 s into a 3 s unbounded query",
            "cancelled in PostgreSQL (57014), no backend left",
            f"backend gone {gone * 1000:.0f} ms after hang-up, 57014 logged: {cancelled}",
            cancelled and gone < 2),
        Row("B14", "next scrape within the TTL", "collector missing, not re-run",
            f"{within.status}, present: {f'forever_{m}' in within.text}, SQL run {runs_within}x",
            within.status == 200 and f"forever_{m}" not in within.text and runs_within == 1),
        Row("B14, B18", "scrape after the TTL", "re-run; error counters 0",
            f"{retried.status}, SQL run {runs_after}x, scrape_error_count {errors:g}",
            retried.status == 200 and runs_after == 2 and errors == 0),
    ]  # fmt: skip


def _print(rows: list[Row]) -> None:
    headers = ("clause", "scenario", "expected", "measured", "ok")
    table = [headers, *((r.clause, r.scenario, r.expected, r.measured, "yes" if r.ok else "NO")
                        for r in rows)]  # fmt: skip
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for line in table[1:]:
        print("| " + " | ".join(line) + " |")


async def main() -> int:
    """Run every scenario on one throw-away PostgreSQL 18 and print the table."""
    with LocalCluster(pg18_bindir(), settings=VERBOSE_LOG_SETTINGS) as cluster:
        rows = [
            *await shared_pass(cluster),
            *await short_budget(cluster),
            *await unbounded_hang_up(cluster),
        ]
    _print(rows)
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
