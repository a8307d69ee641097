"""The .deb: its metadata and payload, then installed with apt-get on this Debian machine."""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import time
from pathlib import Path

import pytest

from rigs.localpg import LocalCluster, free_port
from tests.fixtures.helpers import samples, value
from tests.packaging.conftest import (
    APT_ENV,
    ENV_FILE,
    REPO,
    SANDBOX,
    UNIT,
    VERSION,
    Built,
    assert_compiled_paths,
    claimed_minors,
    deb_installed,
    find_cpython,
    purge_pg_exporter,
    read_env_file,
    run,
    serve_and_scrape,
)

SITE = Path("/usr/lib/pg_exporter/site-packages")
CONFIG_DIR = Path("/etc/pg_exporter")
EXPOSURE_LIMIT = 2.0
EXTENSION = re.compile(r"(?P<module>.+)\.(?P<abi>cpython-3\d+|abi3)(-x86_64-linux-gnu)?\.so")
#: The compiled paths issue 37 is about: psycopg's, aiohttp's parser, multidict's, yarl's.
REQUIRED_EXTENSIONS = {"psycopg_c/pq", "psycopg_c/_psycopg", "aiohttp/_http_parser",
                       "multidict/_multidict", "yarl/_quoting_c"}  # fmt: skip
OLDEST_GLIBC = (2, 34)  # RHEL 9; Debian 12 has 2.36, Ubuntu 24.04 2.39
SYSTEM_LIBRARIES = {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "libgcc_s.so.1",
                    "libstdc++.so.6", "ld-linux-x86-64.so.2", "libpq.so.5"}  # fmt: skip


def _field(deb: Path, name: str) -> str:
    return run("dpkg-deb", "-f", deb, name).stdout.strip()


def _members(deb: Path) -> dict[str, str]:
    """Path in the package → its mode string, from ``dpkg-deb -c``."""
    listing = run("dpkg-deb", "-c", deb).stdout
    members = {}
    for line in listing.splitlines():
        mode, *_, path = line.split(maxsplit=5)
        members[path.removeprefix(".").split(" -> ")[0].rstrip("/") or "/"] = mode
    return members


def test_control_declares_the_distribution_dependencies(built: Built) -> None:
    """Name, version and arch are right; Depends names only Debian's python3 >= 3.11 and libpq5."""
    assert _field(built.deb, "Package") == "pg-exporter"
    assert _field(built.deb, "Version") == f"{VERSION}-1"
    assert _field(built.deb, "Architecture") == "amd64"
    assert _field(built.deb, "Depends") == "python3 (>= 3.11~), libpq5"


def test_conffiles_are_the_collector_library_and_the_env_file(built: Built, tmp_path: Path) -> None:
    """Every collector file and /etc/default/pg_exporter are conffiles, so edits survive."""
    run("dpkg-deb", "-e", built.deb, tmp_path / "control")
    conffiles = set((tmp_path / "control" / "conffiles").read_text().split())
    library = {f"/etc/pg_exporter/{p.name}" for p in (REPO / "collectors").glob("*.yml")}
    assert conffiles == library | {"/etc/default/pg_exporter"}
    scripts = {p.name for p in (tmp_path / "control").iterdir()}
    assert {"preinst", "postinst", "prerm", "postrm"} <= scripts


def test_payload_layout_and_modes(built: Built) -> None:
    """Launcher, unit, docs and config where operators look; the env file is root-only."""
    members = _members(built.deb)
    assert members["/usr/bin/pg_exporter"] == "-rwxr-xr-x"
    assert members["/usr/lib/systemd/system/pg_exporter.service"] == "-rw-r--r--"
    assert members["/etc/default/pg_exporter"] == "-rw-------"
    assert members["/usr/share/doc/pg-exporter/README.md"] == "-rw-r--r--"
    # The README's links into docs/ resolve where it is installed.
    for page in sorted((REPO / "docs").glob("*.md")):
        assert members[f"/usr/share/doc/pg-exporter/docs/{page.name}"] == "-rw-r--r--", page.name
    assert members["/usr/share/doc/pg-exporter/copyright"] == "-rw-r--r--"
    assert f"{SITE}/exporter/cli.py" in members
    assert f"{SITE}/psycopg/pq/_pq_ctypes.py" in members  # the pure fallback stays


