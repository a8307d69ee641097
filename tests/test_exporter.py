"""The exporter of one target without a database: the collection lock (B4, B5, B8), the
fleet's gate, how wide a pass walks, reloads waiting for the next pass, and closing or
releasing connections never opened. Passes over a real server are covered in
tests/integration."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from exporter.collect.budget import Budget, Interruption
from exporter.collect.exporter import Exporter, _acquire_within, _report_orphan_failure
from exporter.collect.gate import Gate
from exporter.collect.passes import Snapshot
from exporter.config.commandline import read_settings
from exporter.config.definitions import Collector, Definitions
from exporter.config.settings import Settings
from exporter.config.targetsfile import load_targets

URL = "postgresql://127.0.0.1:1/main"  # never connected to by these tests
SHORT = 0.05  # seconds: a budget that runs out while a held lock is awaited


def _exporter(gate: Gate | None = None, **fields: int) -> Exporter:
    settings = Settings(url=URL, **fields)  # type: ignore[arg-type]
    return Exporter(settings, Definitions(()), random=lambda: 0.5, gate=gate)


def _spent() -> Budget:
    """A request whose budget is already over: a pass under it connects nothing."""
    return Budget(deadline=0.0)


async def _until(condition: Callable[[], bool], attempts: int = 1000) -> None:
    """Let other tasks run until ``condition()`` holds (bounded, no sleeping)."""
    for _ in range(attempts):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


# --- the lock ----------------------------------------------------------------------


async def test_a_free_lock_is_taken_at_once() -> None:
    """B4: a free lock is taken, even with no time left to wait."""
    lock = asyncio.Lock()
    assert await _acquire_within(lock, 0.0)
    assert lock.locked()


async def test_a_held_lock_is_given_up_when_the_time_runs_out() -> None:
    """B5: a lock held by another pass is not taken once the time is up."""
    lock = asyncio.Lock()
    await lock.acquire()
    assert not await _acquire_within(lock, SHORT)
    lock.release()
    assert not lock.locked()  # the waiter that gave up holds nothing


async def test_a_request_behind_another_pass_shares_it_and_gets_no_families() -> None:
    """B5, B8: while a pass holds the lock, a request whose budget runs out waiting gets
    an interrupted snapshot marked shared, and runs no pass of its own."""
    exporter = _exporter()
    await exporter.lock.acquire()
    snapshot = await exporter.collect(Budget.starting_now(SHORT))
    assert (snapshot.families, snapshot.interrupted) == ([], Interruption.BUDGET)
    assert snapshot.shared
    assert exporter.stats.scrapes == 0


async def test_a_pass_under_a_spent_budget_runs_and_frees_the_lock() -> None:
    """The lock is taken, the pass counted as interrupted, and the lock freed after."""
    exporter = _exporter()
    snapshot = await exporter.collect(_spent())
    assert snapshot.interrupted is Interruption.BUDGET
    assert not snapshot.shared
    assert (exporter.stats.scrapes, exporter.stats.errors) == (1, 0)
    assert not exporter.lock.locked()


# --- the fleet's gate --------------------------------------------------------------


async def test_a_pass_that_finds_the_gate_full_gives_up_with_its_budget() -> None:
    """B1: no place in the fleet's gate within the budget: 503's snapshot, no pass run,
    the lock free again."""
    gate = Gate(1)
    assert await gate.enter(0.0)
    exporter = _exporter(gate)
    snapshot = await exporter.collect(Budget.starting_now(SHORT))
    assert snapshot.interrupted is Interruption.BUDGET
    assert (exporter.stats.scrapes, gate.active, gate.refused) == (0, 1, 1)
    assert not exporter.lock.locked()


async def test_a_request_cancelled_while_its_pass_waits_ends_the_pass() -> None:
    """B10: the client hangs up while the pass waits for the gate: the request is
    cancelled, the budget marked ended, the pass stops without a place and frees the lock."""
    gate = Gate(1)
    assert await gate.enter(0.0)
    exporter = _exporter(gate)
    budget = Budget.starting_now(60.0)
    request = asyncio.create_task(exporter.collect(budget))
    await _until(lambda: gate.waiting == 1)
    passes = set(exporter._passes)
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    assert budget.ended.is_set()
    (snapshot,) = await asyncio.wait_for(asyncio.gather(*passes), 5.0)
    assert snapshot.interrupted is Interruption.CLIENT
    assert (gate.active, gate.waiting) == (1, 0)
    assert not exporter.lock.locked()


async def test_a_pass_that_enters_the_gate_leaves_it() -> None:
    """The gate's place is given back when the pass ends."""
    gate = Gate(1)
    exporter = _exporter(gate)
    await exporter.collect(_spent())
    assert (gate.entered, gate.active) == (1, 0)


# --- width, reloads, closing -------------------------------------------------------


