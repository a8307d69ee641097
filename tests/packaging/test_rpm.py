"""The .rpm, read with rpm -qp, and its payload unpacked and run with this machine's python3.11."""

from __future__ import annotations

import subprocess
from pathlib import Path

from rigs.localpg import LocalCluster
from tests.packaging.conftest import REPO, VERSION, Built, assert_compiled_paths, run

SITE = "/usr/lib/pg_exporter/site-packages"
PYTHON = Path("/usr/bin/python3.11")  # what the RHEL 9 package requires; Debian 12's python3


def _query(rpm: Path, *args: str) -> str:
    return run("rpm", "-qp", *args, rpm).stdout


def _files(rpm: Path) -> dict[str, tuple[str, str]]:
    """Path → (rpm file flags such as 'cn' for config noreplace, permission string)."""
    listing = _query(rpm, "--qf", "[%{FILENAMES}\t%{FILEFLAGS:fflags}\t%{FILEMODES:perms}\n]")
    files = {}
    for line in listing.splitlines():
        path, flags, perms = line.split("\t")
        files[path] = (flags, perms)
    return files


def test_metadata(built: Built) -> None:
    """Name, version, release, arch and licence as RHEL tools show them."""
    fields = "%{NAME}|%{VERSION}|%{RELEASE}|%{ARCH}|%{LICENSE}|%{SUMMARY}"
    assert _query(built.rpm, "--qf", fields).split("|") == [
        "pg-exporter", VERSION, "1", "x86_64", "Apache-2.0",
        "Prometheus exporter for PostgreSQL and pgBouncer",
    ]  # fmt: skip


def test_requires_only_rhel_packages(built: Built) -> None:
    """Requires: python3.11 and libpq from RHEL 9 AppStream, shadow-utils for the user."""
    requires = {
        line.strip()
        for line in _query(built.rpm, "--requires").splitlines()
        if not line.startswith("rpmlib(")
    }
    assert requires == {"python3.11", "libpq", "shadow-utils"}


def test_config_files_are_noreplace(built: Built) -> None:
    """The collector library and the env file are %config(noreplace); nothing else is config."""
    files = _files(built.rpm)
    config = {path for path, (flags, _) in files.items() if "c" in flags}
    library = {f"/etc/pg_exporter/{p.name}" for p in (REPO / "collectors").glob("*.yml")}
    assert config == library | {"/etc/default/pg_exporter"}
    assert all(files[path][0] == "cn" for path in config)
    assert files["/etc/default/pg_exporter"][1] == "-rw-------"


def test_file_list_owns_its_directories(built: Built) -> None:
    """Launcher, unit, licence, and every directory of ours, so rpm -e leaves nothing."""
    files = _files(built.rpm)
    assert files["/usr/bin/pg_exporter"][1] == "-rwxr-xr-x"
    assert files["/usr/lib/systemd/system/pg_exporter.service"][1] == "-rw-r--r--"
    assert files["/usr/share/licenses/pg-exporter/LICENSE"][0] == "l"
    ours = ("/etc/pg_exporter", "/usr/lib/pg_exporter", SITE, "/usr/share/doc/pg-exporter",
            "/usr/share/licenses/pg-exporter")  # fmt: skip
    assert [files[d][1][0] for d in ours] == ["d"] * len(ours)
    site_dirs = {str(Path(p).parent) for p in files if p.startswith(SITE + "/")}
    assert site_dirs <= set(files), sorted(site_dirs - set(files))


def test_scriptlets_are_the_packaging_scripts(built: Built) -> None:
    """%pre, %post, %preun and %postun carry packaging/scripts/*.sh, run by /bin/sh."""
    scripts = _query(built.rpm, "--scripts")
    for heading, name in (
        ("preinstall", "preinstall.sh"),
        ("postinstall", "postinstall.sh"),
        ("preuninstall", "preremove.sh"),
        ("postuninstall", "postremove.sh"),
    ):
        body = (REPO / "packaging" / "scripts" / name).read_text().strip()
        assert f"{heading} scriptlet (using /bin/sh):\n{body}" in scripts, name


def test_payload_runs_with_python311(built: Built, cluster: LocalCluster, tmp_path: Path) -> None:
    """The unpacked launcher runs on python3.11: --version, --dry-run, and --explain on a server."""
    rpm2cpio = subprocess.Popen(["rpm2cpio", str(built.rpm)], stdout=subprocess.PIPE)
    run_cpio = subprocess.run(
        ["cpio", "-idm", "--quiet"], stdin=rpm2cpio.stdout, cwd=tmp_path, check=False
    )
    assert rpm2cpio.wait() == 0
    assert run_cpio.returncode == 0
    launcher = tmp_path / "usr" / "bin" / "pg_exporter"
    assert launcher.read_text().splitlines()[0] == f"#!{PYTHON} -IS"
    assert PYTHON.is_file(), "Debian 12's python3 package provides /usr/bin/python3.11"
    version = run(launcher, "--version").stdout
    assert version.startswith(f"pg_exporter version {VERSION}")
    assert_compiled_paths(version)  # the same payload as the .deb: RHEL 9's python3.11 ABI
    config = tmp_path / "etc" / "pg_exporter"
    assert "pg_primary" in run(launcher, "--dry-run", "-c", config).stdout
    plan = run(launcher, "--explain", "-u", cluster.dsn(), "-c", config, "-T", "5000").stdout
    assert "pg_primary" in plan  # connected through psycopg's C implementation
