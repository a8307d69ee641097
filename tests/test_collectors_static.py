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

from exporter.collect.planning import PRIMARY_TAGS, REPLICA_TAGS, make_plan
from exporter.config.definitions import Collector, Definitions, Usage
from exporter.config.loading import load_definitions, read_document
from exporter.pg.preflight import ServerFacts
from exporter.pg.searchpath import SearchPath

LIBRARY = Path(__file__).resolve().parent.parent / "collectors"
DOC_FILE = LIBRARY / "0000-doc.yml"
SUPPORTED = (130000, 140000, 150000, 160000, 170000, 180000)
# Every family of the default library (issue 6), by where it may be planned.
CLUSTER_FAMILIES = (
    "pg", "pg_meta", "pg_setting",
    "pg_repl", "pg_sync_standby", "pg_downstream", "pg_slot", "pg_sub",
    "pg_archiver", "pg_timeline", "pg_size", "pg_size_wal", "pg_ssl",
    "pg_io", "pg_bgwriter", "pg_checkpointer", "pg_checkpoint", "pg_slru", "pg_wal",
    "pg_db", "pg_db_confl", "pg_activity", "pg_wait", "pg_wait_detail", "pg_backend", "pg_xact",
    "pg_xact_age",
    "pg_lock", "pg_query", "pg_vacuuming", "pg_indexing", "pg_clustering", "pg_backup",
)  # fmt: skip
PRIMARY_ONLY: tuple[str, ...] = ()
REPLICA_ONLY = ("pg_recv", "pg_recovery", "pg_recovery_prefetch")
PER_DATABASE = (
    "pg_table", "pg_index", "pg_func", "pg_seq", "pg_relkind", "pg_defpart",
    "pg_table_size", "pg_pubrel", "pg_subrel",
)  # fmt: skip
SKIPPED = frozenset({"pg_origin", "pg_shmem", "pg_table_bloat", "pg_index_bloat"})
PGBOUNCER = frozenset({"pgbouncer_list", "pgbouncer_database", "pgbouncer_stat", "pgbouncer_pool"})
REQUIRED = CLUSTER_FAMILIES + PRIMARY_ONLY + REPLICA_ONLY + PER_DATABASE
# Families whose view appeared after 13.
SINCE = {"pg_wal": 140000, "pg_recovery_prefetch": 150000, "pg_io": 160000}
PGBOUNCER_VERSIONS = (10800, 11500, 11600, 11700, 11800, 12200, 12300, 12400, 12500)
EXPENSIVE = re.compile(
    r"\b(pg_total_relation_size|pg_relation_size|pg_indexes_size|pg_database_size"
    r"|pg_ls_\w*dir|pg_stats)\b"
)
# Every field of the format (compatibility.md §3, plus our per-branch max_series).
FORMAT_FIELDS = frozenset(
    {"name", "desc", "query", "predicate_queries", "ttl", "timeout", "priority", "fatal"}
    | {"min_version", "max_version", "skip", "tags", "metrics", "max_series"}
    | {"predicate_query", "usage", "rename", "description", "default", "scale", "bucket"}
    | {"top", "by", "limit", "band", "hold", "churn", "keep", "other"}  # ours (issue 38)
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
        search_path=SearchPath.of(["pg_stat_statements\tpublic"], ["pg_catalog", "public"]),
    )


def bouncer(version: int) -> ServerFacts:
    """A pgBouncer admin console of the given version (1.22.1 is 12201)."""
    return ServerFacts(
        version=version, in_recovery=False, datname="pgbouncer", username="stats", pgbouncer=True
    )


def expected_families(version: int, in_recovery: bool) -> set[str]:
    """Families the main database of a server of this version and role must plan."""
    role = REPLICA_ONLY if in_recovery else PRIMARY_ONLY
    names = CLUSTER_FAMILIES + PER_DATABASE + role
    return {name for name in names if version >= SINCE.get(name, 0)}


def test_library_loads_without_problem_or_warning() -> None:
    """The directory loads with the exporter's loader: no skipped file, no warning."""
    definitions = library()
    assert definitions.skipped_files == ()
    assert definitions.warnings == ()
    assert len(definitions.collectors) >= len(REQUIRED) + len(SKIPPED) + len(PGBOUNCER)


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


def test_every_family_of_the_issue_exists() -> None:
    """Every family the default library promises is defined, and nothing else."""
    names = {collector.name for collector in library().collectors}
    assert names == set(REQUIRED) | SKIPPED | PGBOUNCER


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
def test_main_database_plans_each_family_once(version: int, in_recovery: bool) -> None:
    """On every version and role the main database plans exactly the expected families, once."""
    plan = make_plan(library(), facts(version, in_recovery), [])
    planned = [collector.name for collector in plan.planned]
    assert len(planned) == len(set(planned)), planned
    assert set(planned) == expected_families(version, in_recovery)


@pytest.mark.parametrize("version", SUPPORTED)
def test_discovered_databases_get_only_per_database_families(version: int) -> None:
    """A discovered database runs the per-database families, nothing cluster-wide."""
    plan = make_plan(library(), facts(version, False, is_main=False), [])
    assert {collector.name for collector in plan.planned} == set(PER_DATABASE)


def test_skipped_by_default_are_exactly_the_costly_or_privileged_ones() -> None:
    """pg_origin, pg_shmem and the bloat estimates exist but carry skip: true."""
    skipped = {collector.name for collector in library().collectors if collector.skip}
    assert skipped == SKIPPED


