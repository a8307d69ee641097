"""Package tests: build the .deb and .rpm once per session and install the .deb here.

These tests change the machine, on purpose and only as root: they install,
upgrade and purge pg-exporter itself. The tools they use (rpm and cpio to read
the .rpm, python3-seccomp for the sandbox, systemd for systemd-analyze) come from
``scripts/setup``; a test never installs them. A marker file tells a pg-exporter
they installed (and a run that was killed left behind) from one an operator
installed, which they refuse to touch.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

import exporter
from rigs.localpg import LocalCluster, pg15_bindir
from tests.packaging.containers import Podman, ways

REPO = Path(__file__).resolve().parents[2]
DIST = REPO / "dist"
VERSION = exporter.__version__
UNIT = Path("/usr/lib/systemd/system/pg_exporter.service")
ENV_FILE = Path("/etc/default/pg_exporter")
SANDBOX = Path(__file__).with_name("sandbox.py")
MARKER = Path("/var/tmp/pg-exporter-package-tests.installed")
TOOLS = ("rpm", "cpio", "python3-seccomp", "systemd", "binutils")
APT_ENV = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
TIMEOUT = 600  # seconds for a build or an apt-get run
IMAGE = f"localhost/pg-exporter:{VERSION}"
ARCHIVE = DIST / f"pg-exporter_{VERSION}_oci.tar"


@dataclass(frozen=True, slots=True)
class Built:
    """The packages scripts/packages made."""

    deb: Path
    rpm: Path


def run(
    *argv: str | Path, cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a command to completion, failing the test with its output when it fails."""
    words = [str(a) for a in argv]
    done = subprocess.run(
        words, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    assert done.returncode == 0, f"{shlex.join(words)}:\n{done.stdout}\n{done.stderr}"
    return done


def deb_installed(name: str) -> bool:
    """Whether dpkg reports the package as installed."""
    status = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", name], capture_output=True, text=True, check=False
    ).stdout
    return status.endswith("ok installed")


def purge_pg_exporter() -> None:
    """Remove pg-exporter with its configuration, then forget the marker."""
    if deb_installed("pg-exporter"):
        run("apt-get", "purge", "-y", "-q", "pg-exporter", env=APT_ENV)
    MARKER.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def tools() -> None:
    """rpm, cpio, python3-seccomp, systemd-analyze and objdump are installed; we are root."""
    if os.geteuid() != 0:
        pytest.fail("the package tests install pg-exporter on this machine: run them as root")
    missing = [name for name in TOOLS if not deb_installed(name)]
    if missing:
        pytest.fail(f"missing Debian packages {', '.join(missing)}: run scripts/setup")


@pytest.fixture(scope="session")
def built(tools: None) -> Built:
    """Both packages, freshly built by ``scripts/packages`` from this checkout."""
    run("bash", REPO / "scripts" / "packages", cwd=REPO)
    deb = DIST / f"pg-exporter_{VERSION}-1_amd64.deb"
    rpm = DIST / f"pg-exporter-{VERSION}-1.x86_64.rpm"
    assert deb.is_file(), sorted(p.name for p in DIST.iterdir())
    assert rpm.is_file(), sorted(p.name for p in DIST.iterdir())
    return Built(deb=deb, rpm=rpm)


@pytest.fixture(scope="session")
def installed(built: Built) -> Iterator[None]:
    """The .deb installed with apt-get; purged at the end of the session."""
    if deb_installed("pg-exporter") and not MARKER.exists():
        pytest.fail(
            "pg-exporter is already installed and not by these tests; they would purge it: "
            "remove it first (apt-get purge pg-exporter)"
        )
    purge_pg_exporter()
    MARKER.touch()
    run("apt-get", "install", "-y", "-q", str(built.deb), env=APT_ENV)
    yield
    purge_pg_exporter()


