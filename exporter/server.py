"""One scraped database: its connection, plan, caches and statistics.

A ``Server`` owns at most one connection (D5), opened lazily and replaced after
it is lost (D8), and closed when the target's connection budget needs room for
another database (issue 13). Its collectors run one at a time in priority order, each under
its own deadline; results are published whole or not at all.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random as _random
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import NoReturn

import psycopg
from psycopg import errors as pgerrors

from exporter import postgres
from exporter.backoff import (
    DEFAULT_CEILING,
    PERIOD_JITTER,
    Backoff,
    Random,
    after_failure,
    ceiling_for,
    spread,
)
from exporter.breaker import NO_SHEDDING, PassTally, Shedding, distress_of, is_shed
from exporter.budget import Budget, Interruption, RequestEnded, deadline, until_request_ends
from exporter.cache import CollectorStats, Entry, Outcome, fresh_since, is_fresh
from exporter.connections import ConnectionBudget
from exporter.definitions import Collector, Definitions, Predicate
from exporter.errors import (
    CollectorError,
    FatalCollectorFailed,
    TooManySeriesError,
)
from exporter.exposition import Family
from exporter.planning import Plan, ServerFacts, make_plan
from exporter.prepared import Prepared, deallocate_all, preparable, prepare
from exporter.samples import SampleBuilder
from exporter.seriesbudget import Part
from exporter.target import database_of

log = logging.getLogger(__name__)

Conn = psycopg.AsyncConnection[tuple[object, ...]]


class _Skipped(enum.Enum):
    SKIPPED = "skipped"


SKIPPED = _Skipped.SKIPPED  # a predicate said no


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """What every database of one exporter shares."""

    url: str
    connect_timeout: float
    const_labels: tuple[tuple[str, str], ...]
    tags: tuple[str, ...]
    disable_cache: bool
    max_series: int
    pgbouncer: bool = False  # the target is pgBouncer's admin console (D4)
    backoff_ceiling: float = DEFAULT_CEILING  # seconds (D15)


@dataclass(slots=True)
class ServerResult:
    """What one database's part of a pass produced."""

    parts: list[Part] = field(default_factory=list)  # each collector's families, in run order
    error: str = ""  # connection/preflight or fatal collector failure
    interrupted: Interruption | None = None  # when the request stopped the walk
    tally: PassTally = field(default_factory=PassTally)  # for the breaker (D16)

    @property
    def families(self) -> list[Family]:
        """Every family, in run order."""
        return [family for part in self.parts for family in part.families]


