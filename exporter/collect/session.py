"""A collector's run on one database's connection: its deadline, its limits, its
predicates, its prepared statement, its rows streamed into samples, and how it ended
(B11–B13, D1, D9, D10, issue 22).

:class:`Session` remembers what the exporter set up on the connection's session (the
limits in force, the statements prepared) so that most collectors cost one round trip;
``Server`` owns the connection and calls :meth:`Session.run` for each collector.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass

import psycopg
from psycopg import errors as pgerrors

from exporter.collect import probed, topn
from exporter.collect.budget import Budget, RequestEnded, deadline, until_request_ends
from exporter.collect.cache import Entry, Outcome
from exporter.collect.runtime import CollectorRuntime
from exporter.config.definitions import Collector, Predicate
from exporter.errors import CollectorError, TooManySeriesError
from exporter.expose.exposition import Family
from exporter.expose.samples import SampleBuilder
from exporter.pg import loaders, postgres
from exporter.pg.limits import Limits, limits_sql, session_read_only, session_sql
from exporter.pg.preflight import ServerFacts
from exporter.pg.prepared import Prepared, deallocate_all, plan_memory, preparable, prepare

log = logging.getLogger(__name__)

Conn = psycopg.AsyncConnection[tuple[object, ...]]
Cursor = psycopg.AsyncCursor[tuple[object, ...]]
RawCursor = psycopg.AsyncRawCursor[tuple[object, ...]]
Batches = AsyncGenerator[postgres.Batch, None]


class _Skipped(enum.Enum):
    SKIPPED = "skipped"


SKIPPED = _Skipped.SKIPPED  # a predicate said no


@dataclass(frozen=True, slots=True)
class Place:
    """Where one collector runs: the database's connection and what its preflight read,
    its name for labels and logs, whether it runs fenced in a rolled-back transaction of
    its own (it may reach a tenant's code, issue 36), and how to close a connection the
    run left unusable (D7)."""

    conn: Conn | None
    facts: ServerFacts | None
    datname: str
    fenced: bool
    disconnect: Callable[[], Awaitable[None]]


class Session:
    """What the collectors set up on one database's connection, and the SQL they run."""

    def __init__(
        self,
        *,
        pgbouncer: bool,
        const_labels: tuple[tuple[str, str], ...],
        max_series: int,
        clock: Callable[[], float],
    ) -> None:
        self.pgbouncer = pgbouncer  # the target is pgBouncer's admin console (D4)
        self.const_labels = const_labels
        self.max_series = max_series
        self.clock = clock
        # The collector limits in force on that connection's session (issue 22).
        self.limits: tuple[Conn, Limits] | None = None
        self.prepared: Prepared | None = None  # the collector queries it has prepared
        self.plan_bytes: int | None = None  # their plans' memory in the backend, last read
        self.cursor: tuple[Conn, Cursor] | None = None  # reused while the connection lives
        self.raw_cursor: tuple[Conn, RawCursor] | None = None  # for queries with $1 (a probe's)

    def _cursor(self, conn: Conn) -> Cursor:
        """The connection's one cursor, reused by every collector: a cursor per collector
        was a few per cent of the exporter's CPU in an uncached pass (issue 22)."""
        held = self.cursor
        if held is None or held[0] is not conn:
            held = self.cursor = (conn, conn.cursor())
            loaders.install(held[1])  # cells read as the Go exporter reads them (issue 30)
        return held[1]

    def forget_limits(self) -> None:
        """Send every limit again before the next collector."""
        self.limits = None

    @property
    def prepared_count(self) -> int:
        """Statements prepared on the connection now."""
        return len(self.prepared.names) if self.prepared is not None else 0

    async def read_plan_memory(self, conn: Conn) -> None:
        """Read what the prepared plans hold in the backend (issue 31): a statement of its
        own, run by the server when it searches the path again (once a minute)."""
        held = self.prepared
        if held is None or held.connection is not conn or not held.names:
            self.plan_bytes = None
            return
        self.plan_bytes = await plan_memory(self._cursor(conn))

    def reloaded(self) -> None:
        """The definitions changed: what was prepared is dropped on its next use."""
        if self.prepared is not None:
            self.prepared.obsolete = True

    async def run(self, place: Place, runtime: CollectorRuntime, budget: Budget) -> Entry:
        """Run one collector and build its families; never raises for collector failures."""
        collector = runtime.collector
        datname = place.datname
        start = self.clock()
        try:
            families, series, outcome = await self._execute(place, runtime, budget)
            error = ""
        except RequestEnded as ended:
            families, series, outcome = (), 0, Outcome.CANCELLED
            error = f"unbounded collector {collector.key} cancelled: {ended}"
        except (TimeoutError, pgerrors.QueryCanceled, pgerrors.LockNotAvailable) as exc:
            families, series = (), 0
            outcome, error = Outcome.TIMEOUT, timeout_message(collector, exc)
        except TooManySeriesError as exc:
            families, series, outcome, error = (), 0, Outcome.TOO_MANY_SERIES, str(exc)
        except (psycopg.Error, CollectorError) as exc:
            families, series, outcome = (), 0, Outcome.ERROR
            error = f"collector {collector.key} on {datname}: {exc}"
        except Exception as exc:  # a fault of ours in this collector's rows: its run alone fails
            families, series, outcome = (), 0, Outcome.ERROR
            error = (
                f"collector {collector.key} on {datname}: internal error "
                f"{type(exc).__name__}: {exc} (a bug of the exporter's; please report it)"
            )
            log.error("collector failed on a fault of the exporter's", exc_info=exc,
                      extra={"collector": collector.key, "datname": datname})  # fmt: skip
        duration = self.clock() - start
        where = {"collector": collector.key, "datname": datname}
        if outcome is Outcome.CANCELLED:
            log.info(error, extra=where)
        elif outcome.failed:
            fields = {"outcome": outcome.value, "duration": round(duration, 4)}
            log.warning("collector failed: %s", error, extra=where | fields)
        return Entry(families, outcome, self.clock(), duration, series, error)

    async def _execute(
        self, place: Place, runtime: CollectorRuntime, budget: Budget
    ) -> tuple[tuple[Family, ...], int, Outcome]:
        collector, conn, facts, datname = runtime.collector, place.conn, place.facts, place.datname
        if conn is None:
            raise psycopg.OperationalError(f"no connection to {datname}")
        assert facts is not None
        try:
            if collector.bounded:
                # Its own deadline only: it finishes even if its request ends (B11).
                async with deadline(self.client_deadline(collector)):
                    builder = await self.query(conn, runtime, facts, datname, place.fenced)
            else:  # nothing else bounds it, so it ends with its request (B12)
                builder = await until_request_ends(
                    self.query(conn, runtime, facts, datname, place.fenced), budget
                )
        finally:
            if not await postgres.settle(conn):  # ROLLBACK of a transaction of ours
                await place.disconnect()
        if builder is SKIPPED:
            return (), 0, Outcome.SKIPPED
        if builder is None:  # an empty result: nothing to publish
            return (), 0, Outcome.OK
        for warning in builder.warnings:
            log.warning(warning, extra={"collector": collector.key, "datname": datname})
        return builder.finish(), builder.series, Outcome.OK

    def client_deadline(self, collector: Collector) -> float | None:
        """Seconds of the client-side deadline; the server-side limits mirror it (D1)."""
        return collector.timeout

    async def query(
        self,
        conn: Conn,
        runtime: CollectorRuntime,
        facts: ServerFacts,
        datname: str,
        fenced: bool = False,
    ) -> SampleBuilder | _Skipped | None:
        """Predicates then the main query, read only under the collector's limits (B13, D1).

        Rows are converted as they stream in, so a result over the series cap is
        cancelled in the server instead of being read whole (D9). None: no rows.
        """
        collector = runtime.collector
        cur = self._cursor(conn)
        session = False
        if not self.pgbouncer:  # the console has no transactions or SET (D4)
            session = await self._limit(conn, cur, collector, facts, fenced=fenced)
        for predicate in collector.predicates:
            if not await self._predicate(cur, runtime, predicate):
                return SKIPPED
        if session and collector.predicates:
            self._check_read_only(conn, collector)  # a predicate may have turned it off
        if self.pgbouncer:  # no probe here: loading refuses one on a pgbouncer branch
            return await self._build(
                collector, postgres.console_batches(cur, collector.query), runtime
            )
        if collector.top is not None and collector.top.probe is not None:
            return await self._probed(conn, cur, runtime)
        query = collector.query
        text = await self._statement(conn, cur, collector, datname) if session else query
        try:
            return await self._build(collector, postgres.stream_batches(cur, text), runtime)
        except (pgerrors.InvalidSqlStatementName, pgerrors.FeatureNotSupported) as exc:
            if text == collector.query or not self._forget_statement(text, exc):
                raise
        # The prepared statement is gone or its plan no longer fits: run it as text.
        return await self._build(collector, postgres.stream_batches(cur, collector.query), runtime)

    async def _probed(
        self, conn: Conn, cur: Cursor, runtime: CollectorRuntime
    ) -> SampleBuilder | None:
        """A ``top`` collector with a probe (issue 38): the probe lists every key, the
        ranking names some, and the query reads those alone (``$1``). Neither is prepared:
        the query has a parameter, and the probe's plan is not where its time goes."""
        collector = runtime.collector
        top = collector.top
        assert top is not None
        assert top.probe is not None
        cap = collector.max_series or self.max_series
        # One statement by the extended protocol, as any query of a collector (D2). As
        # text: the arrays come as PostgreSQL writes them, read only when they changed.
        names: Sequence[str] = ()
        rows: list[tuple[object, ...]] = []
        async with aclosing(postgres.stream_batches(cur, top.probe)) as batches:
            async for columns, _, batch in batches:
                names = columns
                rows.extend(batch)  # a row per group: as many as databases at most
                if len(rows) > cap:
                    raise TooManySeriesError(
                        f"collector {collector.key}: its top probe returned more than {cap} "
                        "rows; nothing is published. It must return one row per group"
                    )
        listed = probed.read_probe(runtime, names, rows, self.clock(), cap) if rows else None
        if listed is None:
            return None
        raw = self._raw_cursor(conn)
        keys = (probed.keys_literal(listed.named),)
        if listed.named:
            batches = postgres.stream_batches(raw, collector.query, keys)
        else:  # none named yet (a first run): its columns alone, for the remainders
            batches = postgres.described(raw, collector.query, keys)
        return await self._build(collector, probed.accounted(runtime, listed, batches, cap))

    def _raw_cursor(self, conn: Conn) -> RawCursor:
        """The connection's cursor for queries that take ``$1`` (a probed collector's)."""
        held = self.raw_cursor
        if held is None or held[0] is not conn:
            held = self.raw_cursor = (conn, psycopg.AsyncRawCursor(conn))
            loaders.install(held[1])
        return held[1]

    async def _build(
        self, collector: Collector, rows: Batches, runtime: CollectorRuntime | None = None
    ) -> SampleBuilder | None:
        """Samples from the batches of ``rows``, stopping at the series cap (D9); a ``top``
        collector's rows ranked first, its busiest keys named (issue 38)."""
        builder: SampleBuilder | None = None
        cap = collector.max_series or self.max_series
        if runtime is not None and collector.top is not None:
            rows = topn.ranked(runtime, rows, self.clock, cap)
        async with aclosing(rows) as batches:
            async for names, types, batch in batches:
                if builder is None:
                    builder = SampleBuilder(collector, names, self.const_labels, cap, types)
                builder.add_rows(batch)
        return builder

    async def _limit(
        self, conn: Conn, cur: Cursor, collector: Collector, facts: ServerFacts, *, fenced: bool
    ) -> bool:
        """Put the collector's limits in force (D1): as session settings over the guards
        given at login, sent only where they differ from the last collector's, so that
        most collectors cost one round trip (issue 22); else in a read-only transaction of
        the collector's own with every guard local to it, rolled back after (issue 36):
        where the connection was not proven direct and holding the guards (a pooler would
        hand our session settings to an application), and for a collector that may reach
        a tenant's code (``fenced``). True when the limits are session settings."""
        limits = Limits.of(collector.timeout, facts.guards)
        read_only = session_read_only(conn)
        if read_only is None or facts.own_transaction or fenced:
            await postgres.send_limits(cur, limits_sql(limits))
            return False
        held = self.limits
        # All again on a connection not yet set up, or whose read-only default a
        # collector's SQL turned off (the server reports that change at once).
        same = held is not None and held[0] is conn and read_only
        previous = held[1] if held is not None and same else None
        login = postgres.login_settings(conn) if previous is None else frozenset()
        sql = session_sql(limits, previous, login)
        if sql:
            self.limits = None  # unknown until the server has applied the whole list
            await postgres.send_limits(cur, sql)
        self.limits = (conn, limits)
        self._check_read_only(conn, collector)
        return True

    def _check_read_only(self, conn: Conn, collector: Collector) -> None:
        """Believe the read-only default only when the server reports it on (issue 29):
        a ``set_config`` of somebody else's, or a predicate that turned it off, would
        otherwise let the collector's query write."""
        if session_read_only(conn) is not True:
            self.limits = None
            raise CollectorError(
                f"collector {collector.key} not run: the server reports its session's "
                "read-only default off after the exporter set it on"
            )

    async def _statement(self, conn: Conn, cur: Cursor, collector: Collector, datname: str) -> str:
        """What to send for the collector's query on a session-limits connection: ``EXECUTE``
        of the query prepared on this connection from its second run on (issue 22), else
        its text."""
        form = preparable(collector.query, collector.key)
        if form is None:
            return collector.query
        name, statement = form
        held = self.prepared
        if held is None or held.connection is not conn:
            held = self.prepared = Prepared(conn)
        if held.obsolete:  # a reload left statements nobody runs: drop them all, once
            await deallocate_all(cur)
            held = self.prepared = Prepared(conn)
        if held.due(name):
            if await prepare(cur, name, statement):
                held.names.add(name)
            else:
                held.refused.add(name)
                log.info(
                    "collector query runs as text: PostgreSQL would not prepare it",
                    extra={"collector": collector.key, "datname": datname},
                )
        return f"EXECUTE {name}" if name in held.names else collector.query

    def _forget_statement(self, text: str, exc: psycopg.Error) -> bool:
        """Forget a prepared statement that failed for being one; True when it did: gone
        from the session (26000: a collector's own DEALLOCATE) or planned for a result
        that no longer fits (0A000: a view or table changed its columns under it), which
        then runs as text on this connection."""
        held = self.prepared
        if held is None:
            return False
        if isinstance(exc, pgerrors.InvalidSqlStatementName):
            self.prepared = None  # start over: what else was prepared may be gone too
        else:
            held.refuse(text.removeprefix("EXECUTE "))
        return True

    async def _predicate(self, cur: Cursor, runtime: CollectorRuntime, p: Predicate) -> bool:
        """The predicate's answer: cached for its TTL (D17), else asked now."""
        cached = runtime.answer(p, self.clock())
        if cached is not None:
            return cached
        value = await postgres.run_predicate(cur, p, console=self.pgbouncer)
        runtime.remember(p, value, self.clock())
        return value


def timeout_message(collector: Collector, exc: BaseException) -> str:
    """What a collector that ran out of time (or waited too long for a lock) tells."""
    limit = f"{collector.timeout:g}s" if collector.timeout is not None else "its server limit"
    if isinstance(exc, pgerrors.LockNotAvailable):
        return (
            f"collector {collector.key} waited too long for a lock held by another session "
            "(lock_timeout); it gave up rather than queue behind it"
        )
    where = "server-side limit" if isinstance(exc, pgerrors.QueryCanceled) else "deadline"
    return f"collector {collector.key} exceeded its timeout of {limit} ({where}); " + (
        "raise its timeout or make the query cheaper"
    )
