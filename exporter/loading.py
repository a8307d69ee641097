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
from typing import Any

import yaml

from exporter.definitions import (
    Collector,
    Definitions,
    Usage,
)
from exporter.errors import ConfigError, Problem, excerpt, shorten
from exporter.files import FileRefused, read_regular
from exporter.problems import Notes, kind_name
from exporter.settings import Settings
from exporter.validation import const_label_problems, read_branch

YAML_SUFFIXES = (".yml", ".yaml")
_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
# Versions are written like 090600; YAML 1.1 would read octal or a string.
_LEADING_ZERO_INT = re.compile(r"^[-+]?0[0-9]+$")
# Go reads 1e-6 as a number; YAML 1.1 needs a dot, so PyYAML would give a string.
_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")
# Bounds on one collector file, so that no file (a wrong path, /dev/zero, a generated
# or hostile one) costs more than ~100 MB and a few seconds. The whole stock library,
# as one file, is 0.27 MB, 10 000 values and no alias.
MAX_FILE_CHARS = 4 * 1024 * 1024  # bytes: read no more than this
MAX_VALUES = 100_000  # PyYAML holds ~800 bytes per value while reading
# Aliases let a few bytes stand for an enormous document (a "billion laughs" file):
# the text they add is capped. The Go exporter's YAML library refuses excessive
# aliasing as well.
MAX_ALIAS_EXPANSION = 1_000_000


@dataclass(frozen=True, slots=True)
class Bounds:
    """What one YAML file may cost: bytes read, values held, text its aliases add."""

    chars: int = MAX_FILE_CHARS
    values: int = MAX_VALUES
    alias_expansion: int = MAX_ALIAS_EXPANSION


COLLECTOR_BOUNDS = Bounds()


class _TooBig(yaml.composer.ComposerError):
    """A document past the bounds above, or whose aliases make a value contain itself."""


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads ``090600`` as 90600, notes duplicate keys and bounds the size."""

    def __init__(self, stream: str, bounds: Bounds = COLLECTOR_BOUNDS) -> None:
        super().__init__(stream)
        self.bounds = bounds
        self.duplicates: list[tuple[str, int]] = []
        self._sizes: dict[int, int] = {}  # id(node) -> characters of its text, aliases expanded
        self._expansion = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            return self._compose_alias(parent, index)
        node = super().compose_node(parent, index)
        if node is not None:
            self._sizes[id(node)] = _expanded_size(node, self._sizes)
            if len(self._sizes) > self.bounds.values:
                limit = self.bounds.values
                problem = f"more than {limit} values in one file; split it into several"
                raise _TooBig(None, None, problem, node.start_mark)
        return node

    def _compose_alias(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        """The aliased node, once its expanded size keeps the document within bounds."""
        mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]  # untyped in stubs
        node = super().compose_node(parent, index)
        size = self._sizes.get(id(node))
        if size is None:  # its anchor is still open: the value would contain itself
            raise _TooBig(
                None, None, "an alias inside its own anchor: a value cannot contain itself", mark
            )
        self._expansion += size
        if self._expansion > self.bounds.alias_expansion:
            problem = (
                f"aliases expand the document by more than {self.bounds.alias_expansion} "
                "characters (an alias bomb?); write the values out or use fewer aliases"
            )
            raise _TooBig(None, None, problem, mark)
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        pairs = node.value if isinstance(node, yaml.MappingNode) else []  # e.g. !!set [1]
        for key_node, _ in pairs:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                if key_node.value in seen:
                    self.duplicates.append((key_node.value, key_node.start_mark.line + 1))
                seen.add(key_node.value)
        return super().construct_mapping(node, deep)


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """Characters a node stands for, counting what its aliases repeat (children are known)."""
    if isinstance(node, yaml.SequenceNode):
        return 2 + sum(sizes[id(item)] for item in node.value)
    if isinstance(node, yaml.MappingNode):
        return 2 + sum(sizes[id(key)] + sizes[id(value)] for key, value in node.value)
    return 2 + len(node.value)


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


def read_document(text: str, source: str, file_index: int) -> ParsedDocument:
    """Validate one collector file's text: branches (only when it has no problem),
    problems and warnings (unknown fields, duplicates)."""
    notes = Notes(source)
    data = _parse_yaml(text, notes)
    if data is None:
        return ParsedDocument((), tuple(notes.problems), tuple(notes.warnings))
    if not _looks_like_collectors(data):  # a wrong file: no line of it is quoted
        notes.error("", f"{_NOT_COLLECTORS}, got {_shape(data)}; check --config")
        return ParsedDocument((), tuple(notes.problems), ())
    collectors = [
        branch
        for key, body in (data.items() if isinstance(data, dict) else ())
        if (branch := read_branch(notes, key, body, file_index)) is not None
    ]
    if notes.problems:
        collectors = []
    return ParsedDocument(tuple(collectors), tuple(notes.problems), tuple(notes.warnings))


_NOT_COLLECTORS = "not a collector file: the top level must map branch names to mappings"


def _looks_like_collectors(data: object) -> bool:
    """A mapping, not one of keys alone: lines like ``root:$6$…:7:::`` (a shadow file)
    read as keys without values, and are no branch names to quote back."""
    return isinstance(data, dict) and (not data or any(v is not None for v in data.values()))


def _shape(data: object) -> str:
    """What a wrong file holds, without its text."""
    if isinstance(data, dict):
        return f"{len(data)} key(s) without a value"
    return kind_name(data)


def _parse_yaml(text: str, notes: Notes, bounds: Bounds = COLLECTOR_BOUNDS) -> Any:
    """The document's data, or None after noting a syntax error (with its line)."""
    loader: _Loader | None = None
    try:
        loader = _Loader(text, bounds)  # refuses control characters already
        data = loader.get_single_data()
    except yaml.YAMLError as exc:
        notes.error(*_yaml_problem(exc))
        return None
    except RecursionError:
        notes.error("", "malformed YAML: nested too deeply to read")
        return None
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
        # PyYAML's constructors raise plain exceptions for values they cannot build:
        # 2001-13-45 (read as a date), !!int abc, !!bool maybe, !!int ''.
        notes.error(
            "", f"malformed YAML: a value cannot be read ({excerpt(exc)}); quote it as text"
        )
        return None
    finally:
        if loader is not None:
            loader.dispose()
    for key, line in loader.duplicates:
        notes.warn(
            f"line {line}", f"key {excerpt(key)} appears twice in one mapping; the last one wins"
        )
    return data


