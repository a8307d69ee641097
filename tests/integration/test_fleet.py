"""Fleet mode's safety guarantees on real servers (issue 14): PostgreSQL 18, its replica,
PostgreSQL 15 and a pgBouncer as declared targets, and a cluster of this module's own
that the tests freeze (SIGSTOP), stop or make require a password.

A request only reaches a declared target, and reaches nothing else; each target is
bounded on its own (a hung one delays no other, two probes of one target are admitted,
a third refused); the fleet's ceiling makes passes wait within their budget or refuse;
credentials show in no page and no log; a reload adds, removes and changes targets and
leaves the unchanged ones as they were; health paths answer per target; without a
targets file nothing changed.

Tests synchronise on observable state (pg_stat_activity, the statement log, the
exporter's admission and lock), polled with deadlines; timing bounds carry wide margins.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from exporter.collect.budget import CANCEL_GRACE
from exporter.config.settings import Settings
from exporter.web.healthpages import HEALTH_PATHS, PRIMARY_PATHS, REPLICA_PATHS, UP_PATHS
from rigs.localbouncer import LocalPgBouncer
from rigs.localpg import VERBOSE_LOG_SETTINGS, LocalCluster, free_port, pg18_bindir
from tests.fixtures.fleetrig import (
    Listener,
    fetch,
    fleet_of,
    fleet_process,
    frozen,
    member,
    serving_fleet,
    write_targets,
)
from tests.fixtures.helpers import (
    REPO,
    exporter_running,
    http_get,
    statement_calls,
    value,
    write_collectors,
)
from tests.fixtures.polling import poll, poll_async, wait_for
from tests.fixtures.rawhttp import RawClient, Response, Served, Start, get

pytestmark = pytest.mark.pg

BUDGET = "X-Prometheus-Scrape-Timeout-Seconds"
Target = dict[str, Any]
StartFleet = Callable[..., Awaitable[Served]]  # (targets, collectors, **settings)


def _marker() -> str:
    return f"m{uuid.uuid4().hex[:10]}"


def _quick(marker: str, *, ttl: float = 0, timeout: float = 5) -> str:
    """One cheap collector on PostgreSQL and one on pgBouncer, recognisable by ``marker``."""
    return f"""
    fleet_quick:
      query: SELECT 1 AS {marker}
      ttl: {ttl}
      timeout: {timeout}
      metrics:
        - {marker}: {{usage: GAUGE, description: probe}}
    fleet_bouncer:
      query: SHOW LISTS
      ttl: {ttl}
      timeout: 5
      tags: [pgbouncer]
      metrics:
        - list: {{usage: LABEL, description: list}}
        - items: {{usage: GAUGE, description: entries}}
    """


def _slow(marker: str, seconds: float, *, ttl: float = 0) -> str:
    """A collector taking ``seconds``, planned only on targets tagged ``slow``."""
    return f"""
    fleet_slow:
      query: SELECT 1 AS {marker} FROM pg_sleep({seconds})
      ttl: {ttl}
      timeout: 10
      tags: [slow]
      metrics:
        - {marker}: {{usage: GAUGE, description: probe}}
    """


def _target(name: str, url: str, **options: Any) -> Target:
    return {"name": name, "url": url, **options}


@dataclass(frozen=True)
class Servers:
    """The session's shared servers this module declares as targets (only read)."""

    pg18: LocalCluster
    replica: LocalCluster
    pg15: LocalCluster
    bouncer: LocalPgBouncer


@pytest.fixture(scope="module")
def servers(
    pg18: LocalCluster, pg18_replica: LocalCluster, pg15: LocalCluster, pgbouncer18: LocalPgBouncer
) -> Servers:
    """PostgreSQL 18, its streaming replica, PostgreSQL 15 and a pgBouncer."""
    return Servers(pg18, pg18_replica, pg15, pgbouncer18)


