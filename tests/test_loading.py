"""Collector files: YAML reading, validation with located problems, directory merging."""

from __future__ import annotations

import os
import textwrap
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from exporter.config.definitions import (
    DEFAULT_TIMEOUT,
    Collector,
    Column,
    Definitions,
    Predicate,
    Usage,
)
from exporter.config.loading import load_definitions, load_for_settings, read_document
from exporter.config.settings import Settings
from exporter.config.yamlfiles import MAX_ALIAS_EXPANSION, MAX_FILE_CHARS, MAX_VALUES
from exporter.errors import ConfigError, Problem

GAUGE_ONLY = "metrics: [{v: {usage: GAUGE}}]"


def parse_document(
    text: str, source: str, file_index: int
) -> tuple[list[Collector], list[Problem]]:
    """One file's branches and problems, as the loader reads them (warnings aside)."""
    parsed = read_document(text, source, file_index)
    return list(parsed.collectors), list(parsed.problems)


def parse(text: str, index: int = 0) -> list[Collector]:
    """Branches of a document that must be valid."""
    collectors, problems = parse_document(textwrap.dedent(text), "c.yml", index)
    assert problems == []
    return collectors


def problems_of(text: str) -> dict[str, str]:
    """Problems of a document that must be invalid, by location."""
    collectors, problems = parse_document(textwrap.dedent(text), "c.yml", 0)
    assert problems, "expected at least one problem"
    assert collectors == []
    return {problem.location: problem.message for problem in problems}


def branch(fields: str = "", metrics: str = GAUGE_ONLY) -> str:
    """A branch ``b`` with a query, the given extra fields and metrics."""
    lines = ["b:", "  query: SELECT 1 AS v", f"  {metrics}"]
    lines += [f"  {line}" for line in textwrap.dedent(fields).strip().splitlines()]
    return "\n".join(lines) + "\n"


def column_problems(*columns: str) -> dict[str, str]:
    """Problems of branch ``b`` whose metrics list is the given entries."""
    metrics = "\n".join(f"    - {column}" for column in columns)
    return problems_of(f"b:\n  query: SELECT 1\n  metrics:\n{metrics}\n")


# --- valid documents ---------------------------------------------------------------


def test_full_branch_becomes_frozen_collector() -> None:
    """Every documented field lands in the matching Collector/Column/Predicate field."""
    (collector,) = parse(
        """
        pg_db:
          name: pg_database
          desc: per database
          query: SELECT datname, n, lat FROM x
          ttl: 10
          timeout: 2.5
          priority: 7
          min_version: 100000
          max_version: 180000
          fatal: true
          skip: false
          tags: [cluster, primary]
          max_series: 500
          backoff_ceiling: 120
          predicate_queries:
            - {name: has_x, predicate_query: SELECT true, ttl: 60}
          metrics:
            - datname: {usage: label, rename: db, description: name}
            - n: {usage: Counter, default: 0, scale: 1e-3}
            - lat: {usage: HISTOGRAM, bucket: [0.1, 1, 10]}
        """
    )
    assert collector == Collector(
        key="pg_db",
        name="pg_database",
        query="SELECT datname, n, lat FROM x",
        columns=(
            Column("datname", Usage.LABEL, rename="db", description="name"),
            Column("n", Usage.COUNTER, default=0.0, scale=0.001),
            Column("lat", Usage.HISTOGRAM, buckets=(0.1, 1.0, 10.0)),
        ),
        desc="per database",
        predicates=(Predicate("has_x", "SELECT true", 60.0),),
        ttl=10.0,
        timeout=2.5,
        priority=7,
        min_version=100000,
        max_version=180000,
        fatal=True,
        tags=("cluster", "primary"),
        max_series=500,
        backoff_ceiling=120.0,
        source="c.yml",
    )


def test_name_defaults_to_key_and_priority_to_the_files_default() -> None:
    """Without name the key is the prefix; without priority the file's default applies."""
    (collector,) = parse(branch(), index=103)
    assert (collector.name, collector.priority) == ("b", 103)


def test_priority_zero_counts_as_absent() -> None:
    """``priority: 0`` gets the file default, as the Go exporter's zero value does."""
    (collector,) = parse(branch("priority: 0"), index=102)
    assert collector.priority == 102


@pytest.mark.parametrize(
    ("field", "value", "read"),
    [("min_version", "9.6", 9), ("max_version", "130000.9", 130000), ("priority", "1.5", 1)],
)
def test_an_integer_with_a_fraction_loses_it_with_a_warning(
    field: str, value: str, read: int
) -> None:
    """Go reads ``min_version: 9.6`` as 9 (every server passes): so do we, and say so."""
    parsed = read_document(branch(f"{field}: {value}"), "c.yml", 0)
    (collector,) = parsed.collectors
    assert getattr(collector, field) == read
    assert any(f"c.yml:b.{field}: {value} is read as {read}" in w for w in parsed.warnings)


