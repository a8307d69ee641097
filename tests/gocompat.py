"""The Go exporter's metric interface, read from the facts file, checked against our library.

``tests/data/go-pg_exporter-1.4.1-metrics.tsv`` lists every metric of the Go
exporter's shipped config: one row per metric per branch, with the branch's
version range and tags; ``go-pg_exporter-1.6-changes.tsv`` beside it holds the
rows that changed up to Go 1.6.1, the release we match, and replaces the 1.4.1
row of the same branch and metric. A row *applies* to a server when its branch would be
planned there; for every applicable row our library, planned on the same
server, must produce that name with that type and at least those labels.
Pure functions: the caller brings the facts.

For series themselves (the values and label text a scrape serves), :func:`series_of`
reads an exposition literally and :func:`compare_series` says where two differ;
:class:`GoExporter` runs a Go pg_exporter binary someone built beside the project
(never built here) so that facts can be recorded from it.
"""

from __future__ import annotations

import csv
import math
import re
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

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


_SAMPLE_LINE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)(?: \S+)?")
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?')


def series_of(exposition: str, prefix: str = "") -> dict[str, str]:
    """Every sample of a text exposition whose name starts with ``prefix``: its identity
    (name and label pairs sorted by label name, values as escaped on the wire, so byte
    by byte) → its value as written. Lines split on "\\n" only: a label may hold U+2028."""
    out: dict[str, str] = {}
    for line in exposition.split("\n"):
        if not line.startswith(prefix) or line.startswith("#"):
            continue
        match = _SAMPLE_LINE.fullmatch(line)
        if match is None:
            raise ValueError(f"not a sample line: {line[:200]!r}")
        name, block, value = match.groups()
        pairs = _PAIR.findall(block[1:-1]) if block else []
        rebuilt = ",".join(f'{k}="{v}"' for k, v in pairs)
        if block and rebuilt != block[1:-1].rstrip(","):
            raise ValueError(f"label block not understood: {line[:200]!r}")
        key = name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(pairs)) + "}"
        if key in out:
            raise ValueError(f"series written twice: {key[:200]}")
        out[key] = value
    return out


def same_value(a: str, b: str) -> bool:
    """Two sample values as Prometheus reads them (NaN equals NaN, 1e+06 equals 1000000.0)."""
    x, y = float(a), float(b)
    return x == y or (math.isnan(x) and math.isnan(y))


@dataclass(frozen=True, slots=True)
class Difference:
    """One series where two expositions disagree: only in Go's, only in ours, or valued
    differently (``go``/``ours`` None where the series is absent)."""

    series: str
    go: str | None
    ours: str | None

    @property
    def kind(self) -> str:
        """``missing`` (Go only), ``extra`` (ours only) or ``value``."""
        if self.ours is None:
            return "missing"
        return "extra" if self.go is None else "value"

    def __str__(self) -> str:
        return f"{self.kind}: {self.series[:300]} Go={self.go} ours={self.ours}"


def compare_series(go: Mapping[str, str], ours: Mapping[str, str]) -> list[Difference]:
    """Every series on which the two differ, in name order."""
    return [
        Difference(key, go.get(key), ours.get(key))
        for key in sorted(go.keys() | ours.keys())
        if key not in go or key not in ours or not same_value(go[key], ours[key])
    ]


def free_local_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class GoExporter:
    """A running Go pg_exporter binary (built elsewhere, given by path)."""

    process: subprocess.Popen[bytes]
    port: int

    def scrape(self, path: str = "/metrics", accept: str = "") -> str:
        """One GET of ``path``, as text."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}")
        if accept:
            request.add_header("Accept", accept)
        with urllib.request.urlopen(request, timeout=60) as answer:
            text: str = answer.read().decode("utf-8")
            return text


def go_command(binary: Path, url: str, config: Path, port: int) -> list[str]:
    """The command line the values facts were recorded with."""
    return [
        str(binary),
        f"--url={url}",
        f"--config={config}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--auto-discovery=false",
        "--disable-cache",
        "--log.level=warn",
    ]


@contextmanager
def go_exporter(binary: Path, url: str, config: Path, within: float = 30.0) -> Iterator[GoExporter]:
    """Run the Go binary on ``url`` with ``config`` until the block ends; it is ready when
    its ``/version`` answers."""
    port = free_local_port()
    # A file, not a pipe: Go stops when a pipe nobody reads is full of its warnings.
    command = go_command(binary, url, config, port)
    with tempfile.TemporaryFile() as log, subprocess.Popen(command, stderr=log) as process:
        running = GoExporter(process, port)
        try:
            _wait_until_serving(running, log, within)
            yield running
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()


def _wait_until_serving(go: GoExporter, log: IO[bytes], within: float) -> None:
    deadline = time.monotonic() + within
    while True:
        try:
            go.scrape("/version")
            return
        except OSError:
            if go.process.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                err = log.read().decode(errors="replace")[-2000:]
                raise RuntimeError(f"the Go exporter did not start: {err}") from None
            time.sleep(0.1)  # polled against the deadline above


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
