"""Every PostgreSQL type as a value and as a label, beside the Go exporter (issue 30).

``tests/data/gocompat/values/cases.yml`` lists SQL expressions by type; :func:`config`
turns them into one collector file that both exporters run. The Go 1.4.1 binary's
answer to it, on PostgreSQL 18 and 13, is recorded beside the cases (``go-<server>.prom``
with ``go-<server>.json`` saying how); ``tests/integration/test_go_values.py``
compares ours with it series by series.

Re-recording is a manual step that runs a Go binary someone built outside this
repository (docs/compatibility.md, "Differences kept on purpose")::

    python -m tests.govalues --go-binary /path/to/pg_exporter-1.4.1
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import yaml

from rigs.localpg import LocalCluster, bindir_for
from tests.gocompat import go_command, go_exporter

VALUES_DIR = Path(__file__).parent / "data" / "gocompat" / "values"
CASES_FILE = VALUES_DIR / "cases.yml"
DATABASE = "gocompat_values"
PREFIX = "gv_"  # every family of the cases, and only those
MAJORS = (18, 13)  # the newest and the oldest server we claim

# The columns each type's collectors read: (column, its metrics entry).
VALUE_COLUMNS: tuple[tuple[str, dict[str, object]], ...] = (
    ("g", {"usage": "GAUGE"}),
    ("c", {"usage": "COUNTER"}),
    ("s", {"usage": "GAUGE", "scale": 1000}),
    ("d", {"usage": "GAUGE", "default": 7}),
    ("ds", {"usage": "GAUGE", "default": 7, "scale": 1000}),
)
LABEL_COLUMNS: tuple[tuple[str, dict[str, object]], ...] = (
    ("l", {"usage": "LABEL"}),
    ("ld", {"usage": "LABEL", "default": 7}),
    ("ls", {"usage": "LABEL", "scale": 1000}),
)


@dataclass(frozen=True, slots=True)
class TypeCase:
    """One type's expressions, and where a server can produce them."""

    name: str
    values: tuple[str, ...]
    min_version: int = 0
    needs: str = ""


@dataclass(frozen=True, slots=True)
class Cases:
    """The whole cases file."""

    setup: str
    types: tuple[TypeCase, ...]
    collectors: Mapping[str, Any]


def load_cases(path: Path = CASES_FILE) -> Cases:
    """The cases file, read."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    types = []
    for name, spec in data["types"].items():
        if isinstance(spec, list):
            types.append(TypeCase(name, tuple(spec)))
        else:
            values = tuple(spec["values"])
            types.append(TypeCase(name, values, spec.get("min_version", 0), spec.get("needs", "")))
    return Cases(data["setup"], tuple(types), data.get("collectors") or {})


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _rows(values: Iterable[str]) -> str:
    return ", ".join(f"({_literal(v)}, {v})" for v in values)


def _collector(query: str, columns: Sequence[tuple[str, dict[str, object]]]) -> dict[str, object]:
    metrics = [{"k": {"usage": "LABEL"}}] + [{name: dict(spec)} for name, spec in columns]
    return {"query": query, "ttl": 0, "timeout": 10, "metrics": metrics}


def type_collectors(case: TypeCase) -> dict[str, object]:
    """The two collectors of one type: its expressions as values, and as labels."""
    rows = _rows(case.values)
    as_values = ", ".join(f"v AS {name}" for name, _ in VALUE_COLUMNS)
    as_labels = ", ".join(f"v AS {name}" for name, _ in LABEL_COLUMNS)
    source = f"FROM (VALUES {rows}) AS t(k, v)"
    label_columns: tuple[tuple[str, dict[str, object]], ...] = (
        *LABEL_COLUMNS,
        ("one", {"usage": "GAUGE"}),
    )
    return {
        f"{PREFIX}{case.name}_value": _collector(f"SELECT k, {as_values} {source}", VALUE_COLUMNS),
        f"{PREFIX}{case.name}_label": _collector(
            f"SELECT k, {as_labels}, 1 AS one {source}", label_columns
        ),
    }


def config(cases: Cases, version: int, features: frozenset[str]) -> str:
    """The collector file for a server of this version with these features."""
    branches: dict[str, object] = {}
    for case in cases.types:
        if version >= case.min_version and (not case.needs or case.needs in features):
            branches.update(type_collectors(case))
    branches.update(cases.collectors)
    return yaml.safe_dump(branches, sort_keys=False, width=1 << 20, allow_unicode=False)


def digest(text: str) -> str:
    """The SHA-256 of a config's text, recorded with the facts it produced."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def prepare(cluster: LocalCluster, cases: Cases) -> frozenset[str]:
    """Create the cases' database (if missing) with the types they use; the features the
    server has."""
    exists = cluster.psql(f"SELECT 1 FROM pg_database WHERE datname = {_literal(DATABASE)}")
    if not exists:
        cluster.psql(f"CREATE DATABASE {DATABASE}")
        cluster.psql(cases.setup, dbname=DATABASE)
    return features_of(cluster)


