"""Which code paths the libraries run: compiled, or their pure-Python fallback (issue 37).

psycopg (its C implementation against the system's libpq, or the bundled-libpq
``binary`` one), aiohttp's HTTP parser, multidict and yarl each carry a compiled
module and fall back to pure Python, silently, when it cannot load (a missing
build for this Python, a libpq too old for the C module, a ``*_NO_EXTENSIONS``
variable). The pure paths cost about twice the CPU per uncached scrape, so the
exporter says which one runs: in ``--version``, in ``/explain``, and once in the
log at start when a fallback is in use, with the reason the compiled module gave.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata


@dataclass(frozen=True, slots=True)
class Library:
    """A library with a compiled module and a pure-Python fallback."""

    name: str  #: the distribution, for its version
    compiled_module: str  #: what must import for the compiled path
    switch: str  #: the environment variable that turns the compiled path off
    compiled_in_use: Callable[[], bool]
    describe: Callable[[bool], str]  #: the path in use, for people


@dataclass(frozen=True, slots=True)
class CodePath:
    """What one library runs in this process."""

    library: str
    version: str
    compiled: bool
    detail: str
    why_not: str  #: why the compiled module is not in use; empty when it is


def _psycopg_compiled() -> bool:
    from psycopg import pq

    return pq.__impl__ in ("c", "binary")


def _psycopg_detail(compiled: bool) -> str:
    from psycopg import pq

    return f"{pq.__impl__} implementation (libpq {pq.version_pretty(pq.version())})"


def _aiohttp_compiled() -> bool:
    from aiohttp import http_parser

    return http_parser.HttpRequestParser is getattr(http_parser, "HttpRequestParserC", None)


def _multidict_compiled() -> bool:
    import multidict

    return multidict.MultiDict.__module__ == "multidict._multidict"


def _yarl_compiled() -> bool:
    from yarl import _quoting

    return bool(_quoting._Quoter.__module__ == "yarl._quoting_c")


def _extension(compiled: bool) -> str:
    return "C extension" if compiled else "pure Python"


#: What is reported, in this order; psycopg's implementation matters most.
LIBRARIES = (
    Library("psycopg", "psycopg_c.pq", "PSYCOPG_IMPL", _psycopg_compiled, _psycopg_detail),
    Library("aiohttp", "aiohttp._http_parser", "AIOHTTP_NO_EXTENSIONS", _aiohttp_compiled,
            lambda compiled: f"{'C' if compiled else 'pure-Python'} HTTP parser"),
    Library("multidict", "multidict._multidict", "MULTIDICT_NO_EXTENSIONS", _multidict_compiled,
            _extension),
    Library("yarl", "yarl._quoting_c", "YARL_NO_EXTENSIONS", _yarl_compiled, _extension),
)  # fmt: skip


def _why_not(library: Library) -> str:
    """The reason the compiled module is not in use: the switch, or its import error."""
    if value := os.environ.get(library.switch):
        return f"{library.switch}={value} is set"
    try:
        importlib.import_module(library.compiled_module)
    except Exception as exc:  # any import failure is the reason to report
        return f"{library.compiled_module} cannot be imported: {exc}"
    return f"{library.compiled_module} imports but is not in use"


def _code_path(library: Library) -> CodePath:
    compiled = library.compiled_in_use()
    return CodePath(
        library=library.name,
        version=metadata.version(library.name),
        compiled=compiled,
        detail=library.describe(compiled),
        why_not="" if compiled else _why_not(library),
    )


@functools.cache
def code_paths() -> tuple[CodePath, ...]:
    """The code path of each library in :data:`LIBRARIES`; fixed for the process's life."""
    return tuple(_code_path(library) for library in LIBRARIES)


def version_lines() -> str:
    """One line per library for ``--version``: its version and the path in use."""
    return "\n".join(f"{p.library}: {p.version}, {p.detail}" for p in code_paths())


def fallbacks() -> list[str]:
    """A sentence per library running its pure-Python path, with the reason."""
    return [
        f"{p.library} runs its pure-Python code path ({p.detail}), which costs more CPU per "
        f"scrape: {p.why_not}"
        for p in code_paths()
        if not p.compiled
    ]


def explain_text() -> str:
    """The code paths in use, for ``/explain``: one line, then each fallback's reason."""
    summary = "; ".join(f"{p.library} {p.detail}" for p in code_paths())
    return "\n".join([f"code paths: {summary}", *(f"  {line}" for line in fallbacks())]) + "\n"


def log_fallbacks(log: logging.Logger) -> None:
    """Warn once per library that runs its pure-Python path (called at start)."""
    for line in fallbacks():
        log.warning(line)
