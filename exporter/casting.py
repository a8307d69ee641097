"""Casting: one result cell as a sample value or a label value (pure).

psycopg hands over Python objects; docs/compatibility.md §3 says how each
becomes a number: timestamps as Unix seconds, booleans 1/0, numeric text parsed,
anything else NaN. ``scale`` applies to numbers only.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from decimal import Decimal
from typing import Any

NAN = math.nan
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _from_datetime(v: dt.datetime) -> float:
    """Unix seconds; a naive timestamp is taken as UTC."""
    return (v if v.tzinfo else v.replace(tzinfo=dt.UTC)).timestamp()


def _from_date(v: dt.date) -> float:
    """Unix seconds of midnight UTC."""
    return (dt.datetime(v.year, v.month, v.day, tzinfo=dt.UTC) - _EPOCH).total_seconds()


def _from_text(v: str) -> float:
    try:
        return float(v)
    except ValueError:
        return NAN


def _from_decimal(v: Decimal) -> float:
    try:
        return float(v)
    except ValueError:  # signalling NaN
        return NAN


def _same(v: float) -> float:
    return v


def _not_a_number(v: object) -> float:
    return NAN


# Converters take Any: each is only ever called with the type it is keyed by.
_Conversion = tuple[Callable[[Any], float | int], bool]
# type → (to number, whether ``scale`` applies). Timestamps and booleans are not scaled.
_NUMBERS: dict[type, _Conversion] = {
    int: (_same, True),
    float: (_same, True),
    bool: (int, False),
    Decimal: (_from_decimal, True),
    str: (_from_text, True),
    dt.datetime: (_from_datetime, False),
    dt.date: (_from_date, False),
    dt.timedelta: (dt.timedelta.total_seconds, True),
}
_NOT_A_NUMBER: _Conversion = (_not_a_number, False)
FAST_TYPES = frozenset({int, float})


def to_number(value: object, scale: float | None = None) -> float | int:
    """A result cell as a sample value (NULL and non-numeric values are NaN)."""
    convert, scalable = _NUMBERS.get(type(value)) or _by_isinstance(value)
    number = convert(value)
    return number * scale if scalable and scale is not None else number


def _by_isinstance(value: object) -> _Conversion:
    """Conversion for subclasses of the known types (datetime before date: it is one)."""
    for kind in (bool, dt.datetime, dt.date, dt.timedelta, int, float, Decimal, str):
        if isinstance(value, kind):
            return _NUMBERS[kind]
    return _NOT_A_NUMBER


class Escaped(str):
    """Text that held bytes invalid in UTF-8, shown with those bytes as ``\\xNN``: fit to
    read and to label, but not the server's own spelling (no connection can name it)."""

    __slots__ = ()


def decode_text(data: bytes) -> str:
    """Bytes PostgreSQL sent as text, as UTF-8 with each invalid byte escaped as ``\\xNN``.

    A SQL_ASCII server stores whatever bytes it was given, so psycopg hands them over
    undecoded; one rule for every label value, database name and log line keeps them
    readable and round-trippable by eye (issue 25). An :class:`Escaped` marks a change.
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return Escaped(data.decode("utf-8", "backslashreplace"))


def label_text(value: object) -> str:
    """A result cell as an (unescaped) label value."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return decode_text(bytes(value))
    return str(value)
