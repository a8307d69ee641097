"""Validation of one collector branch: raw YAML mapping → frozen :class:`Collector`.

Each check notes problems with their location instead of stopping, so a file
is reported with everything that is wrong in it at once. The ``metrics`` list is
read by :mod:`exporter.config.columns`; problems are noted on
:class:`exporter.config.problems.Notes`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from exporter.config.columns import METRIC_NAME, is_number, read_metrics
from exporter.config.definitions import (
    DEFAULT_TIMEOUT,
    MAX_SECONDS,
    Collector,
    Predicate,
    Usage,
)
from exporter.config.problems import Notes, kind_of
from exporter.config.sqltext import collector_sql_problem
from exporter.config.top import read_top
from exporter.errors import Problem, excerpt, shorten

BRANCH_FIELDS = frozenset(
    {"name", "desc", "query", "predicate_queries", "ttl", "timeout", "priority"}
    | {"min_version", "max_version", "fatal", "skip", "tags", "metrics", "max_series"}
    | {"backoff_ceiling", "top"}
)
PREDICATE_FIELDS = frozenset({"name", "predicate_query", "ttl"})
ARGUMENT_TAGS = ("extension:", "schema:", "dbname:", "username:", "not:")
# Words that Go's YAML library reads as booleans into a boolean field, quoted or not
# (YAML 1.1's; PyYAML reads the unquoted yes/no/on/off as booleans already).
GO_BOOLEANS = dict.fromkeys(("y", "Y", "yes", "Yes", "YES", "on", "On", "ON"), True)
GO_BOOLEANS |= dict.fromkeys(("n", "N", "no", "No", "NO", "off", "Off", "OFF"), False)
VERSION = "a version number such as 90600 or 130000 (0 = open)"


def read_branch(notes: Notes, key: object, body: object, default_priority: int) -> Collector | None:
    """One top-level branch as a Collector, or None after noting its problems; without a
    priority (absent or 0) it gets ``default_priority``."""
    if not isinstance(key, str) or not key.strip():
        notes.error(str(key), "a branch key must be a non-blank string; quote it")
        return None
    if not isinstance(body, dict):
        notes.error(key, f"a branch must be a mapping with query and metrics, got {kind_of(body)}")
        return None
    before = len(notes.problems)
    notes.warn_unknown(key, body, BRANCH_FIELDS)
    name = _read_prefix(notes, key, body.get("name"))
    query = body.get("query")
    if not isinstance(query, str) or not query.strip():
        notes.error(f"{key}.query", "query is required: the SQL whose rows become metrics")
    else:
        _check_sql(notes, f"{key}.query", query)
    columns = read_metrics(notes, key, name, body.get("metrics"))
    top = read_top(notes, key, body.get("top"), columns)
    predicates = _read_predicates(notes, key, body.get("predicate_queries"))
    tags = _read_tags(notes, f"{key}.tags", body.get("tags"))
    if top is not None and top.probe is not None and "pgbouncer" in tags:
        notes.error(
            f"{key}.top.probe",
            "a probe needs PostgreSQL: its query takes the named keys as a parameter, and "
            "a branch tagged pgbouncer runs on pgBouncer's console, which takes none",
        )
    scheduling = _read_scheduling(notes, key, body, default_priority)
    if len(notes.problems) > before:
        return None
    desc = body.get("desc")
    return Collector(
        key=key,
        name=name,
        query=str(query),
        columns=columns,
        desc="" if desc is None else str(desc),
        predicates=predicates,
        tags=tags,
        source=notes.source,
        ttl=scheduling.ttl,
        timeout=scheduling.timeout,
        priority=scheduling.priority,
        min_version=scheduling.min_version,
        max_version=scheduling.max_version,
        fatal=scheduling.fatal,
        skip=scheduling.skip,
        max_series=scheduling.max_series,
        backoff_ceiling=scheduling.backoff_ceiling,
        top=top,
    )


def _check_sql(notes: Notes, where: str, sql: str) -> None:
    """A query or predicate that could leave the read-only transaction is refused (D2)."""
    if (problem := collector_sql_problem(sql)) is not None:
        notes.error(where, problem)


def _read_prefix(notes: Notes, key: str, value: object) -> str:
    """The metric prefix: ``name``, else the key; must itself be a valid metric name."""
    if value is None:
        if not METRIC_NAME.fullmatch(key):
            notes.error(
                key, "the key is used as metric prefix but is not a valid metric name; add name"
            )
        return key
    if not isinstance(value, str) or not METRIC_NAME.fullmatch(value):
        notes.error(f"{key}.name", f"name must match {METRIC_NAME.pattern}, got {excerpt(value)}")
        return key
    return value


def _read_predicates(notes: Notes, key: str, raw: object) -> tuple[Predicate, ...]:
    """``predicate_queries``: a list of ``{name, predicate_query, ttl}``."""
    where = f"{key}.predicate_queries"
    if raw is None:
        return ()
    if not isinstance(raw, list):
        notes.error(where, f"expected a list of {{name, predicate_query, ttl}}, got {kind_of(raw)}")
        return ()
    predicates = []
    for index, item in enumerate(raw):
        at = f"{where}[{index}]"
        if not isinstance(item, dict):
            notes.error(
                at, f"expected a mapping {{name, predicate_query, ttl}}, got {kind_of(item)}"
            )
            continue
        notes.warn_unknown(at, item, PREDICATE_FIELDS)
        sql = item.get("predicate_query")
        if not isinstance(sql, str) or not sql.strip():
            notes.error(f"{at}.predicate_query", "blank predicate: give SQL returning one boolean")
            continue
        _check_sql(notes, f"{at}.predicate_query", sql)
        name = item.get("name")
        label = name if isinstance(name, str) and name.strip() else f"predicate {index}"
        ttl = _read_seconds(notes, f"{at}.ttl", item.get("ttl"))
        predicates.append(Predicate(label, sql, ttl))
    return tuple(predicates)


@dataclass(frozen=True, slots=True)
class Scheduling:
    """When and how a branch runs: the scheduling fields of a :class:`Collector`."""

    ttl: float
    timeout: float | None
    priority: int
    min_version: int
    max_version: int
    fatal: bool
    skip: bool
    max_series: int | None
    backoff_ceiling: float | None


def _read_scheduling(
    notes: Notes, key: str, body: dict[Any, Any], default_priority: int
) -> Scheduling:
    """ttl, timeout, priority, version range, flags, max_series and backoff_ceiling."""
    priority = _read_go_int(notes, f"{key}.priority", body.get("priority"), None)
    min_version = _read_go_int(notes, f"{key}.min_version", body.get("min_version"), 0, VERSION)
    max_version = _read_go_int(notes, f"{key}.max_version", body.get("max_version"), 0, VERSION)
    if min_version and max_version and min_version >= max_version:
        notes.warn(key, f"min_version {min_version} >= max_version {max_version}: never planned")
    return Scheduling(
        ttl=_read_seconds(notes, f"{key}.ttl", body.get("ttl")),
        timeout=_read_timeout(notes, f"{key}.timeout", body.get("timeout")),
        priority=priority or default_priority,
        min_version=min_version or 0,
        max_version=max_version or 0,
        fatal=_read_bool(notes, f"{key}.fatal", body.get("fatal")),
        skip=_read_bool(notes, f"{key}.skip", body.get("skip")),
        max_series=_read_int(notes, f"{key}.max_series", body.get("max_series"), 1),
        backoff_ceiling=_read_ceiling(notes, f"{key}.backoff_ceiling", body.get("backoff_ceiling")),
    )


def _read_seconds(notes: Notes, where: str, value: object) -> float:
    """A ttl: absent means 0; otherwise a finite number >= 0 that a Go duration holds."""
    if value is None:
        return 0.0
    if not is_number(value) or not 0 <= value <= MAX_SECONDS:
        notes.error(
            where,
            f"expected a number of seconds >= 0 and at most {int(MAX_SECONDS)} (the longest "
            f"Go duration), got {kind_of(value)}",
        )
        return 0.0
    return float(value)


def _read_ceiling(notes: Notes, where: str, value: object) -> float | None:
    """A back-off ceiling: absent means the global one; else finite seconds >= 0 (D15)."""
    if value is None:
        return None
    if not is_number(value) or not math.isfinite(value) or value < 0:
        notes.error(
            where, f"expected seconds >= 0 (0 = no back-off beyond the ttl), got {kind_of(value)}"
        )
        return None
    return float(value)


def _read_timeout(notes: Notes, where: str, value: object) -> float | None:
    """Absent or 0 → the default; negative → unbounded (None); positive → seconds; either
    within what a Go duration holds."""
    if value is None or (is_number(value) and value == 0):
        return DEFAULT_TIMEOUT
    if not is_number(value) or not -MAX_SECONDS <= value <= MAX_SECONDS:
        notes.error(
            where,
            f"expected seconds (0 = default 0.1, < 0 = none) between -{int(MAX_SECONDS)} and "
            f"{int(MAX_SECONDS)} (the longest Go duration), got {kind_of(value)}",
        )
        return DEFAULT_TIMEOUT
    return None if value < 0 else float(value)


def _read_int(
    notes: Notes, where: str, value: object, minimum: int | None, what: str = "an integer"
) -> int | None:
    """An optional integer, at least ``minimum`` when one is given."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        notes.error(where, f"expected {what}, got {kind_of(value)}")
        return None
    if minimum is not None and value < minimum:
        notes.error(where, f"must be at least {minimum} ({what}), got {excerpt(value)}")
        return None
    return value


