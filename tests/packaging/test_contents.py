"""What the wheel and the system packages ship: the exporter package, never a test rig.

The local PostgreSQL/pgBouncer rigs and the demo live in ``rigs/`` at the top of
the repository, for the tests, the benchmark and ``scripts/demo`` only.
"""

from __future__ import annotations

import shutil
import sys
import zipfile
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

import pytest

from tests.packaging.conftest import REPO, VERSION, Built, run

RIG_MODULES = frozenset({"localpg", "localbouncer", "demo"})
RIG_PACKAGES = frozenset({"rigs", "tests", "bench"})
SITE = "usr/lib/pg_exporter/site-packages"
DIST_INFO = f"pg_exporter-{VERSION}.dist-info"
# Not part of a source tree: what a checkout accumulates besides its tracked files.
UNTRACKED = shutil.ignore_patterns(
    ".git", ".venv", ".venv-peer", "build", "dist", "*.egg-info", "__pycache__", ".*_cache"
)


def strays(paths: Iterable[str]) -> list[str]:
    """Python files of ours that are a rig or lie outside ``exporter/``."""
    modules = [PurePosixPath(path) for path in paths if path.endswith(".py")]
    return sorted(
        str(path) for path in modules if path.parts[0] != "exporter" or path.stem in RIG_MODULES
    )


def rigs_anywhere(paths: Iterable[str]) -> list[str]:
    """Paths under site-packages named like a rig module or a rig package."""
    found = []
    for path in paths:
        relative = PurePosixPath(path.removeprefix("./")).relative_to(SITE)
        if relative.parts and (relative.parts[0] in RIG_PACKAGES or relative.stem in RIG_MODULES):
            found.append(path)
    return sorted(found)


def test_strays_names_rigs_and_modules_outside_the_package() -> None:
    """The check itself: rig modules and top-level packages other than exporter are caught."""
    assert (
        strays(["exporter/cli.py", "exporter/web/app.py", "pg_exporter-0.dist-info/RECORD"]) == []
    )
    assert strays(["exporter/localpg.py", "exporter/demo.py", "rigs/localbouncer.py"]) == [
        "exporter/demo.py",
        "exporter/localpg.py",
        "rigs/localbouncer.py",
    ]
    assert strays(["tests/conftest.py", "bench/soak.py"]) == ["bench/soak.py", "tests/conftest.py"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel pip builds from a clean copy of this checkout (so no stale build/lib)."""
    source = tmp_path_factory.mktemp("source") / "pg_exporter"
    shutil.copytree(REPO, source, ignore=UNTRACKED)
    out = tmp_path_factory.mktemp("wheel")
    pip = (sys.executable, "-m", "pip", "--disable-pip-version-check", "-q")
    run(*pip, "wheel", "--no-deps", "-w", out, source)
    built = sorted(out.glob("pg_exporter-*.whl"))
    assert len(built) == 1, built
    return built[0]


def test_wheel_holds_only_the_exporter_package(wheel: Path) -> None:
    """Every Python module in the wheel is in exporter/, and none of them is a rig."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert "exporter/cli.py" in names
    assert strays(names) == []


def test_deb_holds_only_the_exporter_package(built: Built, tmp_path: Path) -> None:
    """Our files in the .deb (its RECORD) are exporter/ only; no rig anywhere in the payload."""
    run("dpkg-deb", "-x", built.deb, tmp_path)
    record = (tmp_path / SITE / DIST_INFO / "RECORD").read_text()
    ours = [line.split(",", 1)[0] for line in record.splitlines() if line]
    assert "exporter/cli.py" in ours
    assert strays(ours) == []
    listing = run("dpkg-deb", "-c", built.deb).stdout.splitlines()
    paths = [line.split(maxsplit=5)[-1].split(" -> ")[0] for line in listing]
    assert rigs_anywhere(path for path in paths if f"{SITE}/" in path) == []


def test_rpm_holds_no_rig(built: Built) -> None:
    """Nothing under the .rpm's site-packages is named like a rig module or package."""
    listing = run("rpm", "-qlp", built.rpm).stdout.split()
    in_site = [path.removeprefix("/") for path in listing if path.startswith(f"/{SITE}/")]
    assert f"{SITE}/exporter/cli.py" in in_site
    assert rigs_anywhere(in_site) == []
