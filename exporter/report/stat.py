"""Per-collector statistics: one walk for ``/stat`` and the ``…_query_*`` self-metrics.

Both are keyed by the collector's ``name`` (``pg_db``), as in the Go exporter and
its dashboards, not by the branch key (``pg_db_18``). Planning keeps one branch
of a name per server in the shipped library; should a config plan several, their
figures add up under the one name instead of colliding.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from exporter.collect.cache import Outcome, ttl_left
from exporter.collect.exporter import Exporter
from exporter.collect.runtime import CollectorRuntime, CollectorState
from exporter.collect.server import Server


@dataclass(slots=True)
class CollectorRow:
    """What one collector name did on one database since start (or the last reload)."""

    datname: str
    name: str
    branches: list[str] = field(default_factory=list)  # planned branch keys of this name
    ran: bool = False  # False until some branch of the name was executed or served
    total: int = 0
    hits: int = 0
    errors: int = 0
    skips: int = 0
    series: int = 0
    last_duration: float = 0.0
    ttl: float = 0.0
    ttl_left: float = 0.0
    outcomes: dict[Outcome, int] = field(default_factory=dict)
    state: CollectorState = CollectorState.NORMAL  # shed, else backoff, if any branch is
    failures: int = 0  # failures in a row (D15)
    retry_in: float = 0.0  # seconds until a collector in back-off may run again
    stretched: float = 0.0  # the ttl the server-time budget stretched it to (issue 31)


def _worse(a: CollectorState, b: CollectorState) -> CollectorState:
    order = (
        CollectorState.NORMAL,
        CollectorState.STRETCHED,
        CollectorState.BACKOFF,
        CollectorState.SHED,
    )
    return max(a, b, key=order.index)


def collector_rows(servers: Iterable[Server], now: float) -> list[CollectorRow]:
    """One row per planned collector name and database, in run order."""
    rows: list[CollectorRow] = []
    for server in servers:
        if server.plan is None:
            continue
        by_name: dict[str, CollectorRow] = {}
        for collector in server.plan.planned:
            row = by_name.get(collector.name)
            if row is None:
                row = by_name[collector.name] = CollectorRow(server.label, collector.name)
                rows.append(row)
            row.branches.append(collector.key)
            row.ttl = max(row.ttl, collector.ttl)
            runtime = server.runtimes.get(collector.key)
            if runtime is not None:
                _add(row, runtime, now)
    return rows


def _add(row: CollectorRow, runtime: CollectorRuntime, now: float) -> None:
    """Fold one branch's cache, back-off (D15), shedding (D16), stretch (issue 31) and
    statistics into its row."""
    row.ttl_left = max(row.ttl_left, ttl_left(runtime.entry, runtime.ttl, now))
    row.state = _worse(row.state, runtime.state)
    row.stretched = max(row.stretched, runtime.stretch)
    if runtime.backoff is not None:
        row.failures = max(row.failures, runtime.backoff.failures)
        row.retry_in = max(row.retry_in, runtime.retry_in(now))
    if not runtime.ran:
        return
    stats = runtime.stats
    row.ran = True
    row.total += stats.total
    row.hits += stats.hits
    row.errors += stats.errors
    row.skips += stats.skips
    row.series += stats.series
    row.last_duration += stats.last_duration
    for outcome, count in stats.outcomes.items():
        row.outcomes[outcome] = row.outcomes.get(outcome, 0) + count


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
    "state",
    "fails",
    "retry_in",
    "stretch",
    "conns",
    "outcomes",
    "branch",
)


def stat_text(exporter: Exporter) -> str:
    """One row per planned collector name and database, aligned in columns; ``conns`` is
    how many connections were opened to the row's database (issue 13)."""
    table: list[tuple[str, ...]] = [_HEADER]
    for row in collector_rows(exporter.servers, exporter.clock()):
        outcomes = ",".join(f"{o.value}={row.outcomes[o]}" for o in Outcome if o in row.outcomes)
        table.append(
            (
                row.datname,
                row.name,
                str(row.total),
                str(row.hits),
                str(row.errors),
                str(row.skips),
                str(row.series),
                f"{row.ttl:g}",
                f"{row.ttl_left:.1f}",
                f"{row.last_duration:.4f}" if row.ran else "-",
                row.state.value,
                str(row.failures),
                f"{row.retry_in:.1f}",
                f"{row.stretched:.1f}" if row.stretched else "-",
                str(exporter.connections.opened_by.get(row.datname, 0)),
                outcomes or "-",
                ",".join(row.branches),
            )
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(_HEADER))]
    return "".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n" for r in table
    )
