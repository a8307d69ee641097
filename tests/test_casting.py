"""A result column's cells as sample values and label values (compatibility §3, issue 30),
without a database. The Go exporter's answers these rules follow are recorded in
tests/data/gocompat/values and compared for real in tests/integration/test_go_values.py;
the expectations below are taken from there."""

from __future__ import annotations

import datetime as dt
import enum
import math
import uuid
from decimal import Decimal

import pytest

from exporter.pg.casting import (
    KIND_BY_OID,
    Escaped,
    Kind,
    array_elements,
    cast_for,
    decode_text,
    go_float,
    go_parse_float,
    kind_of,
    label_text,
    to_number,
)

UTC = dt.UTC
INT4, FLOAT8, NUMERIC, BOOL, BYTEA, TEXT, TIMESTAMP = 23, 701, 1700, 16, 17, 25, 1114
JSON, INTERVAL, TIME = 114, 1186, 1083


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or (a == b and type(a) is type(b))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("42", 42.0),
        ("+42", 42.0),
        ("-1.5e3", -1500.0),
        (".5", 0.5),
        ("5.", 5.0),
        ("1_000", 1000.0),
        ("1_000.5e1_0", 1000.5e10),
        ("0x1p4", 16.0),
        ("0x_1.8p1", 3.0),
        ("1e-400", 0.0),
        ("inf", math.inf),
        ("Inf", math.inf),
        ("+Infinity", math.inf),
        ("-infinity", -math.inf),
        ("NaN", math.nan),
        ("nan", math.nan),
    ],
)
def test_text_parses_as_go_parses_it(text: str, expected: float) -> None:
    """What Go's ParseFloat takes: signs, a bare point, underscores between digits,
    hexadecimal with a p exponent, inf/infinity/nan in any case; underflow is 0."""
    assert _same(go_parse_float(text), expected)


@pytest.mark.parametrize(
    "text",
    [
        " 42",
        "42 ",
        "\uff14\uff12",  # fullwidth digits
        "\u0661\u0662",  # Arabic-Indic digits
        "0x10",  # hexadecimal without a p exponent
        "0b101",
        "1__000",
        "_1",
        "1_",
        "1_.5",
        "1e400",  # overflow: Go publishes NaN
        "-1e400",
        "0x1p99999",
        "+nan",
        "infin",
        "",
        ".",
        "1e",
        "abc",
        "$1,000.50",
    ],
)
def test_text_go_does_not_parse_is_nan(text: str) -> None:
    """Padding, digits of other scripts, base prefixes Go refuses, misplaced underscores
    and overflow: NaN, where Python's float() would take several of them."""
    assert math.isnan(go_parse_float(text))


@pytest.mark.parametrize(
    ("oid", "kind"),
    [
        (20, Kind.INT),
        (21, Kind.INT),
        (INT4, Kind.INT),
        (26, Kind.INT),
        (700, Kind.FLOAT),
        (FLOAT8, Kind.FLOAT),
        (NUMERIC, Kind.NUMERIC),
        (BOOL, Kind.BOOL),
        (BYTEA, Kind.BYTEA),
        (1082, Kind.EPOCH),
        (TIMESTAMP, Kind.EPOCH),
        (1184, Kind.EPOCH),
        (TEXT, Kind.TEXT),
        (JSON, Kind.TEXT),
        (INTERVAL, Kind.TEXT),
        (TIME, Kind.TEXT),
        (1007, Kind.TEXT),  # int4[]
        (987654, Kind.TEXT),  # a type of the user's own (an enum)
        (None, Kind.ANY),
    ],
)
def test_a_columns_kind_comes_from_its_type_oid(oid: int | None, kind: Kind) -> None:
    """One decision per column, from the result's type oid."""
    assert kind_of(oid) is kind
    assert cast_for(oid).kind is kind


def test_every_kind_by_oid_has_a_cast() -> None:
    assert {cast_for(oid).kind for oid in KIND_BY_OID} == set(KIND_BY_OID.values())