@pytest.fixture(scope="module")
def spare() -> Iterator[LocalCluster]:
    """A PostgreSQL 18 cluster of this module's own: tests freeze it, stop it, or make it
    require a password, and leave it running and trusting again."""
    with LocalCluster(pg18_bindir(), settings=VERBOSE_LOG_SETTINGS) as cluster:
        yield cluster


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[StartFleet]:
    """Serve a fleet in-process (the production runner, a real socket) from a list of
    targets and collector YAML; discovery off. Every server stops at the end."""
    async with AsyncExitStack() as stack:

        async def _start(targets: list[Target], collectors: str, **overrides: Any) -> Served:
            definitions = write_collectors(tmp_path, collectors)
            settings = Settings(
                connect_timeout=5.0,
                auto_discovery=False,
                config=str(tmp_path / "collectors.yml"),
                **overrides,
            )
            targets_file = write_targets(tmp_path / "targets.yml", targets)
            return await stack.enter_async_context(
                serving_fleet(settings, definitions, targets_file)
            )

        yield _start


async def _timed(port: int, path: str, **headers: str) -> tuple[Response, float]:
    started = time.monotonic()
    response = await get(port, path, **headers)
    return response, time.monotonic() - started


# 1. Unknown or undeclared targets ---------------------------------------------------------


async def test_undeclared_targets_run_nothing_and_reach_nothing(
    pg18: LocalCluster, fleet: StartFleet
) -> None:
    """A name that is not declared, a URL, a host:port, extra parameters, a repeated or
    empty target: 400 or 404 at once on every per-target path; no connection reaches the
    host the request names, no SQL reaches the declared target, nothing is echoed."""
    m = _marker()
    with Listener() as trap:
        served = await fleet([_target("a", pg18.dsn())], _quick(m, ttl=60))
        secret = f"pw{uuid.uuid4().hex[:8]}"
        url = f"postgresql://u:{secret}@127.0.0.1:{trap.port}/db"
        asked = {
            "target=nope-4711": 404,
            f"target={quote(url, safe='')}": 404,
            f"target={url}": 404,
            f"target=127.0.0.1:{trap.port}": 404,
            f"target=a&host=127.0.0.1&port={trap.port}": 400,
            f"target=a&url={quote(url, safe='')}": 400,
            f"host=127.0.0.1&port={trap.port}": 400,
            "target=a&target=a": 400,
            "target=a&target=nope-4711": 400,
            "target=": 404,
            "": 400,
        }
        slowest = 0.0
        for path in ("/probe", "/primary", "/up", "/stat", "/explain"):
            for query, want in asked.items():
                response, took = await _timed(served.port, f"{path}?{query}")
                slowest = max(slowest, took)
                where = f"{path}?{query}"
                assert response.status == want, where
                assert took < 0.5, (where, took)  # at once: nothing was tried first
                for text in ("nope-4711", secret, str(trap.port), "127.0.0.1", "u:"):
                    assert text not in response.text, (where, text)
        a = member(served, "a")
        assert a.state.exporter.stats.scrapes == 0  # no pass ran
        assert a.state.admission.active == 0
        assert statement_calls(pg18, m) == 0
        assert trap.connections == 0
        print(f"{5 * len(asked)} undeclared requests, slowest answer {slowest * 1000:.1f} ms")
        # The instruments see what they must: a declared probe runs the marked SQL, and a
        # connection to the trap is recorded.
        ok = await get(served.port, "/probe?target=a")
        assert ok.status == 200
        assert value(ok.text, f"fleet_quick_{m}") == 1
        assert statement_calls(pg18, m) == 1
        with socket.create_connection(("127.0.0.1", trap.port)):
            wait_for(lambda: trap.connections == 1, "the trap to record a connection")


# 2. A hung or stopped target delays no other ---------------------------------------------

