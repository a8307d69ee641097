"""The command line for real: --explain, serving as a process, SIGTERM, --fail-fast."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.cli import main
from rigs.localpg import LocalCluster, free_port
from tests.fixtures.helpers import COLLECTORS, REPO, http_get, terminate, value
from tests.fixtures.holdingproxy import holding_proxy
from tests.fixtures.polling import wait_for


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
        wait_for(lambda: http_get(f"http://127.0.0.1:{port}/")[0] == 200, "the exporter to listen")
        status, body = http_get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        assert value(body, "pg_up") == 1
        assert value(body, "pg_exporter_scrape_error_count") == 0
        status, page = http_get(f"http://127.0.0.1:{port}/")
        assert 'href="/metrics"' in page
    finally:
        code = terminate(process)
    assert code == 0
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


_ONE = """
first:
  query: SELECT 1 AS one
  timeout: 5
  metrics:
    - one: {usage: GAUGE, description: one}
"""
_TWO = _ONE.replace("first", "second")
# What systemd does for a socket unit: the socket as fd 3, LISTEN_PID the service's pid.
_AS_SYSTEMD_WOULD = """
import os, sys
os.dup2(int(sys.argv[1]), 3)
os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="1")
os.execv(sys.executable, [sys.executable, "-m", "exporter", *sys.argv[2:]])
"""


def test_socket_activation_sigusr1_reload_and_libpq_variables(
    pg18: LocalCluster, tmp_path: Path
) -> None:
    """Go-compatible start-up: with --web.systemd-socket the exporter serves the socket
    passed by the LISTEN_FDS protocol (fd 3, LISTEN_PID = its own pid); PGSERVICE, which
    would make libpq fail or connect elsewhere, is cleared with a warning; SIGUSR1
    reloads the collector files like SIGHUP."""
    config = tmp_path / "conf"
    config.mkdir()
    (config / "1-first.yml").write_text(_ONE)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    fd = listener.fileno()
    process = subprocess.Popen(
        [sys.executable, "-c", _AS_SYSTEMD_WOULD, str(fd), "-u", pg18.dsn(), "-c", str(config),
         "--web.systemd-socket", "-T", "5000", "--no-auto-discovery"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, pass_fds=(fd,),
        env={**os.environ, "PGSERVICE": "nowhere"},
    )  # fmt: skip
    listener.close()  # the child holds its own copy as fd 3
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        wait_for(lambda: http_get(url)[0] == 200, "the exporter to serve the passed socket")
        body = http_get(url)[1]
        assert value(body, "pg_up") == 1
        assert value(body, "first_one") == 1
        (config / "2-second.yml").write_text(_TWO)
        process.send_signal(signal.SIGUSR1)
        wait_for(lambda: "second_one 1" in http_get(url)[1], "SIGUSR1 to load the second file")
    finally:
        code = terminate(process)
    assert code == 0
    stderr = process.stderr.read().decode() if process.stderr else ""
    assert "cleared $PGSERVICE" in stderr
    assert "listening on a socket from systemd" in stderr


def test_systemd_socket_without_sockets_exits_1(tmp_path: Path) -> None:
    """--web.systemd-socket outside socket activation stops with exit 1 and a reason."""
    result = subprocess.run(
        [sys.executable, "-m", "exporter", "-u", f"postgresql://127.0.0.1:{free_port()}/x",
         "-c", str(COLLECTORS), "--web.systemd-socket"],
        cwd=REPO, capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert "systemd passed no socket" in result.stderr.decode()


def _start_and_exit(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The exporter as a process that must stop at start, within 30 s (else it hangs)."""
    return subprocess.run(
        [sys.executable, "-m", "exporter", "-c", str(COLLECTORS),
         "--web.listen-address", f"127.0.0.1:{free_port()}", *args],
        cwd=REPO, capture_output=True, text=True, timeout=30, check=False,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_a_url_with_an_unencoded_slash_in_its_password_is_refused_at_start(
    tmp_path: Path,
) -> None:
    """libpq reads u:Ab3/Pw@host as host u, port Ab3: refused with the encoding advice,
    the password in no line (it once reached datname, /targets and the start-up log)."""
    url = "postgresql://monitor:Ab3/Zq9Pw@127.0.0.1/postgres"
    done = _start_and_exit(tmp_path, "-u", url)
    assert done.returncode == 1, done.stderr
    assert "libpq reads the target URL with a port that is not a number" in done.stderr
    assert "/ as %2F" in done.stderr
    assert "Zq9" not in done.stderr
    assert "Ab3" not in done.stderr
    targets = tmp_path / "targets.yml"
    targets.write_text(f"targets:\n  - name: a\n    url: {url}\n")
    done = _start_and_exit(tmp_path, "--targets.file", str(targets))
    assert done.returncode == 2, done.stderr
    assert "targets[0](a).url: libpq reads the target URL with a port" in done.stderr
    assert "Zq9" not in done.stderr
    assert "Ab3" not in done.stderr


def test_a_fifo_as_secret_file_stops_the_start_with_a_reason(tmp_path: Path) -> None:
    """$PG_EXPORTER_URL_FILE or a password_file that is a FIFO: the exporter once hung
    silently at start; now it exits with one line naming the file."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = _start_and_exit(tmp_path, env={"PG_EXPORTER_URL_FILE": str(fifo)})
    assert done.returncode == 1
    assert f"$PG_EXPORTER_URL_FILE '{fifo}': it is a FIFO, not a regular file" in done.stderr
    targets = tmp_path / "targets.yml"
    targets.write_text(
        f"targets:\n  - name: a\n    url: postgresql:///x\n    password_file: {fifo}\n"
    )
    done = _start_and_exit(tmp_path, "--targets.file", str(targets))
    assert done.returncode == 2
    assert "targets[0](a).password_file: cannot read" in done.stderr


def test_a_bcrypt_cost_of_31_is_refused_at_start(tmp_path: Path) -> None:
    """A $2b$31$ hash (a day a check) once loaded silently, then locked logins out and
    kept SIGTERM waiting: refused at start, naming the user and the limit."""
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  alice: $2b$31$" + "a" * 53 + "\n")
    done = _start_and_exit(tmp_path, "-u", "postgresql:///x", "--web.config.file", str(web))
    assert done.returncode == 1
    assert "basic_auth_users.alice: the bcrypt cost is 31, above the 14" in done.stderr


@pytest.mark.parametrize("fail_fast", [False, True])
def test_a_preflight_that_never_answers_does_not_hold_the_start(
    pg18: LocalCluster, fail_fast: bool
) -> None:
    """A server that accepts the connection but never answers the first preflight (a
    proxy relays the login and holds every query) does not hold the start: the preflight
    is given up after --connect-timeout plus 5 s (psycopg then spends up to 10 s trying
    to cancel it), the exporter serves and retries on each scrape; with --fail-fast it
    exits 2."""
    port = free_port()
    with holding_proxy(pg18.port) as proxy:
        url = f"postgresql://postgres@127.0.0.1:{proxy}/postgres?sslmode=disable"
        process = subprocess.Popen(
            [sys.executable, "-m", "exporter", "-u", url, "-c", str(COLLECTORS),
             "--web.listen-address", f"127.0.0.1:{port}", "--connect-timeout", "2000",
             *(["--fail-fast"] if fail_fast else [])],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ},
        )  # fmt: skip
        code: int | None = None
        try:
            if fail_fast:
                code = process.wait(timeout=30)
            else:
                wait_for(lambda: http_get(f"http://127.0.0.1:{port}/")[0] == 200,
                         "the exporter to listen", within=30)  # fmt: skip
        finally:
            if not fail_fast:
                code = terminate(process)
    stderr = process.stderr.read().decode() if process.stderr else ""
    assert code == (2 if fail_fast else 0), stderr
    assert "no answer within 7s" in stderr, stderr
