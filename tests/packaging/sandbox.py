"""Run a command inside the sandbox a systemd unit asks for, as far as a test can build it.

    python3 sandbox.py UNIT_FILE USER -- COMMAND [ARG...]

Run as root with Debian's python3 and python3-seccomp (this machine has no systemd
as PID 1, so the unit cannot be started for real). From the unit it applies
``User=`` (given, with its group), ``UMask=``, ``NoNewPrivileges=``,
``MemoryDenyWriteExecute=`` (through the kernel's PR_SET_MDWE),
``SystemCallFilter=`` with ``SystemCallErrorNumber=``, ``SystemCallArchitectures=native``
and ``RestrictAddressFamilies=``. The syscall groups are expanded by
``systemd-analyze syscall-filter``, so the filter is the one systemd would build.
Namespaces and mount options (ProtectSystem=, PrivateTmp=, ...) are not reproduced.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import pwd
import socket
import subprocess
import sys

import seccomp  # type: ignore[import-not-found]

PR_SET_NO_NEW_PRIVS = 38
PR_SET_MDWE = 65
PR_MDWE_REFUSE_EXEC_GAIN = 1
AF_MAX = 46  # address families the kernel knows today, with margin


def unit_settings(path: str) -> dict[str, list[str]]:
    """``[Service]`` settings of a unit file, each with every value it was given."""
    settings: dict[str, list[str]] = {}
    section = ""
    with open(path, encoding="utf-8") as unit:
        for raw in unit:
            line = raw.strip()
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1]
            elif section == "Service" and "=" in line and not line.startswith(("#", ";")):
                key, _, value = line.partition("=")
                settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def syscall_groups() -> dict[str, list[str]]:
    """Every ``@group`` systemd knows, with its members (names or nested groups)."""
    listing = subprocess.run(
        ["systemd-analyze", "syscall-filter", "--no-pager"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    groups: dict[str, list[str]] = {}
    current: list[str] = []
    for line in listing.splitlines():
        word = line.strip()
        if line.startswith("@"):
            current = groups.setdefault(word, [])
        elif word and not word.startswith("#"):
            current.append(word)
    return groups


def expand(items: list[str], groups: dict[str, list[str]]) -> set[str]:
    """System call names behind a list of names and ``@groups``."""
    names: set[str] = set()
    for item in items:
        if item.startswith("@"):
            names |= expand(groups[item], groups)
        else:
            names.add(item)
    return names


def allowed_syscalls(settings: dict[str, list[str]]) -> set[str]:
    """The allow list systemd builds: lists without ``~`` add, lists with ``~`` remove."""
    groups = syscall_groups()
    allowed: set[str] = set()
    for value in settings.get("SystemCallFilter", []):
        deny = value.startswith("~")
        names = expand(value.removeprefix("~").split(), groups)
        allowed = allowed - names if deny else allowed | names
    return allowed


def build_filter(settings: dict[str, list[str]]) -> seccomp.SyscallFilter:
    """The seccomp filter for the unit's syscall and address-family restrictions."""
    error = getattr(errno, settings.get("SystemCallErrorNumber", ["EPERM"])[-1])
    syscalls = seccomp.SyscallFilter(defaction=seccomp.ERRNO(error))
    for name in sorted(allowed_syscalls(settings) - {"socket"}):
        with contextlib.suppress(RuntimeError):  # a name this libseccomp does not know
            syscalls.add_rule(seccomp.ALLOW, name)
    families = {
        int(getattr(socket, name))
        for value in settings.get("RestrictAddressFamilies", [])
        for name in value.split()
    }
    for family in range(AF_MAX):
        if family in families:
            syscalls.add_rule(seccomp.ALLOW, "socket", seccomp.Arg(0, seccomp.EQ, family))
        else:
            action = seccomp.ERRNO(errno.EAFNOSUPPORT)
            syscalls.add_rule(action, "socket", seccomp.Arg(0, seccomp.EQ, family))
    return syscalls


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def main(argv: list[str]) -> None:
    unit_path, user, separator, *command = argv
    if separator != "--" or not command:
        sys.exit("usage: sandbox.py UNIT_FILE USER -- COMMAND [ARG...]")
    settings = unit_settings(unit_path)
    account = pwd.getpwnam(user)
    syscalls = build_filter(settings)  # before we drop the right to run systemd-analyze
    os.setgroups([])
    os.setgid(account.pw_gid)
    os.setuid(account.pw_uid)
    os.umask(int(settings.get("UMask", ["0022"])[-1], 8))
    if settings.get("NoNewPrivileges", ["no"])[-1] == "yes":
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
    if settings.get("MemoryDenyWriteExecute", ["no"])[-1] == "yes":
        _prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN)
    syscalls.load()
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
