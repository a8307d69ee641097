"""Real processes for integration tests: the exporter (``python -m exporter``, for one
target or a fleet), a Debian Prometheus, and a Debian HAProxy routing by the exporters'
health paths."""

from __future__ import annotations

import contextlib
import csv
import io
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rigs.localpg import free_port
from tests.integration.helpers import COLLECTORS, REPO, http_get, terminate, wait_for


@contextlib.contextmanager
def exporter(dsn: str, log: Path, *extra: str, connect_timeout_ms: int = 5000) -> Iterator[int]:
    """``python -m exporter`` with the default library against ``dsn``; its port."""
    with _exporter(log, "-u", dsn, "-c", str(COLLECTORS), "-T", str(connect_timeout_ms),
                   *extra) as port:  # fmt: skip
        yield port


@contextlib.contextmanager
def fleet_exporter(
    targets: Path, collectors: Path, log: Path, *extra: str, connect_timeout_ms: int = 5000
) -> Iterator[int]:
    """``python -m exporter`` in fleet mode: the targets file ``targets``, collectors from
    ``collectors`` (a file or a directory); its port once it serves."""
    with _exporter(log, "--targets.file", str(targets), "-c", str(collectors),
                   "-T", str(connect_timeout_ms), *extra) as port:  # fmt: skip
        yield port


@contextlib.contextmanager
def _exporter(log: Path, *args: str) -> Iterator[int]:
    port = free_port()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "exporter", *args,
             "--web.listen-address", f"127.0.0.1:{port}"],
            cwd=REPO, stdout=sink, stderr=sink, env={**os.environ},
        )  # fmt: skip
    try:
        wait_for(lambda: http_get(f"http://127.0.0.1:{port}/version")[0] == 200, "the exporter")
        yield port
    finally:
        terminate(process)


@dataclass(frozen=True)
class Backend:
    """One database server behind HAProxy, checked through its exporter's port."""

    name: str
    pg_port: int
    exporter_port: int


# Writes go where OPTIONS /primary (HAProxy's default check method) says 200; reads where
# GET /replica says 200, as in docs/health-checks.md.
_HAPROXY_CONFIG = """
global
  maxconn 100
defaults
  mode tcp
  timeout connect 2s
  timeout client 10s
  timeout server 10s
  default-server inter {inter} fall {fall} rise 1
listen writes
  bind 127.0.0.1:{writes}
  option httpchk OPTIONS /primary
  http-check expect status 200
{servers}
listen reads
  bind 127.0.0.1:{reads}
  option httpchk
  http-check send meth GET uri /replica
  http-check expect status 200
{servers}
listen stats
  mode http
  bind 127.0.0.1:{stats}
  stats enable
  stats uri /stats
"""


@contextlib.contextmanager
def haproxy(
    home: Path, backends: Sequence[Backend], *, inter: str = "200ms", fall: int = 2
) -> Iterator[str]:
    """Debian's haproxy in the foreground routing to ``backends``; yields its stats CSV URL."""
    binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
    assert Path(binary).exists(), "haproxy is missing: scripts/setup installs it"
    servers = "\n".join(
        f"  server {b.name} 127.0.0.1:{b.pg_port} check port {b.exporter_port}" for b in backends
    )
    config = home / "haproxy.cfg"
    ports = {"writes": free_port(), "reads": free_port(), "stats": free_port()}
    config.write_text(_HAPROXY_CONFIG.format(inter=inter, fall=fall, servers=servers, **ports))
    check = subprocess.run([binary, "-c", "-f", str(config)], capture_output=True, check=False)
    assert check.returncode == 0, check.stderr.decode()
    with (home / "haproxy.log").open("wb") as sink:
        process = subprocess.Popen([binary, "-db", "-f", str(config)], stdout=sink, stderr=sink)
    url = f"http://127.0.0.1:{ports['stats']}/stats;csv"
    try:
        wait_for(lambda: http_get(url)[0] == 200, "haproxy's stats page")
        yield url
    finally:
        terminate(process)


def haproxy_states(text: str) -> dict[tuple[str, str], str]:
    """(proxy, server) → UP / DOWN from HAProxy's stats CSV (no transitional states)."""
    rows = csv.DictReader(io.StringIO(text.removeprefix("# ")))
    return {
        (r["pxname"], r["svname"]): r["status"].split()[0]
        for r in rows
        if r["pxname"] in ("writes", "reads") and r["svname"] not in ("FRONTEND", "BACKEND")
    }


def settles(stats_url: str, want: dict[tuple[str, str], str]) -> bool:
    """True when HAProxy's checks currently decide exactly ``want``."""
    return haproxy_states(http_get(stats_url)[1]) == want


@contextlib.contextmanager
def prometheus(home: Path, config: str, *flags: str) -> Iterator[str]:
    """Debian's prometheus with ``config`` (YAML text); yields its base URL once ready."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is missing: scripts/setup installs it"
    (home / "prometheus.yml").write_text(config)
    port = free_port()
    with (home / "prometheus.log").open("wb") as sink:
        process = subprocess.Popen(
            [binary, f"--config.file={home / 'prometheus.yml'}",
             f"--storage.tsdb.path={home / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
             *flags],
            stdout=sink, stderr=sink,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: http_get(f"{base}/-/ready")[0] == 200, "prometheus to be ready")
        yield base
    finally:
        terminate(process)