@pytest.mark.parametrize(
    ("value", "read"),
    [("y", True), ("'yes'", True), ("'ON'", True), ("n", False), ("'off'", False)],
)
def test_flags_take_the_words_gos_yaml_reads_as_booleans(value: str, read: bool) -> None:
    """``fatal: y`` or ``fatal: 'yes'`` is true to Go's YAML library, so to us too."""
    (collector,) = parse(branch(f"fatal: {value}\nskip: {value}"))
    assert (collector.fatal, collector.skip) == (read, read)


def test_a_columns_name_field_names_the_result_column() -> None:
    """``- v: {name: w, usage: GAUGE}`` reads column w, as the Go exporter does."""
    (collector,) = parse(branch(metrics="metrics: [{v: {name: w, usage: GAUGE}}]"))
    assert [c.name for c in collector.columns] == ["w"]
    assert collector.metric_name(collector.columns[0]) == "b_w"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", DEFAULT_TIMEOUT),
        ("timeout: 0", DEFAULT_TIMEOUT),
        ("timeout: -1", None),
        ("timeout: 2.5", 2.5),
        ("timeout: 3", 3.0),
    ],
)
def test_timeout_defaults(text: str, expected: float | None) -> None:
    """Absent or 0 → 0.1 s, negative → unbounded (None), positive → itself."""
    (collector,) = parse(branch(text))
    assert collector.timeout == expected


def test_leading_zero_versions_read_as_decimal() -> None:
    """``090600`` (not octal, not a string) and ``070000`` (not octal) read as decimal."""
    (collector,) = parse(branch("min_version: 090600\nmax_version: 070000"))
    assert (collector.min_version, collector.max_version) == (90600, 70000)


def test_other_scalars_keep_their_yaml_meaning() -> None:
    """The version fix leaves booleans, hex and quoted text alone; ``1e-3`` is a number."""
    (collector,) = parse(
        branch(
            "fatal: yes\npriority: 0x10\ndesc: '090600'",
            "metrics: [{v: {usage: GAUGE, scale: 1e-3}}]",
        )
    )
    assert (collector.fatal, collector.priority, collector.desc) == (True, 16, "090600")
    assert collector.columns[0].scale == 0.001


def test_numeric_text_scale_and_default_are_accepted() -> None:
    """Quoted numbers in scale/default parse, as the Go exporter reads them as text."""
    (collector,) = parse(
        branch(metrics="metrics: [{v: {usage: GAUGE, scale: '0.5', default: '-1'}}]")
    )
    assert (collector.columns[0].scale, collector.columns[0].default) == (0.5, -1.0)


def test_unknown_fields_are_warnings_not_problems() -> None:
    """Unknown branch, column and predicate fields are reported as warnings only."""
    text = branch(
        "colour: blue\npredicate_queries: [{predicate_query: SELECT true, when: now}]",
        "metrics: [{v: {usage: GAUGE, unit: s}}]",
    )
    parsed = read_document(text, "c.yml", 0)
    assert parsed.problems == ()
    assert len(parsed.collectors) == 1
    joined = "\n".join(parsed.warnings)
    for location in (
        "c.yml:b.colour",
        "c.yml:b.metrics[0].unit",
        "c.yml:b.predicate_queries[0].when",
    ):
        assert location in joined
    assert "unknown field" in joined


def test_a_duplicate_branch_key_refuses_the_file_naming_both_lines() -> None:
    """A key repeated in one mapping is a problem, as Go's YAML library makes it."""
    text = branch() + "b:\n  query: SELECT 2\n  " + GAUGE_ONLY + "\n"
    assert problems_of(text) == {
        "c.yml:line 4": "key 'b' is already defined at line 1 of the same mapping; keep one "
        "of them (the Go exporter refuses such a file too)"
    }


def test_a_duplicate_field_refuses_the_file() -> None:
    """Not only branch keys: ``{usage: GAUGE, usage: LABEL}`` is refused too."""
    found = problems_of(branch(metrics="metrics: [{v: {usage: GAUGE, usage: LABEL}}]"))
    assert "key 'usage' is already defined at line 3" in found["c.yml:line 3"]


def test_empty_document_has_no_branches_and_no_problems() -> None:
    """An empty (or comment-only) file gives nothing, which is not itself a problem."""
    assert parse_document("# nothing yet\n", "c.yml", 0) == ([], [])


def test_le_label_allowed_without_histogram() -> None:
    """``le`` is only reserved in branches that have a HISTOGRAM column."""
    (collector,) = parse(branch(metrics="metrics: [{le: {usage: LABEL}}, {v: {usage: GAUGE}}]"))
    assert collector.label_columns[0].name == "le"


# --- rejections, each with its location ----------------------------------------------


def test_malformed_yaml_names_the_line() -> None:
    """A syntax error is one problem located at its line."""
    found = problems_of("b:\n  query: SELECT 1\n  metrics: [\n")
    (location,) = found
    assert location.startswith("c.yml:line ")
    assert "malformed YAML" in found[location]


def test_top_level_must_be_a_mapping() -> None:
    """A list at the top level is rejected at the file."""
    assert "the top level must map branch names" in problems_of("- a\n- b\n")["c.yml"]


