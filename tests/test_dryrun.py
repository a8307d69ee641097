"""``--dry-run``'s rendering of the parsed definitions as a collector file, without a database.

That the shipped collectors survive the round trip field for field is pinned in
tests/test_cli.py; these pin the layout of the text itself.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from exporter.cli import main
from exporter.config.definitions import Collector, Column, Definitions, Predicate, Usage
from exporter.config.dryrun import render_definitions
from exporter.config.loading import load_definitions

MULTILINE_SQL = "SELECT datname,\n       numbackends\n  FROM pg_stat_database\n"


def _collector(**fields: object) -> Collector:
    base: dict[str, object] = {
        "key": "pg_db",
        "name": "pg_db",
        "query": "SELECT 1 AS one",
        "columns": (Column("one", Usage.GAUGE, description="one"),),
        "source": "/etc/pg_exporter/0100-db.yml",
    }
    base.update(fields)
    return Collector(**base)  # type: ignore[arg-type]


def _branch(collector: Collector) -> dict[str, object]:
    text = render_definitions(Definitions((collector,), ("/etc/pg_exporter",)))
    loaded = yaml.safe_load(text)
    branch: dict[str, object] = loaded[collector.key]
    return branch


def test_header_counts_collectors_and_lists_sources() -> None:
    """The output begins with the number of collectors and every file read, as comments."""
    text = render_definitions(
        Definitions((_collector(), _collector(key="b")), ("/etc/a.yml", "/etc/b.yml"))
    )
    assert text.splitlines()[:3] == [
        "# 2 collector(s), planned order, read from:",
        "#   /etc/a.yml",
        "#   /etc/b.yml",
    ]


def test_each_collector_follows_its_source_in_planned_order() -> None:
    """Each branch is preceded by the file it came from, in the definitions' order."""
    text = render_definitions(
        Definitions((_collector(key="first"), _collector(key="second", source="")))
    )
    assert text.index("# from /etc/pg_exporter/0100-db.yml\nfirst:") < text.index(
        "# from unknown file\nsecond:"
    )


def test_multiline_sql_is_a_literal_block() -> None:
    """A multi-line query is written as a ``|`` block, readable as it was written."""
    text = render_definitions(Definitions((_collector(query=MULTILINE_SQL),)))
    assert "  query: |\n    SELECT datname,\n           numbackends\n" in text
    assert _branch(_collector(query=MULTILINE_SQL))["query"] == MULTILINE_SQL


def test_unbounded_timeout_is_written_as_minus_one() -> None:
    """``timeout: None`` (unbounded) is written the way a collector file says it: -1."""
    assert _branch(_collector(timeout=None))["timeout"] == -1
    assert _branch(_collector(timeout=0.5))["timeout"] == 0.5


def test_unset_optional_fields_are_left_out() -> None:
    """max_series, backoff_ceiling and predicates appear only when set."""
    plain = _branch(_collector())
    assert {"max_series", "backoff_ceiling", "predicate_queries"}.isdisjoint(plain)
    full = _branch(
        _collector(
            max_series=10,
            backoff_ceiling=60.0,
            predicates=(Predicate("is_primary", "SELECT NOT pg_is_in_recovery()", 30.0),),
        )
    )
    assert full["max_series"] == 10
    assert full["backoff_ceiling"] == 60.0
    assert full["predicate_queries"] == [
        {"name": "is_primary", "predicate_query": "SELECT NOT pg_is_in_recovery()", "ttl": 30.0}
    ]


def test_columns_keep_order_and_only_their_set_fields() -> None:
    """Columns stay in file order; rename, default, scale and buckets only when given."""
    columns = (
        Column("datname", Usage.LABEL, description="database"),
        Column("size", Usage.GAUGE, rename="bytes", default=0.0, scale=1024.0, description="s"),
        Column("lat", Usage.HISTOGRAM, buckets=(0.1, 1.0), description="latency"),
    )
    metrics = _branch(_collector(columns=columns))["metrics"]
    assert metrics == [
        {"datname": {"usage": "LABEL", "description": "database"}},
        {
            "size": {
                "usage": "GAUGE",
                "rename": "bytes",
                "default": 0.0,
                "scale": 1024.0,
                "description": "s",
            }
        },
        {"lat": {"usage": "HISTOGRAM", "bucket": [0.1, 1.0], "description": "latency"}},
    ]


def test_output_loads_again_as_the_same_collector(tmp_path: Path) -> None:
    """Every field of a collector, set away from its default, comes back on loading."""
    original = _collector(
        name="pg_database",
        desc="databases",
        query=MULTILINE_SQL,
        ttl=10.0,
        timeout=None,
        priority=7,
        min_version=120000,
        max_version=190000,
        fatal=True,
        skip=True,
        tags=("cluster", "primary"),
        max_series=50,
        backoff_ceiling=120.0,
        predicates=(Predicate("p", "SELECT true", 5.0),),
        columns=(
            Column("datname", Usage.LABEL, description="database"),
            Column("numbackends", Usage.GAUGE, rename="backends", scale=2.0, description="n"),
            Column("xacts", Usage.COUNTER, default=0.0, description="x"),
            Column("lat", Usage.HISTOGRAM, buckets=(0.5, 1.0, 5.0), description="latency"),
            Column("junk", Usage.DISCARD),
        ),
    )
    path = tmp_path / "again.yml"
    path.write_text(render_definitions(Definitions((original,))))
    (loaded,) = load_definitions(str(path)).collectors
    assert loaded.key == original.key
    for field in dataclasses.fields(Collector):
        if field.name != "source":
            assert getattr(loaded, field.name) == getattr(original, field.name), field.name


def test_non_ascii_text_is_written_as_is() -> None:
    """Descriptions in other scripts stay readable, not ``\\u`` escapes."""
    text = render_definitions(Definitions((_collector(desc="размер базы"),)))
    assert "desc: размер базы" in text


def test_dry_run_refuses_a_predicate_that_could_leave_the_read_only_transaction(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 29's predicate (BEGIN READ WRITE; INSERT; COMMIT; SELECT true) is refused by
    --dry-run, exit 1, the message naming the collector's predicate and why (D2)."""
    path = tmp_path / "c.yml"
    path.write_text(
        "writer:\n  query: SELECT 1 AS v\n  predicate_queries:\n"
        "    - {name: p, predicate_query: 'BEGIN READ WRITE; INSERT INTO t VALUES (1); "
        "COMMIT; SELECT true'}\n  metrics:\n    - v: {usage: GAUGE}\n"
    )
    assert main(["--dry-run", "-c", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}:writer.predicate_queries[0].predicate_query: several statements, " in err
    assert "could commit and write outside the read-only transaction" in err
