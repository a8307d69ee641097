"""A database in distress gets less work, on a real PostgreSQL (D15, D16, D17).

Passes are driven directly on an :class:`Exporter` with an injected clock, one
simulated second apart, so minutes of scraping take seconds; the SQL the exporter
sent is counted in the server's statement log. The collectors' timeouts are short
only to keep the tests quick: the counts depend on the schedule, not on them.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from exporter.collect.admission import Admission
from exporter.collect.breaker import BreakerState
from exporter.collect.budget import Budget, Interruption
from exporter.collect.cache import Outcome
from exporter.collect.exporter import Exporter
from exporter.collect.passes import Snapshot
from exporter.expose.exposition import Format, encode
from exporter.report.explain import last_plans
from exporter.report.selfmetrics import SelfMetrics
from exporter.report.stat import stat_text
from exporter.web.appstate import STATE
from rigs.localpg import LocalCluster
from tests.fixtures.clock import FakeClock
from tests.fixtures.helpers import settings_for, statement_calls, value, write_collectors
from tests.fixtures.polling import poll_async
from tests.fixtures.rawhttp import Start, get

SEED = 16  # the jitter draws are seeded, so every count below is reproducible


def sql_sent(cluster: LocalCluster, marker: str) -> int:
    """Statements containing ``marker`` the exporter sent, from the server log.

    A query that waits for a table's lock waits at parse time, so a lock timeout is
    logged as an error (SQLSTATE 55P03) with its STATEMENT, without the ``execute`` line
    :func:`statement_calls` counts; both are counted here.
    """
    return statement_calls(cluster, marker) + sum(
        1
        for line in cluster.log_text().splitlines()
        if marker in line
        and "app=pg_exporter" in line
        and " 55P03 " in line
        and "STATEMENT: " in line
    )


def _marker(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def _branch(key: str, sql: str, column: str, **fields: object) -> str:
    """One collector branch as YAML text."""
    extra = "".join(f"  {name}: {value}\n" for name, value in fields.items())
    return (
        f"{key}:\n  query: {sql}\n{extra}"
        f"  metrics:\n    - {column}: {{usage: GAUGE, description: probe}}\n"
    )


def _exporter(
    cluster: LocalCluster, tmp_path: Path, text: str, clock: FakeClock, **overrides: object
) -> Exporter:
    name = f"{uuid.uuid4().hex[:6]}.yml"
    definitions = write_collectors(tmp_path, text, name=name)
    settings = settings_for(cluster, **{"auto_discovery": False, **overrides})
    return Exporter(settings, definitions, clock=clock, random=random.Random(SEED).random)


async def _pass(exporter: Exporter, clock: FakeClock) -> Snapshot:
    """One scrape's pass, then a simulated second."""
    snapshot = await exporter.collect(Budget.starting_now(30.0, clock=clock))
    clock.advance(1.0)
    return snapshot


def _stat_row(exporter: Exporter, query: str) -> dict[str, str]:
    lines = stat_text(exporter).splitlines()
    header = lines[0].split()
    rows = [dict(zip(header, line.split(), strict=True)) for line in lines[1:]]
    return next(row for row in rows if row["query"] == query)


def _self_metrics(exporter: Exporter) -> str:
    families = SelfMetrics("pg", ()).families(exporter, Admission())
    return encode(families, Format.TEXT).decode()


def _fast(count: int) -> str:
    return "".join(_branch(f"fast{i}", f"SELECT {i} AS v", "v", timeout=5) for i in range(count))


