"""The command line for real: --explain, serving as a process, SIGTERM, --fail-fast."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from exporter.cli import main
from exporter.localpg import LocalCluster, free_port
from tests.integration.helpers import COLLECTORS, REPO, value, wait_for


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def test_explain_prints_plan_with_reasons(
    pg15: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """--explain connects, prints planned collectors with SQL and why others were skipped."""
    assert main(["--explain", "-u", pg15.dsn(), "-c", str(COLLECTORS), "-T", "5000"]) == 0
    out = capsys.readouterr().out
    assert "pg_primary" in out  # planned on a primary
    assert "SELECT" in out
    assert "pg_replica" in out  # not planned, with a reason
    assert "recovery" in out.lower()


def test_explain_unreachable_target_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    """--explain against nothing exits 1 with the masked URL, never the password."""
    url = f"postgresql://u:hunter2@127.0.0.1:{free_port()}/postgres"
    assert main(["--explain", "-u", url, "-c", str(COLLECTORS)]) == 1
    err = capsys.readouterr().err
    assert "hunter2" not in err
    assert "xxxxx" in err


def test_process_serves_and_stops_on_sigterm(pg18: LocalCluster) -> None:
    """``python -m exporter`` serves the default library and exits 0 on SIGTERM."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "exporter", "-u", pg18.dsn(), "-c", str(COLLECTORS),
         "--web.listen-address", f"127.0.0.1:{port}", "-T", "5000", "--log.format", "json"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ},
    )  # fmt: skip
    try:
        wait_for(lambda: _get(f"http://127.0.0.1:{port}/")[0] == 200, "the exporter to listen")
        status, body = _get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        assert value(body, "pg_up") == 1
        assert value(body, "pg_exporter_scrape_error_count") == 0
        status, page = _get(f"http://127.0.0.1:{port}/")
        assert 'href="/metrics"' in page
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    stderr = process.stderr.read().decode() if process.stderr else ""
    assert '"msg": "listening"' in stderr or '"msg":"listening"' in stderr


def test_fail_fast_exits_2_when_target_unreachable() -> None:
    """--fail-fast with an unreachable target exits 2 at start."""
    result = subprocess.run(
        [sys.executable, "-m", "exporter", "-u", f"postgresql://127.0.0.1:{free_port()}/x",
         "-c", str(COLLECTORS), "--web.listen-address", f"127.0.0.1:{free_port()}", "-f"],
        cwd=REPO, capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr.decode()
