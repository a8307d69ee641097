"""Shared helpers for integration tests: settings for a cluster, collector files, parsing."""

from __future__ import annotations

import math
import re
import signal
import subprocess
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from exporter.definitions import Definitions
from exporter.loading import load_definitions
from exporter.probe import PROBE_SQL
from exporter.settings import Settings
from rigs.localpg import LocalCluster

REPO = Path(__file__).resolve().parents[2]
COLLECTORS = REPO / "collectors"


def http_get(url: str, method: str = "GET") -> tuple[int, str]:
    """(status, body) of one request, error statuses included; (0, "") when nothing answers."""
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def terminate(process: subprocess.Popen[bytes], within: float = 30.0) -> int | None:
    """SIGTERM and wait: the exit code, or None when it had to be killed after ``within`` s."""
    if process.poll() is not None:
        return process.returncode
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=within)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return None


def settings_for(cluster: LocalCluster, **overrides: object) -> Settings:
    """Settings pointing at ``cluster`` with a generous connect timeout for busy machines."""
    base = Settings(url=cluster.dsn(), connect_timeout=5.0)
    return replace(base, **overrides)  # type: ignore[arg-type]


def write_collectors(directory: Path, text: str, name: str = "collectors.yml") -> Definitions:
    """Write one collector file and load it."""
    path = directory / name
    path.write_text(textwrap.dedent(text))
    return load_definitions(str(path))


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def samples(body: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a text exposition keyed by (name, sorted labels), names as written.

    Read literally rather than with client_python's parser, which renames counter
    samples to ``_total`` and would hide the names we promise to keep.
    """
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for line in body.splitlines():
        match = _SAMPLE.match(line)
        if line.startswith("#") or match is None:
            continue
        name, raw_labels, raw_value = match.groups()
        labels = [
            (k, re.sub(r"\\[\\\"n]", lambda m: _UNESCAPE[m.group(0)], v))
            for k, v in _LABEL.findall(raw_labels or "")
        ]
        out[(name, tuple(sorted(labels)))] = float(raw_value)
    return out


def value(body: str, name: str, **labels: str) -> float:
    """The one sample of ``name`` whose labels include ``labels`` (NaN when absent)."""
    found = [
        v
        for (n, lbls), v in samples(body).items()
        if n == name and all(dict(lbls).get(k) == want for k, want in labels.items())
    ]
    assert len(found) <= 1, f"{name}{labels} matched {len(found)} samples"
    return found[0] if found else math.nan


def wait_for(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Poll ``check`` until it holds, failing with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


_PREPARED = re.compile(r"statement: PREPARE (pgx_\w+) AS ")
_EXECUTED = re.compile(r": EXECUTE (pgx_\w+)$")


def statement_calls(cluster: LocalCluster, marker: str) -> int:
    """How often the exporter ran a statement containing ``marker``, from the statement log.

    The log (``log_statement = all`` in the fixtures) is exact; pg_stat_statements is
    not, since it merges statements that differ only in column aliases. A prepared
    query (issue 22) counts at each ``EXECUTE`` of its name, not at its ``PREPARE``.
    """
    lines = [
        line
        for line in cluster.log_text().splitlines()
        if "app=pg_exporter" in line  # not the tests' own probes that mention the marker
        and ("statement: " in line or "execute " in line)
    ]
    names = prepared_names(cluster, marker)
    return sum(
        1
        for line in lines
        if (marker in line and _PREPARED.search(line) is None)
        or ((m := _EXECUTED.search(line)) is not None and m.group(1) in names)
    )


def exporter_backends(cluster: LocalCluster, where: str = "true", *, probe: bool = False) -> int:
    """The exporter's backends matching ``where``; the health probe's only if ``probe``.

    The probe keeps a connection of its own (D5 allows one beyond the databases); its
    last query is always PROBE_SQL, which tells it apart from the pass's connections.
    """
    quoted = PROBE_SQL.replace("'", "''")
    not_probe = "true" if probe else f"query <> '{quoted}'"
    out = cluster.psql(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg_exporter' "
        f"AND ({where}) AND {not_probe} AND pid <> pg_backend_pid()"
    )
    return int(out.strip())


def exporter_running(cluster: LocalCluster, marker: str) -> bool:
    """True while a backend of the exporter is executing the marked query, as text or as
    the ``EXECUTE`` of a statement prepared from it (issue 22)."""
    names = prepared_names(cluster, marker)
    executing = "".join(f" OR query = 'EXECUTE {name}'" for name in sorted(names))
    out = cluster.psql(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg_exporter' "
        f"AND state = 'active' AND (query LIKE '%{marker}%'{executing})"
        " AND pid <> pg_backend_pid()"
    )
    return out.strip() != "0"


def prepared_names(cluster: LocalCluster, marker: str) -> set[str]:
    """Names of the statements the exporter prepared from queries holding ``marker``."""
    return {
        m.group(1)
        for line in cluster.log_text().splitlines()
        if marker in line and "app=pg_exporter" in line
        and (m := _PREPARED.search(line)) is not None
    }  # fmt: skip
