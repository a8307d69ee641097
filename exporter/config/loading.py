"""Collector files → :class:`Definitions`: reading, validation and merging.

Every problem is collected with its location (``file:branch.field``) instead of
stopping at the first one, so a single ``--dry-run`` shows all that needs fixing.
As in the Go exporter, a branch without a ``priority`` (absent or 0) keeps 0 in a
single file; in a directory, read in name order, the n-th file read without a problem
(n = 1, 2, …) gives it 100 + n.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from exporter.config.definitions import PRIORITY_BASE, Collector, Definitions, Usage
from exporter.config.files import entry_kind
from exporter.config.problems import Notes, kind_name
from exporter.config.settings import Settings
from exporter.config.validation import const_label_problems, read_branch
from exporter.config.yamlfiles import parse_yaml, read_text
from exporter.errors import ConfigError, Problem, shorten

YAML_SUFFIXES = (".yml", ".yaml")


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
    parsed = _read_file(path, 0)  # one file: a branch without priority keeps 0, as in Go
    if parsed.problems:
        raise ConfigError(parsed.problems, f"{path}: {len(parsed.problems)} problem(s)")
    warnings = parsed.warnings
    if not parsed.collectors:
        warnings += (f"{path}: {_NO_BRANCH}",)
    ordered = _ordered(parsed.collectors)
    return Definitions(ordered, (path,), warnings=warnings + _kind_conflicts(ordered))


_SERVED = "only the exporter's own metrics are served"
_NO_BRANCH = (
    f"no collector branch (the file is empty or all comments): {_SERVED}; add top-level "
    "keys each defining query and metrics"
)


def read_document(text: str, source: str, default_priority: int) -> ParsedDocument:
    """Validate one collector file's text: branches (only when it has no problem),
    problems and warnings (unknown fields). Branches without a priority (absent or 0)
    get ``default_priority``."""
    notes = Notes(source)
    data = parse_yaml(text, notes, unique_keys=True)
    if notes.problems:
        return ParsedDocument((), tuple(notes.problems), tuple(notes.warnings))
    if data is None:  # empty, or comments alone: Go reads it as no branch at all
        return ParsedDocument((), (), tuple(notes.warnings))
    if not _looks_like_collectors(data):  # a wrong file: no line of it is quoted
        notes.error("", f"{_NOT_COLLECTORS}, got {_shape(data)}; check --config")
        return ParsedDocument((), tuple(notes.problems), ())
    collectors = [
        branch
        for key, body in (data.items() if isinstance(data, dict) else ())
        if (branch := read_branch(notes, key, body, default_priority)) is not None
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


def _load_directory(path: str) -> Definitions:
    """Merge every YAML file of a directory, skipping (and reporting) bad files.

    As in Go, the n-th file read without a problem (n = 1, 2, …) gives its branches
    without a priority 100 + n, a directory without any YAML file gives no branch (a
    warning), and one whose YAML files give none is refused.
    """
    files, problems = _yaml_files(path)
    specials = len(problems)
    merged: dict[str, Collector] = {}
    warnings = [f"{problem}; skipped" for problem in problems]
    skipped = [problem.location for problem in problems]
    read = 0
    for file in files:
        parsed = _read_file(file, PRIORITY_BASE + read + 1)
        warnings.extend(parsed.warnings)
        if parsed.problems:
            skipped.append(file)
            problems.extend(parsed.problems)
            warnings.append(f"{file}: skipped, {len(parsed.problems)} problem(s):")
            warnings.extend(f"  {problem}" for problem in parsed.problems)
            continue
        read += 1
        _merge(merged, parsed.collectors, warnings)
    if not files and not specials:
        warnings.append(f"{path}: directory has no *.yml or *.yaml collector file; {_SERVED}")
    elif not merged:
        entries = len(files) + specials
        problems = problems or [Problem(path, "no collector branch in any of its YAML files")]
        raise ConfigError(problems, f"{path}: no valid collector in {entries} file(s)")
    ordered = _ordered(merged.values())
    warnings.extend(_kind_conflicts(ordered))
    return Definitions(ordered, tuple(files), tuple(skipped), tuple(warnings))


def _merge(merged: dict[str, Collector], collectors: Iterable[Collector], out: list[str]) -> None:
    """Add a file's branches: a key seen in an earlier file is replaced, with a warning."""
    for collector in collectors:
        if (earlier := merged.get(collector.key)) is not None:
            key = shorten(collector.key)
            out.append(f"{collector.source}: {key} replaces the one from {earlier.source}")
        merged[collector.key] = collector


def _yaml_files(path: str) -> tuple[list[str], list[Problem]]:
    """``*.yml``/``*.yaml`` entries of a directory in name order (not recursive): the
    regular files, and a problem for each other entry (a FIFO, a device, a directory,
    a link to nothing), which is skipped without being opened."""
    try:
        names = sorted(os.listdir(path))
    except OSError as exc:
        raise ConfigError([Problem(path, f"cannot list directory: {exc.strerror}")]) from exc
    files: list[str] = []
    problems: list[Problem] = []
    for name in names:
        if name.endswith(YAML_SUFFIXES):
            entry = os.path.join(path, name)
            reason = entry_kind(entry)
            if reason is None:
                files.append(entry)
            else:
                problems.append(Problem(entry, reason))
    return files, problems


def _read_file(path: str, default_priority: int) -> ParsedDocument:
    """One file's text validated; an unreadable or oversized file is a problem of its own."""
    notes = Notes(path)
    text = read_text(path, notes, "check --config or PG_EXPORTER_CONFIG")
    if text is None:
        return ParsedDocument((), tuple(notes.problems))
    return read_document(text, path, default_priority)


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
        what = "does not exist"
        if os.path.lexists(settings.config):
            what = "is a symbolic link that leads nowhere (its target is missing, or links loop)"
        raise ConfigError([], f"config path {settings.config!r}{origin} {what}")
    definitions = load_definitions(settings.config)
    clashes = const_label_problems(
        definitions.collectors,
        (name for name, _ in settings.const_labels),
        self_metrics=not settings.disable_intro,
    )
    if clashes:
        raise ConfigError(clashes, "const labels conflict with collector labels")
    return definitions
