"""The server-time budget on a real PostgreSQL (issue 31).

An expensive collector (``pg_sleep(0.2)`` at every pass: its server time is real and
known) beside a ``fatal`` one that sleeps 10 ms and two cheap ones. Passes are driven on
an :class:`Exporter` whose clock is the real one plus an offset the test moves a second
after each pass: the statements take their real time, the minutes between passes pass at
once. The statements the exporter sent are counted in the server's statement log.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from pathlib import Path

import pytest

from exporter.collect.admission import Admission
from exporter.collect.budget import Budget
from exporter.collect.cache import Outcome
from exporter.collect.exporter import Exporter
from exporter.collect.stretch import AT_CEILING
from exporter.config.settings import DEFAULT_SERVER_TIME_BUDGET_MS
from exporter.expose.exposition import Format, encode
from exporter.report.explain import degradation_text, last_plans
from exporter.report.selfmetrics import SelfMetrics
from exporter.report.stat import stat_text
from rigs.localpg import LocalCluster
from tests.fixtures.helpers import settings_for, statement_calls, value, write_collectors
from tests.fixtures.promtool import unexpected_problems

FIRST = 60  # passes of every exporter, a simulated second apart: the budget acts after 30
MEASURED = 320  # passes of the budgeted ones after those: more than a 300 s window
DEAR_SLEEP, FATAL_SLEEP = 0.2, 0.01  # seconds of server time a run
BUDGET_MS = 60.0
TIGHT_MS = 4.0  # less than the fatal collector alone takes


class SteppedClock:
    """Monotonic seconds: the real clock, plus what the test added between passes."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


def _branch(key: str, sql: str, column: str, **fields: object) -> str:
    extra = "".join(f"  {name}: {value}\n" for name, value in fields.items())
    return (
        f"{key}:\n  query: {sql}\n{extra}"
        f"  metrics:\n    - {column}: {{usage: GAUGE, description: probe}}\n"
    )


def _config(m: str) -> str:
    """The fatal one first in run order, the expensive one last (the least important)."""
    text = _branch("up", f"SELECT 1 AS up_{m} FROM pg_sleep({FATAL_SLEEP})", f"up_{m}",
                   fatal="true", priority=1, ttl=0, timeout=5)  # fmt: skip
    for k in range(2):
        text += _branch(f"cheap{k}", f"SELECT 1 AS cheap{k}_{m}", f"cheap{k}_{m}",
                        priority=2 + k, ttl=0, timeout=5)  # fmt: skip
    text += _branch("dear", f"SELECT 1 AS dear_{m} FROM pg_sleep({DEAR_SLEEP})", f"dear_{m}",
                    priority=9, ttl=0, timeout=5)  # fmt: skip
    return text


def _exporter(cluster: LocalCluster, tmp_path: Path, m: str, clock: SteppedClock,
              **overrides: object) -> Exporter:  # fmt: skip
    definitions = write_collectors(tmp_path, _config(m), name=f"{uuid.uuid4().hex[:6]}.yml")
    settings = settings_for(cluster, **{"auto_discovery": False, **overrides})
    return Exporter(settings, definitions, clock=clock)


def _stat_row(exporter: Exporter, query: str) -> dict[str, str]:
    lines = stat_text(exporter).splitlines()
    header = lines[0].split()
    rows = [dict(zip(header, line.split(), strict=True)) for line in lines[1:]]
    return next(row for row in rows if row["query"] == query)


def _self_metrics(exporter: Exporter) -> str:
    return encode(SelfMetrics("pg", ()).families(exporter, Admission()), Format.TEXT).decode()


class Run:
    """One exporter's passes: when the expensive collector ran, the fatal one's stretches."""

    def __init__(self, exporter: Exporter, clock: SteppedClock) -> None:
        self.exporter = exporter
        self.clock = clock
        self.dear_runs: list[float] = []  # when the expensive collector ran, stepped clock
        self.dear_stretches: list[tuple[float, float]] = []  # (when, its stretch then)
        self.fatal_stretches: list[float] = []

    async def step(self) -> None:
        runtimes = self.exporter.main.runtimes
        before = runtimes["dear"].entry if "dear" in runtimes else None
        snapshot = await self.exporter.collect(Budget.starting_now(30.0, clock=self.clock))
        assert snapshot.interrupted is None
        assert self.exporter.main.up
        dear = self.exporter.main.runtimes["dear"]
        if dear.entry is not before:
            self.dear_runs.append(self.clock())
        self.dear_stretches.append((self.clock(), dear.stretch))
        self.fatal_stretches.append(self.exporter.main.runtimes["up"].stretch)

    def rate(self) -> float:
        """The exporter's own measure over its window (or its run), in ms a second."""
        rate = self.exporter.server_time.meter.rate(self.clock())
        assert rate is not None
        return rate * 1000


