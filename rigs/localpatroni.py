"""A throw-away HA cluster: etcd and Patroni nodes (Debian's packages), PostgreSQL 15.

Everything runs as plain processes on loopback ports, in one temporary
directory: one etcd, then one Patroni per node, each managing its own
PostgreSQL. No system service is used or touched. PostgreSQL refuses to run as
root, so when we are root Patroni (and with it PostgreSQL) runs as the same
non-root account as :mod:`rigs.localpg` uses.

The timings are those of a small cluster that should fail over quickly:
Patroni's loop every second, its REST checks bounded to a second.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from rigs.localpg import (
    OWNER_FILE,
    LocalPgError,
    free_port,
    pg15_bindir,
    server_account,
    wait_until,
)

START_TIMEOUT = 90.0  # seconds for etcd, the leader's initdb and a replica's base backup
STOP_TIMEOUT = 30.0
SCOPE = "exporter-ha"
PREFIX = "localha-"


def _binary(name: str, package: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
    if found is None:
        raise LocalPgError(f"{name} is not installed: run scripts/setup (Debian {package})")
    return found


def _http(url: str, method: str = "GET", timeout: float = 2.0) -> tuple[int, str]:
    """(status, body) of one request; 0 when nothing answered."""
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


class PatroniNode:
    """One Patroni process and the PostgreSQL it manages."""

    def __init__(self, cluster: LocalPatroni, name: str) -> None:
        self.cluster = cluster
        self.name = name
        self.pg_port = free_port()
        self.rest_port = free_port()
        self.home = cluster.base_dir / name
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def data_dir(self) -> Path:
        """PGDATA."""
        return self.home / "data"

    @property
    def log_path(self) -> Path:
        """Patroni's log, PostgreSQL's stderr included."""
        return self.home / "patroni.log"

    @property
    def rest(self) -> str:
        """Base URL of Patroni's REST API."""
        return f"http://127.0.0.1:{self.rest_port}"

    def dsn(self, dbname: str = "postgres") -> str:
        """A libpq URL reaching this node's PostgreSQL over TCP."""
        return f"postgresql://postgres@127.0.0.1:{self.pg_port}/{dbname}?sslmode=disable"

    def role(self) -> str:
        """The role Patroni reports (``primary``, ``replica``, …; empty when unreachable)."""
        status, body = _http(f"{self.rest}/patroni", timeout=1.0)
        if status == 0 or not body:
            return ""
        role: str = json.loads(body).get("role", "")
        return "primary" if role == "master" else role

    def start(self) -> None:
        """Write the config and start Patroni (it initialises or clones PostgreSQL)."""
        self.home.mkdir(parents=True, exist_ok=True)
        config = self.home / "patroni.yml"
        config.write_text(json.dumps(self._config(), indent=1))  # JSON is YAML
        self.cluster.own(self.home)
        self.cluster.own(config)
        account = self.cluster.account
        with self.log_path.open("ab") as sink:
            self.process = subprocess.Popen(
                [_binary("patroni", "patroni"), str(config)],
                stdout=sink,
                stderr=sink,
                cwd=self.home,
                env=self.cluster.env(),
                start_new_session=True,  # Ctrl-C in a terminal must not reach it
                user=account,
                group=account,
                extra_groups=[] if account else None,
            )

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM Patroni, which stops PostgreSQL; kill both when it takes too long."""
        process = self.process
        if process is None or process.poll() is not None:
            self._kill_postmaster()
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        self._kill_postmaster()

    def postmaster_pid(self) -> int:
        """The running postmaster's pid, from postmaster.pid (0 when there is none)."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return 0
        return pid if str(self.data_dir).encode() in cmdline else 0

    def _kill_postmaster(self) -> None:
        pid = self.postmaster_pid()
        if pid:
            os.kill(pid, signal.SIGKILL)

    def _config(self) -> dict[str, object]:
        bindir = pg15_bindir()
        return {
            "scope": SCOPE,
            "namespace": f"/{self.cluster.base_dir.name}/",
            "name": self.name,
            "log": {"level": "INFO"},
            "restapi": {
                "listen": f"127.0.0.1:{self.rest_port}",
                "connect_address": f"127.0.0.1:{self.rest_port}",
            },
            "etcd3": {"host": f"127.0.0.1:{self.cluster.etcd_port}"},
            "bootstrap": {
                "dcs": {
                    "ttl": 20,
                    "loop_wait": 1,
                    "retry_timeout": 5,
                    "maximum_lag_on_failover": 16 * 1024 * 1024,
                    "postgresql": {"use_pg_rewind": True, "parameters": _BOOTSTRAP_PARAMETERS},
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C"}],
                "pg_hba": [
                    "local all all trust",
                    "host all all 127.0.0.1/32 trust",
                    "host replication all 127.0.0.1/32 trust",
                ],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{self.pg_port}",
                "connect_address": f"127.0.0.1:{self.pg_port}",
                "data_dir": str(self.data_dir),
                "bin_dir": str(bindir),
                "pgpass": str(self.home / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres", "password": "postgres"},
                    "replication": {"username": "replicator", "password": "replicator"},
                    "rewind": {"username": "postgres", "password": "postgres"},
                },
                "parameters": {
                    "unix_socket_directories": str(self.home),
                    **self.cluster.parameters,
                },
            },
        }


# Settings every node starts with (Patroni keeps them in the DCS). fsync off: throw-away
# data, and a shared machine's disk must not decide the timings.
_BOOTSTRAP_PARAMETERS: Mapping[str, object] = {
    "wal_level": "replica",
    "hot_standby": "on",
    "max_wal_senders": 5,
    "max_replication_slots": 5,
    "wal_log_hints": "on",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "on",
}


class LocalPatroni:
    """etcd plus ``nodes`` Patroni nodes of one cluster; use as a context manager.

    ``parameters`` go to every node's PostgreSQL (e.g. logging settings).
    """

    def __init__(self, nodes: int = 2, parameters: Mapping[str, str] | None = None) -> None:
        self.base_dir = Path(tempfile.mkdtemp(prefix=PREFIX))
        self.account = server_account()
        self.parameters = dict(parameters or {})
        self.etcd_port = free_port()
        self._etcd: subprocess.Popen[bytes] | None = None
        self.nodes = [PatroniNode(self, f"node{i + 1}") for i in range(nodes)]

    def own(self, path: Path) -> None:
        """Hand ``path`` to the account Patroni runs as."""
        if self.account is not None:
            shutil.chown(path, self.account, self.account)

    def env(self) -> dict[str, str]:
        """Our environment without PG* variables that would redirect PostgreSQL tools."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_MESSAGES"] = "C"  # the exporter recognises 57P03 by its English text
        return env

    def start(self) -> None:
        """etcd, then the first node as the leader, then the others as streaming replicas."""
        _reap_strays()
        _live.add(self)
        (self.base_dir / OWNER_FILE).write_text(str(os.getpid()))
        self.own(self.base_dir)
        self._start_etcd()
        first, *others = self.nodes
        first.start()
        wait_until(functools.partial(self.writable, first), "the first node to lead", START_TIMEOUT)
        for node in others:
            node.start()
            streams = functools.partial(self.streaming, node)
            wait_until(streams, f"{node.name} to stream", START_TIMEOUT)

    def streaming(self, node: PatroniNode) -> bool:
        """True when ``node`` is a replica that Patroni reports running and streaming."""
        status, body = _http(f"{node.rest}/patroni", timeout=1.0)
        if status != 200 or not body:
            return False
        state = json.loads(body)
        return bool(state.get("role") == "replica" and state.get("state") == "running") and (
            self.psql(node, "SELECT status FROM pg_stat_wal_receiver") == "streaming"
        )

    def psql(self, node: PatroniNode, sql: str) -> str:
        """Run SQL on ``node`` with psql; empty when it fails."""
        args = [str(pg15_bindir() / "psql"), "-X", "-A", "-t", "-q", "-d", node.dsn(), "-c", sql]
        done = subprocess.run(
            args, capture_output=True, text=True, check=False, env=self.env(), timeout=10
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    def patronictl(self, *args: str, timeout: float = 60.0) -> str:
        """Run patronictl against this cluster; its output (raises when it fails)."""
        config = self.nodes[0].home / "patroni.yml"
        done = subprocess.run(
            [_binary("patronictl", "patroni"), "-c", str(config), *args],
            capture_output=True,
            text=True,
            check=False,
            env=self.env(),
            timeout=timeout,
        )
        if done.returncode != 0:
            raise LocalPgError(f"patronictl {' '.join(args)}: {done.stderr or done.stdout}")
        return done.stdout

    def close(self) -> None:
        """Stop every node and etcd, and remove the directory."""
        try:
            for node in reversed(self.nodes):
                node.stop()
        finally:
            if self._etcd is not None and self._etcd.poll() is None:
                self._etcd.terminate()
                try:
                    self._etcd.wait(timeout=STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    self._etcd.kill()
                    self._etcd.wait()
            shutil.rmtree(self.base_dir, ignore_errors=True)
            _live.discard(self)

    def writable(self, node: PatroniNode) -> bool:
        """True when Patroni says ``node`` leads and its PostgreSQL is out of recovery."""
        return node.role() == "primary" and self.psql(node, "SELECT pg_is_in_recovery()") == "f"

    def _start_etcd(self) -> None:
        peer = free_port()
        client = f"http://127.0.0.1:{self.etcd_port}"
        command = [
            _binary("etcd", "etcd-server"),
            "--name", "etcd", "--data-dir", str(self.base_dir / "etcd"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"etcd=http://127.0.0.1:{peer}",
        ]  # fmt: skip
        with (self.base_dir / "etcd.log").open("ab") as sink:
            self._etcd = subprocess.Popen(
                command, stdout=sink, stderr=sink, env=self.env(), start_new_session=True
            )
        wait_until(lambda: _http(f"{client}/health")[0] == 200, "etcd", START_TIMEOUT)

    def __enter__(self) -> LocalPatroni:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


_live: set[LocalPatroni] = set()


@functools.cache  # once per process
def _reap_strays() -> None:
    """Stop what clusters of dead processes of ours left running; close ours at exit.

    etcd and Patroni run in sessions of their own, so they outlive a test process
    that was killed; each is found by its command line, which names its directory.
    """
    atexit.register(_close_all)
    for base in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        try:
            owner = int((base / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # not one of ours, or one still being created
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            _kill_named(str(base))
            shutil.rmtree(base, ignore_errors=True)
        except PermissionError:
            continue  # alive, as another user


def _kill_named(marker: str) -> None:
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
            if proc.name.isdigit() and marker.encode() in cmdline:
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue


def _close_all() -> None:
    """At interpreter exit: no cluster outlives the process that started it."""
    for cluster in list(_live):
        cluster.close()
