"""The bounded-scrape contract (B1–B22) on a real PostgreSQL, with real sockets.

Every test synchronises on observable state: the query's backend in
pg_stat_activity, the server's statement log, the exporter's admission and lock
state. Sleeps appear only as the polling interval of a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import time
import uuid

import pytest

from exporter.collect.cache import Outcome
from exporter.web.appstate import STATE
from rigs.localpg import LocalCluster
from tests.fixtures.helpers import (
    exporter_backends,
    exporter_running,
    statement_calls,
    value,
)
from tests.fixtures.polling import poll, poll_async
from tests.fixtures.rawhttp import RawClient, Served, Start, get

pytestmark = pytest.mark.concurrency


def _marker() -> str:
    return f"m{uuid.uuid4().hex[:10]}"


def _sleeper(
    key: str,
    marker: str,
    seconds: float,
    *,
    timeout: float,
    ttl: float,
    fatal: bool = False,
    priority: int = 100,
) -> str:
    """A collector whose query takes ``seconds`` and is recognisable by ``marker``."""
    return f"""
    {key}:
      query: SELECT 1 AS {marker} FROM pg_sleep({seconds})
      ttl: {ttl}
      timeout: {timeout}
      fatal: {str(fatal).lower()}
      priority: {priority}
      metrics:
        - {marker}: {{usage: GAUGE, description: probe}}
    """


def _entry_outcome(served: Served, key: str) -> Outcome | None:
    runtime = served.app[STATE].exporter.main.runtimes.get(key)
    return runtime.outcome if runtime else None


def _admitted(served: Served) -> int:
    return served.app[STATE].admission.active


async def test_overlapping_scrapes_share_one_execution_and_third_is_refused(
    pg: LocalCluster, start: Start
) -> None:
    """Two overlapping scrapes both answer 200 from one execution (B4–B6); a third gets 503
    at once and runs no SQL (B1, D12)."""
    m = _marker()
    served = await start(pg, _sleeper("slow", m, 0.8, timeout=5, ttl=60))
    first = await RawClient.send(served.port)
    await poll_async(lambda: exporter_running(pg, m), "the first pass to run the query")
    second = await RawClient.send(served.port)
    await poll(lambda: _admitted(served) == 2, "the second request to be admitted")
    started = time.monotonic()
    third = await get(served.port)
    assert third.status == 503
    assert time.monotonic() - started < 0.5  # answered at once, not after the pass
    assert served.app[STATE].exporter.lock.locked(), "answered while the pass still ran"
    a, b = await first.response(), await second.response()
    assert (a.status, b.status) == (200, 200)
    assert value(a.text, f"slow_{m}") == 1
    assert value(b.text, f"slow_{m}") == 1
    assert statement_calls(pg, m) == 1
    assert value(b.text, "pg_exporter_last_pass_shared") == 1
    assert value(b.text, "pg_exporter_requests_rejected_total") == 1


async def test_explain_burst_neither_delays_nor_shares_a_scrape(
    pg18: LocalCluster, start: Start
) -> None:
    """Twenty /explain requests at once take no slot and no collection lock: a scrape sent
    right behind them is admitted, waits for no pass and is not counted as shared (B1, B4)."""
    m = _marker()
    served = await start(pg18, _sleeper("quick", m, 0, timeout=5, ttl=0))
    admission = served.app[STATE].admission
    assert (await get(served.port)).status == 200  # the first pass plans
    waited_before = admission.wait_seconds
    explains = [await RawClient.send(served.port, "/explain") for _ in range(20)]
    scrape = await (await RawClient.send(served.port)).response()
    assert scrape.status == 200
    assert value(scrape.text, "pg_exporter_last_pass_shared") == 0
    assert value(scrape.text, "pg_exporter_requests_rejected_total") == 0
    assert admission.wait_seconds - waited_before < 0.05
    for explain in explains:
        answer = await explain.response()
        assert answer.status == 200
        assert "quick (name quick)" in answer.text


async def test_waiter_that_hangs_up_frees_its_slot(pg18: LocalCluster, start: Start) -> None:
    """A request waiting for the pass stops waiting when its client leaves, releasing its
    slot, and runs no SQL (B3, B5)."""
    m = _marker()
    served = await start(pg18, _sleeper("slow", m, 3, timeout=10, ttl=60))
    lock = served.app[STATE].exporter.lock
    first = await RawClient.send(served.port)
    await poll_async(lambda: exporter_running(pg18, m), "the first pass to run the query")
    waiter = await RawClient.send(served.port)
    await poll(lambda: _admitted(served) == 2, "the waiter to be admitted")
    waiter.hang_up()
    await poll(lambda: _admitted(served) == 1, "the waiter's slot to be released")
    assert lock.locked()  # released while the first pass still runs: it stopped waiting
    third = await RawClient.send(served.port)  # admitted: a slot is free again
    await poll(lambda: _admitted(served) == 2, "the third request to be admitted")
    assert (await first.response()).status == 200
    late = await third.response()
    assert late.status == 200
    assert statement_calls(pg18, m) == 1
    assert value(late.text, "pg_exporter_requests_interrupted_total", reason="client") == 1


async def test_short_budget_answers_503_after_bounded_collector_then_serves_cache(
    pg: LocalCluster, start: Start
) -> None:
    """With a 0.3 s budget against a 0.8 s bounded collector the answer is 503 once the
    collector finished (B7, B11, B21); the next scrape serves its cached result (B6)."""
    m = _marker()
    served = await start(pg, _sleeper("slow", m, 0.8, timeout=5, ttl=60))
    started = time.monotonic()
    short = await get(served.port, **{"X-Prometheus-Scrape-Timeout-Seconds": "0.3"})
    elapsed = time.monotonic() - started
    assert short.status == 503
    assert 0.7 <= elapsed < 4.0, elapsed  # waited for the collector, not for its 5 s timeout
    assert _entry_outcome(served, "slow") is Outcome.OK
    after = await get(served.port)
    assert after.status == 200
    assert value(after.text, f"slow_{m}") == 1
    assert statement_calls(pg, m) == 1
    assert value(after.text, "pg_exporter_scrape_error_count") == 0


async def test_no_collector_starts_once_budget_is_spent(pg18: LocalCluster, start: Start) -> None:
    """After the budget runs out the pass starts no further collector (B10)."""
    m1, m2 = _marker(), _marker()
    text = _sleeper("first", m1, 0.6, timeout=5, ttl=60, priority=1) + _sleeper(
        "second", m2, 0, timeout=5, ttl=60, priority=2
    )
    served = await start(pg18, text)
    short = await get(served.port, **{"X-Prometheus-Scrape-Timeout-Seconds": "0.2"})
    assert short.status == 503
    assert statement_calls(pg18, m1) == 1
    assert statement_calls(pg18, m2) == 0


@pytest.mark.parametrize("header", ["", "abc", "0", "-1", "NaN", "inf", "1e999", "0x1"])
async def test_invalid_budget_headers_are_ignored(
    pg18: LocalCluster, start: Start, header: str
) -> None:
    """Invalid X-Prometheus-Scrape-Timeout-Seconds values fall back to the default (B7)."""
    m = _marker()
    served = await start(pg18, _sleeper("quick", m, 0.05, timeout=5, ttl=0))
    response = await get(served.port, **{"X-Prometheus-Scrape-Timeout-Seconds": header})
    assert response.status == 200
    assert value(response.text, f"quick_{m}") == 1


async def test_scrapes_sharing_a_pass_each_get_their_own_encoding(
    pg: LocalCluster, start: Start
) -> None:
    """Two scrapes served by one pass, one asking for OpenMetrics with gzip and one for
    plain text, each get what they asked for: nothing of a request is kept on the shared
    pass (B22)."""
    m = _marker()
    served = await start(pg, _sleeper("slow", m, 0.8, timeout=5, ttl=60), openmetrics=True)
    rich = await RawClient.send(
        served.port,
        headers={"Accept": "application/openmetrics-text; version=1.0.0",
                 "Accept-Encoding": "gzip"},
    )  # fmt: skip
    await poll_async(lambda: exporter_running(pg, m), "the pass to run the query")
    plain = await RawClient.send(served.port)
    await poll(lambda: _admitted(served) == 2, "the second request to be admitted")
    a, b = await rich.response(), await plain.response()
    assert (a.status, b.status) == (200, 200)
    assert statement_calls(pg, m) == 1
    assert a.headers["Content-Encoding"] == "gzip"
    assert a.headers["Content-Type"].startswith("application/openmetrics-text")
    assert gzip.decompress(a.body).decode().endswith("# EOF\n")
    assert "Content-Encoding" not in b.headers
    assert b.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert value(b.text, f"slow_{m}") == 1


@pytest.mark.parametrize("fatal", [False, True])
async def test_hang_up_during_bounded_collector_completes_and_caches(
    pg: LocalCluster, start: Start, fatal: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A client leaving mid-collector does not stop it: it completes and is cached, error
    counters stay 0, pg_up stays 1 also for a fatal collector (B11, B17, B18)."""
    caplog.set_level(logging.INFO, logger="exporter")
    m = _marker()
    served = await start(pg, _sleeper("slow", m, 0.8, timeout=5, ttl=60, fatal=fatal))
    leaver = await RawClient.send(served.port)
    await poll_async(lambda: exporter_running(pg, m), "the collector to run")
    leaver.hang_up()
    await poll(lambda: _entry_outcome(served, "slow") is Outcome.OK, "the collector to finish")
    await poll(lambda: not served.app[STATE].exporter.lock.locked(), "the pass to end")
    after = await get(served.port)
    assert after.status == 200
    assert value(after.text, f"slow_{m}") == 1
    assert value(after.text, "pg_up") == 1
    assert value(after.text, "pg_exporter_scrape_error_count") == 0
    assert value(after.text, "pg_exporter_server_scrape_error_count", datname="postgres") == 0
    assert statement_calls(pg, m) == 1
    interrupted = [r for r in caplog.records if "interrupted" in r.getMessage()]
    assert len(interrupted) == 1
    assert interrupted[0].levelno == logging.INFO


