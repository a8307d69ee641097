"""Collector definitions: what collectors exist, as frozen and validated objects.

These types are produced by :mod:`exporter.config.loading` from YAML collector files
and are trusted everywhere else. Nothing here does I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

#: Timeout applied when a branch says ``timeout: 0`` or nothing at all.
DEFAULT_TIMEOUT = 0.1
#: The most seconds a ttl or timeout may hold: the Go exporter keeps them as Go durations
#: (int64 nanoseconds, about 292 years) and refuses what overflows one since 1.5.0.
MAX_SECONDS = (2**63 - 1) / 1e9
#: Priority base: the k-th file's branches without ``priority`` get ``100 + k``.
PRIORITY_BASE = 100


class Usage(enum.Enum):
    """What a result column becomes."""

    DISCARD = "DISCARD"
    LABEL = "LABEL"
    GAUGE = "GAUGE"
    COUNTER = "COUNTER"
    HISTOGRAM = "HISTOGRAM"

    @property
    def is_value(self) -> bool:
        """True for columns that produce samples."""
        return self in (Usage.GAUGE, Usage.COUNTER, Usage.HISTOGRAM)


@dataclass(frozen=True, slots=True)
class Column:
    """One entry of a branch's ``metrics`` list."""

    name: str  # column name in the query result
    usage: Usage
    rename: str | None = None
    description: str = ""
    default: float | None = None  # replaces NULL (before scaling)
    scale: float | None = None
    buckets: tuple[float, ...] = ()  # HISTOGRAM only: finite, strictly increasing

    @property
    def output_name(self) -> str:
        """Label name (LABEL) or metric suffix (values): the rename if any, else the column."""
        return self.rename or self.name


@dataclass(frozen=True, slots=True)
class Predicate:
    """A predicate query: one boolean column, at most one row; all true → run."""

    name: str
    sql: str
    ttl: float = 0.0


#: What a remainder series carries in place of each key label (``top.other``'s default).
DEFAULT_OTHER = "other"
#: Seconds a named key must rank outside the band before it may leave (``top.hold``).
DEFAULT_HOLD = 600.0


@dataclass(frozen=True, slots=True)
class Top:
    """``top``: publish at most ``limit`` keys by the recent rate of counter ``by``, the
    rest summed into one remainder series per metric and per kept labels (issue 38)."""

    by: str  # the COUNTER column whose rate ranks the keys
    limit: int  # at most this many keys named at once
    band: int  # a named key may leave only after ranking beyond this for ``hold`` seconds
    hold: float = DEFAULT_HOLD
    churn: float = 0.0  # new keys that may be named per hour, heavy hitters aside
    keep: tuple[str, ...] = ()  # LABEL columns the remainder keeps (e.g. datname)
    other: str = DEFAULT_OTHER  # the remainder's value for every other LABEL column
    sum: tuple[str, ...] = ()  # GAUGE columns whose remainder is the sum of the unnamed keys'
    max: tuple[str, ...] = ()  # GAUGE columns whose remainder is the largest of theirs
    # A probe: SQL that lists, a row per group of the ``keep`` labels, every key and its
    # ranking counter as arrays, and the totals the remainder is the rest of; the query
    # then reads the named keys alone, passed as its parameter $1, each row telling its
    # key in column ``id``.
    probe: str | None = None
    id: str | None = None


@dataclass(frozen=True, slots=True)
class Collector:
    """One branch of a collector file (a top-level key)."""

    key: str  # the branch key, unique after merging
    name: str  # metric prefix, defaults to the key; may be shared by branches
    query: str
    columns: tuple[Column, ...]
    desc: str = ""
    predicates: tuple[Predicate, ...] = ()
    ttl: float = 0.0
    timeout: float | None = DEFAULT_TIMEOUT  # seconds; None means unbounded
    priority: int = PRIORITY_BASE
    min_version: int = 0  # inclusive, 0 = open
    max_version: int = 0  # exclusive, 0 = open
    fatal: bool = False
    skip: bool = False
    tags: tuple[str, ...] = ()
    max_series: int | None = None  # per-collector series cap; None uses the global one
    backoff_ceiling: float | None = None  # seconds; None uses --backoff-ceiling (D15)
    top: Top | None = None  # rank the rows and name only the busiest keys (issue 38)
    source: str = ""  # file the branch came from, for messages

    @property
    def bounded(self) -> bool:
        """True when the collector has a deadline of its own (timeout > 0)."""
        return self.timeout is not None

    @property
    def label_columns(self) -> tuple[Column, ...]:
        """LABEL columns in file order."""
        return tuple(c for c in self.columns if c.usage is Usage.LABEL)

    @property
    def value_columns(self) -> tuple[Column, ...]:
        """GAUGE, COUNTER and HISTOGRAM columns in file order."""
        return tuple(c for c in self.columns if c.usage.is_value)

    def metric_name(self, column: Column) -> str:
        """Family name of a value column: ``<name>_<rename or column>``."""
        return f"{self.name}_{column.output_name}"


@dataclass(frozen=True, slots=True)
class Definitions:
    """Every collector from a config file or directory, merged and ordered."""

    collectors: tuple[Collector, ...]  # sorted by (priority, key)
    sources: tuple[str, ...] = ()  # files read, in order
    # Files skipped in directory mode because they were invalid; reported, not fatal.
    skipped_files: tuple[str, ...] = field(default=())
    warnings: tuple[str, ...] = field(default=())