HUNG_BUDGET = 4.0  # the hung target's scrape budget (seconds)
HUNG_TIMEOUT = 2.0  # its collector's own timeout: shorter than the budget (B11)
HEALTHY_WITHIN = 2.0  # healthy targets answer well before the hung one's budget ends
# A frozen server answers no cancel request either: the exporter gives a cancelled query
# CANCEL_GRACE to end, then drops its connection, so the frozen target's 503 comes at
# most that long after its budget (psycopg alone would wait 10 s more).


@pytest.mark.concurrency
@pytest.mark.parametrize("hang", ["frozen", "silent", "stopped"])
async def test_hung_or_stopped_target_delays_no_other(
    servers: Servers, spare: LocalCluster, fleet: StartFleet, hang: str
) -> None:
    """While one target hangs (its server frozen by SIGSTOP after the exporter connected,
    or a listener that accepts and never answers) or is shut down, the other four are
    scraped concurrently and answer within a fraction of the hung one's budget; the hung
    one answers 503 or pg_up 0 within its own budget, a frozen server's cancellation
    given CANCEL_GRACE at most (B9, B21, D7)."""
    m = _marker()
    with Listener() as silent:
        hung_url = silent.dsn() if hang == "silent" else spare.dsn()
        healthy = {
            "primary": servers.pg18.dsn(),
            "replica": servers.replica.dsn(),
            "pg15": servers.pg15.dsn(),
            "bouncer": servers.bouncer.dsn(),
        }
        targets = [_target(n, u) for n, u in healthy.items()] + [_target("hung", hung_url)]
        served = await fleet(targets, _quick(m, timeout=HUNG_TIMEOUT))
        for name in healthy if hang == "silent" else [*healthy, "hung"]:
            warm = await get(served.port, f"/probe?target={name}")  # connected, planned
            assert (warm.status, value(warm.text, _up(name))) == (200, 1), name
        hung = member(served, "hung").state.exporter
        with ExitStack() as hanging:
            if hang == "frozen":
                hanging.enter_context(frozen(spare))
            elif hang == "stopped":
                spare.stop()
                hanging.callback(spare.start)
            pending = await RawClient.send(
                served.port, "/probe?target=hung", {BUDGET: str(HUNG_BUDGET)}
            )
            started = time.monotonic()
            if hang != "stopped":  # a refused connection may end the pass at once
                await poll(hung.lock.locked, "the hung target's pass to start")
            answers = await asyncio.gather(
                *(_timed(served.port, f"/probe?target={n}", **{BUDGET: "10"}) for n in healthy)
            )
            for name, (response, took) in zip(healthy, answers, strict=True):
                assert response.status == 200, name
                assert value(response.text, _up(name)) == 1, name
                assert took < HEALTHY_WITHIN, (name, took)
            if hang != "stopped":
                assert hung.lock.locked(), "the healthy answers came after the hung pass ended"
            answer = await pending.response()
            took = time.monotonic() - started
            assert answer.status == 503 or value(answer.text, "pg_up") == 0, answer.text
            print(f"{hang}: healthy {[round(t, 3) for _, t in answers]} s, hung {took:.2f} s")
            assert took < HUNG_BUDGET + CANCEL_GRACE + 1.5, took


def _up(name: str) -> str:
    return "pgbouncer_up" if name == "bouncer" else "pg_up"


# 3. Admission per target ------------------------------------------------------------------


