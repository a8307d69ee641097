"""A throw-away pgBouncer (Debian's package) in front of a :class:`LocalCluster`."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from exporter.localpg import LocalCluster, LocalPgError, free_port

SERVER_ACCOUNT = "pgtest"  # pgBouncer refuses to run as root, like PostgreSQL
START_TIMEOUT = 30.0


class LocalPgBouncer:
    """pgBouncer on a random loopback port, admin console for user ``postgres``."""

    def __init__(self, cluster: LocalCluster, databases: tuple[str, ...] = ("postgres",)) -> None:
        self.cluster = cluster
        self.databases = databases
        self.port = 0
        self.base_dir = Path()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        """pgBouncer's own log file."""
        return self.base_dir / "pgbouncer.log"

    def dsn(self, dbname: str = "pgbouncer") -> str:
        """A URL for the admin console (``pgbouncer``) or a pooled database."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}?sslmode=disable"

    def start(self) -> None:
        """Write a config, start pgBouncer and wait until it accepts connections."""
        binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        if not Path(binary).is_file():
            raise LocalPgError("pgbouncer is not installed: run scripts/setup")
        self.base_dir = Path(tempfile.mkdtemp(prefix="localbouncer-"))
        self.port = free_port()
        (self.base_dir / "pgbouncer.ini").write_text(self._config())
        command = [binary, str(self.base_dir / "pgbouncer.ini")]
        if os.geteuid() == 0:
            shutil.chown(self.base_dir, SERVER_ACCOUNT)
            command[1:1] = ["-u", SERVER_ACCOUNT]
        self._process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait_listening()

    def _config(self) -> str:
        pools = "".join(
            f"{db} = host=127.0.0.1 port={self.cluster.port} dbname={db} pool_size=2\n"
            for db in self.databases
        )
        return (
            f"[databases]\n{pools}[pgbouncer]\nlisten_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\nunix_socket_dir =\nauth_type = any\n"
            "admin_users = postgres\nstats_users = postgres\npool_mode = transaction\n"
            f"logfile = {self.log_path}\n"
        )

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert self._process is not None
            if self._process.poll() is not None:
                stderr = self._process.stderr.read().decode() if self._process.stderr else ""
                raise LocalPgError(f"pgbouncer exited at start: {stderr.strip()}")
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            if time.monotonic() > deadline:
                raise LocalPgError("pgbouncer did not start listening")
            time.sleep(0.05)  # polling interval of a start-up wait with a deadline

    def stop(self) -> None:
        """Stop pgBouncer and remove its directory."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> LocalPgBouncer:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
