"""The package's layers hold: ``ls exporter/`` shows them, each sub-package imports only
the layers before it, the error types stand on nothing, and each layer's docstring
names its modules. Read from the source (every import, at any depth, including those
under ``TYPE_CHECKING``), so a lazy import inside a function counts too."""

from __future__ import annotations

import ast
import collections
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

import exporter

PACKAGE = Path(__file__).resolve().parent.parent / "exporter"

# The layers, lowest first: a module may import its own layer and those before it.
# "process" is the package's top level (cli, serve, signals, systemd, __main__).
LAYERS = ("errors", "config", "pg", "health", "expose", "collect", "report", "fleet", "web")
PROCESS = {"__init__", "__main__", "cli", "serve", "signals", "systemd"}


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
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def reaches(names: Iterator[str], target: str) -> list[str]:
    return sorted({n for n in names if n == target or n.startswith(f"{target}.")})


def layer_of(module: str) -> str:
    """The layer a dotted module name belongs to: its sub-package, ``errors``, or
    ``process`` for the rest of the top level."""
    parts = module.split(".")
    if len(parts) == 1:
        return "process"
    return parts[1] if parts[1] in LAYERS else "process"


def rank(layer: str) -> int:
    return len(LAYERS) if layer == "process" else LAYERS.index(layer)


def all_modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_ls_shows_the_layers() -> None:
    """The top level holds the layers as packages and the process's modules, nothing else."""
    entries = {p.name for p in PACKAGE.iterdir() if p.name != "__pycache__"}
    packages = {name for name in entries if (PACKAGE / name).is_dir()}
    assert packages == set(LAYERS) - {"errors"}
    assert {Path(name).stem for name in entries - packages} == PROCESS | {"errors"}
    for name in packages:
        assert (PACKAGE / name / "__init__.py").is_file(), f"exporter/{name}/ is not a package"
        assert not [p for p in (PACKAGE / name).iterdir() if p.is_dir() and p.name != "__pycache__"]


@pytest.mark.parametrize("path", all_modules(), ids=module_name)
def test_a_module_imports_only_its_layer_and_those_before_it(path: Path) -> None:
    """exporter.pg never reaches into exporter.collect, the core never into exporter.web,
    and so on: the order of LAYERS, which exporter/__init__.py's docstring gives too."""
    module = module_name(path)
    mine = rank(layer_of(module))
    above = sorted(
        name
        for name in imported(path.read_text(), module)
        if name.startswith("exporter.")
        and name != "exporter.__version__"  # the package's version, which every layer may read
        and rank(layer_of(name)) > mine
    )
    assert not above, f"{module} ({layer_of(module)}) imports {above}, from a later layer"


def test_only_the_process_imports_the_web_layer() -> None:
    """Of the process's modules, cli (the web config, the route table) and serve (the
    app) import exporter.web; the rest of the package does not."""
    importers = {
        module_name(path)
        for path in all_modules()
        if not module_name(path).startswith("exporter.web")
        and reaches(imported(path.read_text(), module_name(path)), "exporter.web")
    }
    assert importers == {"exporter.cli", "exporter.serve"}


def test_errors_imports_nothing_from_the_package() -> None:
    """exporter/errors.py is imported by nearly every module; importing back would
    make cycles."""
    path = PACKAGE / "errors.py"
    found = reaches(imported(path.read_text(), "exporter.errors"), "exporter")
    assert not found, f"errors.py imports {found}"


def test_no_two_modules_share_a_name() -> None:
    """One noun, one room: no module or package name is used twice (a layer called
    ``health`` and a ``web/health.py`` would be two rooms of one name)."""
    names = collections.Counter(
        p.parent.name if p.stem == "__init__" else p.stem
        for p in all_modules()
        if p.parent != PACKAGE or p.stem != "__init__"  # the package itself is no room
    )
    assert [name for name, count in names.items() if count > 1] == []


@pytest.mark.parametrize("layer", [layer for layer in LAYERS if layer != "errors"])
def test_each_layer_says_what_it_holds_and_what_it_may_import(layer: str) -> None:
    """A layer's ``__init__`` docstring names each of its modules and the layers it
    may import; the package's docstring names every layer in order."""
    doc = ast.get_docstring(ast.parse((PACKAGE / layer / "__init__.py").read_text())) or ""
    named = set(re.findall(r"``(\w+)``", doc))
    modules = {p.stem for p in (PACKAGE / layer).glob("*.py")} - {"__init__"}
    assert modules <= named, f"exporter/{layer}/__init__.py does not name {modules - named}"
    assert "May import:" in doc
    order = re.findall(r":mod:`exporter\.(\w+)`", exporter.__doc__ or "")
    assert [m for m in order if m in LAYERS] == list(LAYERS)


@pytest.mark.parametrize(
    ("source", "module", "expected"),
    [
        (
            "from exporter.web.appstate import STATE",
            "exporter.collect.gate",
            ["exporter.web.appstate", "exporter.web.appstate.STATE"],
        ),
        ("from exporter import web", "exporter.collect.gate", ["exporter.web"]),
        ("from ..web import app", "exporter.collect.gate", ["exporter.web", "exporter.web.app"]),
        ("from .web import app", "exporter.cli", ["exporter.web", "exporter.web.app"]),
        ("def f():\n    import exporter.web.app\n", "exporter.collect.gate", ["exporter.web.app"]),
        ("from . import pages", "exporter.web.healthpages", ["exporter.web", "exporter.web.pages"]),
        ("from .web import app", "exporter.collect.gate", []),  # exporter.collect.web
        ("from exporter.webby import x", "exporter.collect.gate", []),
    ],
)
def test_the_check_sees_every_spelling(source: str, module: str, expected: list[str]) -> None:
    assert reaches(imported(source, module), "exporter.web") == expected


def test_layers_are_ranked_by_their_package() -> None:
    assert layer_of("exporter.pg.postgres") == "pg"
    assert layer_of("exporter.errors") == "errors"
    assert layer_of("exporter.cli") == "process"
    assert layer_of("exporter") == "process"
    assert rank("errors") < rank("config") < rank("web") < rank("process")


def test_pyproject_ships_every_layer() -> None:
    """The wheel (and so the .deb and .rpm) carries each package: a layer missing from
    pyproject.toml's list would install an exporter that cannot import."""
    listed = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"
    ]
    on_disk = {module_name(p) for p in PACKAGE.rglob("__init__.py")}
    assert set(listed) == on_disk
