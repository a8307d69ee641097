"""Collector files → :class:`Definitions`: YAML reading, validation and merging.

Every problem is collected with its location (``file:branch.field``) instead of
stopping at the first one, so a single ``--dry-run`` shows all that needs fixing.
Directory mode numbers files from 0 in name order: the k-th file (k = 0, 1, …)
gives its branches without a ``priority`` (absent or 0) the priority 100 + k.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from exporter.definitions import (
    Collector,
    Definitions,
    Usage,
)
from exporter.errors import ConfigError, Problem
from exporter.settings import Settings
from exporter.validation import Notes, const_label_problems, kind_of, read_branch

YAML_SUFFIXES = (".yml", ".yaml")
_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
# Versions are written like 090600; YAML 1.1 would read octal or a string.
_LEADING_ZERO_INT = re.compile(r"^[-+]?0[0-9]+$")
# Go reads 1e-6 as a number; YAML 1.1 needs a dot, so PyYAML would give a string.
_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads ``090600`` as 90600 and notes duplicate mapping keys."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.duplicates: list[tuple[str, int]] = []

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        pairs = node.value if isinstance(node, yaml.MappingNode) else []  # e.g. !!set [1]
        for key_node, _ in pairs:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                if key_node.value in seen:
                    self.duplicates.append((key_node.value, key_node.start_mark.line + 1))
                seen.add(key_node.value)
        return super().construct_mapping(node, deep)


def _construct_int(loader: _Loader, node: yaml.ScalarNode) -> int:
    value = loader.construct_scalar(node)
    if _LEADING_ZERO_INT.fullmatch(value):
        return int(value, 10)
    return loader.construct_yaml_int(node)


def _prefer_resolver(tag: str, regexp: re.Pattern[str], first: str) -> None:
    """Register a resolver ahead of PyYAML's own for the same first characters."""
    _Loader.add_implicit_resolver(tag, regexp, list(first))
    for char in first:
        resolvers = _Loader.yaml_implicit_resolvers[char]
        resolvers.insert(0, resolvers.pop())


_prefer_resolver(_INT_TAG, _LEADING_ZERO_INT, "-+0")
_prefer_resolver(_FLOAT_TAG, _EXPONENT_FLOAT, "-+.0123456789")
_Loader.add_constructor(_INT_TAG, _construct_int)


@dataclass(frozen=True, slots=True)
class ParsedDocument:
    """What one collector file gave: valid branches, problems and warnings."""

    collectors: tuple[Collector, ...]
    problems: tuple[Problem, ...]
    warnings: tuple[str, ...] = field(default=())


def load_definitions(path: str) -> Definitions:
    """Load a collector file or directory; raise ConfigError with every problem."""
    if os.path.isdir(path):
        return _load_directory(path)
    parsed = _read_file(path, 0)
    if parsed.problems:
        raise ConfigError(parsed.problems, f"{path}: {len(parsed.problems)} problem(s)")
    if not parsed.collectors:
        message = "no collector branch; expected top-level keys each defining query and metrics"
        raise ConfigError([Problem(path, message)])
    ordered = _ordered(parsed.collectors)
    return Definitions(ordered, (path,), warnings=parsed.warnings + _kind_conflicts(ordered))


def parse_document(
    text: str, source: str, file_index: int
) -> tuple[list[Collector], list[Problem]]:
    """Validate one collector file's text; branches are returned only when it has no problem."""
    parsed = read_document(text, source, file_index)
    return list(parsed.collectors), list(parsed.problems)


def read_document(text: str, source: str, file_index: int) -> ParsedDocument:
    """Like :func:`parse_document`, keeping the warnings (unknown fields, duplicates)."""
    notes = Notes(source)
    data = _parse_yaml(text, notes)
    if data is None:
        return ParsedDocument((), tuple(notes.problems), tuple(notes.warnings))
    if not isinstance(data, dict):
        notes.error("", f"the top level must be a mapping of branch names, got {kind_of(data)}")
    collectors = [
        branch
        for key, body in (data.items() if isinstance(data, dict) else ())
        if (branch := read_branch(notes, key, body, file_index)) is not None
    ]
    if notes.problems:
        collectors = []
    return ParsedDocument(tuple(collectors), tuple(notes.problems), tuple(notes.warnings))


