"""The benchmark workload and the three config files that serve it with the same SQL.

One query returns ``rows`` rows of two labels and eight gauge columns, so it
yields ``rows × 8`` series. Each exporter gets its own config format, written
from the same SQL text, in an uncached and a cached flavour.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

VALUE_COLUMNS = tuple(f"c{i}" for i in range(1, 9))
LABEL_COLUMNS = ("grp", "key")
#: Metric prefix used by ours and the Go peer (``bench_c1`` …).
PREFIX = "bench"
#: Cache lifetime of the cached flavour: longer than any run, so scrapes never refresh it.
CACHED_TTL = 3600
#: Collector timeout for ours: generous, the bench measures cost, not deadlines.
TIMEOUT = 30


@dataclass(frozen=True, slots=True)
class Workload:
    """One size of the workload."""

    name: str
    rows: int
    scrapes: int  # measured scrapes (after warm-up)

    @property
    def series(self) -> int:
        """Workload series per scrape."""
        return self.rows * len(VALUE_COLUMNS)

    @property
    def sql(self) -> str:
        """The one SQL text every exporter runs."""
        columns = ", ".join((*LABEL_COLUMNS, *VALUE_COLUMNS))
        return f"SELECT {columns} FROM bench_items WHERE id <= {self.rows} ORDER BY id"


@dataclass(frozen=True, slots=True)
class ConfigFiles:
    """Config paths of one workload flavour, one per exporter."""

    ours: Path
    go_peer: Path
    query_exporter: Path


def write_configs(workload: Workload, cached: bool, url: str, directory: Path) -> ConfigFiles:
    """Write the three config files of a workload flavour into ``directory``."""
    tag = f"{workload.name}-{'cached' if cached else 'uncached'}"
    files = ConfigFiles(
        ours=directory / f"ours-{tag}.yml",
        go_peer=directory / f"go-{tag}.yml",
        query_exporter=directory / f"qe-{tag}.yml",
    )
    _dump(files.ours, ours_config(workload, cached))
    _dump(files.go_peer, go_peer_config(workload, cached))
    _dump(files.query_exporter, query_exporter_config(workload, cached, url))
    return files


def ours_config(workload: Workload, cached: bool) -> dict[str, object]:
    """Collector file in the pg_exporter format (compatibility.md §3)."""
    labels: list[dict[str, object]] = [{c: {"usage": "LABEL"}} for c in LABEL_COLUMNS]
    gauges: list[dict[str, object]] = [
        {c: {"usage": "GAUGE", "description": f"bench value {c}"}} for c in VALUE_COLUMNS
    ]
    branch = {
        "name": PREFIX,
        "desc": f"benchmark workload, {workload.series} series",
        "query": workload.sql,
        "ttl": CACHED_TTL if cached else 0,
        "timeout": TIMEOUT,
        "metrics": labels + gauges,
    }
    return {f"{PREFIX}_{workload.name}": branch}


def go_peer_config(workload: Workload, cached: bool) -> dict[str, object]:
    """Custom-queries file of prometheus-postgres-exporter (``--extend.query-path``)."""
    metrics: list[dict[str, object]] = [
        {c: {"usage": "LABEL", "description": f"bench label {c}"}} for c in LABEL_COLUMNS
    ]
    metrics += [{c: {"usage": "GAUGE", "description": f"bench value {c}"}} for c in VALUE_COLUMNS]
    branch: dict[str, object] = {"query": workload.sql, "metrics": metrics}
    if cached:
        branch["cache_seconds"] = CACHED_TTL
    return {PREFIX: branch}


def query_exporter_config(workload: Workload, cached: bool, url: str) -> dict[str, object]:
    """query-exporter config (``databases`` / ``metrics`` / ``queries``).

    Without ``interval`` the query runs on every scrape; with one, it runs in
    the background at start and then every ``interval``, and scrapes only
    render: that is its cached mode.
    """
    dsn = url.replace("postgresql://", "postgresql+psycopg://", 1)
    query: dict[str, object] = {
        "databases": ["bench"],
        "metrics": list(VALUE_COLUMNS),
        "sql": workload.sql,
    }
    if cached:
        query["interval"] = CACHED_TTL
    return {
        "databases": {"bench": {"dsn": dsn}},
        "metrics": {
            c: {"type": "gauge", "description": f"bench value {c}", "labels": list(LABEL_COLUMNS)}
            for c in VALUE_COLUMNS
        },
        "queries": {f"{PREFIX}_{workload.name}": query},
    }


def _dump(path: Path, document: dict[str, object]) -> None:
    """Write a YAML document, keeping key order so the files read like hand-written ones."""
    path.write_text(yaml.safe_dump(document, sort_keys=False, default_flow_style=None))
