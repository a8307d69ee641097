"""libpq's own files for real (issue 29, finding 3): a FIFO where libpq expects its
passfile, named by ``?passfile=``, by ``$PGPASSFILE`` or found as ``~/.pgpass``, at
start or put in place of a passfile that worked. libpq 18 opens it before it checks
what it is, on the thread that connects, with the GIL held: the exporter once never
listened, or stopped answering ``/up`` and ``/metrics`` and ignored SIGTERM. Now the
exporter serves, says which file is wrong, and stops at once. libpq reads the passfile
again for every cancel request, and its TLS files on a server that speaks TLS: those
are tried here too, on a connection in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from exporter.pg import postgres
from exporter.pg.libpqfiles import LibpqFileRefused
from rigs.localpg import LocalCluster, free_port, pg15_bindir, server_account
from tests.fixtures.helpers import COLLECTORS, REPO, value
from tests.fixtures.polling import wait_for

ROLE = "pw_passfile"
PASSWORD = "Qx7-passfile-secret"
# A SIGTERM is answered within this many seconds: the process is idle but for a probe,
# so it leaves at once; the margin is for a busy shared machine.
PROMPT_EXIT = 10.0


@pytest.fixture
def password_role(pg18: LocalCluster) -> Iterator[str]:
    """A role that must log in over TCP with its password (scram-sha-256); its URL."""
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
        yield f"postgresql://{ROLE}@127.0.0.1:{pg18.port}/postgres"
    finally:
        hba.write_text(original, encoding="utf-8")
        with psycopg.connect(pg18.dsn(), autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                [ROLE],
            )
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(ROLE)))


def _get(port: int, path: str) -> tuple[int, str]:
    """(status, body) within 5 s; (0, "") when nothing answered in time."""
    try:
        url = f"http://127.0.0.1:{port}{path}"
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


@dataclass
class Exporter:
    """``python -m exporter`` as a process, its port and its log file."""

    process: subprocess.Popen[bytes]
    port: int
    log: Path

    def text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> tuple[int | None, float]:
        """SIGTERM: the exit code (None when it had to be killed) and the seconds it took."""
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            code: int | None = self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            code = None
        return code, time.monotonic() - started


@pytest.fixture
def start(tmp_path: Path) -> Iterator[object]:
    """Start an exporter (url, extra environment); every one started is killed at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def launch(url: str, env: dict[str, str] | None = None) -> Exporter:
        port, log = free_port(), tmp_path / f"exporter-{len(started)}.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(
                [sys.executable, "-m", "exporter", "-u", url, "-c", str(COLLECTORS),
                 "--web.listen-address", f"127.0.0.1:{port}", "-T", "3000",
                 "--no-auto-discovery"],
                cwd=REPO, stdout=sink, stderr=sink, env={**os.environ, **(env or {})},
            )  # fmt: skip
        started.append(process)
        return Exporter(process, port, log)

    yield launch
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()


def _how(kind: str, path: Path, home: Path) -> tuple[str, dict[str, str]]:
    """The URL's extra query and the environment that make libpq read ``path``."""
    if kind == "url":
        return f"?passfile={path}", {}
    if kind == "env":
        return "", {"PGPASSFILE": str(path)}
    assert path == home / ".pgpass"
    return "", {"HOME": str(home)}


WHERE = ["url", "env", "home"]
SAID = {"url": "passfile= in the URL", "env": "$PGPASSFILE", "home": "the default ~/.pgpass"}


