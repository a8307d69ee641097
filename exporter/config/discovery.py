"""Which databases auto-discovery scrapes: names and patterns (issue 13).

``--include-database`` and ``--exclude-database`` take names and shell-style
patterns alike: ``*`` matches any run of characters, ``?`` one character,
``[abc]`` one of those, ``[!abc]`` any other. Matching is case-sensitive, like
PostgreSQL's own names, and a name without those characters matches only itself,
as in the Go exporter.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase

_PATTERN_CHARS = frozenset("*?[")


def is_pattern(text: str) -> bool:
    """True when ``text`` holds a wildcard, so it may match more than one name."""
    return not _PATTERN_CHARS.isdisjoint(text)


def matches(name: str, patterns: Sequence[str]) -> bool:
    """True when ``name`` is one of ``patterns`` or matches one of them."""
    return any(name == p or (is_pattern(p) and fnmatchcase(name, p)) for p in patterns)


def select_databases(
    available: Iterable[str], include: Sequence[str], exclude: Sequence[str], main: str
) -> set[str]:
    """The databases to discover: every one ``include`` names (all when it is empty)
    that ``exclude`` does not, the main database aside (it is scraped anyway)."""
    return {
        name
        for name in available
        if name != main and not matches(name, exclude) and (not include or matches(name, include))
    }
