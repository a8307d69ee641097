"""The three exporters under test: how to find, start, wait for and stop each one."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench.cluster import REPO
from bench.measure import Scrape, scrape
from bench.workload import ConfigFiles
from rigs.localpg import free_port

OURS = "ours"
GO_PEER = "go"
QUERY_EXPORTER = "qe"
ALL = (OURS, GO_PEER, QUERY_EXPORTER)
TITLES = {
    OURS: "pg_exporter (ours)",
    GO_PEER: "postgres_exporter (Go)",
    QUERY_EXPORTER: "query-exporter",
}
GO_BINARY = "prometheus-postgres-exporter"
PEER_VENV = REPO / "bench/.venv-peer"
#: Go peer: keep only the custom query; its own built-in collectors are switched off.
GO_QUIET_FLAGS = (
    "--disable-default-metrics",
    "--disable-settings-metrics",
    "--no-collector.database",
    "--no-collector.bgwriter",
    "--log.level=warn",
)


@dataclass(frozen=True, slots=True)
class Launch:
    """Everything needed to start one exporter on one config."""

    key: str
    argv: tuple[str, ...]
    port: int
    env: dict[str, str] = field(default_factory=dict)
    path: str = "/metrics"


class ExporterFailed(RuntimeError):
    """The exporter exited, or never served the expected workload in time."""


def missing(key: str) -> str | None:
    """Why an exporter cannot run here, or None when it can."""
    if key == OURS:
        return None
    if key == GO_PEER:
        return None if shutil.which(GO_BINARY) else f"{GO_BINARY} not installed (setup-peers.sh)"
    if not (PEER_VENV / "bin/query-exporter").exists():
        return f"{PEER_VENV}/bin/query-exporter missing (setup-peers.sh)"
    return None


def launch(key: str, configs: ConfigFiles, url: str, extra: tuple[str, ...] = ()) -> Launch:
    """The command line of an exporter on a fresh local port."""
    port = free_port()
    listen = f"127.0.0.1:{port}"
    argv: tuple[str, ...]
    if key == OURS:
        argv = (ours_python(), "-m", "exporter", "--url", url, "--config", str(configs.ours))
        argv += ("--web.listen-address", listen, "--no-auto-discovery", "--log.level", "warn")
        return Launch(key, argv + extra, port)
    if key == GO_PEER:
        argv = (GO_BINARY, f"--web.listen-address={listen}")
        argv += (f"--extend.query-path={configs.go_peer}", *GO_QUIET_FLAGS)
        return Launch(key, argv + extra, port, env={"DATA_SOURCE_NAME": url})
    argv = (str(PEER_VENV / "bin/query-exporter"), "--config", str(configs.query_exporter))
    argv += ("-H", "127.0.0.1", "-p", str(port), "-L", "warning")
    return Launch(key, argv + extra, port)


def ours_python() -> str:
    """The project venv's interpreter, else the one running the bench."""
    venv = REPO / ".venv/bin/python"
    return str(venv) if venv.exists() else sys.executable


@contextlib.contextmanager
def running(spec: Launch, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run an exporter for the duration of the block; its output goes to ``log``."""
    env = {**os.environ, **spec.env}
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            spec.argv,
            env=env,
            cwd=REPO,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            yield proc
        finally:
            _stop(proc)


def wait_ready(
    spec: Launch, proc: subprocess.Popen[bytes], expected: int, *, gzip_ok: bool, deadline: float
) -> Scrape:
    """Scrape until the workload is served in full; fail fast if the process dies."""
    last = "no answer yet"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ExporterFailed(f"{spec.key} exited with {proc.returncode}")
        try:
            result = scrape(spec.port, spec.path, gzip_ok=gzip_ok, timeout=60)
        except OSError as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
            if result.status == 200 and result.workload_series == expected:
                return result
            last = f"HTTP {result.status}, {result.workload_series}/{expected} workload series"
        time.sleep(0.2)  # polling interval of a condition with a deadline, not a sync point
    raise ExporterFailed(f"{spec.key} not ready before the deadline: {last}")


def version_of(key: str) -> str:
    """A one-line version string, for the record."""
    argv = {
        OURS: [ours_python(), "-m", "exporter", "--version"],
        GO_PEER: [GO_BINARY, "--version"],
        QUERY_EXPORTER: [str(PEER_VENV / "bin/query-exporter"), "--version"],
    }[key]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    text = (out.stdout + out.stderr).strip()
    return text.splitlines()[0] if text else "unknown"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after a grace period; only this process, which we started."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