def _read_go_int(
    notes: Notes, where: str, value: object, minimum: int | None, what: str = "an integer"
) -> int | None:
    """An integer field as Go reads one: a number with a fraction loses it (9.6 is 9),
    which is said, since a version written 9.6 is read as 9 and not as 90600."""
    if isinstance(value, float) and math.isfinite(value) and abs(value) < 2**63:
        whole = int(value)  # toward zero, as Go's conversion
        if whole != value:
            notes.warn(
                where, f"{value!r} is read as {whole}, as the Go exporter does; write {what}"
            )
        value = whole
    return _read_int(notes, where, value, minimum, what)


def _read_bool(notes: Notes, where: str, value: object) -> bool:
    """An optional flag: a YAML boolean, or a word Go's YAML library reads as one."""
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, str) and value in GO_BOOLEANS:
        return GO_BOOLEANS[value]
    notes.error(where, f"expected true or false, got {kind_of(value)}")
    return False


def _read_tags(notes: Notes, where: str, raw: object) -> tuple[str, ...]:
    """Planning tags: a list of non-blank strings; ``kind:`` tags need a name."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        notes.error(
            where, f"expected a list of strings like [cluster, primary], got {kind_of(raw)}"
        )
        return ()
    for index, tag in enumerate(raw):
        at = f"{where}[{index}]"
        if not isinstance(tag, str) or not tag.strip():
            notes.error(at, f"a tag must be a non-blank string, got {kind_of(tag)}")
        elif tag in ARGUMENT_TAGS:
            notes.error(
                at, f"{tag!r} needs a name after the colon, e.g. extension:pg_stat_statements"
            )
    return tuple(str(tag) for tag in raw)


def const_label_problems(
    collectors: Iterable[Collector], const_names: Iterable[str], *, self_metrics: bool
) -> list[Problem]:
    """Const labels (``--label``) that collide with a collector's or self-metric's labels."""
    names = set(const_names)
    problems = []
    if self_metrics and (clash := names & {"datname", "query"}):
        problems.append(
            Problem("--label", f"{', '.join(sorted(clash))} is used by the self-metrics; rename it")
        )
    for collector in collectors:
        labels = {c.output_name for c in collector.label_columns}
        if any(c.usage is Usage.HISTOGRAM for c in collector.columns):
            labels.add("le")
        for name in sorted(names & labels):
            problems.append(
                Problem(
                    f"{collector.source}:{shorten(collector.key)}",
                    f"const label {name!r} from --label is also a label of this collector; "
                    "rename one of them",
                )
            )
    return problems
