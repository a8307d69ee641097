"""What serving imports: modules whose import costs resident memory the exporter does
not need at every start (issue 31) are imported only where they are used."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# What the CLI imports on its way to serving, in its order (parse_settings reads the
# route table before the server starts).
_SERVING = ("exporter.cli", "exporter.web.routes", "exporter.serve", "exporter.web.app")


def _imported_after_serving_imports(names: tuple[str, ...]) -> dict[str, bool]:
    code = (
        f"import importlib, json, sys\nfor m in {_SERVING!r}: importlib.import_module(m)\n"
        f"print(json.dumps({{n: n in sys.modules for n in {names!r}}}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    found: dict[str, bool] = json.loads(out.stdout)
    return found


@pytest.mark.parametrize(
    ("module", "where"),
    [
        (
            "prometheus_client",
            "never: exporter.report.process reads the runtime families (1.0 MiB)",
        ),
        ("bcrypt", "with basic auth, at the first check (0.4 MiB)"),
        ("difflib", "for a mistyped flag or targets-file key (0.2 MiB)"),
    ],
)
def test_serving_does_not_import(module: str, where: str) -> None:
    """Imported only where it is used: ``where``."""
    assert _imported_after_serving_imports((module,)) == {module: False}, where