@pytest.mark.parametrize(
    ("oid", "cell", "scale", "expected"),
    [
        (INT4, 42, None, 42),
        (INT4, 42, 1000.0, 42000.0),
        (FLOAT8, 0.5, 2.0, 1.0),
        (NUMERIC, "12345678901234567890.123456789", None, 1.2345678901234567e19),
        (NUMERIC, "1.50", 1000.0, 1500.0),
        (NUMERIC, "NaN", None, math.nan),
        (NUMERIC, "Infinity", None, math.inf),
        (NUMERIC, "1" + "0" * 400, None, math.inf),  # beyond float: +Inf, never 401 digits
        (NUMERIC, "-1" + "0" * 400, 2.0, -math.inf),
        (BOOL, True, 1000.0, 1),  # booleans are not scaled
        (BOOL, False, None, 0),
        (TIMESTAMP, 1709210096, 1000.0, 1709210096),  # nor are timestamps
        (TIMESTAMP, math.inf, None, math.inf),
        (BYTEA, b"42", 1000.0, 42000.0),
        (BYTEA, b" 42.5", None, math.nan),
        (TEXT, "42", 1000.0, 42000.0),
        (TEXT, " 42", None, math.nan),
        (JSON, "4.2e1", None, 42.0),
        (JSON, '"42"', None, math.nan),
        (INTERVAL, "1 day 02:00:00", None, math.nan),
        (TIME, "12:34:56.789", None, math.nan),
    ],
)
def test_values_by_type(oid: int, cell: object, scale: float | None, expected: float) -> None:
    """Each kind's cells as sample values, ``scale`` applied where Go applies it."""
    assert _same(cast_for(oid).converter(scale)(cell), expected)


@pytest.mark.parametrize(
    ("oid", "cell", "expected"),
    [
        (INT4, -2147483648, "-2147483648"),
        (20, 9223372036854775807, "9223372036854775807"),
        (FLOAT8, 1e6, "1e+06"),
        (FLOAT8, 42.0, "42"),
        (FLOAT8, 1e-5, "1e-05"),
        (FLOAT8, 0.0001, "0.0001"),
        (FLOAT8, 123456789012.0, "1.23456789012e+11"),
        (FLOAT8, -0.0, "-0"),
        (FLOAT8, math.inf, "+Inf"),
        (FLOAT8, -math.inf, "-Inf"),
        (FLOAT8, math.nan, "NaN"),
        (NUMERIC, "1.50", "1.50"),  # PostgreSQL's own text
        (BOOL, True, "true"),
        (BOOL, False, "false"),
        (TIMESTAMP, 1709210096, "1709210096"),
        (TIMESTAMP, -210863520000, "-210863520000"),
        (TIMESTAMP, math.inf, "infinity"),
        (TIMESTAMP, -math.inf, "-infinity"),
        (BYTEA, b"42", "42"),
        (BYTEA, b"\xe9", "\\xe9"),
        (TEXT, " 42", " 42"),
        (JSON, '{"a": 1}', '{"a": 1}'),
        (1007, "{1,2}", "{1,2}"),
    ],
)
def test_labels_by_type(oid: int, cell: object, expected: str) -> None:
    """Each kind's cells as label text: floats in Go's shortest form, timestamps as Unix
    seconds, everything else as PostgreSQL writes it."""
    assert cast_for(oid).label(cell) == expected


class Level(enum.IntEnum):
    HIGH = 7


class Stamp(dt.datetime):
    """A datetime subclass (as a driver adapter might return)."""


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        (42, 42),
        (-1.5, -1.5),
        (True, 1),
        (False, 0),
        (Decimal("12.25"), 12.25),
        (Decimal("-Infinity"), -math.inf),
        (Decimal("1E+400"), math.inf),
        ("3.5", 3.5),
        ("-1e3", -1000.0),
        (b"12", 12.0),
        (dt.datetime(1970, 1, 2, tzinfo=UTC), 86400),
        (dt.datetime(1970, 1, 2, 1, tzinfo=dt.timezone(dt.timedelta(hours=1))), 86400),
        (dt.datetime(1970, 1, 2), 86400),  # naive: taken as UTC
        (dt.datetime(1969, 12, 31, 23, 59, 59, 500000, tzinfo=UTC), -1),  # rounded down
        (dt.date(1970, 1, 3), 172800),
        (Level.HIGH, 7),
        (Stamp(1970, 1, 1, 0, 0, 10, tzinfo=UTC), 10),
    ],
)
def test_without_a_type_cells_are_cast_by_their_python_type(cell: object, expected: float) -> None:
    """No type oid known: numbers keep their value, timestamps whole Unix seconds,
    booleans 1/0, text parsed as Go parses it."""
    assert to_number(cell) == expected


