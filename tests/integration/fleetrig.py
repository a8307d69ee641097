"""Rigs for fleet-mode tests: targets files, a fleet served in-process or as a process,
TCP listeners that record or swallow connections, and a server frozen with SIGSTOP."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from exporter.declared import load_targets
from exporter.definitions import Definitions
from exporter.fleet import Fleet, Member
from exporter.settings import Settings
from exporter.web.app import create_fleet_app, make_runner
from exporter.web.fleet import FLEET
from rigs.localpg import LocalCluster, free_port
from tests.integration.helpers import REPO, http_get, terminate, wait_for
from tests.integration.rawhttp import Served


def write_targets(path: Path, targets: Sequence[Mapping[str, Any]], **top: Any) -> Path:
    """Write a targets file declaring ``targets`` (plus top-level keys such as defaults)."""
    path.write_text(yaml.safe_dump({**top, "targets": [dict(t) for t in targets]}))
    return path


@asynccontextmanager
async def serving_fleet(
    settings: Settings, definitions: Definitions, targets_file: Path
) -> AsyncIterator[Served]:
    """The fleet application of ``targets_file`` with the production runner on a random
    port, as ``python -m exporter --targets.file`` serves it."""
    settings = replace(settings, targets_file=str(targets_file))
    declared = load_targets(str(targets_file), settings)
    app = create_fleet_app(settings, definitions, declared)
    runner = make_runner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield Served(app, runner.addresses[0][1])
    finally:
        await runner.cleanup()


def fleet_of(served: Served) -> Fleet:
    """The fleet an in-process server serves."""
    return served.app[FLEET]


def member(served: Served, name: str) -> Member:
    """The member declared as ``name`` (fails when there is none)."""
    found = fleet_of(served).member(name)
    assert found is not None, f"no member {name!r}"
    return found


@contextlib.contextmanager
def fleet_process(
    targets_file: Path,
    config: Path,
    log: Path,
    *extra: str,
    env: Mapping[str, str] | None = None,
) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """``python -m exporter --targets.file`` on a random port: (port, process) once it
    answers /version; terminated on exit."""
    port = free_port()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "exporter", "--targets.file", str(targets_file),
             "-c", str(config), "--web.listen-address", f"127.0.0.1:{port}", "-T", "5000",
             *extra],
            cwd=REPO, stdout=sink, stderr=sink, env={**os.environ, **(env or {})},
        )  # fmt: skip
    try:
        wait_for(
            lambda: (
                process.poll() is not None or http_get(f"http://127.0.0.1:{port}/version")[0] == 200
            ),
            "the fleet exporter",
        )
        assert process.poll() is None, log.read_text()
        yield port, process
    finally:
        terminate(process)


class Listener:
    """A plain TCP listener on 127.0.0.1 that records every connection it accepts and
    never answers (a server that hangs after accepting, or a trap nobody may reach)."""

    def __init__(self, port: int = 0) -> None:
        self._socket = socket.create_server(("127.0.0.1", port))
        self._socket.settimeout(0.1)
        self.port: int = self._socket.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="listener", daemon=True)

    def dsn(self) -> str:
        """A PostgreSQL URL pointing at the listener."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres?sslmode=disable"

    @property
    def connections(self) -> int:
        """How many connections were accepted so far."""
        return len(self.accepted)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._socket.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted.append(conn)  # held open, never read nor answered

    def __enter__(self) -> Listener:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._socket.close()
        for conn in self.accepted:
            conn.close()


def server_pids(cluster: LocalCluster) -> list[int]:
    """The postmaster of ``cluster`` and every process it started (its backends)."""
    postmaster = int((cluster.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
    children = Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split()
    return [postmaster, *(int(pid) for pid in children)]


@contextlib.contextmanager
def frozen(cluster: LocalCluster) -> Iterator[None]:
    """SIGSTOP the server and its backends: it accepts TCP connections (the kernel does)
    and answers nothing; SIGCONT on exit, whatever happened."""
    pids = server_pids(cluster)
    stopped: list[int] = []
    try:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
        yield
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def fetch(
    url: str, method: str = "GET", headers: Mapping[str, str] | None = None
) -> tuple[int, str]:
    """(status, body) of one request with headers, error statuses included."""
    request = urllib.request.Request(url, method=method, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
