"""Validation of one collector branch: raw YAML mapping → frozen :class:`Collector`.

Each check notes problems with their location instead of stopping, so a file
is reported with everything that is wrong in it at once.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from exporter.definitions import (
    DEFAULT_TIMEOUT,
    MAX_SECONDS,
    PRIORITY_BASE,
    Collector,
    Column,
    Predicate,
    Usage,
)
from exporter.errors import Problem, excerpt, shorten
from exporter.target import mask

BRANCH_FIELDS = frozenset(
    {"name", "desc", "query", "predicate_queries", "ttl", "timeout", "priority"}
    | {"min_version", "max_version", "fatal", "skip", "tags", "metrics", "max_series"}
    | {"backoff_ceiling"}
)
PREDICATE_FIELDS = frozenset({"name", "predicate_query", "ttl"})
COLUMN_FIELDS = frozenset({"usage", "rename", "description", "default", "scale", "bucket"})
USAGES = ", ".join(usage.value for usage in Usage)
ARGUMENT_TAGS = ("extension:", "schema:", "dbname:", "username:", "not:")
METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
METRIC_SUFFIX = re.compile(r"[a-zA-Z0-9_:]+")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_KINDS: dict[type, str] = {bool: "a boolean", int: "an integer", float: "a number"}
_KINDS |= {str: "a string", list: "a list", dict: "a mapping", type(None): "nothing"}
VERSION = "a version number such as 90600 or 130000 (0 = open)"


@dataclass(slots=True)
class Notes:
    """Problems and warnings found in one file, each located as ``file:where``."""

    source: str
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def error(self, where: str, message: str) -> None:
        """Note a problem: the file is invalid."""
        self.problems.append(Problem(self._at(where), mask(message)))

    def warn(self, where: str, message: str) -> None:
        """Note something suspicious that does not make the file invalid."""
        self.warnings.append(f"{self._at(where)}: {mask(message)}")

    def warn_unknown(self, where: str, mapping: dict[Any, Any], known: frozenset[str]) -> None:
        """Unknown fields are warnings: the Go exporter ignores them, so configs carry some."""
        for name, value in mapping.items():
            if name in known:
                continue
            if value is None and isinstance(name, str) and " " in name.strip():
                # `{usage: GAUGE, description: a, b}`: the stock configs have many of these.
                message = "text after an unquoted comma became a key, ignored; quote the text"
            else:
                message = f"unknown field, ignored (known: {', '.join(sorted(known))})"
            self.warn(f"{where}.{name}", message)

    def _at(self, where: str) -> str:
        # Keys come from the file: a wrong file (a URL, a shadow line) must not be quoted.
        return f"{self.source}:{shorten(mask(where))}" if where else self.source


def read_branch(notes: Notes, key: object, body: object, file_index: int) -> Collector | None:
    """One top-level branch as a Collector, or None after noting its problems."""
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
    columns = _read_metrics(notes, key, name, body.get("metrics"))
    predicates = _read_predicates(notes, key, body.get("predicate_queries"))
    tags = _read_tags(notes, f"{key}.tags", body.get("tags"))
    scheduling = _read_scheduling(notes, key, body, file_index)
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
    )


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


def _read_metrics(notes: Notes, key: str, name: str, raw: object) -> tuple[Column, ...]:
    """The ``metrics`` list as columns, checked one by one and then together."""
    where = f"{key}.metrics"
    if not isinstance(raw, list) or not raw:
        notes.error(where, "metrics must be a non-empty list like `- datname: {usage: LABEL}`")
        return ()
    entries: list[tuple[str, Column]] = []
    for index, entry in enumerate(raw):
        column = _read_column(notes, f"{where}[{index}]", entry)
        if column is not None:
            entries.append((f"{where}[{index}]", column))
    _check_columns(notes, where, name, entries, complete=len(entries) == len(raw))
    return tuple(column for _, column in entries)


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


def _read_scheduling(notes: Notes, key: str, body: dict[Any, Any], index: int) -> Scheduling:
    """ttl, timeout, priority, version range, flags, max_series and backoff_ceiling."""
    priority = _read_int(notes, f"{key}.priority", body.get("priority"), None)
    min_version = _read_int(notes, f"{key}.min_version", body.get("min_version"), 0, VERSION)
    max_version = _read_int(notes, f"{key}.max_version", body.get("max_version"), 0, VERSION)
    if min_version and max_version and min_version >= max_version:
        notes.warn(key, f"min_version {min_version} >= max_version {max_version}: never planned")
    return Scheduling(
        ttl=_read_seconds(notes, f"{key}.ttl", body.get("ttl")),
        timeout=_read_timeout(notes, f"{key}.timeout", body.get("timeout")),
        priority=priority or PRIORITY_BASE + index,
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
    if not _is_number(value) or not 0 <= value <= MAX_SECONDS:
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
    if not _is_number(value) or not math.isfinite(value) or value < 0:
        notes.error(
            where, f"expected seconds >= 0 (0 = no back-off beyond the ttl), got {kind_of(value)}"
        )
        return None
    return float(value)


def _read_timeout(notes: Notes, where: str, value: object) -> float | None:
    """Absent or 0 → the default; negative → unbounded (None); positive → seconds; either
    within what a Go duration holds."""
    if value is None or (_is_number(value) and value == 0):
        return DEFAULT_TIMEOUT
    if not _is_number(value) or not -MAX_SECONDS <= value <= MAX_SECONDS:
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


def _read_bool(notes: Notes, where: str, value: object) -> bool:
    """An optional flag that must be a real YAML boolean."""
    if value is None or isinstance(value, bool):
        return bool(value)
    notes.error(where, f"expected true or false, got {kind_of(value)}")
    return False


def _read_column(notes: Notes, where: str, entry: object) -> Column | None:
    """One ``- column: {usage, ...}`` entry, or None after noting its problems."""
    if not isinstance(entry, dict) or len(entry) != 1:
        got = f"{len(entry)} keys" if isinstance(entry, dict) else kind_of(entry)
        notes.error(where, f"expected a map with exactly one key, the column name; got {got}")
        return None
    ((name, spec),) = entry.items()
    if not isinstance(name, str) or not name.strip():
        notes.error(where, f"a column name must be a non-blank string, got {kind_of(name)}")
        return None
    if not isinstance(spec, dict):
        notes.error(
            where, f"column {excerpt(name)} needs a map like {{usage: GAUGE}}, got {kind_of(spec)}"
        )
        return None
    notes.warn_unknown(where, spec, COLUMN_FIELDS)
    usage = _read_usage(notes, f"{where}.usage", spec.get("usage"))
    rename = _read_rename(notes, f"{where}.rename", spec.get("rename"))
    default = _read_float(notes, f"{where}.default", spec.get("default"), finite=False)
    scale = _read_float(notes, f"{where}.scale", spec.get("scale"), finite=True)
    buckets = _read_buckets(notes, f"{where}.bucket", usage, spec.get("bucket"))
    # Keep a column with bad details for the cross-column checks; the branch is
    # rejected anyway because a problem was noted.
    if usage is None:
        return None
    text = spec.get("description")
    description = "" if text is None else str(text)
    return Column(name, usage, rename, description, default, scale, buckets)


def _read_usage(notes: Notes, where: str, value: object) -> Usage | None:
    """The column usage, case-insensitive."""
    if isinstance(value, str) and value.strip().upper() in Usage.__members__:
        return Usage[value.strip().upper()]
    notes.error(where, f"expected one of {USAGES} (any case), got {kind_of(value)}")
    return None


def _read_rename(notes: Notes, where: str, value: object) -> str | None:
    """An optional non-blank replacement for the column name in output."""
    if value is None or (isinstance(value, str) and value.strip()):
        return value
    notes.error(where, f"expected a non-blank name, got {kind_of(value)}")
    return None


def _read_float(notes: Notes, where: str, value: object, *, finite: bool) -> float | None:
    """``scale`` or ``default``: a number, or numeric text (the Go exporter parses text)."""
    if value is None:
        return None
    number = None
    if _is_number(value):
        number = float(value)
    elif isinstance(value, str):
        with contextlib.suppress(ValueError):
            number = float(value)
    if number is None or (finite and not math.isfinite(number)):
        notes.error(where, f"expected a {'finite ' if finite else ''}number, got {kind_of(value)}")
        return None
    return number


def _read_buckets(notes: Notes, where: str, usage: Usage | None, raw: object) -> tuple[float, ...]:
    """HISTOGRAM upper bounds: required there, finite, strictly increasing; banned elsewhere."""
    if usage is not Usage.HISTOGRAM:
        if raw is not None and usage is not None:
            notes.error(where, "bucket is only for HISTOGRAM columns; remove it or change usage")
        return ()
    if not isinstance(raw, list) or not raw:
        notes.error(where, f"a HISTOGRAM column needs bucket: a list of bounds, got {kind_of(raw)}")
        return ()
    if not all(_is_number(bound) for bound in raw):
        notes.error(where, f"bucket bounds must be numbers, got {excerpt(raw)}")
        return ()
    bounds = tuple(float(bound) for bound in raw)
    if not all(math.isfinite(bound) for bound in bounds):
        notes.error(where, f"bucket bounds must be finite (+Inf is implicit), got {excerpt(raw)}")
    elif any(low >= high for low, high in itertools.pairwise(bounds)):
        notes.error(where, f"bucket bounds must be strictly increasing, got {excerpt(raw)}")
    return bounds


def _check_columns(
    notes: Notes, where: str, name: str, entries: list[tuple[str, Column]], *, complete: bool
) -> None:
    """Checks across the valid columns of a branch: duplicates, labels, metric families."""
    unique = _unique_columns(notes, entries)
    # An invalid entry may be the value column; do not claim there is none.
    if complete and not any(column.usage.is_value for _, column in unique):
        notes.error(where, "no GAUGE, COUNTER or HISTOGRAM column: the branch yields no metric")
    histogram = any(column.usage is Usage.HISTOGRAM for _, column in unique)
    labels = [(at, column) for at, column in unique if column.usage is Usage.LABEL]
    _check_labels(notes, labels, reserve_le=histogram)
    values = [(at, column) for at, column in unique if column.usage.is_value]
    _check_families(notes, name, values)


def _unique_columns(notes: Notes, entries: list[tuple[str, Column]]) -> list[tuple[str, Column]]:
    """Entries whose column was not listed before; each repeat is a problem."""
    first: dict[str, str] = {}
    unique = []
    for where, column in entries:
        if column.name in first:
            at = shorten(first[column.name])
            notes.error(where, f"column {excerpt(column.name)} is already at {at}")
        else:
            first[column.name] = where
            unique.append((where, column))
    return unique


def _check_labels(notes: Notes, labels: list[tuple[str, Column]], *, reserve_le: bool) -> None:
    """Label names (after rename) must be valid, unreserved and distinct."""
    first: dict[str, str] = {}
    for where, column in labels:
        label = column.output_name
        at = f"{where}.rename" if column.rename else where
        if not LABEL_NAME.fullmatch(label) or label.startswith("__"):
            notes.error(
                at, f"invalid label name {excerpt(label)}: expected {LABEL_NAME.pattern}, no __"
            )
        elif label == "le" and reserve_le:
            notes.error(at, "label 'le' is reserved in a branch with a HISTOGRAM column; rename it")
        elif label in first:
            other = shorten(first[label])
            notes.error(at, f"label {excerpt(label)} is also produced by {other}; rename one")
        else:
            first[label] = where


def _check_families(notes: Notes, name: str, values: list[tuple[str, Column]]) -> None:
    """Metric names must be valid and no two columns may produce the same family."""
    first: dict[str, str] = {}
    for where, column in values:
        metric = f"{name}_{column.output_name}"
        at = f"{where}.rename" if column.rename else where
        # The prefix is checked on its own, so only the suffix can make this invalid.
        if not METRIC_SUFFIX.fullmatch(column.output_name):
            notes.error(
                at, f"invalid metric name {excerpt(metric)}: expected {METRIC_NAME.pattern}"
            )
            continue
        families = _families(metric, column.usage)
        clash = next((family for family in families if family in first), None)
        if clash is not None:
            other = shorten(first[clash])
            notes.error(at, f"metric {excerpt(clash)} is also produced by {other}; rename one")
        first.update(dict.fromkeys(families, where))


def _families(metric: str, usage: Usage) -> tuple[str, ...]:
    """Family names a value column exposes: histograms expose three."""
    if usage is Usage.HISTOGRAM:
        return (f"{metric}_bucket", f"{metric}_count", f"{metric}_sum")
    return (metric,)


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


def _is_number(value: object) -> TypeGuard[int | float]:
    """True for YAML integers and floats that fit a float; booleans are not numbers here."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return isinstance(value, float) or abs(value) <= sys.float_info.max


def kind_name(value: object) -> str:
    """A value's YAML type alone, for where its text may be a secret or a wrong file's."""
    return _KINDS.get(type(value), type(value).__name__)


def kind_of(value: object) -> str:
    """A value as messages show it: its YAML type, and an excerpt of its text."""
    kind = _KINDS.get(type(value), type(value).__name__)
    if value is None or isinstance(value, list | dict):
        return kind
    return f"{kind} {excerpt(value)}"


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