@pytest.fixture(scope="session")
def image(built: Built) -> str:
    """The image, built by scripts/image from this checkout and loaded into podman."""
    if shutil.which("podman") is None or shutil.which("mmdebstrap") is None:
        pytest.fail("podman and mmdebstrap are missing: run scripts/setup")
    run("bash", REPO / "scripts" / "image", cwd=REPO)
    loaded = run("podman", "load", "-i", ARCHIVE).stdout
    assert IMAGE in loaded, loaded
    return IMAGE


@pytest.fixture(scope="session")
def podman(image: str) -> Podman:
    """The first way of running podman that works here."""
    errors = []
    for way in ways():
        done = subprocess.run(
            way.run_argv(image, "--version"),
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode == 0 and f"pg_exporter version {VERSION}" in done.stdout:
            print(f"podman runs the image with: {way.name}")
            return way
        errors.append(f"{way.name}: {done.stderr.strip()[-300:]}")
    pytest.fail("podman cannot run the image here:\n" + "\n".join(errors))


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    """A throw-away PostgreSQL 15 (Debian's build) to point the installed exporter at."""
    with LocalCluster(pg15_bindir()) as local:
        yield local


def find_cpython(minor: int) -> Path | None:
    """An interpreter of 3.MINOR with its headers, found as scripts/packages finds it: the
    distribution's, else pyenv's newest."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    found = sorted(pyenv.glob(f"versions/3.{minor}.*/bin/python3.{minor}"), key=_release)
    for candidate in [Path(f"/usr/bin/python3.{minor}"), *reversed(found)]:
        include = subprocess.run(
            [candidate, "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"],
            capture_output=True, text=True, check=False,
        ).stdout.strip() if candidate.is_file() else ""  # fmt: skip
        if include and (Path(include) / "Python.h").is_file():
            return candidate
    return None


def _release(python: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in python.parent.parent.name.split(".") if part.isdigit())


def claimed_minors() -> list[int]:
    """The CPython minors the payload must carry compiled modules for: 3.11 (Debian 12, RHEL
    9) and 3.12 (Ubuntu 24.04) always, 3.13 where an interpreter here can build it."""
    return [11, 12] + ([13] if find_cpython(13) else [])


def assert_compiled_paths(version_text: str) -> None:
    """``--version`` says psycopg runs "c" (system libpq) and aiohttp, multidict, yarl C."""
    lines = dict(line.split(": ", 1) for line in version_text.splitlines() if ": " in line)
    assert " c implementation (libpq " in lines["psycopg"], version_text
    assert lines["aiohttp"].endswith(", C HTTP parser"), version_text
    assert lines["multidict"].endswith(", C extension"), version_text
    assert lines["yarl"].endswith(", C extension"), version_text


def read_env_file(path: Path) -> dict[str, str]:
    """VAR=value lines the way systemd's EnvironmentFile= reads ours (comments, quotes)."""
    variables: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        name, _, value = line.partition("=")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        variables[name.strip()] = value
    return variables


def _metrics(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
            body: str = response.read().decode()
            return body
    except (urllib.error.URLError, OSError):
        return None


def serve_and_scrape(
    command: list[str], env: Mapping[str, str], port: int, *, user: str | None = None
) -> str:
    """Start the exporter, scrape it once it answers, stop it with SIGTERM (exit 0 expected)."""
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            command, env=env, user=user, group=user, extra_groups=[] if user else None,
            cwd="/", stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            body = _first_scrape(process, port)
            process.send_signal(signal.SIGTERM)
            code = process.wait(TIMEOUT)
        finally:
            process.kill()
            process.wait()
            log.seek(0)
            output = log.read().decode(errors="replace")
    assert body is not None, f"the exporter never served /metrics:\n{output}"
    assert code == 0, f"exit code {code} after SIGTERM:\n{output}"
    assert "Traceback" not in output, output
    return body


def _first_scrape(process: subprocess.Popen[bytes], port: int) -> str | None:
    deadline = time.monotonic() + 60
    while process.poll() is None and time.monotonic() < deadline:
        body = _metrics(port)
        if body is not None:
            return body
        time.sleep(0.1)  # polling the port with a deadline, not synchronising on time
    return None