async def test_a_collector_that_always_times_out_backs_off(
    pg18: LocalCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``ttl: 1``, always timing out, scraped every second for three minutes: with back-off
    it runs a handful of times where the TTL alone runs it every pass; its waits are
    jittered yet within the TTL and the ceiling; entering back-off is logged once; once
    healthy it runs again within its own ceiling and then on every pass (D15, D17)."""
    stuck, ttl_only, healing = _marker("stuck"), _marker("ttlonly"), _marker("heal")
    table = _marker("delay")
    pg18.psql(f"CREATE TABLE {table} AS SELECT 5::float AS d")
    sleeper = "SELECT 1 AS {m} FROM pg_sleep({d})"
    text = _fast(3) + _branch("stuck", sleeper.format(m=stuck, d=5), stuck, ttl=1, timeout=0.05)
    text += _branch("healing", sleeper.format(m=healing, d=f"(SELECT d FROM {table})"),
                    healing, ttl=1, timeout=0.05, backoff_ceiling=30)  # fmt: skip
    baseline_text = _fast(3) + _branch(
        "stuck", sleeper.format(m=ttl_only, d=5), ttl_only, ttl=1, timeout=0.05
    )
    clock = FakeClock()
    backing = _exporter(pg18, tmp_path, text, clock)
    baseline = _exporter(pg18, tmp_path, baseline_text, clock, backoff_ceiling=0.0)
    waits: dict[int, float] = {}  # failures in a row -> the wait drawn after the last
    caplog.set_level(logging.INFO, logger="exporter")
    try:
        for _ in range(180):
            await backing.collect(Budget.starting_now(30.0, clock=clock))
            await _pass(baseline, clock)
            if (state := backing.main.runtimes["stuck"].backoff) is not None:
                waits[state.failures] = state.wait
            assert backing.main.up
            assert baseline.main.up
        runs, runs_ttl_only = statement_calls(pg18, stuck), statement_calls(pg18, ttl_only)
        print(f"\nalways timing out, ttl 1, 180 passes 1 s apart: {runs} runs with back-off, "
              f"{runs_ttl_only} with the TTL alone")  # fmt: skip
        assert runs <= 12
        assert runs_ttl_only >= 170
        row = _stat_row(backing, "stuck")
        assert (row["state"], int(row["fails"])) == ("backoff", runs)
        assert 0 < float(row["retry_in"]) <= 600.0
        metrics = _self_metrics(backing)
        assert value(metrics, "pg_exporter_query_consecutive_failures", query="stuck") == runs
        assert value(metrics, "pg_exporter_query_backoff_seconds", query="stuck") > 0
        assert value(metrics, "pg_exporter_query_outcome_total", query="stuck",
                     outcome="backoff") == 180 - runs  # fmt: skip
        entering = [r for r in caplog.records if "backing off" in r.getMessage()]
        assert sorted(getattr(r, "collector", "") for r in entering) == ["healing", "stuck"]
        assert sorted(waits) == list(range(1, runs + 1))
        bounds = {n: min(600.0, 2.0 ** (n - 1)) for n in waits}  # ttl 1 doubled, capped
        assert all(1.0 <= waits[n] <= bounds[n] for n in waits)  # jitter is bounded
        assert len({waits[n] / bounds[n] for n in waits if n > 1}) == runs - 1  # and present

        pg18.psql(f"UPDATE {table} SET d = 0")  # healthy from now on
        healed_at = clock.now
        while backing.main.runtimes["healing"].outcome is not Outcome.OK:
            await _pass(backing, clock)
            assert clock.now - healed_at <= 31.0, "not tried within its ceiling"
        assert backing.main.runtimes["healing"].backoff is None
        assert any("recovered" in r.getMessage() for r in caplog.records)
        before = statement_calls(pg18, healing)
        for _ in range(5):
            await _pass(backing, clock)
        assert statement_calls(pg18, healing) == before + 5  # ttl 1, a pass a second
    finally:
        await backing.close()
        await baseline.close()


async def test_an_interrupted_round_is_not_a_failure(pg: LocalCluster, tmp_path: Path) -> None:
    """An unbounded collector cancelled with its request three times running is tried again
    right after its TTL each time: a cut-short round is no verdict on it (D15, B12)."""
    m = _marker("cut")
    text = _branch("forever", f"SELECT 1 AS {m} FROM pg_sleep(30)", m, ttl=1, timeout=-1)
    clock = FakeClock()
    exporter = _exporter(pg, tmp_path, text, clock)

    def running() -> bool:
        count = pg.psql(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
            f"AND (query LIKE '%{m}%' OR query LIKE 'EXECUTE pgx_forever%')"  # prepared
            " AND pid <> pg_backend_pid()"
        )
        return int(count) == 1

    try:
        for attempt in range(1, 4):
            budget = Budget.starting_now(30.0, clock=clock)
            task = asyncio.create_task(exporter.collect(budget))
            await poll_async(running, "the unbounded collector to run")
            budget.ended.set()  # the client hung up
            snapshot = await task
            assert snapshot.interrupted is Interruption.CLIENT
            assert exporter.main.runtimes["forever"].outcome is Outcome.CANCELLED
            assert statement_calls(pg, m) == attempt
            assert all(r.backoff is None for r in exporter.main.runtimes.values())
            clock.advance(1.0)  # the TTL, and not a second more
        assert exporter.breaker.state is BreakerState.NORMAL
    finally:
        await exporter.close()


@dataclass
class Timeline:
    """What each pass of a test showed: breaker state and level, shed keys, pg_up."""

    states: list[tuple[BreakerState, int]] = field(default_factory=list)
    shed: list[tuple[str, ...]] = field(default_factory=list)
    ran: list[set[str]] = field(default_factory=list)  # collectors that sent their SQL
    up: list[bool] = field(default_factory=list)

    async def step(self, exporter: Exporter, clock: FakeClock) -> None:
        before = {key: _runs(r.stats.outcomes) for key, r in exporter.main.runtimes.items()}
        await _pass(exporter, clock)
        self.states.append((exporter.breaker.state, exporter.breaker.level))
        self.shed.append(exporter.main.shed)
        now = {key: _runs(r.stats.outcomes) for key, r in exporter.main.runtimes.items()}
        self.ran.append({key for key, runs in now.items() if runs > before.get(key, 0)})
        self.up.append(exporter.main.up)

    def changes(self) -> int:
        return sum(1 for a, b in zip(self.states, self.states[1:], strict=False) if a != b)


def _runs(outcomes: dict[Outcome, int]) -> int:
    """Executions among the outcomes: everything but cache hits and held-back passes."""
    held = (Outcome.CACHED, Outcome.SHED, Outcome.BACKOFF)
    return sum(count for outcome, count in outcomes.items() if outcome not in held)


def _failing(exporter: Exporter) -> bool:
    """True while a collector of the main database has failures in a row (D15)."""
    return any(r.backoff is not None for r in exporter.main.runtimes.values())


LOADS = 6


def _no_relapse(states: list[tuple[BreakerState, int]]) -> bool:
    """Once out of the degraded state, never back in, and tiers only come back."""
    first_out = next(i for i, (state, _) in enumerate(states) if state is not BreakerState.DEGRADED)
    later = states[first_out:]
    levels = [level for _, level in later]
    return all(s is not BreakerState.DEGRADED for s, _ in later) and levels == sorted(
        levels, reverse=True
    )


def _library(m: str, table: str, *, load_sql: str) -> str:
    """A fatal liveness collector, a core one and six low-importance ones reading a table."""
    text = _branch("vital", f"SELECT 1 AS vital_{m}", f"vital_{m}", fatal="true", priority=1,
                   timeout=5)  # fmt: skip
    text += _branch("core", f"SELECT 1 AS core_{m}", f"core_{m}", priority=2, timeout=5)
    for k in range(LOADS):
        column = f"{m}_load{k}"
        text += _branch(f"load{k}", load_sql.format(column=column, table=table), column,
                        priority=10 + k, timeout=0.2, backoff_ceiling=60)  # fmt: skip
    return text


async def test_a_locked_server_sheds_the_least_important_and_recovers_without_flapping(
    pg18: LocalCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A table every low-importance collector reads is locked for two minutes: the breaker
    trips, sheds from the end of the run order, never the fatal or the first collector,
    and pg_up stays 1; after the lock goes it probes and returns to normal with no relapse,
    and every collector publishes again; each change of state is logged once (D16)."""
    m, table = _marker("slow"), _marker("locked")
    pg18.psql(f"CREATE TABLE {table} AS SELECT 1 AS n")
    # The semicolon in the comment keeps the query text, not prepared (issue 22): a lock
    # wait at an EXECUTE is logged without its statement, so sql_sent could not see it.
    load_sql = "SELECT count(*) AS {column} FROM {table} /* ; */"
    text = _library(m, table, load_sql=load_sql)
    clock = FakeClock()
    exporter = _exporter(pg18, tmp_path, text, clock)
    timeline = Timeline()
    caplog.set_level(logging.INFO, logger="exporter")
    holder = await psycopg.AsyncConnection.connect(pg18.dsn())
    try:
        for _ in range(5):
            await timeline.step(exporter, clock)
        await holder.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")  # a migration
        loads_before, core_before = sql_sent(pg18, f"{m}_load"), sql_sent(pg18, f"core_{m}")
        for _ in range(120):
            await timeline.step(exporter, clock)
        loads_run = sql_sent(pg18, f"{m}_load") - loads_before
        assert sql_sent(pg18, f"core_{m}") - core_before == 120  # the core kept running
        loads = [exporter.main.runtimes[f"load{k}"].stats.outcomes for k in range(LOADS)]
        shed = sum(o.get(Outcome.SHED, 0) for o in loads)
        held = sum(o.get(Outcome.BACKOFF, 0) for o in loads)
        print(f"\nlocked for 120 passes: {loads_run} of {LOADS * 120} low-importance runs sent, "
              f"{shed} shed, {held} held back by back-off")  # fmt: skip
        assert loads_run + shed + held == LOADS * 120  # ttl 0: every pass, unless held back
        assert loads_run <= LOADS * 120 // 5
        assert exporter.breaker.state is not BreakerState.NORMAL
        assert exporter.breaker.trips == 1
        assert all(timeline.up)  # reachable throughout: pg_up 1
        order = ["vital", "core", *(f"load{k}" for k in range(LOADS))]
        for shed_now, ran in zip(timeline.shed, timeline.ran, strict=True):
            assert {"vital", "core"} <= ran
            if shed_now:  # lowest importance first: nothing after a shed collector ran
                assert max(map(order.index, ran)) < min(map(order.index, shed_now))
        assert max(len(shed_now) for shed_now in timeline.shed) >= LOADS // 3
        metrics = _self_metrics(exporter)
        assert value(metrics, "pg_up") == 1
        assert value(metrics, "pg_exporter_breaker_trips_total") == 1
        assert value(metrics, "pg_exporter_breaker_state", state="normal") == 0
        assert value(metrics, "pg_exporter_breaker_shed_collectors") == len(exporter.main.shed)
        explain = last_plans(exporter)
        assert f"breaker: {exporter.breaker.state.value}" in explain
        assert ("shed on" in explain) is bool(exporter.main.shed)

        await holder.rollback()  # the lock goes
        released = len(timeline.states)
        for _ in range(600):
            await timeline.step(exporter, clock)
            if timeline.states[-1][0] is BreakerState.NORMAL and not _failing(exporter):
                break
        after = timeline.states[released:]
        assert after[-1] == (BreakerState.NORMAL, 0), after[-1]
        assert _no_relapse(after)
        assert all(timeline.up)
        print(f"back to normal {len(after)} passes after the lock went")
        for _ in range(2):
            await timeline.step(exporter, clock)
        assert all(exporter.main.runtimes[f"load{k}"].outcome is Outcome.OK for k in range(LOADS))
        logged = [r for r in caplog.records if "target breaker" in r.getMessage()]
        # Once per change (a pass may start probing and fail the probe: two changes).
        assert timeline.changes() <= len(logged) <= 2 * timeline.changes()
        assert len(logged) < len(timeline.states) // 4
    finally:
        await holder.close()
        await exporter.close()


async def test_connections_exhausted_trip_the_breaker_and_pg_up_follows_reachability(
    pg18: LocalCluster, tmp_path: Path
) -> None:
    """The exporter's role has one connection slot and something else takes it: refused
    with 53300, pg_up is 0 and the breaker trips; once the slot is free pg_up is 1 again
    at once, the first passes send only the core, then it comes back to normal (D16)."""
    m, role = _marker("conn"), _marker("capped")
    pg18.psql(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 1")
    text = _library(m, "pg_class", load_sql="SELECT count(*) AS {column} FROM {table}")
    clock = FakeClock()
    exporter = _exporter(pg18, tmp_path, text, clock, url=pg18.dsn(user=role))
    timeline = Timeline()

    def role_backends() -> int:
        return int(pg18.psql(f"SELECT count(*) FROM pg_stat_activity WHERE usename = '{role}'"))

    try:
        await timeline.step(exporter, clock)
        pg18.psql(
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'"
        )
        await poll_async(lambda: role_backends() == 0, "the exporter's backend to go")
        hog = await psycopg.AsyncConnection.connect(pg18.dsn(user=role))
        try:
            for _ in range(5):
                await timeline.step(exporter, clock)
        finally:
            await hog.close()
        assert timeline.up == [True] + [False] * 5
        assert exporter.breaker.state is BreakerState.DEGRADED
        assert "53300" in exporter.breaker.reason
        await poll_async(lambda: role_backends() == 0, "the slot to be free")
        loads_before = statement_calls(pg18, f"{m}_load")
        await timeline.step(exporter, clock)
        assert timeline.up[-1] is True  # reachable again: pg_up 1, while still shedding
        assert len(timeline.shed[-1]) >= LOADS // 3
        assert statement_calls(pg18, f"{m}_load") - loads_before == LOADS - len(timeline.shed[-1])
        back = len(timeline.states)
        for _ in range(300):
            await timeline.step(exporter, clock)
            if timeline.states[-1][0] is BreakerState.NORMAL:
                break
        assert timeline.states[-1] == (BreakerState.NORMAL, 0)
        assert _no_relapse(timeline.states[back - 1 :])
        assert all(timeline.up[back - 1 :])
    finally:
        await exporter.close()


async def test_a_client_asking_for_microseconds_cannot_make_the_target_shed(
    pg18: LocalCluster, start: Start
) -> None:
    """Requests whose scrape timeout is spent before their pass could run (a client asking
    for a microsecond) answer 503 and are no evidence against the server: the breaker
    stays normal and a scrape with a real timeout gets every collector (D16)."""
    text = _branch("kept", "SELECT 1 AS kept_v", "kept_v", priority=10, timeout=5)
    text += _branch("last", "SELECT 1 AS last_v", "last_v", priority=20, timeout=5)
    served = await start(pg18, text, disable_cache=True)
    for _ in range(4):
        tiny = await get(served.port, **{"X-Prometheus-Scrape-Timeout-Seconds": "0.000001"})
        assert tiny.status == 503
    exporter = served.app[STATE].exporter
    assert exporter.breaker.state is BreakerState.NORMAL
    body = (await get(served.port)).text
    assert value(body, "last_last_v") == 1, body