def _extensions(members: dict[str, str]) -> dict[str, set[str]]:
    """ABI tag (``cpython-311``, ``abi3``) → the extension modules built for it."""
    found: dict[str, set[str]] = {}
    for path in members:
        if match := EXTENSION.fullmatch(path.removeprefix(f"{SITE}/")):
            found.setdefault(match["abi"], set()).add(match["module"])
    return found


def test_payload_carries_the_compiled_modules_for_each_claimed_python(built: Built) -> None:
    """psycopg's C implementation, aiohttp's parser, multidict and yarl for 3.11, 3.12 (and
    3.13 where it can be built), the same modules for each; bcrypt's stable-ABI module."""
    members = _members(built.deb)
    extensions = _extensions(members)
    assert extensions.pop("abi3") == {"bcrypt/_bcrypt"}
    assert set(extensions) >= {f"cpython-3{minor}" for minor in claimed_minors()}
    first, *rest = extensions.values()
    assert first >= REQUIRED_EXTENSIONS
    assert all(modules == first for modules in rest), extensions
    assert not [path for path in members if "__pycache__" in path or path.endswith(".pyc")]


def test_compiled_modules_load_on_the_oldest_claimed_glibc(built: Built, tmp_path: Path) -> None:
    """No extension asks for glibc newer than RHEL 9's 2.34, nor a library the packages do
    not depend on; psycopg's links the system's libpq.so.5 (never a bundled one)."""
    run("dpkg-deb", "-x", built.deb, tmp_path)
    for module in sorted(tmp_path.glob(f"{SITE.relative_to('/')}/**/*.so")):
        symbols = run("objdump", "-T", module).stdout
        versions = [tuple(map(int, v.split("."))) for v in re.findall(r"GLIBC_([\d.]+)", symbols)]
        assert max(versions) <= OLDEST_GLIBC, (module.name, max(versions))
        needed = set(re.findall(r"NEEDED\s+(\S+)", run("objdump", "-p", module).stdout))
        assert needed <= SYSTEM_LIBRARIES, (module.name, needed - SYSTEM_LIBRARIES)
        if module.parent.name == "psycopg_c":
            assert "libpq.so.5" in needed


@pytest.mark.parametrize("minor", claimed_minors())
def test_each_python_runs_the_compiled_paths_of_the_payload(
    built: Built, tmp_path: Path, minor: int
) -> None:
    """The unpacked launcher, run by each CPython it claims, reports psycopg's "c"
    implementation (the system's libpq), aiohttp's C parser, multidict's C extension."""
    run("dpkg-deb", "-x", built.deb, tmp_path)
    python = find_cpython(minor)
    assert python is not None
    out = run(python, "-I", "-S", tmp_path / "usr/bin/pg_exporter", "--version").stdout
    assert_compiled_paths(out)
    assert f"python: CPython 3.{minor}." in out


def test_a_python_without_a_build_falls_back_to_the_pure_paths(
    built: Built, tmp_path: Path
) -> None:
    """Where the payload has no build for the running Python (a newer CPython), psycopg
    and aiohttp run their pure-Python paths and --version says so, rather than crash."""
    run("dpkg-deb", "-x", built.deb, tmp_path)
    site = tmp_path / SITE.relative_to("/")
    builds = [
        *site.glob("psycopg_c/*.cpython-311-*.so"),
        *site.glob("aiohttp/_http_*.cpython-311-*.so"),
    ]
    assert len(builds) == 4, builds
    for module in builds:
        module.unlink()
    launcher = tmp_path / "usr/bin/pg_exporter"
    out = run("/usr/bin/python3.11", "-I", "-S", launcher, "--version").stdout
    assert "psycopg: " in out
    assert ", python implementation (libpq " in out
    assert ", pure-Python HTTP parser\n" in out


