"""The shipped collector library (collectors/*.yml), checked without a database."""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.definitions import Collector, Definitions, Usage
from exporter.loading import load_definitions, read_document
from exporter.planning import PRIMARY_TAGS, REPLICA_TAGS, ServerFacts, make_plan

LIBRARY = Path(__file__).resolve().parent.parent / "collectors"
DOC_FILE = LIBRARY / "0000-doc.yml"
SUPPORTED = (130000, 140000, 150000, 160000, 170000, 180000)
REQUIRED = (
    "pg",
    "pg_meta",
    "pg_setting",
    "pg_db",
    "pg_activity",
    "pg_lock",
    "pg_size",
    "pg_bgwriter",
    "pg_checkpointer",
    "pg_wal",
    "pg_table",
    "pg_index",
)
SINCE = {"pg_wal": 140000}  # families whose view appeared after 13
# Every field of the format (compatibility.md §3, plus our per-branch max_series).
FORMAT_FIELDS = frozenset(
    {"name", "desc", "query", "predicate_queries", "ttl", "timeout", "priority", "fatal"}
    | {"min_version", "max_version", "skip", "tags", "metrics", "max_series"}
    | {"predicate_query", "usage", "rename", "description", "default", "scale", "bucket"}
)
SELF_METRICS = frozenset({"pg_up", "pg_version", "pg_in_recovery"})
FILE_NAME = re.compile(r"(\d{4})-([a-z0-9-]+)\.yml")
WRITES = re.compile(
    r"\b(INSERT|UPDATE|DELETE|MERGE|CREATE|ALTER|DROP|TRUNCATE|GRANT|REVOKE|COPY|VACUUM"
    r"|ANALYZE|NEXTVAL|SETVAL|PG_TERMINATE_BACKEND|PG_CANCEL_BACKEND|SET_CONFIG)\b",
    re.IGNORECASE,
)


@cache
def library() -> Definitions:
    """The whole directory, loaded once the way the exporter loads it."""
    return load_definitions(str(LIBRARY))


def collector_files() -> list[Path]:
    """Numbered files that define collectors (the doc file excluded)."""
    return sorted(path for path in LIBRARY.glob("*.yml") if path != DOC_FILE)


def raw_branches() -> dict[str, dict[str, Any]]:
    """Every branch as plain YAML data, to see fields the loader fills in by default."""
    branches: dict[str, dict[str, Any]] = {}
    for path in collector_files():
        branches.update(yaml.safe_load(path.read_text(encoding="utf-8")))
    return branches


def roles(collector: Collector) -> frozenset[str]:
    """Server roles a branch may be planned on, from its primary/replica tags."""
    tags = set(collector.tags)
    if tags & PRIMARY_TAGS:
        return frozenset({"primary"})
    if tags & REPLICA_TAGS:
        return frozenset({"replica"})
    return frozenset({"primary", "replica"})


def overlap(a: Collector, b: Collector) -> bool:
    """True when two half-open version ranges [min, max) share a version (0 = open)."""
    a_high = a.max_version or float("inf")
    b_high = b.max_version or float("inf")
    return a.min_version < b_high and b.min_version < a_high


def metric_names(collector: Collector) -> list[str]:
    """Family names a branch exposes."""
    names = []
    for column in collector.value_columns:
        base = collector.metric_name(column)
        if column.usage is Usage.HISTOGRAM:
            names += [f"{base}_bucket", f"{base}_count", f"{base}_sum"]
        else:
            names.append(base)
    return names


def facts(version: int, in_recovery: bool, *, is_main: bool = True) -> ServerFacts:
    """A server with every extension the library may ask for."""
    return ServerFacts(
        version=version,
        in_recovery=in_recovery,
        datname="postgres" if is_main else "app",
        username="monitor",
        extensions=frozenset({"pg_stat_statements"}),
        is_main=is_main,
    )


def test_library_loads_without_problem_or_warning() -> None:
    """The directory loads with the exporter's loader: no skipped file, no warning."""
    definitions = library()
    assert definitions.skipped_files == ()
    assert definitions.warnings == ()
    assert len(definitions.collectors) >= len(REQUIRED)


def test_every_numbered_file_defines_branches_of_its_family() -> None:
    """Files are NNNN-family.yml and each of their branch names starts with that family."""
    by_source: dict[str, list[Collector]] = defaultdict(list)
    for collector in library().collectors:
        by_source[Path(collector.source).name].append(collector)
    for path in collector_files():
        match = FILE_NAME.fullmatch(path.name)
        assert match, f"{path.name}: expected NNNN-family-name.yml"
        family = match.group(2).replace("-", "_")
        assert by_source[path.name], f"{path.name} defines no branch"
        for collector in by_source[path.name]:
            assert re.fullmatch(rf"{family}(_\w+)?", collector.name), (path.name, collector.key)