def _yaml_problem(exc: yaml.YAMLError) -> tuple[str, str]:
    """Where a YAML error is (its line) and what to say about it."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"line {mark.line + 1}" if mark is not None else ""
    detail = shorten(getattr(exc, "problem", None) or str(exc))
    if isinstance(exc, _TooBig):
        return where, detail
    return where, f"malformed YAML: {detail}; fix the syntax (indentation, quoting)"


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
                key = shorten(collector.key)
                warnings.append(f"{file}: {key} replaces the one from {earlier.source}")
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
    """One file's text validated; an unreadable or oversized file is a problem of its own."""
    notes = Notes(path)
    text = read_text(path, notes, "check --config or PG_EXPORTER_CONFIG")
    if text is None:
        return ParsedDocument((), tuple(notes.problems))
    return read_document(text, path, index)


def read_text(
    path: str, notes: Notes, missing_hint: str, limit: int = MAX_FILE_CHARS
) -> str | None:
    """A YAML file's text, or None after noting why it cannot be read: not a regular
    file (a FIFO would block, a device not end), missing, unreadable, or too large."""
    try:
        return read_regular(path, limit)  # never the whole of a huge file, never a FIFO
    except FileRefused as exc:
        if exc.missing:
            notes.error("", f"no such file or directory; {missing_hint}")
        elif exc.too_large:
            mib = limit // 1024 // 1024
            notes.error("", f"more than {mib} MiB of text, the most this file may hold; split it")
        else:
            notes.error("", f"cannot read the file: {exc}")
        return None


def parse_yaml(text: str, notes: Notes, bounds: Bounds = COLLECTOR_BOUNDS) -> Any:
    """The document's data under the loader's limits (aliases, size, values), or None
    after noting a syntax error: for any YAML file the exporter reads."""
    return _parse_yaml(text, notes, bounds)


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
                key, other = shorten(collector.key), shorten(owner.key)
                found.append(
                    f"{collector.source}: {key}: {shorten(metric)} is a "
                    f"{column.usage.value.lower()} here but a {usage.value.lower()} in "
                    f"{other} ({owner.source}); scrapes keep {other}'s and drop this "
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
