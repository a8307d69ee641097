"""An operator's YAML file, read within bounds: the collector files and the targets file.

The text is read without blocking on a FIFO or holding a huge file, then parsed by a
SafeLoader that reads numbers as the Go exporter does (``090600``, ``1e-6``), notes
duplicate keys, and stops at a size, a number of values or an alias expansion, so
that no file costs more than a bounded amount of memory and time. Problems are noted
on :class:`exporter.config.problems.Notes` with their line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml

from exporter.config.files import FileRefused, read_regular
from exporter.config.problems import Notes
from exporter.errors import excerpt, shorten

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
        self.duplicates: list[tuple[str, int, int]] = []  # key, its line, the first one's
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
        seen: dict[str, int] = {}  # key -> line
        pairs = node.value if isinstance(node, yaml.MappingNode) else []  # e.g. !!set [1]
        for key_node, _ in pairs:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                line = key_node.start_mark.line + 1
                if key_node.value in seen:
                    self.duplicates.append((key_node.value, line, seen[key_node.value]))
                seen.setdefault(key_node.value, line)
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


def parse_yaml(
    text: str, notes: Notes, bounds: Bounds = COLLECTOR_BOUNDS, *, unique_keys: bool = False
) -> Any:
    """The document's data under the loader's limits (aliases, size, values), or None
    after noting a syntax error (with its line): for any YAML file the exporter reads.

    A key repeated in one mapping is a problem with ``unique_keys`` (the Go exporter's
    YAML library refuses a collector file so), else a warning that the last one wins.
    """
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
    for key, line, first in loader.duplicates:
        if unique_keys:
            notes.error(
                f"line {line}",
                f"key {excerpt(key)} is already defined at line {first} of the same mapping; "
                "keep one of them (the Go exporter refuses such a file too)",
            )
        else:
            message = f"key {excerpt(key)} appears twice in one mapping; the last one wins"
            notes.warn(f"line {line}", message)
    return data


def _yaml_problem(exc: yaml.YAMLError) -> tuple[str, str]:
    """Where a YAML error is (its line) and what to say about it."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"line {mark.line + 1}" if mark is not None else ""
    detail = shorten(getattr(exc, "problem", None) or str(exc))
    if isinstance(exc, _TooBig):
        return where, detail
    return where, f"malformed YAML: {detail}; fix the syntax (indentation, quoting)"


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
