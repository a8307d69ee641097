"""Validation of a collector branch's ``metrics`` list: entries → :class:`Column`.

Each entry is checked on its own (usage, rename, scale, default, buckets), then the
branch's columns together: no repeats, label names valid and distinct, no two value
columns producing one metric family. Problems are noted with their location, as in
:mod:`exporter.config.validation`, which reads the rest of the branch.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import re
import sys
from typing import TypeGuard

from exporter.config.definitions import Column, Usage
from exporter.config.problems import Notes, kind_of
from exporter.config.rules import LABEL_RULE, is_label_name
from exporter.errors import excerpt, shorten

COLUMN_FIELDS = frozenset({"name", "usage", "rename", "description", "default", "scale", "bucket"})
USAGES = ", ".join(usage.value for usage in Usage)
METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
METRIC_SUFFIX = re.compile(r"[a-zA-Z0-9_:]+")


def read_metrics(notes: Notes, key: str, name: str, raw: object) -> tuple[Column, ...]:
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


def _read_column(notes: Notes, where: str, entry: object) -> Column | None:
    """One ``- column: {usage, ...}`` entry, or None after noting its problems."""
    if not isinstance(entry, dict) or len(entry) != 1:
        got = f"{len(entry)} keys" if isinstance(entry, dict) else kind_of(entry)
        notes.error(where, f"expected a map with exactly one key, the column name; got {got}")
        return None
    ((key, spec),) = entry.items()
    if not isinstance(key, str) or not key.strip():
        notes.error(where, f"a column name must be a non-blank string, got {kind_of(key)}")
        return None
    if not isinstance(spec, dict):
        notes.error(
            where, f"column {excerpt(key)} needs a map like {{usage: GAUGE}}, got {kind_of(spec)}"
        )
        return None
    notes.warn_unknown(where, spec, COLUMN_FIELDS)
    name = _read_name(notes, f"{where}.name", spec.get("name"), key)
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


def _read_name(notes: Notes, where: str, value: object, key: str) -> str:
    """The result column: ``name`` when given (Go reads it so), else the entry's key."""
    if value is None or value == "":
        return key
    if isinstance(value, str) and value.strip():
        return value
    if is_number(value):  # Go's YAML library reads any scalar into text
        return str(value)
    notes.error(where, f"expected the result column's name, got {kind_of(value)}")
    return key


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
    if is_number(value):
        number = float(value)
    elif isinstance(value, str):
        with contextlib.suppress(ValueError):
            number = float(value)
    if number is None or (finite and not math.isfinite(number)):
        notes.error(where, f"expected a {'finite ' if finite else ''}number, got {kind_of(value)}")
        return None
    return number


def _read_buckets(notes: Notes, where: str, usage: Usage | None, raw: object) -> tuple[float, ...]:
    """HISTOGRAM upper bounds: required there, finite, strictly increasing. On another
    column they are ignored, as by the Go exporter, once they read as a list of numbers."""
    if usage is not Usage.HISTOGRAM:
        if raw is None or usage is None:
            return ()
        if not isinstance(raw, list) or not all(is_number(bound) for bound in raw):
            notes.error(where, f"bucket must be a list of numbers, got {excerpt(raw)}")
        else:
            notes.warn(
                where,
                f"bucket is read only for a HISTOGRAM column; ignored on a "
                f"{usage.value} column: remove it",
            )
        return ()
    if not isinstance(raw, list) or not raw:
        notes.error(where, f"a HISTOGRAM column needs bucket: a list of bounds, got {kind_of(raw)}")
        return ()
    if not all(is_number(bound) for bound in raw):
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
        if not is_label_name(label):
            notes.error(at, f"invalid label name {excerpt(label)}: expected {LABEL_RULE}")
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


def is_number(value: object) -> TypeGuard[int | float]:
    """True for YAML integers and floats that fit a float; booleans are not numbers here."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return isinstance(value, float) or abs(value) <= sys.float_info.max