def test_branch_must_be_a_mapping() -> None:
    """A branch whose value is not a mapping is rejected at the branch key."""
    assert "must be a mapping" in problems_of("b: [1, 2]\n")["c.yml:b"]


@pytest.mark.parametrize("query", ["", "query: '   '", "query: 42"])
def test_query_is_required_and_not_blank(query: str) -> None:
    """Missing, blank or non-text query is rejected at ``b.query``."""
    text = f"b:\n  {GAUGE_ONLY}\n" + (f"  {query}\n" if query else "")
    assert "query is required" in problems_of(text)["c.yml:b.query"]


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("ttl", "-1", "seconds >= 0"),
        ("ttl", "soon", "seconds >= 0"),
        ("timeout", "fast", "expected seconds"),
        ("priority", "high", "expected an integer"),
        ("min_version", "'9.6'", "version number"),
        ("max_version", "'130000'", "version number"),
        ("min_version", "-1", "at least 0"),
        ("fatal", "'true'", "true or false"),
        ("skip", "1", "true or false"),
        ("max_series", "0", "at least 1"),
        ("max_series", "many", "expected an integer"),
        ("backoff_ceiling", "-5", "seconds >= 0"),
        ("backoff_ceiling", ".inf", "seconds >= 0"),
        ("backoff_ceiling", "later", "seconds >= 0"),
    ],
)
def test_bad_scalar_fields(field: str, value: str, expected: str) -> None:
    """Wrongly typed or out-of-range branch fields are rejected at ``b.<field>``."""
    assert expected in problems_of(branch(f"{field}: {value}"))[f"c.yml:b.{field}"]


def test_blank_predicate_is_rejected() -> None:
    """A predicate without SQL is rejected at its ``predicate_query``."""
    text = branch("predicate_queries:\n  - {name: ok, predicate_query: SELECT true}\n  - {name: p}")
    assert "blank predicate" in problems_of(text)["c.yml:b.predicate_queries[1].predicate_query"]


def test_predicate_ttl_and_shape_are_checked() -> None:
    """Predicate entries must be mappings with a ttl >= 0."""
    text = branch("predicate_queries:\n  - SELECT true\n  - {predicate_query: SELECT 1, ttl: -5}")
    found = problems_of(text)
    assert "expected a mapping" in found["c.yml:b.predicate_queries[0]"]
    assert "seconds >= 0" in found["c.yml:b.predicate_queries[1].ttl"]


@pytest.mark.parametrize("metrics", ["", "metrics: []", "metrics: {v: {usage: GAUGE}}"])
def test_metrics_must_be_a_non_empty_list(metrics: str) -> None:
    """Missing, empty or non-list metrics are rejected at ``b.metrics``."""
    text = "b:\n  query: SELECT 1\n" + (f"  {metrics}\n" if metrics else "")
    assert "non-empty list" in problems_of(text)["c.yml:b.metrics"]


def test_metrics_entry_needs_exactly_one_key() -> None:
    """Entries with two keys or that are not maps are rejected at their index."""
    found = column_problems("v: {usage: GAUGE}", "{a: {usage: GAUGE}, b: {usage: GAUGE}}", "plain")
    assert "exactly one key" in found["c.yml:b.metrics[1]"]
    assert "2 keys" in found["c.yml:b.metrics[1]"]
    assert "exactly one key" in found["c.yml:b.metrics[2]"]


def test_column_needs_field_mapping() -> None:
    """``- v:`` with no fields is rejected: usage is needed."""
    assert "needs a map" in column_problems("w: {usage: GAUGE}", "v:")["c.yml:b.metrics[1]"]


@pytest.mark.parametrize("usage", ["{usage: GAUGES}", "{usage: 3}", "{rename: x}"])
def test_unknown_or_missing_usage(usage: str) -> None:
    """Usage must be one of the five words; the message lists them."""
    message = column_problems("w: {usage: GAUGE}", f"v: {usage}")["c.yml:b.metrics[1].usage"]
    assert "DISCARD, LABEL, GAUGE, COUNTER, HISTOGRAM" in message


@pytest.mark.parametrize("field", ["scale", "default"])
def test_non_numeric_scale_or_default(field: str) -> None:
    """scale and default must be numbers (or numeric text)."""
    found = column_problems(f"v: {{usage: GAUGE, {field}: lots}}")
    assert "number" in found[f"c.yml:b.metrics[0].{field}"]


def test_scale_must_be_finite() -> None:
    """An infinite scale would turn every sample into ±Inf or NaN."""
    assert "finite" in column_problems("v: {usage: GAUGE, scale: .inf}")["c.yml:b.metrics[0].scale"]


@pytest.mark.parametrize(
    ("bucket", "expected"),
    [
        ("", "needs bucket"),
        (", bucket: []", "needs bucket"),
        (", bucket: [1, 1]", "strictly increasing"),
        (", bucket: [5, 1]", "strictly increasing"),
        (", bucket: [1, .inf]", "finite"),
        (", bucket: [1, .nan]", "finite"),
        (", bucket: [a, b]", "must be numbers"),
    ],
)
def test_histogram_buckets(bucket: str, expected: str) -> None:
    """HISTOGRAM needs a non-empty, finite, strictly increasing numeric bucket list."""
    found = column_problems(f"h: {{usage: HISTOGRAM{bucket}}}")
    assert expected in found["c.yml:b.metrics[0].bucket"]


