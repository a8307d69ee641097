"""The target URL for real: a password libpq accepts reaches PostgreSQL 18 unchanged and
never shows; a URL libpq rejects stops the process at once, quoting no secret (D14)."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from rigs.localpg import LocalCluster, free_port
from tests.fixtures.helpers import COLLECTORS, REPO, terminate, value
from tests.fixtures.polling import wait_for

ROLE = "pw_probe"
# ? and # once cut the URL short; the rest is what a password may hold besides.
PASSWORD = "Zq9 s3?cr#t:@/%'\\é"
# Only what libpq's URL syntax needs encoded: space, %, @ and /; ? # : ' \ é stay raw.
WRITTEN = "Zq9%20s3?cr#t:%40%2F%25'\\é"
FRAGMENTS = ("Zq9", "s3?cr", "cr#t", WRITTEN)


@pytest.fixture
def password_role(pg18: LocalCluster) -> Iterator[str]:
    """A pg_monitor role that must log in over TCP with its password (scram-sha-256)."""
    hba = pg18.data_dir / "pg_hba.conf"
    original = hba.read_text(encoding="utf-8")
    with psycopg.connect(pg18.dsn(), autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE pg_monitor").format(
                sql.Identifier(ROLE), sql.Literal(PASSWORD)
            )
        )
        hba.write_text(f"host all {ROLE} 127.0.0.1/32 scram-sha-256\n{original}", "utf-8")
        conn.execute("SELECT pg_reload_conf()")
    try:
        yield f"postgresql://{ROLE}:{WRITTEN}@127.0.0.1:{pg18.port}/postgres"
    finally:
        hba.write_text(original, encoding="utf-8")
        with psycopg.connect(pg18.dsn(), autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(ROLE)))


def _metrics(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            return str(response.read().decode())
    except OSError:
        return ""


def _sessions(cluster: LocalCluster) -> set[tuple[str, str]]:
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT datname, application_name FROM pg_stat_activity WHERE usename = %s", [ROLE]
        ).fetchall()
    return {(str(db), str(app)) for db, app in rows}


def _serve_and_scrape(
    url: str, cluster: LocalCluster, stderr: Path
) -> tuple[float, set[tuple[str, str]]]:
    """pg_up of a scrape by ``python -m exporter -u url`` and the role's sessions meanwhile."""
    port = free_port()
    with stderr.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "exporter", "-u", url, "-c", str(COLLECTORS),
             "--web.listen-address", f"127.0.0.1:{port}", "-T", "5000", "--no-auto-discovery",
             "--log.level", "debug"],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=sink, env={**os.environ},
        )  # fmt: skip
    try:
        wait_for(lambda: "pg_up " in _metrics(port), "the exporter to serve")
        up, sessions = value(_metrics(port), "pg_up"), _sessions(cluster)
    finally:
        code = terminate(process)
    assert code == 0
    return up, sessions


def test_password_with_url_delimiters_logs_in_and_never_shows(
    pg18: LocalCluster, password_role: str, tmp_path: Path
) -> None:
    """A password holding ? # : @ / % ' \\ and a space logs in by scram and is never logged."""
    wrong = password_role.replace(WRITTEN, "wrong")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(wrong).close()  # the role really needs its password
    stderr = tmp_path / "stderr"
    up, sessions = _serve_and_scrape(password_role, pg18, stderr)
    assert up == 1
    assert ("postgres", "pg_exporter") in sessions
    log = stderr.read_text(encoding="utf-8")
    assert f"postgresql://{ROLE}:xxxxx@127.0.0.1:{pg18.port}/postgres?sslmode=disable" in log
    for fragment in FRAGMENTS:
        assert fragment not in log


def test_passfile_keeps_the_password_out_of_the_url(
    pg18: LocalCluster, password_role: str, tmp_path: Path
) -> None:
    """The documented way: a passfile (mode 0600) named in the URL logs in as well."""
    passfile = tmp_path / "pgpass"
    escaped = PASSWORD.replace("\\", "\\\\").replace(":", "\\:")
    passfile.write_text(f"127.0.0.1:{pg18.port}:*:{ROLE}:{escaped}\n", encoding="utf-8")
    passfile.chmod(0o600)  # libpq ignores a passfile others may read
    url = f"postgresql://{ROLE}@127.0.0.1:{pg18.port}/postgres?passfile={passfile}"
    stderr = tmp_path / "stderr"
    assert _serve_and_scrape(url, pg18, stderr)[0] == 1
    assert "Zq9" not in stderr.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["-u", "postgresql://u:Zq9?#50%off@127.0.0.1/db"], {}),
        ([], {"PG_EXPORTER_URL": "host=127.0.0.1 password=Zq9first Zq9second dbname=db"}),
    ],
)
def test_unreadable_url_exits_1_without_traceback_or_password(
    argv: list[str], env: dict[str, str]
) -> None:
    """A URL libpq rejects: one 'pg_exporter: ...' line, exit 1, no traceback, no secret."""
    result = subprocess.run(
        [sys.executable, "-m", "exporter", *argv, "-c", str(COLLECTORS),
         "--web.listen-address", f"127.0.0.1:{free_port()}"],
        cwd=REPO, capture_output=True, timeout=60, check=False, env={**os.environ, **env},
    )  # fmt: skip
    stderr = result.stderr.decode()
    assert result.returncode == 1, stderr
    (line,) = stderr.splitlines()
    assert line.startswith("pg_exporter: ")
    assert "libpq cannot read the target URL" in line
    assert "Traceback" not in stderr
    assert "Zq9" not in stderr
