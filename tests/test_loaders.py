"""Dates and timestamps read as whole Unix seconds, as the Go exporter publishes them
(issue 30), without a database. The expected seconds are the Go 1.4.1 binary's answers
recorded in tests/data/gocompat/values; tests/integration/test_go_values.py reads them
from a real server."""

from __future__ import annotations

import datetime as dt
import math

import pytest

from exporter.pg.loaders import _EPOCH_LOADERS, days_from_civil, iso_epoch

DATE, TIMESTAMP, TIMESTAMPTZ = 1082, 1114, 1184


@pytest.mark.parametrize(
    ("name", "oid", "text", "seconds"),
    [
        ("date", DATE, b"2024-02-29", 1709164800),
        ("date", DATE, b"0001-01-01", -62135596800),
        ("date", DATE, b"4713-01-01 BC", -210863520000),
        ("date", DATE, b"10000-01-01", 253402300800),
        ("date", DATE, b"5874897-12-31", 185331706992000),
        ("timestamp", TIMESTAMP, b"2024-02-29 12:34:56.789", 1709210096),  # rounded down
        ("timestamp", TIMESTAMP, b"1969-12-31 23:59:59.5", -1),
        ("timestamp", TIMESTAMP, b"0044-03-15 12:00:00 BC", -63517780800),
        ("timestamp", TIMESTAMP, b"294276-12-31 23:59:59.999999", 9224318015999),
        ("timestamptz", TIMESTAMPTZ, b"2024-02-29 12:34:56+05:30", 1709190296),
        ("timestamptz", TIMESTAMPTZ, b"1900-01-01 00:00:00+00:53:28", -2208992008),
        ("timestamptz", TIMESTAMPTZ, b"0044-03-15 12:00:00+00 BC", -63517780800),
        ("timestamptz", TIMESTAMPTZ, b"20000-01-01 00:00:00+00", 568971820800),
        ("timestamptz", TIMESTAMPTZ, b"infinity", math.inf),
        ("timestamp", TIMESTAMP, b"-infinity", -math.inf),
        ("date", DATE, b"infinity", math.inf),
    ],
)
def test_dates_and_timestamps_are_whole_unix_seconds(
    name: str, oid: int, text: bytes, seconds: float
) -> None:
    """Whole seconds rounded down, BC and after year 9999 included; ±inf for infinity."""
    assert _EPOCH_LOADERS[name](oid, None).load(text) == seconds


def test_text_in_another_datestyle_is_read_by_psycopg() -> None:
    """A DateStyle other than ISO goes through psycopg's own loader (it reads the style
    from the connection; without one it takes a form it can recognise)."""
    loader = _EPOCH_LOADERS["date"](DATE, None)
    assert loader.load(b"2024-02-29") == 1709164800


def test_what_no_rule_reads_is_nan_not_an_error() -> None:
    """A form neither psycopg nor the ISO rule reads: NaN, and the collector goes on."""
    assert math.isnan(iso_epoch(b"Thu Feb 29 12:34:56 2024 BC"))
    assert math.isnan(_EPOCH_LOADERS["timestamp"](TIMESTAMP, None).load(b"garbage"))


@pytest.mark.parametrize(
    "day", [dt.date(1, 1, 1), dt.date(1969, 12, 31), dt.date(2000, 2, 29), dt.date(9999, 12, 31)]
)
def test_days_from_civil_agrees_with_python(day: dt.date) -> None:
    """The proleptic Gregorian count that BC and far years need agrees with Python's where
    Python can count."""
    expected = day.toordinal() - dt.date(1970, 1, 1).toordinal()
    assert days_from_civil(day.year, day.month, day.day) == expected