async def _rounds(runs: list[Run], clock: SteppedClock, count: int) -> None:
    """``count`` passes of each exporter, a simulated second apart."""
    for _ in range(count):
        for run in runs:
            await run.step()
        clock.advance(1.0)


class Phase:
    """The statements of each exporter in one stretch of passes, from the server's log."""

    def __init__(self, cluster: LocalCluster, marks: dict[str, str], clock: SteppedClock) -> None:
        self.cluster, self.marks, self.clock = cluster, marks, clock
        self.started = clock()
        self.before = self._counts()

    def _counts(self) -> dict[str, tuple[int, int]]:
        return {
            name: (statement_calls(self.cluster, f"dear_{m}"),
                   statement_calls(self.cluster, f"up_{m}"))
            for name, m in self.marks.items()
        }  # fmt: skip

    def end(self) -> tuple[dict[str, tuple[int, int]], float]:
        """Runs of the expensive and the fatal collector per exporter, and the seconds."""
        now = self._counts()
        runs = {k: (now[k][0] - self.before[k][0], now[k][1] - self.before[k][1]) for k in now}
        return runs, self.clock() - self.started


def _known_ms(runs: tuple[int, int], seconds: float) -> float:
    """What the pg_sleep of the collectors' runs took, in ms a second: server time, known."""
    return (runs[0] * DEAR_SLEEP + runs[1] * FATAL_SLEEP) / seconds * 1000


async def test_an_expensive_collector_is_stretched_to_keep_the_budget_never_the_fatal_one(
    pg18: LocalCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture, promtool: str
) -> None:
    """A budget of 60 ms a second against collectors that would take about 150: once the
    budget has seen 30 s of passes, the expensive collector's effective TTL stretches (it
    runs every few passes, served from its cache between), and over a whole window the
    server time stays within the budget (the known pg_sleep time and the exporter's
    measure alike); the fatal collector runs at every pass and is never stretched; /stat,
    /explain and the self-metrics show it, and each change is logged once. A budget below
    what the fatal collector alone takes leaves it alone too, the expensive one at its
    ceiling. Without a budget, and with the default one (above what these collectors
    take), every collector runs at every pass and nothing is stretched."""
    marks = {name: uuid.uuid4().hex[:8] for name in ("budget", "tight", "off", "default")}
    clock = SteppedClock()
    budgets = {"budget": BUDGET_MS, "tight": TIGHT_MS, "off": 0.0, "default": None}
    runs = {
        name: Run(_exporter(pg18, tmp_path, marks[name], clock,
                            **({} if ms is None else {"server_time_budget": ms})), clock)
        for name, ms in budgets.items()
    }  # fmt: skip
    budget, tight, off, default = runs.values()
    caplog.set_level(logging.INFO, logger="exporter.collect.servertime")
    try:
        settling = Phase(pg18, marks, clock)
        await _rounds(list(runs.values()), clock, FIRST)
        first, first_seconds = settling.end()
        off_rate = off.rate()
        measured = Phase(pg18, marks, clock)
        counted_from = budget.exporter.server_time.meter.total
        await _rounds([budget, tight], clock, MEASURED)
        later, seconds = measured.end()
        spent = budget.exporter.server_time.meter.total - counted_from
        print(f"\nover {seconds:.0f} s after {first_seconds:.0f} s to settle, with a budget of "
              f"{BUDGET_MS:g} ms/s the expensive collector ran {later['budget'][0]} times in "
              f"{MEASURED} passes; its pg_sleep {_known_ms(later['budget'], seconds):.1f} ms/s, "
              f"the exporter's measure {spent / seconds * 1000:.1f}, over the last window "
              f"{budget.rate():.1f}; without a budget "
              f"{_known_ms(first['off'], first_seconds):.1f} and {off_rate:.1f} ms/s; "
              f"effective ttl {budget.exporter.main.runtimes['dear'].stretch:.1f} s")  # fmt: skip

        # Without a budget nothing changes: every collector runs at every pass.
        assert first["off"] == first["default"] == (FIRST, FIRST)
        assert _known_ms(first["off"], first_seconds) > 1.5 * BUDGET_MS  # well over it
        assert default.exporter.server_time.demand * 1000 < DEFAULT_SERVER_TIME_BUDGET_MS
        for run in (off, default):
            assert run.exporter.server_time.stretched == {}
            assert _stat_row(run.exporter, "dear")["state"] == "normal"

        # With it, the expensive collector is stretched and the budget kept.
        assert later["budget"][0] <= MEASURED / 3
        assert _known_ms(later["budget"], seconds) <= BUDGET_MS
        assert spent / seconds * 1000 <= BUDGET_MS * 1.1  # the exporter's own measure
        assert budget.rate() <= BUDGET_MS * 1.1  # over its window, as /explain says it
        dear = budget.exporter.main.runtimes["dear"]
        assert dear.stretch >= 2.0
        for a, b in itertools.pairwise(budget.dear_runs[-later["budget"][0] :]):
            held = max(s for when, s in budget.dear_stretches if a <= when <= b)
            assert b - a <= held + 3.0  # its effective ttl then, give or take a pass
        assert dear.stats.outcomes[Outcome.STRETCHED] >= MEASURED / 2

        # The fatal collector ran at every pass and was never stretched, even with a budget
        # it alone exceeds: the others are at their ceiling, and the page says so.
        for run, name in ((budget, "budget"), (tight, "tight")):
            assert (first[name][1], later[name][1]) == (FIRST, MEASURED)
            assert run.fatal_stretches == [0.0] * (FIRST + MEASURED)
        assert tight.exporter.server_time.plan[("postgres", "dear")] == AT_CEILING
        assert ("postgres", "up") not in tight.exporter.server_time.plan
        assert later["tight"][0] <= 1  # a first period drawn within 600 s, then 600 s
        assert "over the budget even so" in last_plans(tight.exporter)

        _visible(budget.exporter, promtool)
        changes = [r for r in caplog.records if r.getMessage().startswith("server-time budget")
                   and getattr(r, "stretched", None) is not None]  # fmt: skip
        print(f"{len(changes)} changes of plan logged, both budgeted exporters together")
        print(degradation_text(budget.exporter), end="")
        assert changes[0].levelno == logging.WARNING
        assert "postgres/dear every" in changes[0].getMessage()
        assert len(changes) <= 12  # two exporters: a few changes each, not one a pass
    finally:
        for run in runs.values():
            await run.exporter.close()


