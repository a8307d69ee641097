"""The rules a setting's value must meet, each written once.

A setting reaches the exporter three ways: a flag, its ``PG_EXPORTER_*`` variable
(both read by :mod:`exporter.config.commandline`) and a target's field in the targets file
(:mod:`exporter.config.targetsfile`). Each source reads its own form (text, or YAML values)
and words its errors with its own place (the flag, the variable, ``file:field``);
whether a value is acceptable is decided here, so the sources cannot drift apart.
The collector validator asks the same label-name rule of a collector's labels.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeGuard

from exporter.config.settings import DEFAULT_CONNECT_TIMEOUT_MS

LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# What an error says a label name must be: Prometheus reserves names starting with __.
LABEL_RULE = f"{LABEL_NAME.pattern}, not starting with __"
# The namespace prefixes metric names, which may not hold the colon of recording rules.
NAMESPACE_RULE = f"a valid metric name prefix ({LABEL_NAME.pattern})"

# The largest whole number a flag, variable or targets-file field takes: libpq and
# Go's flag parsing both hold 32-bit ints; past this a value is a typo, not a setting.
MAX_WHOLE = 2**31 - 1
_WHOLE = re.compile(r"[-+]?[0-9]+")
_NUMBER = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]{1,3})?")
_WHOLE_DIGITS = 20  # more digits than any value in range: refused without int()


def is_label_name(name: object) -> TypeGuard[str]:
    """A label name Prometheus accepts and does not reserve for itself."""
    return isinstance(name, str) and bool(LABEL_NAME.fullmatch(name)) and not name.startswith("__")


def is_namespace(name: object) -> TypeGuard[str]:
    """A prefix for the exporter's own metric names (``pg``, ``pgbouncer``, ``mine``)."""
    return isinstance(name, str) and bool(LABEL_NAME.fullmatch(name))


@dataclass(frozen=True, slots=True)
class Whole:
    """The whole numbers a setting takes: from ``minimum`` to :data:`MAX_WHOLE`."""

    minimum: int
    meaning: str  # what the lower end is for, as an error says it

    def holds(self, value: int) -> bool:
        """True when ``value`` is in range."""
        return self.minimum <= value <= MAX_WHOLE

    def __str__(self) -> str:
        return f"{self.meaning} (a whole number from {self.minimum} to {MAX_WHOLE})"


@dataclass(frozen=True, slots=True)
class Amount:
    """The numbers a setting takes: finite, from 0 to ``maximum``."""

    maximum: float
    meaning: str  # what the number counts, as an error says it

    def holds(self, value: float) -> bool:
        """True when ``value`` is in range."""
        # An int from YAML may be too large for a float: compared as it is.
        return (not isinstance(value, float) or math.isfinite(value)) and (
            0 <= value <= self.maximum
        )

    def __str__(self) -> str:
        return f"{self.meaning} (a number from 0 to {self.maximum:g})"


CONNECT_TIMEOUT_MS = Whole(-MAX_WHOLE, f"milliseconds (0 or less: {DEFAULT_CONNECT_TIMEOUT_MS})")
MAX_SERIES = Whole(1, "greater than 0")
# The health probe's connection and at least one database's.
MAX_CONNECTIONS = Whole(2, "at least 2, the health probe's connection and one database's")
PARALLEL_DATABASES = Whole(1, "at least 1")
MAX_TOTAL_SERIES = Whole(0, "0 (no limit) or more")
MAX_CONCURRENT_TARGETS = Whole(1, "at least 1")
SERVER_MAX_CONNECTIONS = Whole(2, "at least 2, a health probe's connection and a pass's")
SERVER_MAX_FAILED_LOGINS = Whole(1, "failed logins a minute, at least 1")
# A thousand cores' worth: past it a value is a typo, not a budget.
SERVER_TIME_BUDGET_MS = Amount(1_000_000, "milliseconds of server time a second, 0 for none")


def whole_number(text: str) -> int | None:
    """The whole number ``text`` spells (spaces around it allowed), or None.

    Past 20 digits no value is in range: it reads as one past :data:`MAX_WHOLE`
    (with its sign) without calling int(), which is slow on thousands of digits
    and refuses them (CVE-2020-10735).
    """
    digits = text.strip()
    if not _WHOLE.fullmatch(digits):
        return None
    if len(digits) > _WHOLE_DIGITS:
        return -(MAX_WHOLE + 1) if digits.startswith("-") else MAX_WHOLE + 1
    return int(digits)


def number(text: str) -> float | None:
    """The decimal number ``text`` spells (spaces around it allowed), or None. Only digits,
    a point, a sign and an exponent: no underscores, no ``inf`` or ``nan``."""
    digits = text.strip()
    if not _NUMBER.fullmatch(digits):
        return None
    return float(digits)


def items(text: str) -> list[str]:
    """The items of a comma-separated value, stripped, empty ones dropped (repeats kept)."""
    return [item.strip() for item in text.split(",") if item.strip()]


def names(given: Iterable[str]) -> tuple[str, ...]:
    """A list of names (tags, databases): stripped, empty ones dropped, each name once,
    in the order first given."""
    return tuple(dict.fromkeys(name.strip() for name in given if name.strip()))


def comma_list(text: str) -> tuple[str, ...]:
    """``a, b,,a`` → ``("a", "b")``: the names of a comma-separated value."""
    return names(text.split(","))