class Server:
    """One database scraped by the exporter."""

    def __init__(
        self,
        datname: str | None,
        options: ServerOptions,
        definitions: Definitions,
        *,
        is_main: bool,
        clock: Callable[[], float] = time.monotonic,
        random: Random = _random.random,
        budget: ConnectionBudget | None = None,
    ) -> None:
        self.datname = datname  # None: whatever the URL names
        self.budget = budget or ConnectionBudget.unlimited()  # shared by the target's databases
        self.options = options
        self.definitions = definitions
        self.is_main = is_main
        self.clock = clock
        self.random = random  # back-off and predicate jitter (D15, D17)
        self.conn: Conn | None = None
        # The collector limits in force on that connection's session (issue 22).
        self.session: tuple[Conn, postgres.Limits] | None = None
        self.prepared: Prepared | None = None  # the collector queries it has prepared
        self.facts: ServerFacts | None = None
        self.databases: tuple[str, ...] = ()
        self.unnamed: tuple[str, ...] = ()  # databases discovery cannot name (SQL_ASCII)
        self.plan: Plan | None = None
        self.entries: dict[str, Entry] = {}
        # (collector, predicate) -> (answer, when asked, jittered ttl)
        self.predicates: dict[tuple[str, str], tuple[bool, float, float]] = {}
        self.stats: dict[str, CollectorStats] = {}
        self.backoffs: dict[str, Backoff] = {}  # collectors whose last run(s) failed (D15)
        self.shed: tuple[str, ...] = ()  # branch keys the breaker left out at the last pass
        self.up = False
        self.scrape_count = 0
        self.error_count = 0
        self.total_seconds = 0.0
        self.last_duration = 0.0

    @property
    def label(self) -> str:
        """The database name for labels and logs."""
        if self.facts is not None:
            return self.facts.datname
        return self.datname or database_of(self.options.url)

    async def prepare(self) -> None:
        """Connect if needed, read the server's facts, and plan when they changed."""
        if self.conn is None or self.conn.closed or self.conn.broken:
            await self.disconnect()
            conninfo = postgres.conninfo_for(
                self.options.url, self.datname, self.options.connect_timeout
            )
            await self.budget.make_room(self)  # least recently used first (issue 13)
            try:  # not at all while the server's refusal of our login stands (issue 25)
                self.conn = await self.budget.logins.connect(
                    self.datname,
                    lambda: postgres.connect(conninfo, self.options.connect_timeout),
                )
            except BaseException:  # failed, or cancelled with its request (B9)
                self.budget.cancel()
                raise
            self.budget.opened_for(self)
        else:
            self.budget.used(self)
        try:
            if self.options.pgbouncer:
                pre = await postgres.pgbouncer_preflight(self.conn)
            else:
                pre = await postgres.preflight(self.conn, is_main=self.is_main)
        except psycopg.Error:
            await self.disconnect()
            raise
        self.databases = pre.databases
        self._note_unnamed(pre.unnamed)
        # Facts are read on every pass and planning is pure and cheap, so any change
        # (an extension created, a schema dropped) is planned for at once.
        if self.plan is None or self.facts != pre.facts:
            self.plan = make_plan(self.definitions, pre.facts, self.options.tags)
            log.info(
                "planned %d collectors, skipped %d",
                len(self.plan.planned),
                len(self.plan.skipped),
                extra={"datname": pre.facts.datname, "version": pre.facts.version},
            )
        self._note_limits(pre.facts)
        self.facts = pre.facts

    def _note_limits(self, facts: ServerFacts) -> None:
        """Say once, per change, why collectors run in a transaction each (issue 22); the
        discovered databases share the main one's endpoint, and /explain shows each."""
        reason = facts.own_transaction
        if self.is_main and reason and (self.facts is None or self.facts.own_transaction != reason):
            log.info(
                "each collector runs in a read-only transaction of its own with SET LOCAL "
                "limits, not under session limits, because %s",
                reason,
                extra={"datname": facts.datname},
            )

    def _note_unnamed(self, unnamed: tuple[str, ...]) -> None:
        """Warn once per change about databases discovery cannot reach: their names are not
        UTF-8 (a SQL_ASCII server), and libpq takes a database name only as UTF-8 text."""
        if self.is_main and unnamed and unnamed != self.unnamed:
            log.warning(
                "databases whose names are not valid UTF-8 are left out of discovery (a "
                "connection cannot name them); rename them to scrape them: %s",
                ", ".join(unnamed),
                extra={"datname": self.label},
            )
        self.unnamed = unnamed

    async def disconnect(self) -> None:
        """Close the connection; the next pass opens a new one."""
        conn, self.conn = self.conn, None
        # Its place in the budget frees once the server has ended the backend.
        await self.budget.close(self, postgres.close_and_wait(conn))

    async def scrape(
        self, budget: Budget, shedding: Shedding = NO_SHEDDING, ready: asyncio.Event | None = None
    ) -> ServerResult:
        """Walk this database's planned collectors, serving fresh caches (B6, B10) and
        leaving out what ``shedding`` sheds (D16); ``ready`` is set once the preflight has
        read the server's facts, before the first collector."""
        start = self.clock()
        result = ServerResult()
        self.budget.busy(self, busy=True)  # its connection is not closed for another's
        try:
            result.interrupted = budget.interruption()
            if result.interrupted is None:
                await self._scrape_prepared(budget, result, shedding, ready)
        except (psycopg.Error, OSError) as exc:
            result.error = f"database {self.label or '?'}: {exc}"
            result.tally.distress = distress_of(exc)
            self.up = False
        except FatalCollectorFailed as exc:
            result.error = str(exc)
            result.parts.clear()
            self.up = False
        finally:
            self.budget.busy(self, busy=False)
        self.last_duration = self.clock() - start
        self.total_seconds += self.last_duration
        self.scrape_count += 1
        if result.error and result.interrupted is None:
            # A collector cut short because the request ended fails too; that is an
            # interrupted round, not an error (B18), as the pass itself decides.
            result.interrupted = budget.interruption()
        if result.error and result.interrupted is None:
            self.error_count += 1
        return result

    async def prepare_within(self, budget: Budget) -> None:
        """prepare(), cancelled when the request ends (B9); raises RequestEnded then."""
        try:
            await until_request_ends(self.prepare(), budget)
        except RequestEnded:
            await self.disconnect()  # cancelled mid-connect or mid-preflight: start clean
            raise

    async def _scrape_prepared(
        self, budget: Budget, result: ServerResult, shedding: Shedding, ready: asyncio.Event | None
    ) -> None:
        if self._needs_connection(shedding):
            try:
                await self.prepare_within(budget)  # B9
            except RequestEnded as ended:
                result.interrupted = ended.reason
                return
            self.up = True
        if ready is not None:
            ready.set()
        assert self.plan is not None
        cut = shedding.cut(self.plan.planned)
        try:
            for collector in self.plan.planned:
                result.interrupted = budget.interruption()  # B10
                if result.interrupted is not None:
                    return
                shed = is_shed(collector, cut)
                entry = await self.collect(collector, budget, result.tally, shed=shed)
                result.parts.append(Part(collector, entry.families))
        finally:  # what this pass shed, also when it stopped early (/stat, /explain)
            self.shed = tuple(result.tally.shed)

    def _needs_connection(self, shedding: Shedding) -> bool:
        """False for a discovered database that was up and has nothing to run: every
        collector is fresh in its cache, backing off or shed, so it is not connected at
        all and spends none of the connection budget (issue 13). The main database is
        always asked: its preflight says whether the target is up and what it holds."""
        if self.is_main or self.plan is None or not self.up:
            return True
        now = self.clock()
        cut = shedding.cut(self.plan.planned)
        return any(
            self._held_back(c, self.entries.get(c.key), now, shed=is_shed(c, cut)) is None
            for c in self.plan.planned
        )

    async def collect(
        self, collector: Collector, budget: Budget, tally: PassTally, *, shed: bool = False
    ) -> Entry:
        """The collector's fresh cached result, or a new one (raises FatalCollectorFailed).

        A failure is cached like a result (B14), so a fatal failure keeps the database
        down for the collector's TTL instead of being re-run by every scrape. A collector
        in back-off (D15) or shed (D16) runs nothing and publishes nothing.
        """
        stats = self.stats.setdefault(collector.key, CollectorStats())
        entry = self.entries.get(collector.key)
        now = self.clock()
        held = self._held_back(collector, entry, now, shed=shed)
        if held is Outcome.CACHED and entry is not None:
            stats.record(Outcome.CACHED)
        elif held is not None:
            stats.record(held)
            if held is Outcome.SHED:
                tally.shed.append(collector.key)
            return Entry((), held, now, 0.0)
        else:
            entry = await self.refresh(collector, budget)
            stats.record(entry.outcome, duration=entry.duration, series=entry.series)
            tally.executed += 1
            tally.timeouts += entry.outcome is Outcome.TIMEOUT
            lost = self.conn is None  # the connection died under this collector (D7, D8)
            self._remember(collector, entry, lost=lost)
            if lost:
                self._lost(collector, entry)
            self.entries[collector.key] = entry
            # Cancelled means the request ended: logged at INFO above, not an error (B18).
            if entry.outcome.failed and collector.fatal and entry.outcome is not Outcome.CANCELLED:
                log.error(
                    "fatal collector failed: %s",
                    entry.error,
                    extra={"collector": collector.key, "datname": self.label},
                )
        if entry.outcome.failed and collector.fatal:
            raise FatalCollectorFailed(
                f"fatal collector {collector.key} failed on {self.label}: {entry.error}"
            )
        return entry

    def _held_back(
        self, collector: Collector, entry: Entry | None, now: float, *, shed: bool
    ) -> Outcome | None:
        """Why the collector does not run now: CACHED within its TTL (B6, B14), BACKOFF
        while failures in a row make it wait (D15), SHED when the breaker left it out
        (D16); None when it runs."""
        if is_fresh(entry, collector.ttl, now, disable_cache=self.options.disable_cache):
            return Outcome.CACHED
        backoff = self.backoffs.get(collector.key)
        if backoff is not None and backoff.backing_off and now < backoff.retry_at:
            return Outcome.BACKOFF
        return Outcome.SHED if shed else None

    def _remember(self, collector: Collector, entry: Entry, *, lost: bool) -> None:
        """Count one more failure in a row, or clear the count after a success (D15).

        A run cut short with its request, or failed with its connection, is no verdict
        on the collector and changes nothing.
        """
        if entry.outcome is Outcome.CANCELLED or (lost and entry.outcome is Outcome.ERROR):
            return
        previous = self.backoffs.pop(collector.key, Backoff())
        where = {"collector": collector.key, "datname": self.label}
        if not entry.outcome.failed:
            if previous.backing_off:
                log.info("collector recovered after %d failures in a row", previous.failures,
                         extra=where)  # fmt: skip
            return
        ttl = 0.0 if self.options.disable_cache else collector.ttl
        ceiling = ceiling_for(collector, self.options.backoff_ceiling)
        backoff = after_failure(previous, entry.finished_at, ttl, ceiling, self.random)
        self.backoffs[collector.key] = backoff
        if backoff.backing_off and not previous.backing_off:
            log.warning(
                "collector backing off after %d failures in a row: next try in %.1fs, "
                "then up to twice as long after each failure, at most %gs",
                backoff.failures, backoff.wait, ceiling, extra=where,
            )  # fmt: skip

    def _lost(self, collector: Collector, entry: Entry) -> NoReturn:
        """Stop this database's pass: the collectors after this one have no connection.

        A plain error here is the dead connection's doing, not the collector's, so it is
        not cached: the collector runs again on the next pass, which reconnects. A timeout
        or a cancellation stays cached as usual (B14, D11).
        """
        if entry.outcome is not Outcome.ERROR:
            self.entries[collector.key] = entry
        raise psycopg.OperationalError(
            f"connection to {self.label} lost during collector {collector.key}: {entry.error}"
        )

    async def refresh(self, collector: Collector, budget: Budget) -> Entry:
        """Run one collector and build its families; never raises for collector failures."""
        start = self.clock()
        try:
            families, series, outcome = await self._execute(collector, budget)
            error = ""
        except RequestEnded as ended:
            families, series, outcome = (), 0, Outcome.CANCELLED
            error = f"unbounded collector {collector.key} cancelled: {ended}"
        except (TimeoutError, pgerrors.QueryCanceled, pgerrors.LockNotAvailable) as exc:
            families, series = (), 0
            outcome, error = Outcome.TIMEOUT, _timeout_message(collector, exc)
        except TooManySeriesError as exc:
            families, series, outcome, error = (), 0, Outcome.TOO_MANY_SERIES, str(exc)
        except (psycopg.Error, CollectorError) as exc:
            families, series, outcome = (), 0, Outcome.ERROR
            error = f"collector {collector.key} on {self.label}: {exc}"
        duration = self.clock() - start
        if outcome is Outcome.CANCELLED:
            log.info(error, extra={"collector": collector.key, "datname": self.label})
        elif outcome.failed:
            log.warning(
                "collector failed: %s",
                error,
                extra={
                    "collector": collector.key,
                    "datname": self.label,
                    "outcome": outcome.value,
                    "duration": round(duration, 4),
                },
            )
        return Entry(families, outcome, self.clock(), duration, series, error)

    async def _execute(
        self, collector: Collector, budget: Budget
    ) -> tuple[tuple[Family, ...], int, Outcome]:
        conn = self.conn
        if conn is None:
            raise psycopg.OperationalError(f"no connection to {self.label}")
        try:
            if collector.bounded:
                # Its own deadline only: it finishes even if its request ends (B11).
                async with deadline(self.client_deadline(collector)):
                    builder = await self._query(conn, collector)
            else:  # nothing else bounds it, so it ends with its request (B12)
                builder = await until_request_ends(self._query(conn, collector), budget)
        finally:
            if self.plan is not None and collector.key in self.plan.unsettling:
                self.session = None  # its SQL may have changed a limit: send them all again
            if not await postgres.settle(conn):
                await self.disconnect()
        if builder is SKIPPED:
            return (), 0, Outcome.SKIPPED
        if builder is None:  # an empty result: nothing to publish
            return (), 0, Outcome.OK
        for warning in builder.warnings:
            log.warning(warning, extra={"collector": collector.key, "datname": self.label})
        return builder.finish(), builder.series, Outcome.OK

    def client_deadline(self, collector: Collector) -> float | None:
        """Seconds of the client-side deadline; the server-side limits mirror it (D1)."""
        return collector.timeout

    async def _query(self, conn: Conn, collector: Collector) -> SampleBuilder | _Skipped | None:
        """Predicates then the main query, read only under the collector's limits (B13, D1).

        Rows are converted as they stream in, so a result over the series cap is
        cancelled in the server instead of being read whole (D9). None: no rows.
        """
        assert self.facts is not None
        async with conn.cursor() as cur:
            session = False
            if not self.options.pgbouncer:  # the console has no transactions or SET (D4)
                session = await self._limit(conn, cur, collector)
            for predicate in collector.predicates:
                if not await self._predicate(cur, collector, predicate):
                    return SKIPPED
            if self.options.pgbouncer:
                return await self._build(collector, postgres.console_batches(cur, collector.query))
            text = await self._statement(conn, cur, collector) if session else collector.query
            try:
                return await self._build(collector, postgres.stream_batches(cur, text))
            except (pgerrors.InvalidSqlStatementName, pgerrors.FeatureNotSupported) as exc:
                if text == collector.query or not self._forget_statement(text, exc):
                    raise
            # The prepared statement is gone or its plan no longer fits: run it as text.
            return await self._build(collector, postgres.stream_batches(cur, collector.query))

    async def _build(
        self,
        collector: Collector,
        rows: AsyncGenerator[tuple[Sequence[str], list[tuple[object, ...]]], None],
    ) -> SampleBuilder | None:
        """Samples from the batches of ``rows``, stopping at the series cap (D9)."""
        builder: SampleBuilder | None = None
        cap = collector.max_series or self.options.max_series
        async with aclosing(rows) as batches:
            async for names, batch in batches:
                if builder is None:
                    builder = SampleBuilder(collector, names, self.options.const_labels, cap)
                builder.add_rows(batch)
        return builder

    async def _limit(
        self, conn: Conn, cur: psycopg.AsyncCursor[tuple[object, ...]], collector: Collector
    ) -> bool:
        """Put the collector's limits in force (D1): as session settings, sent only where
        they differ from the last collector's, so that most collectors cost one round trip
        (issue 22); in a read-only transaction of the collector's own, as before, unless
        the preflight proved the connection direct and the server reports its read-only
        default (a pooler would hand our session settings to an application). True when
        the limits are session settings."""
        assert self.facts is not None
        read_only = postgres.session_read_only(conn)
        if read_only is None or self.facts.own_transaction:
            await postgres.begin(cur, collector, self.facts.version)
            return False
        limits = postgres.Limits.of(collector.timeout, self.facts.version)
        held = self.session
        # All again on a connection not yet set up, or whose read-only default a
        # collector's SQL turned off (the server reports that change at once).
        same = held is not None and held[0] is conn and read_only
        sql = postgres.session_sql(limits, held[1] if held is not None and same else None)
        if sql:
            self.session = None  # unknown until the server has applied the whole list
            await postgres.set_session(cur, sql)
        self.session = (conn, limits)
        return True

    async def _statement(
        self, conn: Conn, cur: psycopg.AsyncCursor[tuple[object, ...]], collector: Collector
    ) -> str:
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
                    extra={"collector": collector.key, "datname": self.label},
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

    async def _predicate(
        self, cur: psycopg.AsyncCursor[tuple[object, ...]], collector: Collector, p: Predicate
    ) -> bool:
        key = (collector.key, p.name)
        cached = self.predicates.get(key)
        now = self.clock()
        if cached is not None:
            answer, asked_at, ttl = cached
            if fresh_since(asked_at, ttl, now, disable_cache=self.options.disable_cache):
                return answer
        value = await postgres.run_predicate(cur, p)
        # Answers cached together come due apart, not all in one pass (D17).
        self.predicates[key] = (value, self.clock(), spread(p.ttl, PERIOD_JITTER, self.random))
        return value

    def use(self, definitions: Definitions) -> None:
        """Take reloaded definitions: plan again on the next pass, with fresh caches and
        statistics (a changed collector must not serve the old one's cached result)."""
        self.definitions = definitions
        self.plan = None
        self.entries.clear()
        self.predicates.clear()
        self.stats.clear()
        self.backoffs.clear()
        self.shed = ()
        if self.prepared is not None:
            self.prepared.obsolete = True


def _timeout_message(collector: Collector, exc: BaseException) -> str:
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