@pytest.mark.parametrize("usage", ["GAUGE", "COUNTER", "LABEL", "DISCARD"])
def test_bucket_on_non_histogram_column_is_ignored_with_a_warning(usage: str) -> None:
    """bucket on another column is ignored, as by Go, and the log says so."""
    metrics = f"metrics: [{{c: {{usage: {usage}, bucket: [1, 2]}}}}, {{v: {{usage: GAUGE}}}}]"
    parsed = read_document(branch(metrics=metrics), "c.yml", 0)
    (collector,) = parsed.collectors
    assert collector.columns[0].buckets == ()
    assert parsed.warnings == (
        f"c.yml:b.metrics[0].bucket: bucket is read only for a HISTOGRAM column; ignored on "
        f"a {usage} column: remove it",
    )


def test_bucket_that_is_no_list_of_numbers_is_refused_on_any_column() -> None:
    """Go's YAML library cannot read it into its list of numbers: the file is refused."""
    found = column_problems("v: {usage: GAUGE, bucket: fast}")
    assert found["c.yml:b.metrics[0].bucket"] == "bucket must be a list of numbers, got 'fast'"


def test_duplicate_column() -> None:
    """The second listing of a column is rejected, naming the first."""
    found = column_problems("v: {usage: GAUGE}", "v: {usage: COUNTER, rename: w}")
    assert "already at b.metrics[0]" in found["c.yml:b.metrics[1]"]


def test_branch_without_value_column() -> None:
    """A branch with only LABEL/DISCARD columns yields nothing and is rejected."""
    found = column_problems("a: {usage: LABEL}", "b: {usage: DISCARD}")
    assert "no GAUGE, COUNTER or HISTOGRAM" in found["c.yml:b.metrics"]


def test_misspelt_value_column_is_not_reported_as_missing() -> None:
    """A misspelt usage is the one problem; no misleading 'no GAUGE column' on top."""
    found = column_problems("a: {usage: LABEL}", "v: {usage: GAGUE}")
    assert found.keys() == {"c.yml:b.metrics[1].usage"}


@pytest.mark.parametrize("label", ["9lives", "has-dash", "__reserved"])
def test_invalid_label_name_after_rename(label: str) -> None:
    """Label names (after rename) must be valid Prometheus names, not ``__``-prefixed."""
    found = column_problems(f"a: {{usage: LABEL, rename: '{label}'}}", "v: {usage: GAUGE}")
    assert "invalid label name" in found["c.yml:b.metrics[0].rename"]


def test_invalid_label_name_without_rename() -> None:
    """An unrenamed invalid column name is reported at the entry itself."""
    found = column_problems("'my col': {usage: LABEL}", "v: {usage: GAUGE}")
    assert "invalid label name 'my col'" in found["c.yml:b.metrics[0]"]


def test_duplicate_label_after_rename() -> None:
    """Two columns renamed to one label name are rejected at the second."""
    found = column_problems(
        "a: {usage: LABEL}", "b: {usage: LABEL, rename: a}", "v: {usage: GAUGE}"
    )
    assert "also produced by b.metrics[0]" in found["c.yml:b.metrics[1].rename"]


def test_le_label_reserved_with_histogram() -> None:
    """``le`` as a label clashes with bucket bounds in a branch with a HISTOGRAM."""
    found = column_problems("le: {usage: LABEL}", "h: {usage: HISTOGRAM, bucket: [1]}")
    assert "reserved" in found["c.yml:b.metrics[0]"]


def test_invalid_metric_name() -> None:
    """``<name>_<rename>`` must be a valid metric name."""
    found = column_problems("v: {usage: GAUGE, rename: 'per-sec'}")
    assert "invalid metric name 'b_per-sec'" in found["c.yml:b.metrics[0].rename"]


def test_invalid_prefix_from_name_or_key() -> None:
    """A bad ``name``, or a key used as prefix that is no metric name, is rejected once."""
    assert "name must match" in problems_of(branch("name: 'my-prefix'"))["c.yml:b.name"]
    text = "'my-key':\n  query: SELECT 1\n  metrics: [{v: {usage: GAUGE}}, {w: {usage: GAUGE}}]\n"
    assert problems_of(text).keys() == {"c.yml:my-key"}


def test_two_columns_same_family() -> None:
    """Two value columns renamed to one metric are rejected at the second."""
    found = column_problems("a: {usage: GAUGE}", "c: {usage: COUNTER, rename: a}")
    assert "'b_a' is also produced by b.metrics[0]" in found["c.yml:b.metrics[1].rename"]


def test_histogram_families_clash_with_gauge() -> None:
    """A histogram's ``_count`` family collides with a gauge of that name."""
    found = column_problems("x_count: {usage: GAUGE}", "x: {usage: HISTOGRAM, bucket: [1]}")
    assert "'b_x_count'" in found["c.yml:b.metrics[1]"]


