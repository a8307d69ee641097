"""The test rig itself: throw-away clusters, their settings, replicas, clean-up and the demo."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import time
import types
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import psycopg
import pytest

from rigs import demo, localpg
from rigs.localpg import LocalCluster, LocalPgError, pg18_bindir

REPO = Path(__file__).resolve().parents[2]  # where ``rigs`` imports from, like scripts/demo


def _postmaster_pid(cluster: LocalCluster) -> int:
    return int((cluster.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])


def _gone(pid: int) -> bool:
    """True once pid no longer exists (a zombie of ours counts as gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


def _wait(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_session_clusters_report_their_major_versions(
    pg18: LocalCluster, pg15: LocalCluster
) -> None:
    """pg18 runs PostgreSQL 18 and pg15 runs PostgreSQL 15, each on its own port."""
    assert pg18.version // 10000 == 18
    assert pg15.version // 10000 == 15
    assert int(pg15.psql("SHOW server_version_num")) == pg15.version
    assert pg18.port != pg15.port


def test_pg_stat_statements_is_preloaded_and_usable(pg: LocalCluster) -> None:
    """pg_stat_statements is preloaded, so its view works once the extension exists."""
    dbname = f"rig_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE DATABASE {dbname}")
    try:
        pg.psql("CREATE EXTENSION pg_stat_statements", dbname=dbname)
        pg.psql("SELECT 1 AS rig_pgss_marker", dbname=dbname)  # constants get normalised
        query = "SELECT count(*) FROM pg_stat_statements WHERE query LIKE '%rig_pgss_marker%'"
        assert int(pg.psql(query, dbname=dbname)) >= 1
    finally:
        pg.psql(f"DROP DATABASE {dbname}")


def test_replica_streams_from_pg18(pg18: LocalCluster, pg18_replica: LocalCluster) -> None:
    """The replica is in recovery, streams from pg18 and sees its changes."""
    assert pg18_replica.psql("SELECT pg_is_in_recovery()") == "t"
    assert pg18.psql("SELECT pg_is_in_recovery()") == "f"
    senders = pg18.psql("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")
    assert int(senders) >= 1
    dbname = f"rig_{uuid.uuid4().hex[:8]}"
    pg18.psql(f"CREATE DATABASE {dbname}")
    try:
        seen = f"SELECT count(*) FROM pg_database WHERE datname = '{dbname}'"
        _wait(lambda: pg18_replica.psql(seen) == "1", "the replica to replay CREATE DATABASE")
    finally:
        pg18.psql(f"DROP DATABASE {dbname}")


def test_server_does_not_run_as_root(pg: LocalCluster) -> None:
    """The postmaster and its backends belong to a non-root account."""
    owner = os.stat(f"/proc/{_postmaster_pid(pg)}").st_uid
    assert owner != 0
    assert pg.data_dir.stat().st_uid == owner
    if os.geteuid() == 0:
        assert owner == pwd.getpwnam(localpg.SERVER_ACCOUNT).pw_uid


def test_log_lines_carry_pid_sqlstate_and_application(pg: LocalCluster) -> None:
    """Failed statements are logged with backend pid, SQLSTATE and application name."""
    marker = f"rig_missing_{uuid.uuid4().hex[:8]}"
    with pytest.raises(LocalPgError, match="does not exist"):
        pg.psql(f"SELECT * FROM {marker}")
    lines = [line for line in pg.log_text().splitlines() if marker in line]
    assert any(" 42P01 " in line and "app=psql:" in line and "ERROR:" in line for line in lines)
    assert all("[" in line and "]" in line for line in lines)


def test_dsn_reaches_the_cluster_with_psycopg(pg: LocalCluster) -> None:
    """dsn() is a libpq URL with sslmode=disable that psycopg can use."""
    url = pg.dsn("postgres")
    assert url.endswith("?sslmode=disable")
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT current_user, current_setting('port')::int").fetchone()
    assert row == ("postgres", pg.port)


def test_restart_keeps_port_and_close_removes_everything() -> None:
    """restart() comes back on the same port; leaving the block stops the server and cleans up."""
    with LocalCluster(pg18_bindir()) as cluster:
        first = _postmaster_pid(cluster)
        cluster.restart()
        assert _postmaster_pid(cluster) != first
        assert cluster.psql("SELECT current_setting('port')") == str(cluster.port)
        last, base = _postmaster_pid(cluster), cluster.base_dir
    assert not base.exists()
    _wait(lambda: _gone(last), "the postmaster to exit")


def test_start_failure_cleans_up_and_shows_the_log() -> None:
    """A server that cannot start raises with its log, and leaves no directory behind."""
    cluster = LocalCluster(pg18_bindir(), settings={"shared_buffers": "not-a-size"})
    with pytest.raises(LocalPgError, match="shared_buffers"), cluster:
        pass
    assert cluster._base is not None
    assert not cluster._base.exists()


def test_strays_of_dead_processes_are_reaped() -> None:
    """A cluster whose creating process died is killed and removed by the next process."""
    script = (
        "import os, sys\n"
        "from rigs.localpg import LocalCluster, pg18_bindir\n"
        "c = LocalCluster(pg18_bindir()); c.start()\n"
        "print(c.base_dir, flush=True)\n"
        "os._exit(0)\n"  # die without any clean-up
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    base = Path(done.stdout.strip())
    pid = int((base / "data" / "postmaster.pid").read_text().split("\n", 1)[0])
    assert not _gone(pid)
    localpg._reap_strays.__wrapped__()
    assert not base.exists()
    _wait(lambda: _gone(pid), "the stray postmaster to die")


def test_demo_seeds_a_database_and_generates_activity() -> None:
    """The demo schema loads and one activity round runs its statements."""
    with LocalCluster(pg18_bindir(), settings=demo.DEMO_SETTINGS) as cluster:
        demo.seed(cluster)
        before = int(cluster.psql("SELECT last_value FROM orders_id_seq", dbname="demo"))
        activity = demo.Activity(cluster.dsn("demo"))
        activity.run_round()
        after = int(cluster.psql("SELECT last_value FROM orders_id_seq", dbname="demo"))
        calls = "SELECT calls FROM pg_stat_user_functions WHERE funcname = 'order_total'"
        assert activity.rounds == 1
        assert after == before + 20
        assert int(cluster.psql(calls, dbname="demo")) >= 1


def test_demo_runs_the_exporter_against_its_cluster_then_stops_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """demo.main hands the cluster URL, collectors and port to the CLI, then stops the cluster."""
    seen: dict[str, object] = {}

    def fake_main(argv: Sequence[str]) -> int:
        seen["argv"] = list(argv)
        with psycopg.connect(argv[1]) as conn:
            seen["databases"] = conn.execute("SELECT datname FROM pg_database").fetchall()
        return 7

    monkeypatch.setitem(sys.modules, "exporter.cli", types.SimpleNamespace(main=fake_main))
    assert demo.main(["--port", "19630", "--log.level", "debug"]) == 7
    argv = seen["argv"]
    assert isinstance(argv, list)
    assert argv[0] == "--url"
    assert argv[2:] == [
        "--config",
        str(demo.collectors_dir()),
        "--web.listen-address",
        ":19630",
        "--log.level",
        "debug",
    ]
    assert ("demo",) in seen["databases"]  # type: ignore[operator]
    assert "http://localhost:19630/metrics" in capsys.readouterr().out
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(argv[1], connect_timeout=2)