def _parse_yaml(text: str, notes: Notes) -> Any:
    """The document's data, or None after noting a syntax error (with its line)."""
    loader: _Loader | None = None
    try:
        loader = _Loader(text)  # refuses control characters already
        data = loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        detail = getattr(exc, "problem", None) or str(exc)
        notes.error(where, f"malformed YAML: {detail}; fix the syntax (indentation, quoting)")
        return None
    except RecursionError:
        notes.error("", "malformed YAML: nested too deeply to read")
        return None
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
        # PyYAML's constructors raise plain exceptions for values they cannot build:
        # 2001-13-45 (read as a date), !!int abc, !!bool maybe, !!int ''.
        notes.error("", f"malformed YAML: a value cannot be read ({exc!r}); quote it as text")
        return None
    finally:
        if loader is not None:
            loader.dispose()
    for key, line in loader.duplicates:
        notes.warn(f"line {line}", f"key {key!r} appears twice in one mapping; the last one wins")
    return data


def _load_directory(path: str) -> Definitions:
    """Merge every YAML file of a directory, skipping (and reporting) bad files."""
    files = _yaml_files(path)
    merged: dict[str, Collector] = {}
    problems: list[Problem] = []
    warnings: list[str] = []
    skipped: list[str] = []
    for index, file in enumerate(files):
        parsed = _read_file(file, index)
        warnings.extend(parsed.warnings)
        if parsed.problems:
            skipped.append(file)
            problems.extend(parsed.problems)
            warnings.append(f"{file}: skipped, {len(parsed.problems)} problem(s):")
            warnings.extend(f"  {problem}" for problem in parsed.problems)
            continue
        for collector in parsed.collectors:
            if (earlier := merged.get(collector.key)) is not None:
                warnings.append(f"{file}: {collector.key} replaces the one from {earlier.source}")
            merged[collector.key] = collector
    if not merged:
        problems = problems or [Problem(path, "no collector branch in any of its YAML files")]
        raise ConfigError(problems, f"{path}: no valid collector in {len(files)} file(s)")
    ordered = _ordered(merged.values())
    warnings.extend(_kind_conflicts(ordered))
    return Definitions(ordered, tuple(files), tuple(skipped), tuple(warnings))


def _yaml_files(path: str) -> list[str]:
    """``*.yml``/``*.yaml`` regular files of a directory, in name order (not recursive)."""
    try:
        names = sorted(os.listdir(path))
    except OSError as exc:
        raise ConfigError([Problem(path, f"cannot list directory: {exc.strerror}")]) from exc
    files = [os.path.join(path, n) for n in names if n.endswith(YAML_SUFFIXES)]
    files = [f for f in files if os.path.isfile(f)]
    if not files:
        raise ConfigError([Problem(path, "directory has no *.yml or *.yaml collector file")])
    return files


def _read_file(path: str, index: int) -> ParsedDocument:
    """One file's text validated; an unreadable file is a problem of its own."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        reason = "no such file or directory; check --config or PG_EXPORTER_CONFIG"
        return ParsedDocument((), (Problem(path, reason),))
    except (OSError, UnicodeDecodeError) as exc:
        return ParsedDocument((), (Problem(path, f"cannot read the file: {exc}"),))
    return read_document(text, path, index)


def _ordered(collectors: Iterable[Collector]) -> tuple[Collector, ...]:
    return tuple(sorted(collectors, key=lambda c: (c.priority, c.key)))


def _kind_conflicts(ordered: Sequence[Collector]) -> tuple[str, ...]:
    """Metric names that two differently named collectors give different types.

    One exposition holds one type per name, so the later family is dropped at every
    scrape; say so once, at load. Branches sharing a name are alternatives (versions,
    roles) and never run together, so they are not compared with each other.
    """
    first: dict[str, tuple[Usage, Collector]] = {}
    found: list[str] = []
    for collector in ordered:  # priority order: the exposition keeps the first
        for column in collector.value_columns:
            metric = collector.metric_name(column)
            usage, owner = first.setdefault(metric, (column.usage, collector))
            if usage is not column.usage and owner.name != collector.name:
                found.append(
                    f"{collector.source}: {collector.key}: {metric} is a "
                    f"{column.usage.value.lower()} here but a {usage.value.lower()} in "
                    f"{owner.key} ({owner.source}); scrapes keep {owner.key}'s and drop this "
                    "one: rename the column or change its usage"
                )
    return tuple(found)


def load_for_settings(settings: Settings) -> Definitions:
    """The definitions at ``settings.config``, checked against the const labels too.

    Used at start and by reload, so both accept exactly the same configs.
    """
    assert settings.config is not None  # the CLI always resolves it
    if not os.path.exists(settings.config):
        origin = f" (from {settings.config_origin})" if settings.config_origin else ""
        raise ConfigError([], f"config path {settings.config!r}{origin} does not exist")
    definitions = load_definitions(settings.config)
    clashes = const_label_problems(
        definitions.collectors,
        (name for name, _ in settings.const_labels),
        self_metrics=not settings.disable_intro,
    )
    if clashes:
        raise ConfigError(clashes, "const labels conflict with collector labels")
    return definitions
