"""Exception types a user can see, each carrying enough context to act on."""

from __future__ import annotations

import reprlib
from collections.abc import Sized
from dataclasses import dataclass

# A value quoted in a message is cut to this many characters: a collector file can
# hold megabytes in one value, or (through YAML aliases) far more.
EXCERPT_CHARS = 80
_REPR = reprlib.Repr()
_REPR.maxlevel = 2
_REPR.maxlist = _REPR.maxtuple = _REPR.maxset = _REPR.maxfrozenset = _REPR.maxdict = 6
_REPR.maxstring = _REPR.maxother = EXCERPT_CHARS
_REPR.maxlong = 40


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """``repr(value)`` for a message: cut after ``limit`` characters, saying how long it was."""
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        return f"{value[:limit]!r}… ({len(value)} characters)"
    text = _REPR.repr(value)  # bounded by depth and items, even for shared or cyclic values
    cut = len(text) > limit
    if cut:
        text = f"{text[:limit]}…"
    if isinstance(value, Sized) and (cut or len(value) > _REPR.maxlist):
        text += f" ({len(value)} items)"
    return text


def shorten(text: str, limit: int = 2 * EXCERPT_CHARS) -> str:
    """``text`` whole up to ``limit`` characters, else its two ends: for names in locations."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}…{text[-half:]}"


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong in a collector file, at a precise location.

    ``location`` reads like ``conf/0110-pg.yml:pg_primary.metrics[2].usage``.
    """

    location: str
    message: str

    def __str__(self) -> str:
        return f"{self.location}: {self.message}"


class ExporterError(Exception):
    """Base class for errors the exporter reports to its operator."""


class InfoRequested(Exception):
    """``--help`` or ``--version`` was given: print ``text`` to stdout and exit 0."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class UsageError(ExporterError):
    """Bad command line, environment or settings value (exit code 1)."""


#: A config error message lists this many problems, then counts the rest: a dense file
#: can hold 100 000 mistakes, and the message goes to the log and to /reload's answer.
MAX_LISTED_PROBLEMS = 1000


class ConfigError(ExporterError):
    """Collector definitions are invalid (exit code 2); lists the problems (the first
    :data:`MAX_LISTED_PROBLEMS`, then how many more)."""

    def __init__(self, problems: list[Problem] | tuple[Problem, ...], summary: str = "") -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        self.summary = summary or f"{len(self.problems)} problem(s) in collector definitions"
        super().__init__(str(self))

    def __str__(self) -> str:
        listed = [f"  {p}" for p in self.problems[:MAX_LISTED_PROBLEMS]]
        more = len(self.problems) - len(listed)
        if more > 0:
            listed.append(f"  … and {more} more problem(s) not listed")
        return "\n".join([self.summary, *listed])


class TargetError(ValueError):
    """libpq cannot read the target URL. The message never quotes the URL."""


class CollectorError(ExporterError):
    """A collector's execution or result failed; the message names the collector."""


class PredicateError(CollectorError):
    """A predicate query returned something other than one boolean (or no row)."""


class FatalCollectorFailed(Exception):
    """A ``fatal: true`` collector failed: the database's pass stops here."""


class MissingColumnError(CollectorError):
    """A LABEL or HISTOGRAM column is absent from the query result."""


class TooManySeriesError(CollectorError):
    """A collector produced more series than its cap allows (D9)."""


class RepeatedLabelsError(CollectorError):
    """Rows of a GAUGE or COUNTER collector repeat a label set (Go 1.6.1: the run fails)."""