async def test_hang_up_during_unbounded_fatal_collector_is_no_error(
    pg: LocalCluster, start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    """A fatal collector cancelled because its client left fails the database's round,
    yet neither the pass nor the database counts it as an error: it was interrupted (B18)."""
    caplog.set_level(logging.INFO, logger="exporter")
    m = _marker()
    served = await start(pg, _sleeper("doomed", m, 5, timeout=-1, ttl=60, fatal=True))
    leaver = await RawClient.send(served.port)
    await poll_async(lambda: exporter_running(pg, m), "the unbounded collector to run")
    leaver.hang_up()
    await poll(lambda: _entry_outcome(served, "doomed") is Outcome.CANCELLED, "the cancel")
    exporter = served.app[STATE].exporter
    await poll(lambda: not exporter.lock.locked(), "the pass to end")
    assert exporter.stats.errors == 0  # pg_exporter_scrape_error_count
    assert exporter.main.error_count == 0  # pg_exporter_server_scrape_error_count
    interrupted = [r for r in caplog.records if "interrupted" in r.getMessage()]
    assert len(interrupted) == 1
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_hang_up_cancels_unbounded_collector_in_postgres(
    pg: LocalCluster, start: Start
) -> None:
    """An unbounded collector is cancelled with its request (57014), leaves no busy backend,
    stays missing within its TTL across hang-ups and is tried again after it (B12, B14)."""
    m = _marker()
    served = await start(pg, _sleeper("forever", m, 2, timeout=-1, ttl=2))
    leaver = await RawClient.send(served.port)
    await poll_async(lambda: exporter_running(pg, m), "the unbounded collector to run")
    leaver.hang_up()
    await poll(lambda: _entry_outcome(served, "forever") is Outcome.CANCELLED, "the cancel")
    busy = "state IN ('active', 'idle in transaction', 'idle in transaction (aborted)')"
    await poll_async(lambda: exporter_backends(pg, busy) == 0, "no busy backend", within=10)
    # This query's own cancel: the log's STATEMENT line carries the SQLSTATE and the marker.
    assert any("57014" in line and m in line for line in pg.log_text().splitlines())
    for _ in range(2):  # within the TTL: served without it, not re-run (B14)
        again = await get(served.port)
        assert again.status == 200
        assert f"forever_{m}" not in again.text
    assert statement_calls(pg, m) == 1
    server = served.app[STATE].exporter.main
    entry = server.runtimes["forever"].entry
    assert entry is not None
    await poll(lambda: server.clock() - entry.finished_at >= 2, "the TTL")
    retried = await get(served.port)
    assert retried.status == 200
    assert value(retried.text, f"forever_{m}") == 1
    assert statement_calls(pg, m) == 2
    assert value(retried.text, "pg_exporter_scrape_error_count") == 0


async def test_slow_reader_holds_its_slot_but_not_the_pass(
    pg18: LocalCluster, start: Start
) -> None:
    """A client that stops reading a large response keeps its slot, not the collection lock:
    the next scrape's pass runs (B20); slots return after stalled and aborted responses
    (B2, B3)."""
    text = """
    big:
      query: >-
        SELECT i AS k, repeat('x', 80) AS pad, i AS v FROM generate_series(1, 90000) i
      ttl: 0
      timeout: 20
      metrics:
        - k: {usage: LABEL, description: key}
        - pad: {usage: LABEL, description: padding to make the answer large}
        - v: {usage: GAUGE, description: value}
    """
    served = await start(pg18, text)
    exporter = served.app[STATE].exporter
    stalled = await RawClient.send(served.port, receive_buffer=4096)
    await poll(lambda: exporter.stats.scrapes == 1, "the stalled request's pass to end")
    await poll(lambda: not exporter.lock.locked(), "the lock to be released")
    assert _admitted(served) == 1  # still writing to the client that does not read
    other = await get(served.port)  # its pass runs although the first answer is stuck
    assert other.status == 200
    assert exporter.stats.scrapes == 2
    assert _admitted(served) == 1
    stalled.hang_up()
    await poll(lambda: _admitted(served) == 0, "the stalled slot to be released")
    assert (await get(served.port)).status == 200


async def test_budget_bounds_preflight_against_a_silent_server(
    pg18: LocalCluster, start: Start
) -> None:
    """Connecting runs inside the request's budget and is cancelled with it (B9)."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # accept, never answer

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        served = await start(
            pg18, _sleeper("quick", _marker(), 0, timeout=5, ttl=0),
            url=f"postgresql://postgres@127.0.0.1:{port}/postgres?sslmode=disable",
            connect_timeout=30.0,
        )  # fmt: skip
        started = time.monotonic()
        response = await get(served.port, **{"X-Prometheus-Scrape-Timeout-Seconds": "0.5"})
        assert response.status == 503
        assert time.monotonic() - started < 5.0  # the budget, not the 30 s connect timeout
        body = await get(served.port, **{"X-Prometheus-Scrape-Timeout-Seconds": "0.5"})
        assert body.status == 503  # and again: nothing was left hanging
    finally:
        server.close()


async def test_real_failures_still_count_when_not_interrupted(
    pg15: LocalCluster, start: Start
) -> None:
    """A fatal collector hitting its own timeout counts as a scrape error (B19)."""
    m = _marker()
    served = await start(pg15, _sleeper("fatal", m, 2, timeout=0.2, ttl=0, fatal=True))
    response = await get(served.port)
    assert response.status == 200
    assert value(response.text, "pg_up") == 0
    assert value(response.text, "pg_exporter_scrape_error_count") == 1
    assert value(response.text, "pg_exporter_server_scrape_error_count", datname="postgres") == 1
    assert (
        value(response.text, "pg_exporter_query_outcome_total", query="fatal", outcome="timeout")
        == 1
    )


async def test_budget_ending_during_predicate_still_runs_main_query(
    pg18: LocalCluster, start: Start
) -> None:
    """A request that ends while a bounded collector's predicate runs does not cut the
    collector between its predicate and its main query (B13, B11)."""
    m = _marker()
    text = f"""
    gated:
      query: SELECT 1 AS {m}
      ttl: 60
      timeout: 5
      predicate_queries:
        - {{name: slow_check, predicate_query: "SELECT pg_sleep(0.6) IS NOT NULL"}}
      metrics:
        - {m}: {{usage: GAUGE, description: probe}}
    """
    served = await start(pg18, text)
    short = await get(served.port, **{"X-Prometheus-Scrape-Timeout-Seconds": "0.2"})
    assert short.status == 503  # the budget ended during the predicate
    assert statement_calls(pg18, m) == 1  # yet the main query ran right after it
    after = await get(served.port)
    assert value(after.text, f"gated_{m}") == 1
    assert statement_calls(pg18, m) == 1  # and its result was cached


async def test_waiting_for_the_pass_spends_the_same_budget(
    pg18: LocalCluster, start: Start
) -> None:
    """A request waiting behind another's pass gives up when its own budget is spent, with
    503 and no SQL of its own (B5, B8)."""
    m = _marker()
    served = await start(pg18, _sleeper("slow", m, 2, timeout=5, ttl=0))
    first = await RawClient.send(served.port)
    await poll_async(lambda: exporter_running(pg18, m), "the first pass to run the query")
    started = time.monotonic()
    waiter = await get(served.port, **{"X-Prometheus-Scrape-Timeout-Seconds": "0.3"})
    waited = time.monotonic() - started
    assert waiter.status == 503
    assert waited < 1.5  # its own 0.3 s budget, not the 2 s pass ahead of it
    assert served.app[STATE].exporter.lock.locked(), "answered while the pass still ran"
    assert (await first.response()).status == 200
    assert statement_calls(pg18, m) == 1
