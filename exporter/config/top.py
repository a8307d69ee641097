"""Validation of a branch's ``top`` mapping: raw YAML → frozen :class:`Top` (issue 38).

``top`` is ours (the Go exporter has no such key): a branch without it loads and runs
as before. Each field is checked against the branch's columns, every problem noted at
``file:branch.top.<field>``.
"""

from __future__ import annotations

import math

from exporter.config.columns import is_number
from exporter.config.definitions import DEFAULT_HOLD, DEFAULT_OTHER, Column, Top, Usage
from exporter.config.problems import Notes, kind_of
from exporter.config.sqltext import collector_sql_problem
from exporter.errors import excerpt

TOP_FIELDS = frozenset(
    {"by", "limit", "band", "hold", "churn", "keep", "other", "sum", "max", "probe", "id"}
)
#: ``band`` when absent: twice ``limit``.
BAND_FACTOR = 2
#: ``churn`` when absent: a quarter of ``limit`` new keys an hour, so that the distinct
#: series of an hour stay near 1.25 × limit and below 1.5 × with a few heavy hitters.
CHURN_SHARE = 0.25


def read_top(notes: Notes, key: str, raw: object, columns: tuple[Column, ...]) -> Top | None:
    """The ``top`` mapping as a :class:`Top`, or None (absent, or after noting problems)."""
    where = f"{key}.top"
    if raw is None:
        return None
    if not isinstance(raw, dict):
        notes.error(where, f"expected a mapping like {{by: calls, limit: 100}}, got {kind_of(raw)}")
        return None
    before = len(notes.problems)
    notes.warn_unknown(where, raw, TOP_FIELDS)
    usages = {c.name: c.usage for c in columns}
    probe, ident = _read_probe(notes, where, raw.get("probe"), raw.get("id"))
    by = _read_by(notes, f"{where}.by", raw.get("by"), usages, probed=probe is not None)
    limit = _read_count(notes, f"{where}.limit", raw.get("limit"), 1, required=True)
    band = _read_count(notes, f"{where}.band", raw.get("band"), limit or 1, required=False)
    keep = _read_columns(notes, f"{where}.keep", raw.get("keep"), usages, Usage.LABEL)
    summed = _read_columns(notes, f"{where}.sum", raw.get("sum"), usages, Usage.GAUGE)
    largest = _read_columns(notes, f"{where}.max", raw.get("max"), usages, Usage.GAUGE)
    if both := sorted(set(summed) & set(largest)):
        notes.error(f"{where}.max", f"{excerpt(both[0])} is in sum as well; pick one")
    if probe is not None and largest:
        notes.error(
            f"{where}.max",
            "a probe gives totals only, so the largest of the rest is unknown; "
            "use sum, or drop the probe",
        )
    _check_shape(notes, where, columns, keep)
    hold = _read_number(notes, f"{where}.hold", raw.get("hold"), DEFAULT_HOLD)
    churn = _read_number(notes, f"{where}.churn", raw.get("churn"), CHURN_SHARE * (limit or 0))
    other = raw.get("other", DEFAULT_OTHER)
    if not isinstance(other, str) or not other:
        notes.error(f"{where}.other", f"expected a non-empty string, got {kind_of(other)}")
    if len(notes.problems) > before or by is None or limit is None:
        return None
    band = band or BAND_FACTOR * limit
    return Top(by, limit, band, hold, churn, keep, str(other), summed, largest, probe, ident)


def _read_probe(
    notes: Notes, where: str, probe: object, ident: object
) -> tuple[str | None, str | None]:
    """``probe`` (the SQL that lists every key with its ranking counter) and ``id`` (the
    column of the query's rows that tells their key): both or neither."""
    if probe is None and ident is None:
        return None, None
    if not isinstance(probe, str) or not probe.strip():
        notes.error(
            f"{where}.probe",
            "expected the SQL that lists, a row per group of the keep labels, every "
            f"key and its ranking counter as arrays (id is set), got {kind_of(probe)}",
        )
        return None, None
    if (problem := collector_sql_problem(probe)) is not None:
        notes.error(f"{where}.probe", problem)
    if not isinstance(ident, str) or not ident:
        notes.error(
            f"{where}.id",
            "required with probe: the column of the query's rows that holds "
            f"their key as the probe lists it, got {kind_of(ident)}",
        )
        return None, None
    return probe, ident


def _read_by(
    notes: Notes, where: str, value: object, usages: dict[str, Usage], *, probed: bool
) -> str | None:
    """``by``: required, a COUNTER column of the branch (its rate ranks the keys); with a
    probe, the probe's column that holds each key's ranking counter."""
    if not isinstance(value, str) or not value:
        notes.error(where, f"required: the COUNTER column to rank by, got {kind_of(value)}")
        return None
    if probed:
        if usages.get(value) is Usage.COUNTER:
            notes.error(
                where,
                f"{excerpt(value)} is a COUNTER of this branch, whose total the probe "
                "gives under that name: name the probe's array of ranking counters otherwise",
            )
            return None
        return value
    if usages.get(value) is not Usage.COUNTER:
        notes.error(where, f"{excerpt(value)} is not a COUNTER column of this branch")
        return None
    return value


def _read_count(
    notes: Notes, where: str, value: object, minimum: int, *, required: bool
) -> int | None:
    """A whole number of keys, at least ``minimum``."""
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        notes.error(where, f"expected an integer >= {minimum}, got {kind_of(value)}")
        return None
    return value


def _read_number(notes: Notes, where: str, value: object, default: float) -> float:
    """Seconds or keys per hour: a finite number >= 0."""
    if value is None:
        return float(default)
    if not is_number(value) or not math.isfinite(value) or value < 0:
        notes.error(where, f"expected a finite number >= 0, got {kind_of(value)}")
        return float(default)
    return float(value)


def _read_columns(
    notes: Notes, where: str, value: object, usages: dict[str, Usage], usage: Usage
) -> tuple[str, ...]:
    """``keep`` (LABEL columns the remainder keeps as they are), ``sum`` or ``max``
    (GAUGE columns the remainder sums or takes the largest of)."""
    kind = usage.value
    if value is None:
        return ()
    if not isinstance(value, list):
        notes.error(where, f"expected a list of {kind} columns, got {kind_of(value)}")
        return ()
    for index, name in enumerate(value):
        if not isinstance(name, str) or usages.get(name) is not usage:
            notes.error(f"{where}[{index}]", f"{excerpt(name)} is not a {kind} column here")
    return tuple(str(name) for name in value)


def _check_shape(
    notes: Notes, where: str, columns: tuple[Column, ...], keep: tuple[str, ...]
) -> None:
    """Something to rank (a LABEL column not kept) and nothing that cannot be summed."""
    labels = [c.name for c in columns if c.usage is Usage.LABEL]
    if columns and not set(labels) - set(keep):
        notes.error(where, "needs a LABEL column not in keep: the key that is ranked")
    if any(c.usage is Usage.HISTOGRAM for c in columns):
        notes.error(where, "a branch with HISTOGRAM columns cannot be ranked; split it")
