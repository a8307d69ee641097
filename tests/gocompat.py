"""The Go exporter's metric interface, read from the facts file, checked against our library.

``tests/data/go-pg_exporter-1.4.1-metrics.tsv`` lists every metric of the Go
exporter's shipped config: one row per metric per branch, with the branch's
version range and tags; ``go-pg_exporter-1.6-changes.tsv`` beside it holds the
rows that changed up to Go 1.6.1, the release we match, and replaces the 1.4.1
row of the same branch and metric. A row *applies* to a server when its branch would be
planned there; for every applicable row our library, planned on the same
server, must produce that name with that type and at least those labels.
Pure functions: the caller brings the facts.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from exporter.definitions import Collector, Definitions
from exporter.planning import ServerFacts, make_plan, skip_reason

FACTS_FILE = Path(__file__).parent / "data" / "go-pg_exporter-1.4.1-metrics.tsv"
CHANGES_FILE = Path(__file__).parent / "data" / "go-pg_exporter-1.6-changes.tsv"


@dataclass(frozen=True, slots=True)
class Row:
    """One metric of one Go branch."""

    family: str
    metric: str
    type: str  # GAUGE, COUNTER or HISTOGRAM
    labels: frozenset[str]
    branch: str
    min_version: int
    max_version: int
    tags: tuple[str, ...]
    skip: bool

    def as_collector(self) -> Collector:
        """The branch as planning sees it (no query, no columns)."""
        return Collector(
            key=self.branch,
            name=self.family,
            query="",
            columns=(),
            min_version=self.min_version,
            max_version=self.max_version,
            tags=self.tags,
            skip=self.skip,
        )

    def __str__(self) -> str:
        labels = ",".join(sorted(self.labels))
        return f"{self.metric} {self.type} {{{labels}}} (Go branch {self.branch})"


def _version(text: str) -> int:
    return int(text) if text else 0


def load_rows(path: Path = FACTS_FILE, changes: Path | None = CHANGES_FILE) -> list[Row]:
    """Every row of the facts file, with the rows of the changes file in place of theirs."""
    rows = read_rows(path)
    if changes is None:
        return rows
    newer = {(r.branch, r.metric): r for r in read_rows(changes)}
    kept = [newer.pop((r.branch, r.metric), r) for r in rows]
    return kept + list(newer.values())


def read_rows(path: Path) -> list[Row]:
    """Every row of one facts file (comment lines skipped)."""
    with path.open(newline="") as handle:
        lines = [line for line in handle if not line.startswith("#")]
    rows = []
    for record in csv.DictReader(lines, delimiter="\t"):
        low, _, high = record["versions"].partition("-")
        rows.append(
            Row(
                family=record["family"],
                metric=record["metric"],
                type=record["type"],
                labels=frozenset(filter(None, record["labels"].split(","))),
                branch=record["branch"],
                min_version=_version(low),
                max_version=_version(high),
                tags=tuple(filter(None, record["tags"].split(","))),
                skip=record["skip"].strip() == "skip",
            )
        )
    return rows


def applicable(rows: Iterable[Row], facts: ServerFacts, tags: Sequence[str] = ()) -> list[Row]:
    """The rows whose Go branch would be planned on a server with these facts."""
    exporter_tags = frozenset(tags)
    return [r for r in rows if skip_reason(r.as_collector(), facts, exporter_tags) is None]


@dataclass(frozen=True, slots=True)
class Offer:
    """One metric our planned library produces: its type and labels, and which branch."""

    type: str
    labels: frozenset[str]
    branch: str


def offers(
    definitions: Definitions, facts: ServerFacts, tags: Sequence[str] = ()
) -> dict[str, list[Offer]]:
    """Metric name → what our branches planned on this server produce under that name."""
    out: dict[str, list[Offer]] = {}
    for collector in make_plan(definitions, facts, tags).planned:
        labels = frozenset(c.output_name for c in collector.label_columns)
        for column in collector.value_columns:
            offer = Offer(column.usage.value, labels, collector.key)
            out.setdefault(collector.metric_name(column), []).append(offer)
    return out


def gaps(rows: Iterable[Row], ours: dict[str, list[Offer]]) -> list[str]:
    """One line per applicable row that our plan misses, mistypes or gives too few labels."""
    problems = []
    for row in rows:
        found = ours.get(row.metric)
        if not found:
            problems.append(f"missing: {row}")
            continue
        typed = [o for o in found if o.type == row.type]
        if not typed:
            kinds = ", ".join(sorted({f"{o.type} ({o.branch})" for o in found}))
            problems.append(f"mistyped: {row}; ours is {kinds}")
            continue
        if not any(row.labels <= o.labels for o in typed):
            short = sorted(row.labels - max((o.labels for o in typed), key=len))
            problems.append(f"short of labels {short}: {row}")
    return sorted(set(problems))


def coverage(rows: Iterable[Row], ours: dict[str, list[Offer]]) -> tuple[int, int]:
    """(rows satisfied, rows applicable), counting each metric name once."""
    names = {r.metric for r in rows}
    bad = {line.split(": ", 1)[1].split(" ", 1)[0] for line in gaps(rows, ours)}
    return len(names - bad), len(names)


def _main(argv: Sequence[str] | None = None) -> int:
    """Print the gaps of the default library for hand-made facts (no database needed)."""
    import argparse

    from exporter.loading import load_definitions

    parser = argparse.ArgumentParser(prog="python -m tests.gocompat", description=_main.__doc__)
    parser.add_argument("--version", type=int, default=180000, help="server_version_num")
    parser.add_argument("--replica", action="store_true", help="the server is in recovery")
    parser.add_argument("--pgbouncer", action="store_true", help="the target is pgBouncer")
    parser.add_argument("--family", default="", help="only rows of families starting so")
    parser.add_argument("--config", default=str(Path(__file__).parents[1] / "collectors"))
    args = parser.parse_args(argv)
    facts = ServerFacts(
        version=args.version,
        in_recovery=args.replica,
        datname="pgbouncer" if args.pgbouncer else "postgres",
        username="postgres",
        extensions=frozenset({"pg_stat_statements"}),
        pgbouncer=args.pgbouncer,
    )
    rows = [r for r in applicable(load_rows(), facts) if r.family.startswith(args.family)]
    ours = offers(load_definitions(args.config), facts)
    problems = gaps(rows, ours)
    print("\n".join(problems))
    done, total = coverage(rows, ours)
    print(f"{done}/{total} applicable metric names covered")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(_main())
