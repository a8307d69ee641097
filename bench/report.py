"""Results of a run: one record per (workload, flavour, exporter), a table and ratios."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.exporters import GO_PEER, OURS, QUERY_EXPORTER, TITLES


@dataclass(frozen=True, slots=True)
class Result:
    """What one exporter cost for one workload flavour (``error`` set: nothing measured)."""

    exporter: str
    workload: str
    cached: bool
    scrapes: int = 0
    cpu_ms: float = 0.0  # exporter CPU per scrape
    pg_cpu_ms: float = 0.0  # whole-cluster PostgreSQL CPU per scrape
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    rss_mib: float = 0.0  # after the scrapes
    hwm_mib: float = 0.0  # peak over the process's life
    workload_series: int = 0
    other_series: int = 0  # self-metrics and anything else the exporter adds
    body_kib: float = 0.0  # exposition, decompressed
    wire_kib: float = 0.0  # as sent (gzip when accepted)
    error: str | None = None

    @property
    def flavour(self) -> str:
        """``cached`` or ``uncached``."""
        return "cached" if self.cached else "uncached"


#: Columns of the table: (header, attribute, format).
COLUMNS = (
    ("cpu ms/scrape", "cpu_ms", "{:.1f}"),
    ("pg cpu ms/scrape", "pg_cpu_ms", "{:.1f}"),
    ("p50 ms", "p50_ms", "{:.1f}"),
    ("p90 ms", "p90_ms", "{:.1f}"),
    ("RSS MiB", "rss_mib", "{:.1f}"),
    ("HWM MiB", "hwm_mib", "{:.1f}"),
    ("series", "workload_series", "{:d}"),
    ("other", "other_series", "{:d}"),
    ("body KiB", "body_kib", "{:.0f}"),
    ("wire KiB", "wire_kib", "{:.0f}"),
)
#: Metrics compared as ours/peer: lower is better for each.
RATIO_COLUMNS = (
    ("cpu", "cpu_ms"),
    ("pg cpu", "pg_cpu_ms"),
    ("p50", "p50_ms"),
    ("RSS", "rss_mib"),
    ("HWM", "hwm_mib"),
)


def render(results: Sequence[Result]) -> str:
    """The table, one block per workload flavour, then ours/peer ratios."""
    lines: list[str] = []
    for workload, cached in _groups(results):
        group = [r for r in results if r.workload == workload and r.cached == cached]
        lines.append(f"\n== {workload} series, {'cached' if cached else 'uncached'} ==")
        lines.extend(_table(group))
        lines.extend(_ratios(group))
    return "\n".join(lines)


def write_json(path: Path, results: Sequence[Result], environment: dict[str, str]) -> None:
    """Machine-readable copy of the run."""
    document = {"environment": environment, "results": [asdict(r) for r in results]}
    path.write_text(json.dumps(document, indent=2) + "\n")


def _groups(results: Iterable[Result]) -> list[tuple[str, bool]]:
    """Distinct (workload, cached) pairs in the order they ran."""
    seen: list[tuple[str, bool]] = []
    for r in results:
        if (r.workload, r.cached) not in seen:
            seen.append((r.workload, r.cached))
    return seen


def _table(group: Sequence[Result]) -> list[str]:
    """Aligned rows of one flavour; failed runs show their error instead of figures."""
    header = ["exporter", *(h for h, _, _ in COLUMNS)]
    rows = [header]
    rows += [
        [TITLES[r.exporter], *(f.format(getattr(r, a)) for _, a, f in COLUMNS)]
        for r in group
        if not r.error
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    out = []
    for row in rows:
        cells = [row[0].ljust(widths[0])]
        cells += [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        out.append("  " + "  ".join(cells))
    out += [f"  {TITLES[r.exporter].ljust(widths[0])}  n/a: {r.error}" for r in group if r.error]
    return out


def _ratios(group: Sequence[Result]) -> list[str]:
    """ours/peer for each compared metric (below 1: ours costs less)."""
    by_key = {r.exporter: r for r in group if not r.error}
    ours = by_key.get(OURS)
    if ours is None:
        return ["  ratios: ours not measured"]
    out = []
    for peer in (GO_PEER, QUERY_EXPORTER):
        other = by_key.get(peer)
        if other is None:
            continue
        parts = [
            f"{label} {_ratio(getattr(ours, a), getattr(other, a))}" for label, a in RATIO_COLUMNS
        ]
        out.append(f"  ours/{peer}: " + ", ".join(parts))
    return out


def _ratio(ours: float, peer: float) -> str:
    """``ours / peer`` with two decimals, or a dash when the peer measured zero."""
    return f"{ours / peer:.2f}" if peer > 0 else "-"