@pytest.mark.concurrency
async def test_admission_is_per_target(
    pg18: LocalCluster, pg15: LocalCluster, fleet: StartFleet
) -> None:
    """Two probes of one target are admitted and share its pass; a third gets 503 at once
    and runs nothing, while another target's probe is admitted and answered meanwhile."""
    m, q = _marker(), _marker()
    served = await fleet(
        [_target("a", pg18.dsn(), tags=["slow"]), _target("b", pg15.dsn())],
        _slow(m, 1.5, ttl=60) + _quick(q, ttl=0),
    )
    a = member(served, "a").state
    first = await RawClient.send(served.port, "/probe?target=a")
    await poll_async(lambda: exporter_running(pg18, m), "a's pass to run the slow query")
    second = await RawClient.send(served.port, "/probe?target=a")
    await poll(lambda: a.admission.active == 2, "the second probe of a to be admitted")
    third, took = await _timed(served.port, "/probe?target=a")
    assert third.status == 503
    assert took < 0.5, took
    other, other_took = await _timed(served.port, "/probe?target=b")
    assert other.status == 200
    assert value(other.text, f"fleet_quick_{q}") == 1
    assert other_took < 1.0, other_took
    assert a.exporter.lock.locked(), "a's pass ended before the other target was answered"
    answers = [await first.response(), await second.response()]
    assert [r.status for r in answers] == [200, 200]
    assert all(value(r.text, f"fleet_slow_{m}") == 1 for r in answers)
    assert statement_calls(pg18, m) == 1  # one pass served both; the third ran nothing
    assert value(answers[1].text, "pg_exporter_requests_rejected_total") == 1
    assert member(served, "b").state.admission.rejected == 0
    metrics = (await get(served.port, "/metrics")).text
    assert value(metrics, "pg_exporter_fleet_target_rejected_total", target="a") == 1
    assert value(metrics, "pg_exporter_fleet_target_rejected_total", target="b") == 0
    print(f"third probe of a refused in {took:.3f} s, b answered in {other_took:.3f} s")


# 4. The fleet's ceiling -------------------------------------------------------------------


@pytest.mark.concurrency
async def test_ceiling_makes_other_targets_wait_within_their_budget(
    pg18: LocalCluster, pg15: LocalCluster, fleet: StartFleet
) -> None:
    """With one target collected at once, a probe of b behind a's slow pass waits for the
    place and succeeds within a long budget, or gets 503 when its budget is shorter than
    the wait; /metrics counts both waits and the refusal."""
    m, q = _marker(), _marker()
    served = await fleet(
        [_target("a", pg18.dsn(), tags=["slow"]), _target("b", pg15.dsn())],
        _slow(m, 1.5) + _quick(q),
        max_concurrent_targets=1,
    )
    gate = fleet_of(served).gate

    async def behind_a(budget: str) -> tuple[Response, float]:
        calls = statement_calls(pg18, m)
        slow = await RawClient.send(served.port, "/probe?target=a")
        await poll(lambda: statement_calls(pg18, m) > calls, "a's pass to start its query")
        assert gate.active == 1
        waited = await _timed(served.port, "/probe?target=b", **{BUDGET: budget})
        assert (await slow.response()).status == 200
        return waited

    long_wait, took = await behind_a("10")
    assert long_wait.status == 200
    assert value(long_wait.text, f"fleet_quick_{q}") == 1
    assert 0.5 < took < 8.0, took  # waited for a's pass, not for its budget
    metrics = (await get(served.port, "/metrics")).text
    assert value(metrics, "pg_exporter_fleet_max_concurrent") == 1
    assert value(metrics, "pg_exporter_fleet_waited_total") == 1
    assert value(metrics, "pg_exporter_fleet_refused_total") == 0
    short_wait, refused_in = await behind_a("0.4")
    assert short_wait.status == 503
    assert 0.3 < refused_in < 1.5, refused_in
    assert statement_calls(pg15, q) == 1  # the refused probe ran nothing
    metrics = (await get(served.port, "/metrics")).text
    assert value(metrics, "pg_exporter_fleet_waited_total") == 2
    assert value(metrics, "pg_exporter_fleet_refused_total") == 1
    assert value(metrics, "pg_exporter_fleet_wait_seconds_total") > 0.6
    print(f"b waited {took:.2f} s behind a; refused after {refused_in:.2f} s")


# 5. Credentials -----------------------------------------------------------------------------

ROLES = ("w_file", "w_env", "w_url")