def features_of(cluster: LocalCluster) -> frozenset[str]:
    """Optional server features the cases need: libxml for the ``xml`` type."""
    try:
        cluster.psql("SELECT '<a/>'::xml", dbname=DATABASE)
    except Exception:  # an error is the answer: built without libxml
        return frozenset()
    return frozenset({"libxml"})


def golden_paths(major: int) -> tuple[Path, Path]:
    """(exposition, how it was recorded) for a server major version."""
    return VALUES_DIR / f"go-pg{major}.prom", VALUES_DIR / f"go-pg{major}.json"


def cases_only(exposition: str) -> str:
    """The lines of an exposition that belong to the cases' families."""
    keep = [
        line
        for line in exposition.split("\n")
        if line.startswith(PREFIX) or line.startswith((f"# HELP {PREFIX}", f"# TYPE {PREFIX}"))
    ]
    return "\n".join(keep) + "\n"


@contextmanager
def _cluster(major: int) -> Iterator[LocalCluster]:
    with LocalCluster(bindir_for(major)) as cluster:
        yield cluster


def record(binary: Path, major: int) -> None:
    """Run the Go binary on a fresh server of this major with the cases' config; write
    its answer and how it was obtained."""
    cases = load_cases()
    asked = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=True)
    version = (asked.stdout or asked.stderr).strip()  # kingpin writes it to stderr
    with _cluster(major) as cluster, tempfile.TemporaryDirectory() as scratch:
        features = prepare(cluster, cases)
        text = config(cases, cluster.version, features)
        path = Path(scratch) / "gocompat-values.yml"
        path.write_text(text, encoding="utf-8")
        url = cluster.dsn(DATABASE)
        with go_exporter(binary, url, path) as go:
            exposition = cases_only(go.scrape())
        with psycopg.connect(url) as conn:
            server = conn.execute("SELECT version()").fetchone()
    prom, meta = golden_paths(major)
    prom.write_text(exposition, encoding="utf-8")
    where = f"postgresql://postgres@127.0.0.1:PORT/{DATABASE}?sslmode=disable"
    command = go_command(Path(binary.name), where, Path(path.name), 0)
    facts = {
        "binary": version,
        "server": server[0] if server else "",
        "server_version_num": cluster.version,
        "features": sorted(features),
        "config_sha256": digest(text),
        "command": [part.replace("127.0.0.1:0", "127.0.0.1:PORT") for part in command],
        "scrape": "one GET /metrics after /version answered, lines of gv_* families kept",
        "recorded": dt.date.today().isoformat(),
        "recorder": "python -m tests.govalues --go-binary PATH",
    }
    meta.write_text(json.dumps(facts, indent=2) + "\n", encoding="utf-8")
    print(f"{prom.name}: {exposition.count(chr(10))} lines from {version} on {facts['server']}")


def main(argv: Sequence[str] | None = None) -> int:
    """Record the Go exporter's answers to the value cases."""
    parser = argparse.ArgumentParser(prog="python -m tests.govalues", description=main.__doc__)
    parser.add_argument("--go-binary", type=Path, required=True, help="a Go pg_exporter 1.4.1")
    parser.add_argument("--major", type=int, action="append", help="server majors (18, 13)")
    args = parser.parse_args(argv)
    for major in args.major or MAJORS:
        record(args.go_binary, major)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
