"""Record what the Go pg_exporter does with each collector file of this directory.

Not a test: it needs a Go pg_exporter binary built outside the repository (the path
in ``GO_PG_EXPORTER``) and writes ``go-facts.json`` beside it, which the tests read.
For each case (a ``*.yml`` file here, a directory under ``dirs/``, and the special
files of :data:`SPECIALS`, made in a temporary directory) it runs::

    pg_exporter --dry-run -c CASE
    pg_exporter --url URL -c CASE --web.listen-address 127.0.0.1:PORT

against a throw-away PostgreSQL 18 and keeps the exit code of the first, the branches
it printed, and whether the second served: its exit code if it stopped, else the
samples of ``t_*`` metrics of its second scrape (the first one plans). Run it from
the repository root: ``GO_PG_EXPORTER=/path/pg_exporter python -m
tests.data.gocompat.configs.record``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from rigs.localpg import LocalCluster, pg18_bindir

HERE = Path(__file__).parent
FACTS = HERE / "go-facts.json"
TIMEOUT = 15.0  # seconds a run may take before it is recorded as blocked
# Bytes of address space for a case that reads /dev/zero, so that it ends there rather
# than in the OOM killer (the Go runtime needs about 1 GiB to start at all).
MEMORY = 3 << 30
_MSG = re.compile(r'level=(?:ERROR|WARN) msg="((?:[^"\\]|\\.)*)"')
_SAMPLE = re.compile(r"^(t_[a-zA-Z0-9_:]*(?:\{.*\})?) \S+$")


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _link(target: str) -> Callable[[Path], None]:
    return lambda path: path.symlink_to(target)


def _loop(path: Path) -> None:
    other = path.with_name("loop-b.yml")
    path.symlink_to(other.name)
    other.symlink_to(path.name)


def _directory(path: Path) -> None:
    path.mkdir()


#: Entries no repository holds: made at run time, alone (``single``) or in a directory
#: beside one good file (``in-dir``).
SPECIALS: dict[str, Callable[[Path], None]] = {
    "fifo": _fifo,
    "dev-zero-link": _link("/dev/zero"),
    "dangling-link": _link("no-such-file.yml"),
    "link-loop": _loop,
    "directory-named-yml": _directory,
}
GOOD = "t_good:\n  query: SELECT 1 AS v\n  metrics:\n    - v: {usage: GAUGE}\n"


def _limit_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def _limits(path: str) -> Callable[[], None] | None:
    """The memory limit for a case holding a link to /dev/zero, else none."""
    return _limit_memory if "dev-zero" in path else None


def _crashed(stderr: str) -> bool:
    """The Go runtime gave up (out of memory), rather than the exporter exiting."""
    return "fatal error:" in stderr or "goroutine 1 [" in stderr


def _messages(stderr: str) -> list[str]:
    """The exporter's warnings and errors, paths written relative to this directory."""
    found = [json.loads(f'"{m}"') for m in _MSG.findall(stderr)]
    return [re.sub(r"/tmp/[^/ ]+/", "SCRATCH/", m.replace(f"{HERE}/", "")) for m in found]


def dry_run(binary: str, path: str) -> dict[str, Any]:
    """Exit code and printed branches of ``--dry-run``, or that it did not end."""
    try:
        done = subprocess.run(
            [binary, "--dry-run", "-c", path],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            preexec_fn=_limits(path),
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"exit": "blocked"}
    if _crashed(done.stderr):
        return {"exit": "crashed"}
    fact: dict[str, Any] = {"exit": done.returncode, "messages": _messages(done.stderr)}
    if done.returncode == 0:
        fact["branches"] = _branches(done.stdout)
    return fact


