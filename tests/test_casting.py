"""One result cell as a sample value or a label value (compatibility §3), without a database."""

from __future__ import annotations

import datetime as dt
import enum
import math
import uuid
from decimal import Decimal

import pytest

from exporter.casting import Escaped, decode_text, label_text, to_number

UTC = dt.UTC


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
        ("3.5", 3.5),
        ("-1e3", -1000.0),
        (dt.datetime(1970, 1, 2, tzinfo=UTC), 86400.0),
        (dt.datetime(1970, 1, 2, 1, tzinfo=dt.timezone(dt.timedelta(hours=1))), 86400.0),
        (dt.datetime(1970, 1, 2), 86400.0),  # naive: taken as UTC
        (dt.date(1970, 1, 3), 172800.0),
        (dt.timedelta(minutes=2, milliseconds=500), 120.5),
        (Level.HIGH, 7),
        (Stamp(1970, 1, 1, 0, 0, 10, tzinfo=UTC), 10.0),
    ],
)
def test_numbers_and_times_become_their_value(cell: object, expected: float) -> None:
    """Numbers keep their value, timestamps become Unix seconds, booleans 1/0."""
    assert to_number(cell) == expected


@pytest.mark.parametrize(
    "cell",
    [None, "", "twelve", "1.2.3", Decimal("sNaN"), Decimal("NaN"), b"12", [1], dt.time(1, 2)],
)
def test_what_is_no_number_becomes_nan(cell: object) -> None:
    """NULL, text that does not parse, a signalling NaN and other types give NaN, never raise."""
    assert math.isnan(to_number(cell))


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        (4, 2.0),
        (1.5, 0.75),
        (Decimal("3"), 1.5),
        ("8", 4.0),
        (dt.timedelta(seconds=10), 5.0),
    ],
)
def test_scale_multiplies_numbers(cell: object, expected: float) -> None:
    """``scale`` applies to numbers, numeric text and intervals."""
    assert to_number(cell, 0.5) == expected


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        (True, 1),
        (dt.datetime(1970, 1, 1, 0, 1, tzinfo=UTC), 60.0),
        (dt.date(1970, 1, 2), 86400.0),
        (Stamp(1970, 1, 1, 0, 1, tzinfo=UTC), 60.0),  # a subclass too
    ],
)
def test_scale_leaves_timestamps_and_booleans_alone(cell: object, expected: float) -> None:
    """Timestamps and booleans are never scaled (compatibility §3)."""
    assert to_number(cell, 1000.0) == expected


def test_scale_keeps_nan() -> None:
    """A NULL stays NaN whatever the scale."""
    assert math.isnan(to_number(None, 2.0))


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        ("text", "text"),
        (None, ""),
        (True, "true"),
        (False, "false"),
        (12, "12"),
        (Decimal("1.50"), "1.50"),
        (dt.date(2024, 2, 29), "2024-02-29"),
        (dt.datetime(2024, 2, 29, 12, 30, tzinfo=UTC), "2024-02-29T12:30:00+00:00"),
        (dt.time(8, 5), "08:05:00"),
        (uuid.UUID(int=1), "00000000-0000-0000-0000-000000000001"),
        (b"caf\xc3\xa9", "café"),
        (memoryview(b"abc"), "abc"),
    ],
)
def test_label_text(cell: object, expected: str) -> None:
    """A cell as a label value: NULL is empty, booleans lower case, dates ISO, bytes UTF-8."""
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


def test_bytea_labels_escape_like_text() -> None:
    """A bytea label cell follows the same rule as undecodable text."""
    assert label_text(bytearray(b"\x80a")) == "\\x80a"