@pytest.mark.parametrize("version", PGBOUNCER_VERSIONS)
def test_pgbouncer_plans_its_four_families_and_nothing_else(version: int) -> None:
    """Against pgBouncer 1.8+ exactly one branch of each pgbouncer_* family is planned."""
    plan = make_plan(library(), bouncer(version), [])
    planned = [collector.name for collector in plan.planned]
    assert sorted(planned) == sorted(PGBOUNCER)


def test_pgbouncer_branches_are_tagged_show_commands() -> None:
    """pgBouncer branches are tagged SHOW commands from 1.8 on, never planned on PostgreSQL."""
    for collector in library().collectors:
        is_bouncer = collector.name.startswith("pgbouncer_")
        assert ("pgbouncer" in collector.tags) == is_bouncer, collector.key
        if is_bouncer:
            assert re.fullmatch(r"SHOW [A-Z_]+", collector.query.strip()), collector.key
            assert collector.min_version >= 10800, collector.key
    for version in SUPPORTED:
        plan = make_plan(library(), facts(version, False), [])
        assert not [c.key for c in plan.planned if c.name.startswith("pgbouncer_")]


def test_postgres_branches_start_at_a_supported_version() -> None:
    """Every PostgreSQL branch states min_version 13 or later, in server_version_num form."""
    for collector in library().collectors:
        if "pgbouncer" not in collector.tags:
            assert collector.min_version >= 130000, collector.key
            assert collector.max_version in (0, *SUPPORTED), collector.key


def test_costly_queries_cache_for_at_least_a_minute() -> None:
    """Branches that measure files, list directories or read pg_stats keep results >= 60 s."""
    for collector in library().collectors:
        if EXPENSIVE.search(collector.query):
            assert collector.ttl >= 60, collector.key


def test_snapshot_histograms_have_buckets() -> None:
    """pg_xact_age uses HISTOGRAM columns, each with a bucket list."""
    collectors = [c for c in library().collectors if c.name == "pg_xact_age"]
    assert collectors
    for collector in collectors:
        histograms = [c for c in collector.value_columns if c.usage is Usage.HISTOGRAM]
        assert histograms, collector.key
        assert all(len(column.buckets) >= 5 for column in histograms), collector.key


def test_per_database_branches_label_datname_and_bound_their_rows() -> None:
    """Per-database branches (not cluster, not pgBouncer) carry datname, and bound their
    series: a LIMIT, or ``top`` keeping datname in its remainder (issue 38)."""
    for collector in library().collectors:
        if "cluster" in collector.tags or "pgbouncer" in collector.tags:
            continue
        labels = [column.output_name for column in collector.label_columns]
        assert "datname" in labels, collector.key
        if collector.top is not None:
            assert collector.top.keep == ("datname",), collector.key
        else:
            assert re.search(r"\bLIMIT\s+\d+", collector.query, re.IGNORECASE), collector.key


def test_families_that_grow_with_the_workload_or_the_schema_are_ranked() -> None:
    """Statements, tables, indexes, functions, sequences and per-database families name
    at most a stated number of keys and sum the rest (issue 38); a gauge the remainder
    carries is one that adds up or whose largest is what an alert needs."""
    ranked = {c.name: c.top for c in library().collectors if c.top is not None}
    assert {"pg_query", "pg_func", "pg_seq", "pg_db", "pg_db_confl"} <= ranked.keys()
    assert {"pg_table", "pg_index"} <= ranked.keys()
    for collector in library().collectors:
        if collector.top is not None and collector.top.probe is not None:
            # A probe names the keys; the query reads them by $1 and tells each by id.
            assert "$1" in collector.query, collector.key
            assert collector.top.id in {c.name for c in collector.columns}, collector.key
            assert re.search(rf"\bAS\s+{collector.top.by}\b", collector.top.probe), collector.key
        if collector.top is not None:
            gauges = {c.name for c in collector.value_columns if c.usage is Usage.GAUGE}
            carried = set(collector.top.sum) | set(collector.top.max)
            assert carried <= gauges, collector.key
            assert collector.top.max == () or set(collector.top.max) <= {
                "age", "mxid_age", "used_ratio"
            }, collector.key  # fmt: skip


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
            # pg_seq's last_value is a sequence position (a counter, as in Go), not a time.
            is_last = column.name.startswith("last_") and column.name != "last_value"
            is_instant = is_last or column.name in {
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


# The columns of pg_subscription that PostgreSQL 13 lets every role read: `oid` is not
# one of them (14 adds it), so pg_monitor reading it fails with 42501 (issue 23).
PG13_SUBSCRIPTION_COLUMNS = frozenset(
    {"subdbid", "subname", "subowner", "subenabled", "subslotname", "subpublications"}
)
SUBSCRIPTION_ALIAS = re.compile(r"\bpg_subscription\s+AS\s+(\w+)", re.IGNORECASE)


@pytest.mark.parametrize("in_recovery", [False, True])
def test_branches_for_13_read_only_the_granted_subscription_columns(in_recovery: bool) -> None:
    """On 13 a pg_monitor role may read only some columns of pg_subscription."""
    for collector in make_plan(library(), facts(130000, in_recovery), []).planned:
        query = collector.query
        mentions = re.findall(r"\bpg_subscription\b(\s+AS\s+\w+)?", query, re.IGNORECASE)
        # Each mention names an alias, so the columns read through it can be checked.
        assert all(mentions), f"{collector.key}: write pg_subscription AS <alias>"
        for alias in SUBSCRIPTION_ALIAS.findall(query):
            used = set(re.findall(rf"\b{alias}\.(\w+)", query))
            assert used <= PG13_SUBSCRIPTION_COLUMNS, f"{collector.key}: {sorted(used)}"