@pytest.mark.parametrize("kind", WHERE)
def test_a_fifo_passfile_at_start_is_refused_and_the_exporter_serves(
    pg18: LocalCluster, tmp_path: Path, start: object, kind: str
) -> None:
    """A FIFO as the passfile at start: the exporter listens, /metrics says pg_up 0, the
    log names the parameter and the path, and SIGTERM ends it at once with 0."""
    home = tmp_path / "home"
    home.mkdir()
    fifo = home / ".pgpass"
    os.mkfifo(fifo)
    query, env = _how(kind, fifo, home)
    url = pg18.dsn().replace("?sslmode=disable", query)
    assert callable(start)
    exporter: Exporter = start(url, env)
    wait_for(lambda: _get(exporter.port, "/version")[0] == 200, "the exporter to listen")
    status, body = _get(exporter.port, "/metrics")
    assert status == 200
    assert value(body, "pg_up") == 0
    assert _get(exporter.port, "/up")[0] == 503
    log = exporter.text()
    assert f"libpq's passfile '{fifo}' ({SAID[kind]}): it is a FIFO" in log, log
    code, took = exporter.stop()
    assert code == 0, exporter.text()
    assert took < PROMPT_EXIT


@pytest.mark.parametrize("kind", WHERE)
def test_a_passfile_replaced_by_a_fifo_while_serving(
    pg18: LocalCluster, password_role: str, tmp_path: Path, start: object, kind: str
) -> None:
    """The passfile logs in; replaced by a FIFO and the connections cut, the exporter
    reconnects (its passes and its health probe): /up and /metrics keep answering, the
    log names the FIFO, and SIGTERM ends the process at once."""
    home = tmp_path / "home"
    home.mkdir()
    passfile = home / ".pgpass"
    passfile.write_text(f"*:*:*:{ROLE}:{PASSWORD}\n", encoding="utf-8")
    passfile.chmod(0o600)
    query, env = _how(kind, passfile, home)
    assert callable(start)
    exporter: Exporter = start(password_role + query, env)
    wait_for(lambda: _get(exporter.port, "/up")[0] == 200, "the passfile to log in")
    assert value(_get(exporter.port, "/metrics")[1], "pg_up") == 1
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    os.replace(fifo, passfile)
    pg18.psql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{ROLE}'")
    wait_for(lambda: _get(exporter.port, "/up")[0] == 503, "the probe to see it cannot log in")
    status, body = _get(exporter.port, "/metrics")
    assert status == 200
    assert value(body, "pg_up") == 0
    assert _get(exporter.port, "/up")[0] == 503  # still answering
    assert f"libpq's passfile '{passfile}' ({SAID[kind]}): it is a FIFO" in exporter.text()
    code, took = exporter.stop()
    assert code == 0, exporter.text()
    assert took < PROMPT_EXIT
    assert PASSWORD not in exporter.text()


# --- in this process: cancel requests and TLS files ----------------------------------------


@contextlib.asynccontextmanager
async def _loop_gaps() -> AsyncIterator[list[float]]:
    """The longest time the event loop went without turning while in the block."""
    loop, gaps = asyncio.get_running_loop(), [0.0]

    async def tick() -> None:
        while True:
            before = loop.time()
            await asyncio.sleep(0.01)
            gaps[0] = max(gaps[0], loop.time() - before)

    ticker = asyncio.create_task(tick())
    try:
        yield gaps
    finally:
        ticker.cancel()


@contextlib.contextmanager
def _valve(fifo: Path) -> Iterator[None]:
    """A writer that opens ``fifo`` after 4 s: a libpq blocked on it (without the fix)
    is then released, so that the test fails instead of hanging."""
    writer = subprocess.Popen(["sh", "-c", f"sleep 4; exec 3>'{fifo}'"])
    try:
        yield
    finally:
        writer.kill()
        writer.wait()


async def test_a_cancel_request_after_the_passfile_became_a_fifo_does_not_block(
    pg18: LocalCluster, password_role: str, tmp_path: Path
) -> None:
    """libpq reads the passfile again to cancel a query: the passfile replaced by a FIFO
    since the connection was made, the cancel reads the copy handed at connect, and the
    event loop keeps turning."""
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"*:*:*:{ROLE}:{PASSWORD}\n", encoding="utf-8")
    passfile.chmod(0o600)
    conninfo = postgres.conninfo_for(f"{password_role}?passfile={passfile}", None, 5)
    conn = await postgres.connect(conninfo, 5)
    try:
        fifo = tmp_path / "fifo"
        os.mkfifo(fifo)
        os.replace(fifo, passfile)
        with _valve(passfile):
            async with _loop_gaps() as gaps:
                query = asyncio.create_task(conn.execute("SELECT pg_sleep(30)"))
                await _until_running(pg18)
                query.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await query
        assert gaps[0] < 1.0, f"the event loop stood still for {gaps[0]:.1f}s"
    finally:
        await conn.close()


