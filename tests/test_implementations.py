"""Which code paths the libraries run, as --version, /explain and the log say (issue 37)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.report import implementations
from exporter.report.implementations import CodePath, Library

REPO = Path(__file__).resolve().parent.parent

COMPILED = CodePath("psycopg", "3.3", True, "c implementation (libpq 15.18)", "")
PURE = CodePath("multidict", "7.2", False, "pure Python", "multidict._multidict: no such file")


def _version(**env: str) -> str:
    """``pg_exporter --version`` in a fresh interpreter with ``env`` added."""
    done = subprocess.run(
        [sys.executable, "-m", "exporter", "--version"],
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout


def test_this_venv_runs_every_compiled_path() -> None:
    """The test venv has compiled wheels: nothing falls back, so nothing is reported."""
    assert all(path.compiled for path in implementations.code_paths())
    assert implementations.fallbacks() == []


def test_version_names_each_library_and_its_path() -> None:
    """--version names psycopg's implementation and aiohttp's parser, one line each."""
    out = _version()
    assert "\npsycopg: " in out
    assert " implementation (libpq " in out
    assert "\naiohttp: " in out
    assert ", C HTTP parser\n" in out


def test_version_shows_the_pure_paths_when_they_are_forced() -> None:
    """With the libraries' own switches the pure paths run, and --version says so."""
    out = _version(PSYCOPG_IMPL="python", AIOHTTP_NO_EXTENSIONS="1", YARL_NO_EXTENSIONS="1")
    assert ", python implementation (libpq " in out
    assert ", pure-Python HTTP parser\n" in out
    assert "\nyarl: " in out
    assert out.rstrip().endswith("pure Python")


def test_a_fallback_gives_the_compiled_modules_reason() -> None:
    """A compiled module that cannot be imported is named with its import error."""
    missing = Library("x", "exporter.no_such_module", "X_NO_EXT", lambda: False, str)
    assert "exporter.no_such_module cannot be imported: No module named" in (
        implementations._why_not(missing)
    )


def test_a_fallback_forced_by_a_variable_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the library's switch is set, that is the reason given."""
    monkeypatch.setenv("X_NO_EXT", "1")
    missing = Library("x", "exporter.no_such_module", "X_NO_EXT", lambda: False, str)
    assert implementations._why_not(missing) == "X_NO_EXT=1 is set"


def test_explain_and_the_log_name_each_fallback_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """/explain lists every path and the fallbacks' reasons; the log warns once each."""
    monkeypatch.setattr(implementations, "code_paths", lambda: (COMPILED, PURE))
    text = implementations.explain_text()
    assert text.startswith(
        "code paths: psycopg c implementation (libpq 15.18); multidict pure Python\n"
    )
    assert "  multidict runs its pure-Python code path" in text
    assert "multidict._multidict: no such file" in text
    with caplog.at_level(logging.WARNING):
        implementations.log_fallbacks(logging.getLogger("t"))
    assert [r.getMessage() for r in caplog.records] == implementations.fallbacks()
    assert len(caplog.records) == 1