@pytest.mark.parametrize(
    "cell",
    [None, "", "twelve", " 42", Decimal("sNaN"), Decimal("NaN"), [1], dt.time(1, 2)],
)
def test_without_a_type_what_is_no_number_becomes_nan(cell: object) -> None:
    """NULL, text that does not parse, a signalling NaN and other types give NaN."""
    assert math.isnan(to_number(cell))


def test_without_a_type_scale_leaves_timestamps_and_booleans_alone() -> None:
    assert to_number(True, 1000.0) == 1
    assert to_number(dt.date(1970, 1, 2), 1000.0) == 86400
    assert to_number("8", 0.5) == 4.0
    assert math.isnan(to_number(None, 2.0))


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        ("text", "text"),
        (None, ""),
        (True, "true"),
        (12, "12"),
        (1e6, "1e+06"),
        (Decimal("1.50"), "1.50"),
        (dt.date(2024, 2, 29), "1709164800"),
        (dt.datetime(2024, 2, 29, 12, 34, 56, 789000, tzinfo=UTC), "1709210096"),
        (dt.time(8, 5), "08:05:00"),
        (uuid.UUID(int=1), "00000000-0000-0000-0000-000000000001"),
        (b"caf\xc3\xa9", "café"),
        (memoryview(b"abc"), "abc"),
        (bytearray(b"\x80a"), "\\x80a"),
    ],
)
def test_without_a_type_label_text(cell: object, expected: str) -> None:
    """NULL is empty, booleans lower case, timestamps Unix seconds, bytes UTF-8."""
    assert label_text(cell) == expected


def test_invalid_utf8_is_escaped_and_marked() -> None:
    """Bytes invalid in UTF-8 are written ``\\xNN``, and the text is marked Escaped."""
    text = decode_text(b"ok\xff\xfe!")
    assert text == "ok\\xff\\xfe!"
    assert isinstance(text, Escaped)


def test_valid_utf8_is_not_marked_escaped() -> None:
    """Text that decodes is plain str: only a change is marked."""
    text = decode_text("naïve".encode())
    assert text == "naïve"
    assert not isinstance(text, Escaped)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.0, "0"),
        (0.5, "0.5"),
        (1.0, "1"),
        (2.5, "2.5"),
        (100000.0, "100000"),
        (1e6, "1e+06"),
        (123456789.0, "1.23456789e+08"),
        (0.0001, "0.0001"),
        (0.00001, "1e-05"),
        (0.005, "0.005"),
        (-2.5, "-2.5"),
        (-0.0, "-0"),  # a float8 label '-0' in Go 1.4.1 (tests/data/gocompat/values)
        (1e21, "1e+21"),
        (5e-324, "5e-324"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (math.inf, "+Inf"),
        (-math.inf, "-Inf"),
        (math.nan, "NaN"),
    ],
)
def test_go_float(value: float, text: str) -> None:
    """Bucket bounds and float labels are written the way Go's strconv 'g' shortest
    format writes them."""
    assert go_float(value) == text


def test_array_elements_reads_one_dimension_as_postgresql_writes_it() -> None:
    """A probe's arrays come as their text (issue 38): numbers and plain names split at
    C level, quoted elements with their escapes, NULL as None; a nested array or what is
    no array is refused."""
    assert array_elements("{}") == []
    assert array_elements("{16384,16390,7}") == ["16384", "16390", "7"]
    assert array_elements("{1,NULL,3}") == ["1", None, "3"]
    assert array_elements('{"a,b",c,"d\\"e",NULL,"NULL",""}') == [
        "a,b",
        "c",
        'd"e',
        None,
        "NULL",
        "",
    ]
    refused = {
        "{{1,2},{3,4}}": "a nested array",
        "1,2": "not an array",
        '{"a}': "an unterminated quoted element",
        '{"a"b}': "unexpected 'b' after an element",
    }
    for bad, words in refused.items():
        with pytest.raises(ValueError, match=words):
            array_elements(bad)
