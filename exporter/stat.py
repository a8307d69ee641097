"""``/stat``: per-collector statistics as a plain text table."""

from __future__ import annotations

from exporter.cache import Outcome, ttl_left
from exporter.collection import Exporter

_HEADER = (
    "datname",
    "query",
    "total",
    "hit",
    "error",
    "skip",
    "series",
    "ttl",
    "ttl_left",
    "last_duration",
    "outcomes",
)


def stat_text(exporter: Exporter) -> str:
    """One row per planned collector and database, aligned in columns."""
    now = exporter.clock()
    rows: list[tuple[str, ...]] = [_HEADER]
    for server in exporter.servers:
        if server.plan is None:
            continue
        for collector in server.plan.planned:
            stats = server.stats.get(collector.key)
            entry = server.entries.get(collector.key)
            outcomes = ",".join(
                f"{o.value}={stats.outcomes[o]}" for o in Outcome if stats and o in stats.outcomes
            )
            rows.append(
                (
                    server.label,
                    collector.key,
                    str(stats.total if stats else 0),
                    str(stats.hits if stats else 0),
                    str(stats.errors if stats else 0),
                    str(stats.skips if stats else 0),
                    str(stats.series if stats else 0),
                    f"{collector.ttl:g}",
                    f"{ttl_left(entry, collector.ttl, now):.1f}",
                    f"{stats.last_duration:.4f}" if stats else "-",
                    outcomes or "-",
                )
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(_HEADER))]
    return "".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n" for r in rows
    )
