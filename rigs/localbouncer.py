"""A throw-away pgBouncer (Debian's package) in front of a :class:`LocalCluster`."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

# pgBouncer refuses to run as root, like PostgreSQL: the same account runs both.
from rigs.localpg import SERVER_ACCOUNT, LocalCluster, LocalPgError, free_port, wait_until

START_TIMEOUT = 30.0


class LocalPgBouncer:
    """pgBouncer on a random loopback port, admin console for user ``postgres``."""

    def __init__(self, cluster: LocalCluster, databases: tuple[str, ...] = ("postgres",)) -> None:
        self.cluster = cluster
        self.databases = databases
        self.port = 0
        self.base_dir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        """pgBouncer's own log file."""
        if self.base_dir is None:
            raise LocalPgError("pgbouncer has not been started")
        return self.base_dir / "pgbouncer.log"

    def dsn(self, dbname: str = "pgbouncer") -> str:
        """A URL for the admin console (``pgbouncer``) or a pooled database."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}?sslmode=disable"

    def start(self) -> None:
        """Write a config, start pgBouncer and wait until it accepts connections."""
        self.base_dir = Path(tempfile.mkdtemp(prefix="localbouncer-"))
        self.port = free_port()
        (self.base_dir / "pgbouncer.ini").write_text(self._config())
        if os.geteuid() == 0:
            shutil.chown(self.base_dir, SERVER_ACCOUNT)
        self.launch()

    def launch(self) -> None:
        """Start pgBouncer on the written config (again, after a stop of the process)."""
        binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        if not Path(binary).is_file():
            raise LocalPgError("pgbouncer is not installed: run scripts/setup")
        assert self.base_dir is not None, "start() writes the config first"
        command = [binary, str(self.base_dir / "pgbouncer.ini")]
        if os.geteuid() == 0:
            command[1:1] = ["-u", SERVER_ACCOUNT]
        # In the foreground pgBouncer also logs every line to stderr: a file, never a pipe
        # nobody reads, which would block pgBouncer once its buffer is full.
        with (self.base_dir / "stderr.log").open("ab") as stderr:
            self._process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
        wait_until(self._listening, "pgbouncer listening", START_TIMEOUT)

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

    def _listening(self) -> bool:
        assert self._process is not None
        assert self.base_dir is not None
        if self._process.poll() is not None:
            stderr = (self.base_dir / "stderr.log").read_text(errors="replace")
            raise LocalPgError(f"pgbouncer exited at start: {stderr.strip()[-2000:]}")
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

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
        if self.base_dir is not None:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            self.base_dir = None

    def __enter__(self) -> LocalPgBouncer:
        try:
            self.start()
        except BaseException:
            self.stop()  # a start that failed half-way leaves no process or directory
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