def test_installed_launcher_reports_its_version_quickly(installed: None) -> None:
    """/usr/bin/pg_exporter --version runs on Debian's python3, well under a second each."""
    times = []
    for _ in range(3):
        started = time.monotonic()
        out = run("/usr/bin/pg_exporter", "--version").stdout
        times.append(time.monotonic() - started)
    assert f"pg_exporter version {VERSION}" in out
    assert "python: CPython 3." in out
    assert_compiled_paths(out)
    assert statistics.median(times) < 1.0, times  # 0.41 s measured; wide margin for busy CI


def test_install_compiles_bytecode_for_the_target_python(installed: None) -> None:
    """postinst leaves byte-code for Debian's python3, which the service user could not write."""
    tag = run("/usr/bin/python3", "-c", "import sys; print(sys.implementation.cache_tag)")
    for module in ("exporter/cli", "aiohttp/web", "psycopg/connection"):
        path = Path(module)
        cached = SITE / path.parent / "__pycache__" / f"{path.name}.{tag.stdout.strip()}.pyc"
        assert cached.is_file(), cached


@pytest.mark.parametrize("sandboxed", [False, True], ids=["as-prometheus", "unit-sandbox"])
def test_installed_exporter_scrapes_with_the_env_file(
    installed: None, cluster: LocalCluster, sandboxed: bool
) -> None:
    """As user prometheus, with the installed env file: pg_up 1 and no collector errors."""
    env = {"PATH": "/usr/bin:/bin", **read_env_file(ENV_FILE)}
    env["PG_EXPORTER_URL"] = cluster.dsn()  # the only setting a site must change
    port = free_port()
    opts = env["PG_EXPORTER_OPTS"].replace("--web.listen-address=:9630", "")
    command = ["/usr/bin/pg_exporter", *opts.split(), f"--web.listen-address=127.0.0.1:{port}"]
    if sandboxed:
        command = ["/usr/bin/python3", str(SANDBOX), str(UNIT), "prometheus", "--", *command]
        body = serve_and_scrape(command, env, port)
    else:
        body = serve_and_scrape(command, env, port, user="prometheus")
    assert value(body, "pg_up") == 1
    errors = {
        dict(labels)["query"]: count
        for (name, labels), count in samples(body).items()
        if name == "pg_exporter_query_scrape_error_count"
    }
    assert len(errors) >= 10, "the default library planned fewer collectors than expected"
    assert {query: count for query, count in errors.items() if count} == {}


def test_sandbox_really_refuses_what_the_unit_forbids(tools: None) -> None:
    """The emulated sandbox is not a no-op: netlink, @resources calls and W+X memory fail."""
    probe = (
        "import errno, mmap, os, socket\n"
        "def refused(call):\n"
        "    try:\n        call()\n    except OSError as exc:\n        return exc.errno\n"
        "print(refused(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW)),\n"
        "      refused(lambda: os.setpriority(os.PRIO_PROCESS, 0, 5)),\n"
        "      refused(lambda: mmap.mmap(-1, 4096, prot=7)), os.getuid())\n"
    )
    unit = REPO / "packaging" / "pg_exporter.service"
    out = run("/usr/bin/python3", SANDBOX, unit, "nobody", "--", "/usr/bin/python3", "-c", probe)
    netlink, setpriority, wx, uid = out.stdout.split()
    assert (int(netlink), int(setpriority), int(wx)) == (97, 1, 13)  # EAFNOSUPPORT, EPERM, EACCES
    assert int(uid) != 0


def test_installed_unit_verifies(installed: None) -> None:
    """systemd-analyze verify finds nothing to say about the installed unit."""
    done = run("systemd-analyze", "verify", UNIT)
    assert done.stdout.strip() == ""
    assert done.stderr.strip() == ""


