"""Problem reporting for the files the exporter reads: every problem at once, located.

The collector files (:mod:`exporter.config.loading`, :mod:`exporter.config.validation`) and the
targets file (:mod:`exporter.config.targetsfile`) note what is wrong with its place
(``file:where``) instead of stopping at the first problem, and describe a bad value
by its YAML type; neither the place nor the value ever shows a URL's password.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from exporter.config.target import mask
from exporter.errors import Problem, excerpt, shorten

_KINDS: dict[type, str] = {bool: "a boolean", int: "an integer", float: "a number"}
_KINDS |= {str: "a string", list: "a list", dict: "a mapping", type(None): "nothing"}


@dataclass(slots=True)
class Notes:
    """Problems and warnings found in one file, each located as ``file:where``."""

    source: str
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def error(self, where: str, message: str) -> None:
        """Note a problem: the file is invalid."""
        self.problems.append(Problem(self._at(where), mask(message)))

    def warn(self, where: str, message: str) -> None:
        """Note something suspicious that does not make the file invalid."""
        self.warnings.append(f"{self._at(where)}: {mask(message)}")

    def warn_unknown(self, where: str, mapping: dict[Any, Any], known: frozenset[str]) -> None:
        """Unknown fields are warnings: the Go exporter ignores them, so configs carry some."""
        for name, value in mapping.items():
            if name in known:
                continue
            if value is None and isinstance(name, str) and " " in name.strip():
                # `{usage: GAUGE, description: a, b}`: the stock configs have many of these.
                message = "text after an unquoted comma became a key, ignored; quote the text"
            else:
                message = f"unknown field, ignored (known: {', '.join(sorted(known))})"
            self.warn(f"{where}.{name}", message)

    def _at(self, where: str) -> str:
        # Keys come from the file: a wrong file (a URL, a shadow line) must not be quoted.
        return f"{self.source}:{shorten(mask(where))}" if where else self.source


def kind_name(value: object) -> str:
    """A value's YAML type alone, for where its text may be a secret or a wrong file's."""
    return _KINDS.get(type(value), type(value).__name__)


def kind_of(value: object) -> str:
    """A value as messages show it: its YAML type, and an excerpt of its text."""
    kind = kind_name(value)
    if value is None or isinstance(value, list | dict):
        return kind
    return f"{kind} {excerpt(value)}"
