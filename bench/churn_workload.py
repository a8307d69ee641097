"""The moving statement workload of ``bench.churn`` (issue 38).

An application role runs ``shapes`` distinct statements (``bench.bigdb_build``'s: a
table each, one more predicate per lap over the tables, so each is its own query ID)
at ``rate`` calls a second. The ``hot`` shapes of the moment take ``hot_share`` of the
calls and move to the next ``hot`` shapes every ``move`` seconds; the others get the
rest in turn, a trickle that keeps them in ``pg_stat_statements``. From ``heavy_at``
seconds on, a second session runs one costlier statement, paced so that it holds
``heavy_share`` of the execution time of the whole server since it began (the
statements of the exporters and of this pacing included).

The shape of each call and the heavy hitter's allowance are plain functions; the
threads only send what they say.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
from psycopg.rows import TupleRow

from bench.bigdb_build import statement_sql, table_sql

DATABASE = "churn"
APP = "churn_app"  # not the bootstrap superuser, whose statements the Go config leaves out
HEAVY_TABLE = "churn_heavy"
HEAVY_ROWS = 5_000
HEAVY_SQL = f"SELECT count(DISTINCT v), max(id) FROM {HEAVY_TABLE} WHERE id > %s"
TICK = 0.1  # seconds between the application's batches
PACE = 2.0  # seconds between the heavy hitter's readings of the execution time


@dataclass(frozen=True, slots=True)
class Plan:
    """What the workload runs; times in seconds from its start."""

    shapes: int = 4000
    tables: int = 200
    rows: int = 4000
    hot: int = 200
    hot_share: float = 0.9
    move: float = 60.0
    rate: float = 300.0
    heavy_at: float = 240.0
    heavy_share: float = 0.1


def hot_start(plan: Plan, elapsed: float) -> int:
    """The first shape of the hot set ``elapsed`` seconds in: it moves by ``hot`` shapes
    every ``move`` seconds, wrapping around."""
    return (int(elapsed // plan.move) * plan.hot) % plan.shapes


def shape_of(plan: Plan, call: int, elapsed: float) -> int:
    """The shape of the ``call``-th call: ``hot_share`` of calls cycle over the hot set,
    the rest over every other shape in turn."""
    per_mille = round((1.0 - plan.hot_share) * 1000)  # in integers: no rounding drift
    colds = call * per_mille // 1000
    start = hot_start(plan, elapsed)
    if (call + 1) * per_mille // 1000 > colds and plan.shapes > plan.hot:
        return (start + plan.hot + colds % (plan.shapes - plan.hot)) % plan.shapes
    return (start + (call - colds) % plan.hot) % plan.shapes


def heavy_allowance(heavy_ms: float, all_ms: float, share: float, ahead_ms: float = 0.0) -> float:
    """Milliseconds the heavy hitter may run now to hold ``share`` of the execution time
    since it began, ``all_ms`` (its own ``heavy_ms`` included), once the others have run
    ``ahead_ms`` more; 0 when it is ahead."""
    return max(0.0, (share * (all_ms + ahead_ms) - heavy_ms) / (1.0 - share))


def setup_sql(plan: Plan) -> str:
    """The application's tables (``t0`` …) and the heavy hitter's, analysed."""
    tables = "".join(table_sql(n, plan.rows) for n in range(plan.tables))
    heavy = (f"CREATE TABLE {HEAVY_TABLE} (id int PRIMARY KEY, v text);"
             f" INSERT INTO {HEAVY_TABLE} SELECT g, md5(g::text)"
             f" FROM generate_series(1, {HEAVY_ROWS}) AS g;")  # fmt: skip
    return tables + heavy + "ANALYZE;"


def run_every_shape(dsn: str, plan: Plan) -> None:
    """Each shape once, pipelined: they all exist before the window opens."""
    with psycopg.connect(dsn, autocommit=True) as conn, conn.pipeline() as pipeline:
        for k in range(plan.shapes):
            _send(conn, statement_sql(k, plan.tables), k)
            if k % 100 == 99:
                pipeline.sync()


def _send(conn: psycopg.Connection[TupleRow], sql: str, k: int) -> None:
    conn.execute(sql.encode(), [k % 7] * sql.count("%s"))


class Workload:
    """The application and the heavy hitter, each a thread with its own session, from
    ``start()`` until ``stop()``."""

    def __init__(self, plan: Plan, app_dsn: str, admin_dsn: str) -> None:
        self.plan = plan
        self._app_dsn, self._admin_dsn = app_dsn, admin_dsn
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._guard(f), daemon=True)
                         for f in (self._application, self._heavy)]  # fmt: skip
        self._errors: list[BaseException] = []
        self.started = 0.0  # time.monotonic() at start
        self.calls = 0
        self.heavy_started: float | None = None  # monotonic, its first call
        self.heavy_calls = 0
        self.heavy_base_ms = 0.0  # every statement's execution time when it began
        self.heavy_end = (0.0, 0.0)  # (every statement's, its own) when it ended
        self.heavy_queryid: str | None = None

    def start(self) -> None:
        """Begin both sessions' work now."""
        self.started = time.monotonic()
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """End both sessions and wait for them; raise what failed in either."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)
        if self._errors:
            raise RuntimeError(f"the workload failed: {self._errors[0]!r}") from self._errors[0]

    def _guard(self, body: Callable[[], None]) -> Callable[[], None]:
        def guarded() -> None:
            try:
                body()
            except BaseException as exc:  # reported by stop(), in the main thread
                self._errors.append(exc)

        return guarded

    def _application(self) -> None:
        """``rate`` calls a second in batches every TICK, each batch one pipeline sync."""
        plan = self.plan
        with psycopg.connect(self._app_dsn, autocommit=True) as conn:
            while not self._stop.wait(TICK):
                elapsed = time.monotonic() - self.started
                due = int(elapsed * plan.rate) - self.calls
                with conn.pipeline():
                    for call in range(self.calls, self.calls + due):
                        k = shape_of(plan, call, elapsed)
                        _send(conn, statement_sql(k, plan.tables), k)
                self.calls += max(due, 0)

    def _heavy(self) -> None:
        """From ``heavy_at`` on: run the costly statement whenever it is behind its share."""
        if self._stop.wait(self.plan.heavy_at):
            return
        with (psycopg.connect(self._app_dsn, autocommit=True) as app,
              psycopg.connect(self._admin_dsn, autocommit=True) as admin):  # fmt: skip
            base = self.heavy_base_ms = _exec_ms(admin, None)[0]
            self.heavy_started = time.monotonic()
            self._heavy_call(app)
            self.heavy_queryid = _queryid_of(admin, HEAVY_TABLE)
            while not self._stop.is_set():
                total, heavy = self.heavy_end = _exec_ms(admin, self.heavy_queryid)
                # The others' rate so far, over the next PACE: no lag of a reading behind.
                ahead = (total - base - heavy) * PACE / (time.monotonic() - self.heavy_started)
                allowance = heavy_allowance(heavy, total - base, self.plan.heavy_share, ahead)
                spent = 0.0
                while spent < allowance and not self._stop.is_set():
                    spent += self._heavy_call(app)
                self._stop.wait(PACE)
            self.heavy_end = _exec_ms(admin, self.heavy_queryid)

    def _heavy_call(self, app: psycopg.Connection[TupleRow]) -> float:
        """One call of the heavy statement; its wall time in ms."""
        began = time.perf_counter()
        app.execute(HEAVY_SQL.encode(), [self.heavy_calls % 1000])
        self.heavy_calls += 1
        return (time.perf_counter() - began) * 1000


def _exec_ms(admin: psycopg.Connection[TupleRow], queryid: str | None) -> tuple[float, float]:
    """(every statement's, one query ID's) total execution time in ms so far."""
    row = admin.execute(
        b"SELECT coalesce(sum(total_exec_time), 0),"
        b" coalesce(sum(total_exec_time) FILTER (WHERE queryid::text = %s), 0)"
        b" FROM pg_stat_statements(false)",
        [queryid or ""],
    ).fetchone()
    assert row is not None
    return float(row[0]), float(row[1])


def _queryid_of(admin: psycopg.Connection[TupleRow], table: str) -> str:
    """The query ID of the application's statement on ``table``."""
    row = admin.execute(
        f"SELECT queryid::text FROM pg_stat_statements(true) WHERE userid = '{APP}'::regrole"
        f" AND query LIKE '%{table}%' LIMIT 1".encode()
    ).fetchone()
    if row is None:
        raise RuntimeError(f"no statement on {table} in pg_stat_statements")
    return str(row[0])