def test_tags_must_be_list_of_strings() -> None:
    """tags must be a list of non-blank strings; ``kind:`` tags need a name."""
    assert "list of strings" in problems_of(branch("tags: primary"))["c.yml:b.tags"]
    found = problems_of(branch("tags: [cluster, 7, '', 'extension:']"))
    assert "non-blank string" in found["c.yml:b.tags[1]"]
    assert "non-blank string" in found["c.yml:b.tags[2]"]
    assert "needs a name after the colon" in found["c.yml:b.tags[3]"]


def test_every_problem_is_reported_together() -> None:
    """Problems in several fields and branches come back in one list, none dropped."""
    text = textwrap.dedent(
        """
        one:
          ttl: -1
          metrics: [{v: {usage: WRONG}}, {v2: {usage: GAUGE, scale: x}}]
        two:
          query: SELECT 1
          metrics: []
        three: 5
        good:
          query: SELECT 1
          metrics: [{v: {usage: GAUGE}}]
        """
    )
    collectors, problems = parse_document(text, "conf/0110-pg.yml", 0)
    assert collectors == []
    assert {p.location for p in problems} == {
        "conf/0110-pg.yml:one.query",
        "conf/0110-pg.yml:one.ttl",
        "conf/0110-pg.yml:one.metrics[0].usage",
        "conf/0110-pg.yml:one.metrics[1].scale",
        "conf/0110-pg.yml:two.metrics",
        "conf/0110-pg.yml:three",
    }


def test_problem_message_says_what_is_expected() -> None:
    """Messages carry both the wrong value and what is expected."""
    (problem,) = parse_document(branch("min_version: '9.6'"), "c.yml", 0)[1]
    assert problem == Problem(
        "c.yml:b.min_version",
        "expected a version number such as 90600 or 130000 (0 = open), got a string '9.6'",
    )


# --- files and directories --------------------------------------------------------


def write(directory: Path, name: str, text: str) -> str:
    """Write a collector file and return its path as a string."""
    path = directory / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def simple(key: str, query: str = "SELECT 1", extra: str = "") -> str:
    """A minimal valid branch as YAML text."""
    return f"{key}:\n  query: {query}\n  {GAUGE_ONLY}\n{extra}"


def test_single_file_loads(tmp_path: Path) -> None:
    """A single valid file gives its branches, sorted by (priority, key): without a
    priority a branch keeps 0 there, as in Go, and runs before one of priority 5."""
    path = write(
        tmp_path, "pg.yml", simple("zz") + simple("aa") + simple("mm", extra="  priority: 5\n")
    )
    definitions = load_definitions(path)
    assert [(c.key, c.priority) for c in definitions.collectors] == [
        ("aa", 0), ("zz", 0), ("mm", 5)
    ]  # fmt: skip
    assert definitions.sources == (path,)
    assert all(c.source == path for c in definitions.collectors)


def test_single_file_with_problems_raises_all_of_them(tmp_path: Path) -> None:
    """Any problem in a single file is a ConfigError listing every problem."""
    path = write(tmp_path, "pg.yml", "a:\n  metrics: []\nb: 3\n")
    with pytest.raises(ConfigError) as caught:
        load_definitions(path)
    locations = {p.location for p in caught.value.problems}
    assert locations == {f"{path}:a.query", f"{path}:a.metrics", f"{path}:b"}


@pytest.mark.parametrize("text", ["", "# nothing yet\n", "---\n"])
def test_single_file_without_branches_is_accepted_with_a_warning(tmp_path: Path, text: str) -> None:
    """An empty or comment-only file serves the exporter's own metrics, as Go does."""
    path = write(tmp_path, "pg.yml", text)
    definitions = load_definitions(path)
    assert definitions.collectors == ()
    (warning,) = definitions.warnings
    assert warning.startswith(f"{path}: no collector branch (the file is empty or all comments)")


def test_missing_path_names_it(tmp_path: Path) -> None:
    """A path that does not exist is a ConfigError naming that path."""
    missing = str(tmp_path / "nope.yml")
    with pytest.raises(ConfigError) as caught:
        load_definitions(missing)
    (problem,) = caught.value.problems
    assert problem.location == missing
    assert "no such file" in problem.message


def test_unreadable_file_names_it(tmp_path: Path) -> None:
    """Undecodable bytes are a ConfigError naming the file, not a crash."""
    path = tmp_path / "pg.yml"
    path.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ConfigError) as caught:
        load_definitions(str(path))
    assert caught.value.problems[0].location == str(path)
    assert "cannot read" in caught.value.problems[0].message


def test_directory_merges_in_name_order(tmp_path: Path) -> None:
    """Files merge in name order: a later same-key branch replaces the earlier one."""
    write(tmp_path, "0200-b.yml", simple("shared", "SELECT 'late'") + simple("only_b"))
    write(tmp_path, "0100-a.yaml", simple("shared", "SELECT 'early'") + simple("only_a"))
    definitions = load_definitions(str(tmp_path))
    shared = {c.key: c for c in definitions.collectors}.get("shared")
    assert shared is not None
    assert (shared.query, shared.priority) == ("SELECT 'late'", 102)
    assert shared.source == str(tmp_path / "0200-b.yml")
    assert [c.key for c in definitions.collectors] == ["only_a", "only_b", "shared"]
    assert [c.priority for c in definitions.collectors] == [101, 102, 102]
    assert any("replaces" in w and "shared" in w for w in definitions.warnings)


