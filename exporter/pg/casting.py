"""Casting: a result column's cells as sample values or label values, as the Go
exporter casts them (pure; compatibility §3, issue 30).

How a cell is cast depends on its column's PostgreSQL type, so it is decided once per
column from the type oid of the result (:func:`cast_for`), never per row. The
collector cursor's loaders (``exporter.pg.loaders``) hand over numbers as numbers,
booleans as booleans, ``date``/``timestamp``/``timestamptz`` as whole Unix seconds
(±inf for ``infinity``), ``bytea`` as bytes and every other type as PostgreSQL's own
text; a :class:`Cast` says what each of those becomes:

======================  ============================  ===============================
kind (types)            value                         label
======================  ============================  ===============================
INT (int2/4/8, oid)     the number, scaled            decimal digits
FLOAT (float4/8)        the number, scaled            Go's shortest form (``1e+06``)
NUMERIC                 nearest float (±Inf beyond)   PostgreSQL's text
BOOL                    1 or 0, never scaled          ``true`` / ``false``
EPOCH (date, ts, tstz)  Unix seconds, never scaled    Unix seconds, or ``infinity``
BYTEA                   its bytes parsed as a number  UTF-8, bad bytes as ``\\xNN``
TEXT (everything else)  parsed as Go parses, scaled   PostgreSQL's text
======================  ============================  ===============================

"Parsed as Go parses" is Go's ``strconv.ParseFloat``: no surrounding space, ASCII
digits only, ``_`` between digits, hexadecimal only with a ``p`` exponent, ``inf``/
``infinity``/``nan`` in any case, and NaN when the text does not parse or overflows.
A NULL value takes the column's ``default`` (then scaled), else NaN; a NULL label is
empty. LABEL columns ignore ``scale`` and ``default``, as Go's do.
"""

from __future__ import annotations

import datetime as dt
import enum
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any


def go_float(value: float) -> str:
    """A float as Go's ``strconv.FormatFloat(v, 'g', -1, 64)`` and ``%v`` write it (``le``
    values, float labels): ``1e+06``, ``42``, ``0.0001``, ``1e-05``, ``-0``, ``+Inf``."""
    if not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    sign, digit_tuple, exponent = Decimal(repr(value)).normalize().as_tuple()
    digits = "".join(map(str, digit_tuple))
    point = len(digits) + int(exponent)  # value = 0.<digits> × 10**point
    prefix = "-" if sign else ""
    if not -4 <= point - 1 < 6:  # Go switches to %e at these exponents for shortest output
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{prefix}{mantissa}e{point - 1:+03d}"
    if point <= 0:
        return f"{prefix}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return prefix + digits + "0" * (point - len(digits))
    return f"{prefix}{digits[:point]}.{digits[point:]}"


NAN = math.nan
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_EPOCH_ORDINAL = _EPOCH.date().toordinal()
_SECOND = dt.timedelta(seconds=1)


class Kind(enum.Enum):
    """How a column's cells are cast: by the PostgreSQL type of the column."""

    INT = "int"
    FLOAT = "float"
    NUMERIC = "numeric"
    BOOL = "bool"
    EPOCH = "epoch"
    BYTEA = "bytea"
    TEXT = "text"
    ANY = "any"  # no type known (a caller without a result description): by Python type


# Built-in type oids (stable across PostgreSQL versions; a domain reports its base type).
KIND_BY_OID: dict[int, Kind] = {
    16: Kind.BOOL,
    17: Kind.BYTEA,
    20: Kind.INT,  # int8
    21: Kind.INT,  # int2
    23: Kind.INT,  # int4
    26: Kind.INT,  # oid
    700: Kind.FLOAT,  # float4
    701: Kind.FLOAT,  # float8
    1700: Kind.NUMERIC,
    1082: Kind.EPOCH,  # date
    1114: Kind.EPOCH,  # timestamp
    1184: Kind.EPOCH,  # timestamptz
}


def kind_of(oid: int | None) -> Kind:
    """The kind of a result column of this type oid (None: unknown)."""
    if oid is None:
        return Kind.ANY
    return KIND_BY_OID.get(oid, Kind.TEXT)