async def _until_running(cluster: LocalCluster) -> None:
    """Until the role's pg_sleep is running in the server (deadline 20 s)."""
    sql_text = "SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND query LIKE %s"
    async with asyncio.timeout(20):
        while True:
            async with await psycopg.AsyncConnection.connect(cluster.dsn()) as watcher:
                row = await (await watcher.execute(sql_text, [ROLE, "%pg_sleep%"])).fetchone()
            if row is not None and row[0] > 0:
                return


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Path]]:
    """Debian's PostgreSQL 15 (the embedded 18 is built without TLS) speaking TLS with a
    self-signed certificate; the certificate, for clients to verify the server with."""
    home = tmp_path_factory.mktemp("tls")
    with LocalCluster(pg15_bindir()) as cluster:
        cert, key = cluster.data_dir / "server.crt", cluster.data_dir / "server.key"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)],
            check=True, capture_output=True,
        )  # fmt: skip
        key.chmod(0o600)
        if (account := server_account()) is not None:
            entry = pwd.getpwnam(account)
            for path in (cert, key):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        cluster.psql("ALTER SYSTEM SET ssl = on")
        cluster.psql("SELECT pg_reload_conf()")
        root = home / "root.crt"
        shutil.copy(cert, root)
        yield cluster, root


def _tls_url(cluster: LocalCluster, **params: str) -> str:
    query = "&".join(f"{key}={value}" for key, value in params.items())
    return f"postgresql://postgres@127.0.0.1:{cluster.port}/postgres?{query}"


async def test_tls_files_handed_over_still_verify_the_server(
    tls_cluster: tuple[LocalCluster, Path],
) -> None:
    """The root certificate reaches OpenSSL as a copy, and verify-ca still verifies."""
    cluster, root = tls_cluster
    url = _tls_url(cluster, sslmode="verify-ca", sslrootcert=str(root))
    wait_for(lambda: _speaks_tls(url), "the server to speak TLS")
    conn = await postgres.connect(postgres.conninfo_for(url, None, 5), 5)
    try:
        assert conn.pgconn.ssl_in_use
    finally:
        await conn.close()


def _speaks_tls(url: str) -> bool:
    try:
        with psycopg.connect(url) as conn:
            return bool(conn.pgconn.ssl_in_use)
    except psycopg.OperationalError:
        return False


@pytest.mark.parametrize("keyword", ["sslrootcert", "sslcert", "home"])
async def test_a_fifo_as_a_tls_file_is_refused_without_blocking(
    tls_cluster: tuple[LocalCluster, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    keyword: str,
) -> None:
    """A FIFO as the root certificate, the client certificate or the default client
    certificate under the home: libpq would open it during the TLS handshake; the
    connection is refused, naming it, and the loop keeps turning."""
    cluster, root = tls_cluster
    fifo = tmp_path / ".postgresql" / "postgresql.crt"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    params = {"sslmode": "verify-ca", "sslrootcert": str(root)}
    if keyword == "home":
        monkeypatch.setenv("HOME", str(tmp_path))
        said = "libpq's sslcert"
    else:
        params[keyword] = str(fifo)
        said = f"libpq's {keyword}"
    conninfo = postgres.conninfo_for(_tls_url(cluster, **params), None, 5)
    with _valve(fifo):
        async with _loop_gaps() as gaps:
            with pytest.raises(LibpqFileRefused, match=f"{said} '{fifo}' .*: it is a FIFO"):
                await postgres.connect(conninfo, 5)
    assert gaps[0] < 1.0, f"the event loop stood still for {gaps[0]:.1f}s"