def _require_passwords(cluster: LocalCluster, passwords: dict[str, str]) -> str:
    """Create each role with its password and make the server require it (scram-sha-256)
    from 127.0.0.1; the postgres role stays trusted. Returns pg_hba.conf as it was."""
    for role, password in passwords.items():
        cluster.psql(
            f"DROP ROLE IF EXISTS {role}; "
            f"CREATE ROLE {role} LOGIN PASSWORD '{password}' IN ROLE pg_monitor"
        )
    hba = cluster.data_dir / "pg_hba.conf"
    before = hba.read_text()
    rule = f"host all {','.join(passwords)} 127.0.0.1/32 scram-sha-256\n"
    hba.write_text(rule + before)
    cluster.psql("SELECT pg_reload_conf()")
    return before


def _pages(port: int, names: list[str]) -> dict[str, str]:
    """Every page a fleet exporter serves, by what was asked, for each target."""
    base = f"http://127.0.0.1:{port}"
    asked = ["/", "/targets", "/metrics", "/version", "/alive", "/sd", "/nowhere"]
    for name in names:
        asked += [f"{p}?target={name}" for p in ("/probe", "/stat", "/explain", *HEALTH_PATHS)]
    pages: dict[str, str] = {}
    for path in asked:
        for accept in ("text/plain", "text/html"):
            status, body = fetch(base + path, headers={"Accept": accept})
            assert status != 0, path
            pages[f"{path} ({accept}) {status}"] = body
    for method in ("OPTIONS", "HEAD", "POST"):
        for name in names:
            status, body = fetch(f"{base}/primary?target={name}", method)
            pages[f"{method} /primary?target={name} {status}"] = body
    return pages


def test_credentials_appear_in_no_page_or_log(spare: LocalCluster, tmp_path: Path) -> None:
    """Passwords from a file, an environment variable and the URL reach the server (each
    target's pg_up is 1 where the password is required; without it, 0) and appear in no
    page, no answer of /reload, nowhere in the debug log, also after a SIGHUP that reads
    a rotated password file."""
    m = _marker()
    passwords = {role: f"Pw{uuid.uuid4().hex}" for role in ROLES}
    rotated = f"Pw{uuid.uuid4().hex}"
    secrets = [*passwords.values(), rotated]
    before = _require_passwords(spare, passwords)
    try:
        password_file = tmp_path / "password"
        password_file.write_text(passwords["w_file"] + "\n")
        url = f"postgresql://{{}}@127.0.0.1:{spare.port}/postgres?sslmode=disable"
        targets = [
            _target("by-file", url.format("w_file"), password_file=str(password_file)),
            _target("by-env", url.format("w_env"), password_env="FLEET_TEST_PASSWORD"),
            _target("in-url", url.format(f"w_url:{passwords['w_url']}")),
            _target("no-password", url.format("w_url")),
        ]
        targets_file = write_targets(tmp_path / "targets.yml", targets)
        write_collectors(tmp_path, _quick(m))
        log = tmp_path / "exporter.log"
        names = [t["name"] for t in targets]
        env = {"FLEET_TEST_PASSWORD": passwords["w_env"]}
        with fleet_process(
            targets_file, tmp_path / "collectors.yml", log, "--log.level", "debug", env=env
        ) as (port, process):
            base = f"http://127.0.0.1:{port}"

            def up(name: str) -> float:
                status, body = http_get(f"{base}/probe?target={name}")
                assert status == 200, (name, status, body)
                return value(body, "pg_up")

            assert [up(n) for n in names] == [1, 1, 1, 0]  # the password was needed
            pages = _pages(port, names)
            # A reload that changes a target: its answer and log lines quote no secret.
            targets[2]["labels"] = {"rotated": "no"}
            write_targets(targets_file, targets)
            status, answer = fetch(f"{base}/reload", "POST")
            assert status == 200, answer
            assert "1 changed" in answer
            pages["POST /reload"] = answer
            # SIGHUP after rotating the file's password: the changed target reconnects.
            spare.psql(f"ALTER ROLE w_file PASSWORD '{rotated}'")
            password_file.write_text(rotated + "\n")
            process.send_signal(signal.SIGHUP)
            wait_for(lambda: log.read_text().count("1 changed") >= 2, "the SIGHUP reload")
            assert [up(n) for n in names] == [1, 1, 1, 0]
            pages.update({f"after SIGHUP {k}": v for k, v in _pages(port, names).items()})
        text = log.read_text()
        assert "level=debug" in text  # the log was verbose, and named the targets
        assert "target=by-file" in text
        assert "w_url:" in pages["/targets (text/plain) 200"]  # the URL is shown, masked
        for where, body in [*pages.items(), ("the log", text)]:
            for secret in secrets:
                assert secret not in body, where
    finally:
        (spare.data_dir / "pg_hba.conf").write_text(before)
        spare.psql("SELECT pg_reload_conf()")