# Go's strconv.ParseFloat syntax (underscores only between digits, or after a base prefix).
_DIGITS = r"[0-9](?:_?[0-9])*"  # ASCII only: Python's \d and float() take any script's
_HEX = r"[0-9a-fA-F](?:_?[0-9a-fA-F])*"
_GO_DECIMAL = re.compile(
    rf"[+-]?(?:{_DIGITS}(?:\.(?:{_DIGITS})?)?|\.{_DIGITS})(?:[eE][+-]?{_DIGITS})?"
)
_GO_HEX = re.compile(rf"[+-]?0[xX]_?(?:{_HEX}(?:\.(?:{_HEX})?)?|\.{_HEX})[pP][+-]?{_DIGITS}")
_GO_SPECIAL = {"inf": math.inf, "+inf": math.inf, "-inf": -math.inf, "nan": NAN}


def go_parse_float(text: str) -> float:
    """``text`` as Go's ``strconv.ParseFloat(text, 64)`` reads it; NaN where that fails,
    overflow included (the Go exporter publishes NaN then)."""
    if _GO_DECIMAL.fullmatch(text):
        number = float(text.replace("_", ""))
        return NAN if math.isinf(number) else number
    lowered = text.lower().replace("infinity", "inf")
    if lowered in _GO_SPECIAL:
        return _GO_SPECIAL[lowered]
    if _GO_HEX.fullmatch(text):
        try:
            return float.fromhex(text.replace("_", ""))
        except OverflowError:
            return NAN
    return NAN