@pytest.mark.parametrize(
    ("parallel", "max_connections", "width"), [(2, 4, 2), (3, 4, 3), (5, 4, 3), (4, 2, 1)]
)
def test_a_pass_walks_no_more_databases_than_they_have_connections(
    parallel: int, max_connections: int, width: int
) -> None:
    """--parallel-databases, never above --max-connections less the probe's one."""
    exporter = _exporter(parallel_databases=parallel, max_connections=max_connections)
    assert exporter.width == width


async def test_reloaded_definitions_wait_for_the_lock() -> None:
    """A reload is scheduled, not applied, while a pass may run; taking the lock
    (exclusive) applies it and plans again."""
    exporter = _exporter()
    new = Definitions((Collector(key="a", name="a", query="SELECT 1", columns=()),))
    exporter.schedule(new)
    assert exporter.pending is new
    assert exporter.definitions is not new
    async with exporter.exclusive(Budget.starting_now(5.0)) as held:
        assert held
        assert exporter.definitions is new
        assert exporter.pending is None
        assert exporter.main.definitions is new
    assert not exporter.lock.locked()


async def test_exclusive_gives_up_when_a_pass_holds_the_lock() -> None:
    """exclusive() yields False within its budget, and the reload still waits."""
    exporter = _exporter()
    exporter.schedule(Definitions(()))
    await exporter.lock.acquire()
    async with exporter.exclusive(Budget.starting_now(SHORT)) as held:
        assert not held
    assert exporter.pending is not None


async def test_release_closes_nothing_on_an_exporter_that_never_connected() -> None:
    """Fleet mode: releasing an idle target that holds no connection reports none."""
    exporter = _exporter()
    assert not await exporter.release()
    assert not exporter.lock.locked()


async def test_release_does_not_wait_for_a_pass() -> None:
    """A target whose pass is running keeps its connections: release returns at once."""
    exporter = _exporter()
    await exporter.lock.acquire()
    assert not await asyncio.wait_for(exporter.release(), 5.0)


async def test_after_close_no_pass_starts_and_closing_again_is_harmless() -> None:
    """Shutdown keeps the lock taken: a later request gets no pass; a second close
    returns at once."""
    exporter = _exporter()
    await exporter.close(grace=SHORT)
    assert exporter.lock.locked()
    await asyncio.wait_for(exporter.close(grace=SHORT), 5.0)
    snapshot = await exporter.collect(Budget.starting_now(SHORT))
    assert snapshot.interrupted is Interruption.BUDGET
    assert exporter.stats.scrapes == 0
    assert not await exporter.release()


async def test_a_pass_that_fails_after_its_request_left_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nobody awaits an orphaned pass: its failure is logged at ERROR; a cancelled one or
    one that succeeded is not."""

    async def fail() -> Snapshot:
        raise RuntimeError("boom")

    async def succeed() -> Snapshot:
        return Snapshot([])

    failed, done = asyncio.create_task(fail()), asyncio.create_task(succeed())
    cancelled = asyncio.create_task(succeed())
    cancelled.cancel()
    await asyncio.gather(failed, done, cancelled, return_exceptions=True)
    with caplog.at_level(logging.ERROR, logger="exporter.collect.exporter"):
        for task in (failed, done, cancelled):
            _report_orphan_failure(task)
    assert [r.getMessage() for r in caplog.records] == ["collection pass failed: boom"]


@pytest.mark.parametrize(
    ("argv", "environ", "budget_ms"),
    [
        ([], {}, 200.0),
        (["--disable-cache"], {}, 0.0),
        (["--disable-cache", "--server.time-budget", "200"], {}, 200.0),
        (["-C"], {"PG_EXPORTER_SERVER_TIME_BUDGET": "50"}, 50.0),
        ([], {"PG_EXPORTER_DISABLE_CACHE": "true"}, 0.0),
    ],
)
def test_disable_cache_has_no_server_time_budget_unless_one_is_given(
    argv: list[str], environ: dict[str, str], budget_ms: float
) -> None:
    """Issue 36: --disable-cache keeps the Go exporter's meaning, every collector at every
    pass, unless a budget is given by flag or variable; without it the default applies."""
    argv = ["--url", URL, "--config", "collectors", *argv]
    settings = read_settings(argv, environ, [], lambda path: [])
    exporter = Exporter(settings, Definitions(()), random=lambda: 0.5)
    assert exporter.server_time.budget * 1000 == budget_ms
    if not budget_ms and settings.disable_cache:
        assert "--disable-cache" in exporter.server_time.describe(0.0)


def test_a_targets_file_budget_is_given_under_disable_cache(tmp_path: Path) -> None:
    """Issue 36: ``server_time_budget`` in a targets file is given, as a flag is."""
    path = tmp_path / "targets.yml"
    path.write_text(
        f"defaults: {{server_time_budget: 80}}\ntargets:\n  - {{name: a, url: '{URL}'}}\n"
    )
    base = Settings(url=URL, disable_cache=True)
    (target,) = load_targets(str(path), base, {}).targets
    assert Exporter(target.settings, Definitions(())).server_time.budget == pytest.approx(0.08)
    assert Exporter(base, Definitions(())).server_time.budget == 0.0
