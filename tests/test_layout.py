"""The package's map holds: the core never reaches into the web layer, and the error
types stand on nothing. Read from the source (every import, at any depth, including
those under ``TYPE_CHECKING``), so a lazy import inside a function counts too."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "exporter"

# The modules that build and run the app from the command line, so they alone may
# import exporter.web: cli.py reads the web config file and checks the telemetry path
# against the route table; serve.py creates the app and runs it.
RUNS_THE_APP = {"cli.py", "serve.py"}


def imported(source: str, module: str) -> Iterator[str]:
    """The absolute name of every module ``source`` (the text of ``module``, a dotted
    name inside the package) imports, relative imports resolved."""
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)


def reaches(names: Iterator[str], target: str) -> list[str]:
    return sorted({n for n in names if n == target or n.startswith(f"{target}.")})


def core_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.glob("*.py") if p.name not in RUNS_THE_APP)


@pytest.mark.parametrize("path", core_modules(), ids=lambda p: p.name)
def test_core_modules_do_not_import_the_web_layer(path: Path) -> None:
    """A module outside exporter/web/ imports nothing from exporter.web, except the
    modules that build and run the app (RUNS_THE_APP): the web layer sits on the core,
    never the other way round."""
    found = reaches(imported(path.read_text(), module_name(path)), "exporter.web")
    assert not found, f"{path.name} imports {found}: move what it needs out of exporter/web/"


def test_errors_imports_nothing_from_the_package() -> None:
    """exporter/errors.py is imported by nearly every module; importing back would
    make cycles."""
    path = PACKAGE / "errors.py"
    found = reaches(imported(path.read_text(), "exporter.errors"), "exporter")
    assert not found, f"errors.py imports {found}"


@pytest.mark.parametrize(
    ("source", "module", "expected"),
    [
        (
            "from exporter.web.state import STATE",
            "exporter.gate",
            ["exporter.web.state", "exporter.web.state.STATE"],
        ),
        ("from exporter import web", "exporter.gate", ["exporter.web"]),
        ("from .web import app", "exporter.gate", ["exporter.web", "exporter.web.app"]),
        ("def f():\n    import exporter.web.app\n", "exporter.gate", ["exporter.web.app"]),
        ("from ..web import fleet", "exporter.web.health", ["exporter.web", "exporter.web.fleet"]),
        ("from exporter.webby import x", "exporter.gate", []),
    ],
)
def test_the_check_sees_every_spelling(source: str, module: str, expected: list[str]) -> None:
    assert reaches(imported(source, module), "exporter.web") == expected