def test_directory_explicit_priority_wins(tmp_path: Path) -> None:
    """An explicit priority is kept whatever the file position."""
    write(tmp_path, "a.yml", simple("first"))
    write(tmp_path, "b.yml", simple("second", extra="  priority: 1\n"))
    definitions = load_definitions(str(tmp_path))
    assert [(c.key, c.priority) for c in definitions.collectors] == [("second", 1), ("first", 101)]


def test_directory_reads_only_yaml_files(tmp_path: Path) -> None:
    """Only ``*.yml``/``*.yaml`` regular files are read; others and subdirectories are not."""
    write(tmp_path, "a.yml", simple("a"))
    write(tmp_path, "b.yml.bak", "not: [valid")
    write(tmp_path, "README.md", "# docs")
    (tmp_path / "sub.yml").mkdir()
    write(tmp_path / "sub.yml", "c.yml", simple("c"))
    definitions = load_definitions(str(tmp_path))
    assert [c.key for c in definitions.collectors] == ["a"]
    assert definitions.sources == (str(tmp_path / "a.yml"),)


def test_directory_skips_and_reports_bad_file(tmp_path: Path) -> None:
    """A bad file is skipped and reported, and counts for no priority: as in Go, the
    n-th file read without a problem gives 100 + n, an empty one included."""
    write(tmp_path, "a.yml", simple("a"))
    bad = write(tmp_path, "b.yml", "b:\n  query: SELECT 1\n  metrics: [{v: {usage: NOPE}}]\n")
    write(tmp_path, "c.yml", "# empty for now\n")
    write(tmp_path, "d.yml", simple("d"))
    definitions = load_definitions(str(tmp_path))
    assert [(c.key, c.priority) for c in definitions.collectors] == [("a", 101), ("d", 103)]
    assert definitions.skipped_files == (bad,)
    assert any(f"{bad}:b.metrics[0].usage" in w for w in definitions.warnings)


def test_directory_without_valid_collector_lists_every_problem(tmp_path: Path) -> None:
    """All files bad: a ConfigError with the problems of every file."""
    first = write(tmp_path, "a.yml", "a: [\n")
    second = write(tmp_path, "b.yml", "b:\n  query: SELECT 1\n")
    with pytest.raises(ConfigError) as caught:
        load_definitions(str(tmp_path))
    locations = {p.location for p in caught.value.problems}
    assert f"{second}:b.metrics" in locations
    assert any(location.startswith(f"{first}:line") for location in locations)


def test_directory_without_yaml_files_is_accepted_with_a_warning(tmp_path: Path) -> None:
    """A directory with no collector file serves the exporter's own metrics, as in Go."""
    write(tmp_path, "notes.txt", "x")
    definitions = load_definitions(str(tmp_path))
    assert definitions.collectors == ()
    assert definitions.warnings == (
        f"{tmp_path}: directory has no *.yml or *.yaml collector file; only the exporter's "
        "own metrics are served",
    )


def test_directory_of_empty_yaml_files_is_refused(tmp_path: Path) -> None:
    """YAML files that give no branch at all: refused, as Go refuses them."""
    write(tmp_path, "a.yml", "")
    write(tmp_path, "b.yml", "# later\n")
    with pytest.raises(ConfigError) as caught:
        load_definitions(str(tmp_path))
    assert list(caught.value.problems) == [
        Problem(str(tmp_path), "no collector branch in any of its YAML files")
    ]


