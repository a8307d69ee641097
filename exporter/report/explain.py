"""What the exporter plans to run, as text: ``pg_exporter --explain`` connects, plans
every database afresh, prints the plans and exits; the served ``/explain`` page shows
the plans the last pass made (:func:`last_plans`), with no lock and no SQL.
"""

from __future__ import annotations

import asyncio
import sys

from exporter.collect.budget import Budget
from exporter.collect.exporter import Exporter
from exporter.collect.planning import explain_text
from exporter.config.definitions import Definitions
from exporter.config.settings import Settings
from exporter.report import implementations


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
        text = await plan_all(exporter, budget)
    finally:
        await exporter.close()
    print(text, end="")
    return 0


async def plan_all(exporter: Exporter, budget: Budget) -> str:
    """The plan of every database, refreshing facts first, within ``budget`` (``--explain``).

    Like a scrape, it waits for a pass in flight only as long as its budget lasts
    and preflights each database at most once, cancelled when the budget ends.
    """
    async with exporter.exclusive(budget) as held:
        if not held:
            return "a collection pass is still running; try again\n"
        try:
            await exporter.main.prepare_within(budget)
            await exporter.databases.sync()
        except Exception as exc:  # any failure becomes text for the operator
            return f"cannot reach the target database: {exc}\n"
        parts = [explain_text(exporter.main.plan)] if exporter.main.plan is not None else []
        for server in exporter.servers[1:]:
            if budget.interruption():
                parts.append("(the request's budget ran out before the other databases)\n")
                break
            try:
                await server.prepare_within(budget)
            except Exception as exc:
                parts.append(f"database {server.label}: cannot plan: {exc}\n")
                continue
            if server.plan is not None:
                parts.append(explain_text(server.plan))
        return "\n".join(parts)


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
    parts.append(degradation_text(exporter) + implementations.explain_text())
    for server in exporter.servers:
        if server.plan is None:
            parts.append(f"database {server.label}: not planned yet (the next pass plans it)\n")
        else:
            parts.append(explain_text(server.plan))
    return "\n".join(parts)


def degradation_text(exporter: Exporter) -> str:
    """The breaker's state and the server-time budget's (issue 31), and what the last pass
    shed, held back or stretched, for ``/explain``."""
    now = exporter.clock()
    lines = [f"breaker: {exporter.breaker.describe(now)}",
             f"server-time budget: {exporter.server_time.describe(now)}"]  # fmt: skip
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
        if stretched := exporter.server_time.stretched_on(server.label):
            lines.append(f"  stretched on {server.label}: {stretched}")
    return "\n".join(lines) + "\n"