def test_doc_file_is_comments_only_and_documents_every_field() -> None:
    """0000-doc.yml defines no branch and names every field and usage of the format."""
    text = DOC_FILE.read_text(encoding="utf-8")
    parsed = read_document(text, str(DOC_FILE), 0)
    assert parsed.collectors == ()
    assert parsed.problems == ()
    assert all(line.startswith("#") for line in text.splitlines() if line.strip())
    words = set(re.findall(r"[a-z_]+", text.lower()))
    documented = FORMAT_FIELDS | {usage.value.lower() for usage in Usage}
    assert documented - words == set()


def test_required_families_exist() -> None:
    """Every family the starter library promises is defined."""
    names = {collector.name for collector in library().collectors}
    assert set(REQUIRED) - names == set()


def test_branches_of_one_name_never_overlap_for_the_same_role() -> None:
    """Two branches sharing a name never both fit one version and recovery state."""
    by_name: dict[str, list[Collector]] = defaultdict(list)
    for collector in library().collectors:
        by_name[collector.name].append(collector)
    for branches in by_name.values():
        for a, b in itertools.combinations(branches, 2):
            clash = roles(a) & roles(b) and overlap(a, b)
            assert not clash, f"{a.key} and {b.key} overlap for {sorted(roles(a) & roles(b))}"


@pytest.mark.parametrize("version", SUPPORTED)
@pytest.mark.parametrize("in_recovery", [False, True])
def test_main_database_plans_each_required_family_once(version: int, in_recovery: bool) -> None:
    """On every supported version and role, planning picks exactly one branch per family."""
    plan = make_plan(library(), facts(version, in_recovery), [])
    planned = [collector.name for collector in plan.planned]
    assert len(planned) == len(set(planned)), planned
    expected = {name for name in REQUIRED if version >= SINCE.get(name, 0)}
    assert expected - set(planned) == set()


@pytest.mark.parametrize("version", SUPPORTED)
def test_discovered_databases_get_only_per_database_families(version: int) -> None:
    """A discovered database runs pg_table and pg_index, nothing cluster-wide."""
    plan = make_plan(library(), facts(version, False, is_main=False), [])
    assert {collector.name for collector in plan.planned} == {"pg_table", "pg_index"}


def test_per_database_branches_label_datname_and_bound_their_rows() -> None:
    """Branches without `cluster` carry a datname label and a LIMIT on their rows."""
    for collector in library().collectors:
        if "cluster" in collector.tags:
            continue
        labels = [column.output_name for column in collector.label_columns]
        assert "datname" in labels, collector.key
        assert re.search(r"\bLIMIT\s+\d+", collector.query, re.IGNORECASE), collector.key


def test_metric_names_are_unique_across_families() -> None:
    """A metric name comes from one family only and never shadows a self-metric."""
    owners: dict[str, set[str]] = defaultdict(set)
    for collector in library().collectors:
        for name in metric_names(collector):
            owners[name].add(collector.name)
    shared = {name: sorted(families) for name, families in owners.items() if len(families) > 1}
    assert shared == {}
    assert SELF_METRICS & owners.keys() == set()
    assert [name for name in owners if name.startswith("pg_exporter_")] == []


def test_every_column_has_a_description() -> None:
    """Labels and values alike explain themselves in the exposition's HELP."""
    for collector in library().collectors:
        assert collector.desc.strip(), collector.key
        for column in collector.columns:
            assert column.description.strip(), f"{collector.key}.{column.name}"


def test_every_branch_states_a_positive_timeout_and_ttl() -> None:
    """timeout is written out and positive; ttl is positive and at most five minutes."""
    for key, body in raw_branches().items():
        assert isinstance(body.get("timeout"), int | float), key
        assert body["timeout"] > 0, key
        assert 0 < body.get("ttl", 0) <= 300, key


def test_points_in_time_are_gauges() -> None:
    """Timestamps (last_*, *_time of an event) are never typed as counters."""
    for collector in library().collectors:
        for column in collector.value_columns:
            is_instant = column.name.startswith("last_") or column.name in {
                "reset_time",
                "boot_time",
                "checkpoint_time",
                "conf_reload_time",
            }
            if is_instant:
                assert column.usage is Usage.GAUGE, f"{collector.key}.{column.name}"


def test_queries_are_plain_reads() -> None:
    """No query uses a keyword or function that writes or acts on the server."""
    for collector in library().collectors:
        found = WRITES.findall(collector.query)
        assert found == [], f"{collector.key}: {found}"