def test_directory_path_kept_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Locations use the directory path as the user gave it."""
    (tmp_path / "conf").mkdir()
    write(
        tmp_path / "conf",
        "0110-pg.yml",
        "pg_primary:\n  query: x\n  metrics: [{v: {usage: GAUGE}}, {w: {usage: X}}]\n",
    )
    write(tmp_path / "conf", "0120-ok.yml", simple("ok"))
    monkeypatch.chdir(tmp_path)
    definitions = load_definitions("./conf")
    assert any("./conf/0110-pg.yml:pg_primary.metrics[1].usage" in w for w in definitions.warnings)


def test_unquoted_comma_in_flow_mapping_is_explained() -> None:
    """``{description: a, b c}`` keeps ``a`` and warns that ``b c`` was cut off by the comma."""
    text = branch(metrics="metrics: [{v: {usage: GAUGE, description: first part, second part}}]")
    parsed = read_document(text, "c.yml", 0)
    assert parsed.collectors[0].columns[0].description == "first part"
    (warning,) = parsed.warnings
    assert warning.startswith("c.yml:b.metrics[0].second part: text after an unquoted comma")


def test_a_metric_typed_twice_by_different_collectors_is_warned(tmp_path: Path) -> None:
    """Two collectors that give one metric name two types: only the first survives in an
    exposition, so the load says which one is dropped; version branches of one name are
    alternatives and are not compared."""
    (tmp_path / "a.yml").write_text(
        "first:\n  name: app\n  query: SELECT 1 AS x_total\n  priority: 1\n"
        "  metrics: [{x_total: {usage: COUNTER}}]\n"
        "second:\n  name: app_x\n  query: SELECT 1 AS total\n  priority: 2\n"
        "  metrics: [{total: {usage: GAUGE}}]\n"
        "alt_old:\n  name: app\n  query: SELECT 1 AS x_total\n  max_version: 100000\n"
        "  metrics: [{x_total: {usage: GAUGE}}]\n"
    )
    warnings = load_definitions(str(tmp_path)).warnings
    conflicts = [w for w in warnings if "app_x_total" in w]
    assert len(conflicts) == 1, warnings
    assert "second: app_x_total is a gauge here but a counter in first" in conflicts[0]


# --- bounded messages, aliases and file sizes ------------------------------------------


def test_a_long_value_in_a_problem_is_quoted_as_an_excerpt() -> None:
    """A value of 100 000 characters is quoted by its start and its length, at its location."""
    problems = problems_of(branch(f"name: '{'x' * 100_000}-'"))
    message = problems["c.yml:b.name"]
    assert "… (100001 characters)" in message
    assert len(message) < 300


def test_a_list_in_a_problem_is_quoted_as_an_excerpt() -> None:
    """A bucket list of 10 000 bounds is quoted by its first items and its length."""
    bounds = ", ".join(["x"] * 10_000)
    problems = column_problems(f"h: {{usage: HISTOGRAM, bucket: [{bounds}]}}")
    message = problems["c.yml:b.metrics[0].bucket"]
    assert "(10000 items)" in message
    assert len(message) < 300


def test_a_long_branch_key_keeps_the_location_format() -> None:
    """A 10 000-character key is shortened in the middle: file and field stay readable."""
    problems = problems_of(f"? {'k' * 10_000}\n:\n  metrics: []\n")
    assert sorted(location.rsplit(".", 1)[1] for location in problems) == ["metrics", "query"]
    assert all(location.startswith("c.yml:kkk") and len(location) < 200 for location in problems)


def test_a_long_duplicate_key_is_quoted_as_an_excerpt() -> None:
    """The duplicate-key problem quotes an excerpt of the key, not the whole of it."""
    key = "d" * 10_000
    parsed = read_document(branch(f"? {key}\n: 1\n? {key}\n: 2"), "c.yml", 0)
    (duplicate,) = [str(p) for p in parsed.problems if "already defined" in p.message]
    assert "(10000 characters)" in duplicate
    assert len(duplicate) < 300


def test_anchors_and_merge_keys_still_work() -> None:
    """Ordinary anchors, aliases and ``<<:`` merges load as before."""
    text = """\
    base: &common {query: SELECT 1 AS v, ttl: 10, metrics: [{v: {usage: GAUGE}}]}
    other:
      <<: *common
      ttl: 20
    """
    assert [(c.key, c.ttl) for c in parse(text)] == [("base", 10.0), ("other", 20.0)]


def test_an_alias_inside_its_own_anchor_is_refused() -> None:
    """A value that would contain itself is refused at the alias's line."""
    message = "an alias inside its own anchor: a value cannot contain itself"
    assert problems_of("b: &a\n  query: SELECT 1\n  again: *a\n") == {"c.yml:line 3": message}


def alias_bomb(levels: int) -> str:
    """A "billion laughs" document: each level repeats the one before nine times."""
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"l{n}: &l{n} [{','.join([f'*l{n - 1}'] * 9)}]" for n in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_at_the_line_that_overflows() -> None:
    """Aliases may add at most MAX_ALIAS_EXPANSION characters: line 6 would add 2.8 M."""
    problems = problems_of(alias_bomb(8))
    assert list(problems) == ["c.yml:line 6"]
    assert (
        f"more than {MAX_ALIAS_EXPANSION} characters (an alias bomb?)" in problems["c.yml:line 6"]
    )


def test_a_file_of_too_many_values_is_refused() -> None:
    """Past MAX_VALUES values, reading stops with a problem at the line reached."""
    text = branch(metrics="metrics: [" + "1," * MAX_VALUES + "1]")
    problems = problems_of(text)
    assert problems == {
        "c.yml:line 3": f"more than {MAX_VALUES} values in one file; split it into several"
    }