def _branches(stdout: str) -> dict[str, dict[str, Any]]:
    """The branches ``--dry-run`` printed, by key: prefix, version range, priority, metrics."""
    text = "\n".join(line for line in stdout.splitlines() if not line.startswith("#"))
    data = yaml.safe_load(text) or {}
    branches = {}
    for key, body in data.items():
        metrics = []
        for entry in body.get("metrics", []):
            ((column, spec),) = entry.items()
            if spec.get("usage") in ("GAUGE", "COUNTER", "HISTOGRAM"):
                metrics.append(f"{body['name']}_{spec.get('rename') or spec.get('name') or column}")
        branches[str(key)] = {
            "name": body["name"],
            "min_version": body.get("min_version", 0),
            "max_version": body.get("max_version", 0),
            "priority": body.get("priority", 0),
            "skip": body.get("skip", False),
            "fatal": body.get("fatal", False),
            "metrics": sorted(metrics),
        }
    return branches


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> str | None:
    with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())
    return None


def start(binary: str, path: str, url: str) -> dict[str, Any]:
    """Whether a start serves, and the ``t_*`` samples of its second scrape."""
    port = _free_port()
    command = [binary, "--url", url, "-c", path, f"--web.listen-address=127.0.0.1:{port}"]
    with tempfile.TemporaryFile("w+") as errors:
        limits = _limits(path)
        process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=errors,
            preexec_fn=limits,  # noqa: PLW1509  # this script starts no thread
        )
        try:
            fact = _watch(process, f"http://127.0.0.1:{port}/metrics")
        finally:
            process.kill()
            process.wait()
        errors.seek(0)
        stderr = errors.read()
    if _crashed(stderr):
        return {"serves": False, "exit": "crashed"}
    fact["messages"] = _messages(stderr)
    return fact


def _watch(process: subprocess.Popen[bytes], url: str) -> dict[str, Any]:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return {"serves": False, "exit": process.returncode}
        if _get(url) is not None:
            body = _get(url) or ""
            samples = sorted(m.group(1) for line in body.splitlines() if (m := _SAMPLE.match(line)))
            return {"serves": True, "samples": samples}
        time.sleep(0.2)  # polling a process we do not control; not a test
    return {"serves": False, "exit": "blocked"}


def cases() -> Iterator[tuple[str, str]]:
    """Every committed case: its name and path."""
    for path in sorted(HERE.glob("*.yml")):
        yield path.name, str(path)
    for path in sorted((HERE / "dirs").iterdir()):
        yield f"dirs/{path.name}", str(path)


def specials(root: Path) -> Iterator[tuple[str, str]]:
    """The special entries, alone and in a directory beside a good file."""
    for name, make in SPECIALS.items():
        alone = root / "single" / name / "config.yml"
        alone.parent.mkdir(parents=True)
        make(alone)
        yield f"special/single/{name}", str(alone)
        directory = root / "in-dir" / name
        directory.mkdir(parents=True)
        (directory / "good.yml").write_text(GOOD)
        make(directory / "entry.yml")
        yield f"special/in-dir/{name}", str(directory)


def main() -> int:
    binary = os.environ["GO_PG_EXPORTER"]
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)
    facts: dict[str, Any] = {}
    with LocalCluster(pg18_bindir()) as cluster, tempfile.TemporaryDirectory() as scratch:
        server = cluster.psql("SHOW server_version").strip()
        url = cluster.dsn()
        for name, path in [*cases(), *specials(Path(scratch))]:
            print(name, file=sys.stderr)
            facts[name] = {"dry_run": dry_run(binary, path), "start": start(binary, path, url)}
    produced_by = {
        "binary": (version.stdout or version.stderr).strip(),
        "server": f"PostgreSQL {server} (rigs.localpg, user postgres)",
        "dry_run": "pg_exporter --dry-run -c CASE",
        "start": "pg_exporter --url URL -c CASE --web.listen-address=127.0.0.1:PORT; "
        "GET /metrics twice, the t_* samples of the second",
        "limits": f"{TIMEOUT:.0f} s per run (else 'blocked'), {MEMORY >> 20} MiB of address space",
        "recorded": time.strftime("%Y-%m-%d"),
    }
    document = {"produced_by": produced_by, "cases": facts}
    FACTS.write_text(json.dumps(document, indent=1, ensure_ascii=False, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