def _parsed(value: Any) -> float:
    """Text (or what else a loader gave) parsed as Go parses text."""
    if isinstance(value, str):
        return go_parse_float(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return go_parse_float(bytes(value).decode("latin-1"))
    return to_number(value)


def _numeric(value: Any) -> float:
    """A numeric's text as the nearest float: beyond float's range that is ±Inf, which
    every parser of the exposition reads (its 400 digits no parser takes)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return _parsed(value)


def _bool(value: Any) -> int:
    return 1 if value else 0


def _same(value: Any) -> Any:
    return value


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


def _float_label(value: Any) -> str:
    return go_float(value) if type(value) is float else label_text(value)


def _epoch_label(value: Any) -> str:
    """Whole seconds as digits; ``infinity`` as PostgreSQL writes it (Go shows the text)."""
    if type(value) is int:
        return str(value)
    if isinstance(value, float) and math.isinf(value):
        return "infinity" if value > 0 else "-infinity"
    return label_text(value)


def _bool_label(value: Any) -> str:
    return "true" if value else "false"


def _text_label(value: Any) -> str:
    return value if isinstance(value, str) else label_text(value)


def _bytes_label(value: Any) -> str:
    if isinstance(value, bytes | bytearray | memoryview):
        return decode_text(bytes(value))
    return label_text(value)


@dataclass(frozen=True, slots=True)
class Cast:
    """What one kind of column's (non-NULL) cells become: a number, whether ``scale``
    applies to it, and a label text (unescaped)."""

    kind: Kind
    number: Callable[[Any], float | int]
    scaled: bool
    label: Callable[[Any], str]

    def converter(self, scale: float | None) -> Callable[[Any], float | int]:
        """A non-NULL cell as its sample value, ``scale`` applied where it applies."""
        number = self.number
        if self.kind is Kind.ANY:
            return lambda value: to_number(value, scale)
        if scale is None or not self.scaled:
            return number
        return lambda value: number(value) * scale


_CASTS: dict[Kind, Cast] = {
    Kind.INT: Cast(Kind.INT, _same, True, str),
    Kind.FLOAT: Cast(Kind.FLOAT, _same, True, _float_label),
    Kind.NUMERIC: Cast(Kind.NUMERIC, _numeric, True, _text_label),
    Kind.BOOL: Cast(Kind.BOOL, _bool, False, _bool_label),
    Kind.EPOCH: Cast(Kind.EPOCH, _same, False, _epoch_label),
    Kind.BYTEA: Cast(Kind.BYTEA, _parsed, True, _bytes_label),
    Kind.TEXT: Cast(Kind.TEXT, _parsed, True, _text_label),
}


def cast_for(oid: int | None) -> Cast:
    """The cast of a result column of this type oid (None: decided by each cell's type)."""
    kind = kind_of(oid)
    return _CASTS.get(kind) or _ANY


# ----------------------------------------------------------------------------------------
# Without a type oid: by the Python type of each cell (psycopg's default loaders).


def _from_datetime(v: dt.datetime) -> int:
    """Whole Unix seconds, rounded down as Go's are; a naive timestamp is taken as UTC."""
    return ((v if v.tzinfo else v.replace(tzinfo=dt.UTC)) - _EPOCH) // _SECOND


def _from_date(v: dt.date) -> int:
    """Unix seconds of midnight UTC."""
    return (v.toordinal() - _EPOCH_ORDINAL) * 86400


def _from_decimal(v: Decimal) -> float:
    try:
        return float(v)
    except ValueError:  # signalling NaN
        return NAN


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
    str: (go_parse_float, True),
    bytes: (_parsed, True),
    bytearray: (_parsed, True),
    memoryview: (_parsed, True),
    dt.datetime: (_from_datetime, False),
    dt.date: (_from_date, False),
}
_NOT_A_NUMBER: _Conversion = (_not_a_number, False)


def to_number(value: object, scale: float | None = None) -> float | int:
    """A cell of no known type as a sample value (NULL and non-numeric values are NaN)."""
    convert, scalable = _NUMBERS.get(type(value)) or _by_isinstance(value)
    number = convert(value)
    return number * scale if scalable and scale is not None else number


def _by_isinstance(value: object) -> _Conversion:
    """Conversion for subclasses of the known types (datetime before date: it is one)."""
    for kind in (bool, dt.datetime, dt.date, int, float, Decimal, str, bytes):
        if isinstance(value, kind):
            return _NUMBERS[kind]
    return _NOT_A_NUMBER


def label_text(value: object) -> str:
    """A cell of no known type as an (unescaped) label value."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return _other_label(value)


def _other_label(value: object) -> str:
    if isinstance(value, float):
        return go_float(value)
    if isinstance(value, dt.datetime):
        return str(_from_datetime(value))
    if isinstance(value, dt.date):
        return str(_from_date(value))
    if isinstance(value, bytes | bytearray | memoryview):
        return decode_text(bytes(value))
    return str(value)


_ANY = Cast(Kind.ANY, to_number, True, label_text)


def array_elements(text: str) -> list[str | None]:
    """The elements of a one-dimensional array as PostgreSQL writes it (``{1,2,NULL}``,
    ``{"a b","c\\"d"}``): each as its text, None for NULL. Raises ValueError for what is
    not one (a nested array among them)."""
    if len(text) < 2 or text[0] != "{" or text[-1] != "}":
        raise ValueError(f"not an array: {text[:40]!r}")
    body = text[1:-1]
    if not body:
        return []
    if "{" in body:
        raise ValueError("a nested array: one dimension is expected")
    if '"' not in body:  # numbers, plain names: at C level
        parts: list[str | None] = list(body.split(","))
        return [None if part == "NULL" else part for part in parts] if "NULL" in parts else parts
    return _quoted_elements(body)


def _quoted_elements(body: str) -> list[str | None]:
    """The elements of an array's text that quotes some of them (``"a,b"``, ``\\"``)."""
    found: list[str | None] = []
    n, end = 0, len(body)
    while n <= end:
        if n < end and body[n] == '"':
            chars, n = [], n + 1
            while n < end and body[n] != '"':
                if body[n] == "\\":
                    n += 1
                chars.append(body[n])
                n += 1
            if n >= end:
                raise ValueError("an unterminated quoted element")
            found.append("".join(chars))
            n += 1  # the closing quote
        else:
            comma = body.find(",", n)
            comma = end if comma < 0 else comma
            part = body[n:comma]
            found.append(None if part == "NULL" else part)
            n = comma
        if n < end and body[n] != ",":
            raise ValueError(f"unexpected {body[n]!r} after an element")
        n += 1
    return found
