"""Exception types a user can see, each carrying enough context to act on."""

from __future__ import annotations

from dataclasses import dataclass


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


class UsageError(ExporterError):
    """Bad command line, environment or settings value (exit code 1)."""


class ConfigError(ExporterError):
    """Collector definitions are invalid (exit code 2); lists every problem."""

    def __init__(self, problems: list[Problem] | tuple[Problem, ...], summary: str = "") -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        self.summary = summary or f"{len(self.problems)} problem(s) in collector definitions"
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join([self.summary, *(f"  {p}" for p in self.problems)])


class CollectorError(ExporterError):
    """A collector's execution or result failed; the message names the collector."""


class MissingColumnError(CollectorError):
    """A LABEL or HISTOGRAM column is absent from the query result."""


class TooManySeriesError(CollectorError):
    """A collector produced more series than its cap allows (D9)."""