def test_a_huge_file_is_refused_without_being_read_whole(tmp_path: Path) -> None:
    """A 64 MiB file (sparse, all NUL) is refused after reading at most MAX_FILE_CHARS."""
    path = tmp_path / "huge.yml"
    with path.open("wb") as file:
        file.truncate(64 * 1024 * 1024)
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError) as caught:
            load_definitions(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    (problem,) = caught.value.problems
    assert problem.location == str(path)
    assert problem.message.startswith("more than 4 MiB of text")
    assert peak < 4 * MAX_FILE_CHARS, f"{peak} bytes at the peak"


def test_a_fifo_as_config_is_refused_without_blocking(tmp_path: Path) -> None:
    """A config path that is a FIFO (or a device) is a problem of its own: opening it to
    read would wait for a writer forever, and a reload would hang with it."""
    fifo = tmp_path / "collectors.yml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_definitions(str(fifo))


@pytest.mark.parametrize(
    ("text", "got"),
    [
        ("root:$6$Zq9salt$Zq9hash:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n", "2 key(s)"),
        ("postgresql://monitor:Zq9@db1/postgres\n", "a string"),
        ("alice:$2y$10$Zq9Zq9Zq9Zq9Zq9Zq9Zq9Zq9Zq9Zq9Zq9Zq9Zq9Zq9Zq9Zq9Zq9Zq9Zq\n", "a string"),
        ("- Zq9\n", "a list"),
    ],
)
def test_a_wrong_file_is_named_by_its_shape_never_quoted(text: str, got: str) -> None:
    """A shadow file, a URL file, an htpasswd file given as -c: one problem saying what
    the file holds and the fix, quoting none of it (issue 25)."""
    found = problems_of(text)
    assert list(found) == ["c.yml"]
    assert found["c.yml"].startswith("not a collector file: the top level must map branch")
    assert f"got {got}" in found["c.yml"]
    assert "check --config" in found["c.yml"]
    for part in ("Zq9", "root", "19000", "db1", "alice"):
        assert part not in found["c.yml"]


def test_a_url_or_hash_in_a_branch_key_or_value_is_masked() -> None:
    """Keys and values quoted in locations and messages go through the masking rule."""
    found = problems_of(
        '"postgresql://u:Zq9@h/db": [1]\n'
        'b:\n  query: SELECT 1\n  metrics:\n    - v: {usage: "$6$Zq9$Zq9"}\n'
    )
    assert "c.yml:postgresql://u:xxxxx@h/db" in found
    assert all("Zq9" not in f"{where} {message}" for where, message in found.items())


# --- entries that are not regular files (issue 29 finding 8) -------------------------


def _in_thread(function: Callable[[], object]) -> object:
    """``function()``'s result or exception, failing the test if it is still at work after
    10 s: a FIFO opened for reading would wait there for a writer for ever."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(function())
        except Exception as exc:  # handed to the test
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), "loading blocked"
    return outcome[0]


def _stray(directory: Path, kind: str) -> Path:
    """Make a stray ``entry.yml`` of the given kind in ``directory``."""
    entry = directory / "entry.yml"
    if kind == "fifo":
        os.mkfifo(entry)
    elif kind == "directory":
        entry.mkdir()
    elif kind == "loop":
        entry.symlink_to("other.yml")
        (directory / "other.yml").symlink_to("entry.yml")
    else:
        entry.symlink_to({"zero": "/dev/zero", "dangling": "gone.yml"}[kind])
    return entry


STRAYS = {
    "fifo": "it is a FIFO, not a regular file",
    "zero": "it is a symbolic link to a character device, not a regular file",
    "loop": "it is a symbolic link in a loop",
    "dangling": "it is a symbolic link to 'gone.yml', which does not exist",
    "directory": "it is a directory, not a regular file",
}


@pytest.mark.parametrize("kind", sorted(STRAYS))
def test_a_stray_entry_in_a_directory_is_skipped_with_a_warning(tmp_path: Path, kind: str) -> None:
    """A FIFO, a link to /dev/zero, a link loop or to nothing, a directory named *.yml:
    skipped at once with a warning naming it and why; the other files load."""
    write(tmp_path, "good.yml", simple("good"))
    entry = _stray(tmp_path, kind)
    definitions = _in_thread(lambda: load_definitions(str(tmp_path)))
    assert isinstance(definitions, Definitions)
    assert [c.key for c in definitions.collectors] == ["good"]
    assert f"{entry}: {STRAYS[kind]}; skipped" in definitions.warnings
    assert str(entry) in definitions.skipped_files


def test_a_directory_of_stray_entries_alone_is_refused(tmp_path: Path) -> None:
    """Nothing but a FIFO: refused as a directory whose YAML files give no collector."""
    entry = _stray(tmp_path, "fifo")
    caught = _in_thread(lambda: load_definitions(str(tmp_path)))
    assert isinstance(caught, ConfigError)
    assert list(caught.problems) == [Problem(str(entry), STRAYS["fifo"])]


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("fifo", "cannot read the file: it is a FIFO, not a regular file"),
        ("zero", "cannot read the file: it is a character device, not a regular file"),
        ("loop", "is a symbolic link that leads nowhere (its target is missing, or links loop)"),
        ("dangling", "is a symbolic link that leads nowhere"),
    ],
)
def test_a_config_path_that_is_no_file_is_a_clear_error(
    tmp_path: Path, kind: str, message: str
) -> None:
    """--config naming a FIFO, /dev/zero or a broken link: an error at once, not a hang."""
    entry = _stray(tmp_path, kind)
    settings = Settings(config=str(entry))
    caught = _in_thread(lambda: load_for_settings(settings))
    assert isinstance(caught, ConfigError)
    assert message in "\n".join([str(caught), *map(str, caught.problems)])
