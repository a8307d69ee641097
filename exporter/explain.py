"""``pg_exporter --explain``: connect, plan every database, print the plans, and exit.

The served ``/explain`` page shows the plans the last pass made instead
(:meth:`exporter.collection.Exporter.last_plans`); here there is no pass to
delay, so every database is planned afresh.
"""

from __future__ import annotations

import asyncio
import sys

from exporter.budget import Budget
from exporter.collection import Exporter
from exporter.definitions import Definitions
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
