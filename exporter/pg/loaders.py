"""How a collector's result cells are read from the wire: as the Go exporter's driver
reads them (issue 30).

Installed on the cursor that runs collector queries only (the exporter's own queries
keep psycopg's loaders). Numbers come as numbers (``int2/4/8``, ``oid``: int;
``float4/8``: float), booleans as bool, ``bytea`` as bytes, ``date``/``timestamp``/
``timestamptz`` as whole Unix seconds (an int; ±inf for ``infinity``, as Go publishes
them), and every other type, ``numeric`` included, as PostgreSQL's own text: a cell
never fails to load, so no collector is lost to a value the server can return, and a
label shows what ``psql`` would. ``exporter.pg.casting`` then casts each column by its type.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.abc import AdaptContext, Buffer
from psycopg.adapt import Loader
from psycopg.pq import Format

# Types whose psycopg loaders already give what casting expects (and text types).
_KEPT = frozenset({
    "bool", "bytea", "int2", "int4", "int8", "oid", "float4", "float8",
    "text", "varchar", "bpchar", "name", '"char"',
})  # fmt: skip
_EPOCH_TYPES = ("date", "timestamp", "timestamptz")

_SECOND = dt.timedelta(seconds=1)
_EPOCH_NAIVE = dt.datetime(1970, 1, 1)  # a timestamp without time zone counts as UTC
_EPOCH_AWARE = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()
_DAY = 86400

# PostgreSQL's ISO output (DateStyle ISO) of a date or timestamp[tz], which Python's
# datetime cannot hold when it is BC or after year 9999.
_ISO = re.compile(
    rb"(\d{4,})-(\d\d)-(\d\d)"
    rb"(?: (\d\d):(\d\d):(\d\d)(?:\.\d+)?)?"
    rb"(?:([+-])(\d\d)(?::(\d\d))?(?::(\d\d))?)?"
    rb"( BC)?"
)


def days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (year 0 is 1 BC)."""
    year -= month <= 2
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468


def iso_epoch(data: bytes) -> float | int:
    """Unix seconds (rounded down) of a date or timestamp in PostgreSQL's ISO text; ±inf
    for ``infinity``; NaN for text in another DateStyle that psycopg could not read."""
    if data == b"infinity":
        return math.inf
    if data == b"-infinity":
        return -math.inf
    match = _ISO.fullmatch(data)
    if match is None:
        return math.nan
    year, month, day, hour, minute, second, sign, oh, om, os, bc = match.groups()
    days = days_from_civil(1 - int(year) if bc else int(year), int(month), int(day))
    seconds = days * _DAY + int(hour or 0) * 3600 + int(minute or 0) * 60 + int(second or 0)
    if sign:
        offset = int(oh) * 3600 + int(om or 0) * 60 + int(os or 0)
        seconds -= offset if sign == b"+" else -offset
    return seconds


def _timestamp_seconds(value: dt.datetime) -> int:
    return (value - _EPOCH_NAIVE) // _SECOND


def _timestamptz_seconds(value: dt.datetime) -> int:
    return (value - _EPOCH_AWARE) // _SECOND


def _date_seconds(value: dt.date) -> int:
    return (value.toordinal() - _EPOCH_ORDINAL) * _DAY


_SECONDS: dict[str, Callable[[Any], int]] = {
    "date": _date_seconds,
    "timestamp": _timestamp_seconds,
    "timestamptz": _timestamptz_seconds,
}


class _Epoch(Loader):
    """A date or timestamp[tz] as whole Unix seconds, as the Go exporter publishes it:
    read by psycopg's own loader (any DateStyle), and by :func:`iso_epoch` where that
    refuses (``infinity``, BC, after year 9999)."""

    seconds: Callable[[Any], int]

    def __init__(self, oid: int, context: AdaptContext | None = None) -> None:
        super().__init__(oid, context)
        read = psycopg.adapters.get_loader(oid, Format.TEXT)
        if read is None:  # pragma: no cover - psycopg always has these
            raise psycopg.InterfaceError(f"no psycopg loader for type oid {oid}")
        self._read = read(oid, context).load

    def load(self, data: Buffer) -> float | int:
        try:
            return self.seconds(self._read(data))
        except (psycopg.DataError, ValueError, OverflowError):
            return iso_epoch(bytes(data))


def _epoch_loader(name: str) -> type[_Epoch]:
    return type(f"_{name.title()}Epoch", (_Epoch,), {"seconds": staticmethod(_SECONDS[name])})


_EPOCH_LOADERS = {name: _epoch_loader(name) for name in _EPOCH_TYPES}


def install(cursor: psycopg.AsyncCursor[Any]) -> None:
    """Make this cursor (only) read collector results as the Go exporter's driver does."""
    adapters = cursor.adapters
    # Whatever reads text on this connection: psycopg's, or the SQL_ASCII rule.
    text = adapters.get_loader(0, Format.TEXT)
    if text is None:  # pragma: no cover - psycopg always has one
        raise psycopg.InterfaceError("no text loader")
    for info in adapters.types:
        if info.name in _EPOCH_LOADERS:
            adapters.register_loader(info.oid, _EPOCH_LOADERS[info.name])
        elif info.name not in _KEPT:
            adapters.register_loader(info.oid, text)
        if info.array_oid:
            adapters.register_loader(info.array_oid, text)