def test_installed_unit_exposure_is_at_most_2(installed: None) -> None:
    """systemd-analyze security --offline=yes rates the unit's exposure 2.0 or less."""
    out = run("systemd-analyze", "security", "--offline=yes", "--no-pager", UNIT).stdout
    match = re.search(r"Overall exposure level for pg_exporter\.service: (\d+\.\d)", out)
    assert match is not None, out
    assert float(match.group(1)) <= EXPOSURE_LIMIT, out


def _next_revision(deb: Path, workdir: Path) -> Path:
    """The same package as release 2, so that apt-get sees an upgrade."""
    tree = workdir / "tree"
    run("dpkg-deb", "-R", deb, tree)
    control = tree / "DEBIAN" / "control"
    control.write_text(
        control.read_text().replace(f"Version: {VERSION}-1", f"Version: {VERSION}-2")
    )
    upgrade = workdir / f"pg-exporter_{VERSION}-2_amd64.deb"
    run("dpkg-deb", "--root-owner-group", "-Zxz", "-b", tree, upgrade)
    return upgrade


def test_upgrade_keeps_edited_configuration(installed: None, built: Built, tmp_path: Path) -> None:
    """Edited collector and env files survive an upgrade; the new version runs at once."""
    collector = CONFIG_DIR / "0110-pg.yml"
    edited_collector = collector.read_text() + "\n# edited by the site\n"
    collector.write_text(edited_collector)
    env_text = ENV_FILE.read_text().replace("PG_EXPORTER_TAG=\n", "PG_EXPORTER_TAG=site\n")
    ENV_FILE.write_text(env_text)
    upgrade = _next_revision(built.deb, tmp_path)
    run("apt-get", "install", "-y", "-q", str(upgrade), env=APT_ENV)
    version = run("dpkg-query", "-W", "-f=${Version}", "pg-exporter").stdout
    assert version == f"{VERSION}-2"
    assert collector.read_text() == edited_collector
    assert ENV_FILE.read_text() == env_text
    assert run("/usr/bin/pg_exporter", "--version").stdout.startswith("pg_exporter version")
    assert list(SITE.glob("exporter/__pycache__/cli.*.pyc"))  # compiled again after prerm


def test_launcher_ignores_python_environment_variables(installed: None) -> None:
    """PYTHONPATH and friends from an operator's shell cannot change what the launcher runs."""
    shadow = Path(os.environ.get("TMPDIR", "/tmp")) / f"pg-exporter-shadow-{os.getpid()}"
    (shadow / "exporter").mkdir(parents=True, exist_ok=True)
    (shadow / "exporter" / "__init__.py").write_text("raise SystemExit('shadowed')\n")
    try:
        env = {**os.environ, "PYTHONPATH": str(shadow), "PYTHONHOME": "/nonexistent"}
        done = subprocess.run(
            ["/usr/bin/pg_exporter", "--version"], env=env, capture_output=True, text=True,
            check=False, timeout=60,
        )  # fmt: skip
    finally:
        shutil.rmtree(shadow)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("pg_exporter version"), done.stdout


def test_purge_removes_everything_and_a_reinstall_starts_fresh(
    installed: None, built: Built
) -> None:
    """Purge leaves no file or directory of ours (the shared user stays); reinstall is clean."""
    purge_pg_exporter()
    leftovers = [p for p in (SITE.parent, CONFIG_DIR, ENV_FILE, UNIT) if p.exists()]
    assert leftovers == []
    assert not Path("/usr/bin/pg_exporter").exists()
    assert run("getent", "passwd", "prometheus").stdout.startswith("prometheus:")
    run("apt-get", "install", "-y", "-q", str(built.deb), env=APT_ENV)  # the fixture purges later
    assert "PG_EXPORTER_TAG=\n" in ENV_FILE.read_text()
    assert deb_installed("pg-exporter")