def _visible(exporter: Exporter, promtool: str) -> None:
    """The stretch in /stat, /explain and the self-metrics (promtool clean)."""
    dear = exporter.main.runtimes["dear"]
    row = _stat_row(exporter, "dear")
    assert row["state"] == "stretched"
    assert float(row["stretch"]) == pytest.approx(dear.stretch, abs=0.06)
    assert "stretched=" in row["outcomes"]
    assert _stat_row(exporter, "up")["state"] == "normal"
    explained = last_plans(exporter)
    assert f"server-time budget: {BUDGET_MS:g} ms/s; measured" in explained
    assert "stretched on postgres: dear (ttl 0s, refreshed every" in explained
    metrics = _self_metrics(exporter)
    assert value(metrics, "pg_exporter_query_stretched_ttl_seconds", query="dear") > 2.0
    assert value(metrics, "pg_exporter_query_stretched_ttl_seconds", query="up") == 0.0
    assert value(metrics, "pg_exporter_server_time_stretched_collectors") == 1.0
    assert value(metrics, "pg_exporter_server_time_budget_ratio") == BUDGET_MS / 1000
    assert value(metrics, "pg_exporter_server_time_demand_ratio") * 1000 > 1.5 * BUDGET_MS
    assert value(metrics, "pg_exporter_query_outcome_total", query="dear",
                 outcome="stretched") >= MEASURED / 2  # fmt: skip
    assert unexpected_problems(promtool, metrics.encode()) == []  # the names lint clean
    total = value(metrics, "pg_exporter_server_time_seconds_total")
    assert total == pytest.approx(exporter.server_time.meter.total)


async def test_disable_cache_runs_every_collector_at_every_pass_unless_a_budget_is_given(
    pg18: LocalCluster, tmp_path: Path
) -> None:
    """Issue 36: under --disable-cache the default budget is none, so collectors that would
    take twice the default run at every pass, past the budget's settling time, as the Go
    exporter runs them; the same budget given explicitly stretches the expensive one."""
    clock = SteppedClock()
    given = {"default": None, "asked": DEFAULT_SERVER_TIME_BUDGET_MS}
    runs = {
        name: Run(_exporter(pg18, tmp_path, uuid.uuid4().hex[:8], clock, disable_cache=True,
                            **({} if ms is None else {"server_time_budget": ms})), clock)
        for name, ms in given.items()
    }  # fmt: skip
    default, asked = runs.values()
    try:
        while default.exporter.server_time.meter.seen(clock()) < 40.0:  # SETTLE is 30 s
            for run in runs.values():
                await run.step()
            clock.advance(0.2)  # passes about 0.45 s apart: the collectors take ~450 ms/s
        assert default.exporter.server_time.demand * 1000 > 1.5 * DEFAULT_SERVER_TIME_BUDGET_MS
        assert not default.exporter.server_time.stretched
        assert len(default.dear_runs) == default.exporter.stats.scrapes
        assert {stretch for _, stretch in default.dear_stretches} == {0.0}
        assert ("postgres", "dear") in asked.exporter.server_time.stretched
        assert len(asked.dear_runs) < asked.exporter.stats.scrapes
    finally:
        for run in runs.values():
            await run.exporter.close()
