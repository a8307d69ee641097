"""Maintainer scripts, run for real against stub commands, with and without systemd running.

Each script runs in a private mount namespace where /run is a fresh tmpfs, holding
/run/systemd/system when the case wants systemd "running", and where an installed
pg-exporter (if any) is hidden, so nothing on this machine is changed.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.packaging.conftest import REPO

SCRIPTS = REPO / "packaging" / "scripts"
STUBBED = ("systemctl", "getent", "groupadd", "useradd")
RELOAD = "systemctl daemon-reload"
RESTART = "systemctl try-restart pg_exporter.service"
# Hide what a real installation put here: the scripts compile and clean byte-code there.
HIDE_INSTALLED = (
    "if [ -d /usr/lib/pg_exporter ]; then mount -t tmpfs tmpfs /usr/lib/pg_exporter; fi; "
    "if [ -e /usr/bin/pg_exporter ]; then mount --bind /dev/null /usr/bin/pg_exporter; fi; "
)


def _run_script(
    tmp_path: Path, script: str, *args: str, systemd: bool, account_exists: bool = True
) -> list[str]:
    """Run one script; the stub commands it called, in order, with their arguments."""
    if os.geteuid() != 0:
        pytest.fail("the maintainer-script tests need root for a private mount namespace")
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    calls = tmp_path / "calls"
    calls.write_text("")
    for tool in STUBBED:
        status = "0" if tool != "getent" or account_exists else "2"
        (stubs / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >>"$STUB_LOG"\nexit {status}\n')
        (stubs / tool).chmod(0o755)
    run_dir = "mkdir -p /run/systemd/system; " if systemd else ""
    inner = f'mount -t tmpfs tmpfs /run; {run_dir}{HIDE_INSTALLED}exec sh "$0" "$@"'
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", inner,
         str(SCRIPTS / script), *args],
        env={"PATH": f"{stubs}:/usr/sbin:/usr/bin:/sbin:/bin", "STUB_LOG": str(calls)},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return calls.read_text().splitlines()


def test_preinstall_creates_the_prometheus_account_when_missing(tmp_path: Path) -> None:
    """A system group and a system user without home or shell, both named prometheus."""
    calls = _run_script(tmp_path, "preinstall.sh", "install", systemd=True, account_exists=False)
    assert "groupadd --system prometheus" in calls
    useradd = [call for call in calls if call.startswith("useradd")]
    assert len(useradd) == 1
    words = useradd[0].split()
    assert words[-1] == "prometheus"
    for option in ("--system", "--no-create-home", "--gid prometheus", "--shell /usr/sbin/nologin"):
        assert option in useradd[0]


def test_preinstall_leaves_an_existing_account_alone(tmp_path: Path) -> None:
    """When user and group exist (another exporter made them), nothing is created."""
    calls = _run_script(tmp_path, "preinstall.sh", "1", systemd=True)
    assert [call.split()[0] for call in calls] == ["getent", "getent"]


@pytest.mark.parametrize("args", [("configure", ""), ("1",)], ids=["deb", "rpm"])
def test_first_install_never_enables_or_starts_the_service(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    """With systemd running, a first install only reloads units: no enable, start, restart."""
    assert _run_script(tmp_path, "postinstall.sh", *args, systemd=True) == [RELOAD]


def test_deb_upgrade_restarts_only_a_running_service(tmp_path: Path) -> None:
    """postinst configure OLD-VERSION reloads units, then try-restart (running ones only)."""
    calls = _run_script(tmp_path, "postinstall.sh", "configure", "0.0.9-1", systemd=True)
    assert calls == [RELOAD, RESTART]


def test_rpm_upgrade_restarts_after_the_old_files_are_gone(tmp_path: Path) -> None:
    """%post 2 only reloads; %postun 1 (old files removed) reloads and try-restarts."""
    assert _run_script(tmp_path, "postinstall.sh", "2", systemd=True) == [RELOAD]
    assert _run_script(tmp_path, "postremove.sh", "1", systemd=True) == [RELOAD, RESTART]


def test_without_systemd_running_no_unit_is_touched(tmp_path: Path) -> None:
    """In a container or chroot, install and upgrade call no systemctl at all."""
    assert _run_script(tmp_path, "postinstall.sh", "configure", "0.0.9-1", systemd=False) == []
    assert _run_script(tmp_path, "postremove.sh", "1", systemd=False) == []


@pytest.mark.parametrize("arg", ["remove", "0"], ids=["deb", "rpm"])
def test_removal_stops_and_disables_the_service(tmp_path: Path, arg: str) -> None:
    """prerm remove / %preun 0 stop the service and disable it; postrm reloads units."""
    calls = _run_script(tmp_path, "preremove.sh", arg, systemd=True)
    assert calls == [
        "systemctl stop pg_exporter.service",
        "systemctl --no-reload disable pg_exporter.service",
    ]
    assert _run_script(tmp_path, "postremove.sh", arg, systemd=True) == [RELOAD]


@pytest.mark.parametrize("arg", ["upgrade", "1"], ids=["deb", "rpm"])
def test_upgrade_does_not_stop_the_service(tmp_path: Path, arg: str) -> None:
    """prerm upgrade / %preun 1 leave the service running and enabled."""
    assert _run_script(tmp_path, "preremove.sh", arg, systemd=True) == []
