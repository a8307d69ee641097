"""What the exporter plans to run, as text: ``pg_exporter --explain`` connects, plans
every database afresh, prints the plans and exits; the served ``/explain`` page shows
the plans the last pass made (:func:`last_plans`), with no lock and no SQL.
"""

from __future__ import annotations

import asyncio
import sys

from exporter.budget import Budget
from exporter.collection import Exporter
from exporter.definitions import Definitions
from exporter.planning import explain_text
from exporter.settings import Settings


def run(settings: Settings, definitions: Definitions) -> int:
    """Print the plan of every database; the exit code for the CLI (1: cannot connect)."""
    return asyncio.run(_explain(settings, definitions))


async def _explain(settings: Settings, definitions: Definitions) -> int:
    exporter = Exporter(settings, definitions)
    try:
        try:
            await exporter.main.prepare()
        except Exception as exc:
            print(f"pg_exporter: cannot connect to {settings.masked_url}: {exc}", file=sys.stderr)
            return 1
        budget = Budget.starting_now(max(settings.connect_timeout * 10, 30))
        text = await exporter.explain(budget)
    finally:
        await exporter.close()
    print(text, end="")
    return 0


def last_plans(exporter: Exporter) -> str:
    """Every database's plan as the last pass (or start-up) made it, for ``/explain``.

    It takes no lock and sends no SQL, so no number of ``/explain`` requests can
    delay a scrape or be counted as a pass it shared; every pass plans afresh when a
    server's facts change, so the plans are as recent as the last scrape.
    """
    if exporter.main.plan is None:
        return "nothing planned yet: the first scrape that reaches the target plans it\n"
    parts = []
    if exporter.pending is not None:
        parts.append("a reloaded config applies from the next pass; below, the running one\n")
    if not exporter.main.up and exporter.stats.scrapes:
        parts.append("pg_up was 0 at the last pass; these plans are from before\n")
    parts.append(degradation_text(exporter))
    for server in exporter.servers:
        if server.plan is None:
            parts.append(f"database {server.label}: not planned yet (the next pass plans it)\n")
        else:
            parts.append(explain_text(server.plan))
    return "\n".join(parts)


def degradation_text(exporter: Exporter) -> str:
    """The breaker's state, and what the last pass shed or held back, for ``/explain``."""
    now = exporter.clock()
    lines = [f"breaker: {exporter.breaker.describe(now)}"]
    for server in exporter.servers:
        if server.shed:
            lines.append(f"  shed on {server.label}: {', '.join(server.shed)}")
        waiting = [
            f"{key} ({runtime.backoff.failures} failures in a row, next try in "
            f"{runtime.retry_in(now):.0f}s)"
            for key, runtime in sorted(server.runtimes.items())
            if runtime.backoff is not None and runtime.backoff.backing_off
        ]
        if waiting:
            lines.append(f"  backing off on {server.label}: {', '.join(waiting)}")
    return "\n".join(lines) + "\n"