def test_broken_targets_file_exits_2_naming_target_never_secret(tmp_path: Path) -> None:
    """A URL libpq cannot read and a password file that is missing: exit 2 at start, the
    file and each target named, the secret in the URL never quoted."""
    secret = f"Pw{uuid.uuid4().hex}"
    targets_file = write_targets(
        tmp_path / "targets.yml",
        [
            _target("broken", f"postgresql://w:{secret}@[::1/postgres"),
            _target("lost", "postgresql://w@127.0.0.1/postgres",
                    password_file=str(tmp_path / "missing")),
        ],
    )  # fmt: skip
    write_collectors(tmp_path, _quick(_marker()))
    done = subprocess.run(
        [sys.executable, "-m", "exporter", "--targets.file", str(targets_file),
         "-c", str(tmp_path / "collectors.yml"),
         "--web.listen-address", f"127.0.0.1:{free_port()}"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert str(targets_file) in output
    assert "targets[0](broken).url" in output
    assert "targets[1](lost).password_file" in output
    assert secret not in output


# 6. Reloading the targets file --------------------------------------------------------------


async def test_reload_adds_removes_and_changes_targets_keeping_the_others(
    servers: Servers, fleet: StartFleet, tmp_path: Path
) -> None:
    """POST /reload after editing the targets file: an added target is served, a removed
    one is 404, a changed one scrapes its new server; the unchanged one keeps its member,
    its pass counter and its cache (its collector is not run again within its TTL)."""
    pg18, pg15, replica = servers.pg18, servers.pg15, servers.replica
    m = _marker()
    kept = _target("keep", pg18.dsn())
    served = await fleet(
        [kept, _target("drop", pg15.dsn()), _target("move", pg15.dsn())], _quick(m, ttl=60)
    )
    for name in ("keep", "drop", "move"):
        response = await get(served.port, f"/probe?target={name}")
        assert (response.status, value(response.text, "pg_up")) == (200, 1), name
    keep = member(served, "keep")
    assert (statement_calls(pg18, m), statement_calls(pg15, m)) == (1, 2)
    write_targets(
        tmp_path / "targets.yml",
        [kept, _target("move", replica.dsn()), _target("new", servers.bouncer.dsn())],
    )
    reloaded = await (await RawClient.send(served.port, "/reload", method="POST")).response()
    assert reloaded.status == 200, reloaded.text
    assert "1 added, 1 changed, 1 removed, 3 in all" in reloaded.text
    assert (await get(served.port, "/probe?target=drop")).status == 404
    new = await get(served.port, "/probe?target=new")
    assert (new.status, value(new.text, "pgbouncer_up")) == (200, 1)
    moved = await get(served.port, "/probe?target=move")
    assert (moved.status, value(moved.text, f"fleet_quick_{m}")) == (200, 1)
    assert statement_calls(replica, m) == 1  # its new server ran the collector
    assert statement_calls(pg15, m) == 2  # its old one was not asked again
    again = await get(served.port, "/probe?target=keep")
    assert (again.status, value(again.text, f"fleet_quick_{m}")) == (200, 1)
    assert fleet_of(served).member("keep") is keep
    assert keep.state.exporter.stats.scrapes == 2  # its pass counter kept counting
    assert statement_calls(pg18, m) == 1  # served from its cache, not run again
    stat = await get(served.port, "/stat?target=keep")
    assert stat.status == 200
    assert "fleet_quick" in stat.text
    page = (await get(served.port, "/targets")).text
    assert all(name in page for name in ("keep", "move", "new"))
    assert "drop" not in page


# 7. Health per target -----------------------------------------------------------------------


@pytest.mark.concurrency
async def test_health_paths_answer_per_target_for_every_method(
    servers: Servers, spare: LocalCluster, fleet: StartFleet
) -> None:
    """/primary, /replica and /up (and their aliases) answer from each target's own probe:
    200 for its role, 404 for the other, 503 for a stopped server; any method."""
    spare.stop()
    try:
        served = await fleet(
            [
                _target("primary", servers.pg18.dsn()),
                _target("replica", servers.replica.dsn()),
                _target("stopped", spare.dsn()),
                _target("bouncer", servers.bouncer.dsn()),
            ],
            _quick(_marker()),
        )
        want = {"primary": 200, "replica": 200, "stopped": 503, "bouncer": 200}
        for name, status in want.items():

            async def settled(name: str = name, status: int = status) -> bool:
                return (await get(served.port, f"/up?target={name}")).status == status

            deadline = time.monotonic() + 20
            while not await settled():
                assert time.monotonic() < deadline, f"{name}'s probe to settle"
                await asyncio.sleep(0.05)
        expected = {
            ("primary", PRIMARY_PATHS): 200,
            ("primary", REPLICA_PATHS): 404,
            ("replica", PRIMARY_PATHS): 404,
            ("replica", REPLICA_PATHS): 200,
            ("stopped", PRIMARY_PATHS): 503,
            ("stopped", REPLICA_PATHS): 503,
            ("stopped", UP_PATHS): 503,
            ("primary", UP_PATHS): 200,
            ("replica", UP_PATHS): 200,
        }
        for method in ("GET", "HEAD", "OPTIONS", "POST"):
            for (name, paths), status in expected.items():
                for path in paths:
                    client = await RawClient.send(
                        served.port, f"{path}?target={name}", method=method
                    )
                    response = await client.response()
                    assert response.status == status, (method, path, name)
        assert (await get(served.port, "/alive")).status == 200  # needs no target
        assert (await get(served.port, "/primary")).status == 400  # names no target
        metrics = (await get(served.port, "/metrics")).text
        assert value(metrics, "pg_exporter_fleet_target_health", target="replica",
                     status="replica") == 1  # fmt: skip
        assert value(metrics, "pg_exporter_fleet_target_health", target="primary",
                     status="primary") == 1  # fmt: skip
    finally:
        spare.start()


# 8. Without a targets file --------------------------------------------------------------------


async def test_without_targets_file_nothing_changed(pg18: LocalCluster, start: Start) -> None:
    """/probe and /targets reach the landing page as any unknown path does, /metrics is the
    target's exposition with pg_up, and no fleet metric appears."""
    m = _marker()
    served = await start(pg18, _quick(m))
    for path in ("/probe", "/probe?target=primary", "/targets", f"/probe?target={pg18.dsn()}"):
        response = await get(served.port, path)
        assert response.status == 200, path
        assert response.headers["Content-Type"].startswith("text/html"), path
        assert "<h1>pg_exporter" in response.text, path
    metrics = await get(served.port, "/metrics")
    assert metrics.status == 200
    assert value(metrics.text, "pg_up") == 1
    assert value(metrics.text, f"fleet_quick_{m}") == 1
    assert "pg_exporter_fleet_" not in metrics.text
    assert statement_calls(pg18, m) == 1  # only /metrics ran the collector
    assert (await get(served.port, "/stat")).status == 200  # no target needed
