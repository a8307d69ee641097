"""One scraped database: its connection, its plan, and its collectors' runtimes.

A ``Server`` owns at most one connection (D5), opened lazily and replaced after
it is lost (D8), and closed when the target's connection limit needs room for
another database (issue 13). Its collectors run one at a time in priority order,
each under its own deadline (``session``); each one's cache, statistics and
back-off live in its ``runtime``; results are published whole or not at all.
"""

from __future__ import annotations

import asyncio
import logging
import random as _random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import psycopg

from exporter.collect.breaker import NO_SHEDDING, PassTally, Shedding, distress_of, is_shed
from exporter.collect.budget import Budget, Interruption, RequestEnded, until_request_ends
from exporter.collect.cache import Entry, Outcome
from exporter.collect.planning import Plan, make_plan
from exporter.collect.runtime import CollectorRuntime, Rules
from exporter.collect.seriescap import Part
from exporter.collect.session import Conn, Place, Session
from exporter.config.definitions import Collector, Definitions
from exporter.config.settings import DEFAULT_BACKOFF_CEILING
from exporter.config.target import database_of
from exporter.errors import FatalCollectorFailed
from exporter.expose.exposition import Family
from exporter.pg import guards as table
from exporter.pg import postgres
from exporter.pg.connections import ConnectionLimit
from exporter.pg.loginrate import Random
from exporter.pg.preflight import Preflight, ServerFacts, pgbouncer_preflight, preflight

log = logging.getLogger(__name__)

PLAN_MEMORY_PERIOD = 60.0  # seconds between two readings of the prepared plans' memory


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
    backoff_ceiling: float = DEFAULT_BACKOFF_CEILING  # seconds (D15)


@dataclass(slots=True)
class ServerResult:
    """What one database's part of a pass produced."""

    parts: list[Part] = field(default_factory=list)  # each collector's families, in run order
    error: str = ""  # connection/preflight or fatal collector failure
    interrupted: Interruption | None = None  # when the request stopped the walk
    tally: PassTally = field(default_factory=PassTally)  # for the breaker (D16)
    server_time: float = 0.0  # seconds its statements took: preflight and collectors (issue 31)
    preflight_time: float = 0.0  # of which the preflight's

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
        connections: ConnectionLimit | None = None,
    ) -> None:
        self.datname = datname  # None: whatever the URL names
        # Shared by the target's databases (issue 13).
        self.connections = connections or ConnectionLimit.unlimited()
        self.options = options
        self.definitions = definitions
        self.is_main = is_main
        self.clock = clock
        self.rules = Rules(options.disable_cache, options.backoff_ceiling, random)
        self.conn: Conn | None = None
        self.session = Session(pgbouncer=options.pgbouncer, const_labels=options.const_labels,
                               max_series=options.max_series, clock=clock)  # fmt: skip
        self.facts: ServerFacts | None = None
        self.plans_read_at = -PLAN_MEMORY_PERIOD  # when the prepared plans' memory was read
        self.databases: tuple[str, ...] = ()
        self.unnamed: tuple[str, ...] = ()  # databases discovery cannot name (SQL_ASCII)
        self.plan: Plan | None = None
        # Each planned collector's cache, statistics, back-off and predicate answers.
        self.runtimes: dict[str, CollectorRuntime] = {}
        self.up = False
        self.cut_short = False  # its part of the last pass outran its deadline (issue 36)
        self.scrape_count = 0
        self.error_count = 0
        self.total_seconds = 0.0
        self.last_duration = 0.0
        # Seconds our statements took since start, as the client waited for them: every
        # collector run and preflight, and the preflights alone (issue 31).
        self.statement_seconds = 0.0
        self.preflight_seconds = 0.0

    @property
    def label(self) -> str:
        """The database name for labels and logs."""
        if self.facts is not None:
            return self.facts.datname
        return self.datname or database_of(self.options.url)

    async def prepare(self) -> None:
        """Connect if needed, read the server's facts, and plan when they changed.

        A session proven direct makes every later login of our role at that server carry
        the server's whole set of guards (issue 36); the first one's session gets those
        its login lacked with its first limits."""
        pre = await self._read()
        self._guard_logins(pre.facts)
        facts = self._settle_guards(pre.facts)
        self.databases = pre.databases
        self._note_unnamed(pre.unnamed)
        # Facts are read on every pass and planning is pure and cheap, so any change
        # (an extension created, a schema dropped) is planned for at once.
        if self.plan is None or self.facts != facts:
            self.plan = make_plan(self.definitions, facts, self.options.tags)
            log.info(
                "planned %d collectors, skipped %d",
                len(self.plan.planned),
                len(self.plan.skipped),
                extra={"datname": facts.datname, "version": facts.version},
            )
        self._note_limits(facts)
        self._note_path(facts)
        self.facts = facts
        if facts.may_read_plans and not facts.own_transaction and self.conn is not None:
            now = self.clock()
            if now - self.plans_read_at >= PLAN_MEMORY_PERIOD:  # issue 31
                self.plans_read_at = now
                await self.session.read_plan_memory(self.conn)

    async def _read(self) -> Preflight:
        """Connect if needed, then the preflight, its time counted as server time."""
        if self.conn is None or self.conn.closed or self.conn.broken:
            await self.disconnect()
            conninfo = postgres.conninfo_for(
                self.options.url, self.datname, self.options.connect_timeout
            )
            await self.connections.make_room(self)  # least recently used first (issue 13)
            try:  # not while a refusal stands (issue 25), within the server's bulkhead (29)
                self.conn = await self.connections.dial(
                    self, self.datname, conninfo, self.options.connect_timeout
                )
            except BaseException:  # failed, or cancelled with its request (B9)
                self.connections.cancel()
                raise
            self.connections.opened_for(self)
        else:
            self.connections.used(self)
        started = self.clock()
        try:
            if self.options.pgbouncer:
                return await pgbouncer_preflight(self.conn)
            return await preflight(self.conn, is_main=self.is_main)
        except psycopg.Error:
            await self.disconnect()
            raise
        finally:
            took = self.clock() - started
            self.statement_seconds += took
            self.preflight_seconds += took

    def _guard_logins(self, facts: ServerFacts) -> None:
        """After a session proven direct, our role's logins at that server carry its whole
        set of guards; after one that is not (a pooler answered), none (issue 36)."""
        if self.options.pgbouncer:
            return
        if not facts.direct:
            if facts.login_guarded:
                self.connections.guard_logins(self, None)
            return
        self.connections.guard_logins(self, facts.guards.login_options())

    def _settle_guards(self, facts: ServerFacts) -> ServerFacts:
        """The facts with why collectors run in transactions of their own where a direct
        session does not hold the guards its login set: the server reports one otherwise
        (issue 36). A direct session that logged in without them (its server refused
        them, or its role's sessions there were not direct before) gets them all with its
        first limits."""
        if self.options.pgbouncer or facts.own_transaction or not facts.login_guarded:
            return facts
        login = postgres.login_settings(self.conn) if self.conn is not None else frozenset()
        differ = table.differences(facts.guards.shape, list(facts.reported), login)
        if not differ:
            return facts
        said = "; ".join(
            f"{name} is {seen} (we logged in with {want})" for name, want, seen in differ
        )
        return replace(facts, own_transaction=f"the server does not keep the guards: {said}")

    def _note_path(self, facts: ServerFacts) -> None:
        """Say once per change which extensions stay off our search_path (issue 36)."""
        left = facts.search_path.left_out
        if left and (self.facts is None or self.facts.search_path.left_out != left):
            log.info(
                "extensions in schemas that roles other than superusers and ours may write "
                "stay off the search_path; our library names their objects by schema, a "
                "collector of yours should too (@extschema:NAME@): %s",
                "; ".join(f"{what} in {schema}" for schema, what in left),
                extra={"datname": facts.datname},
            )

    def _note_limits(self, facts: ServerFacts) -> None:
        """Say once, per change, why collectors run in a transaction each (issue 22); the
        discovered databases share the main one's endpoint, and /explain shows each."""
        reason = facts.own_transaction
        if self.is_main and reason and (self.facts is None or self.facts.own_transaction != reason):
            log.info(
                "each collector runs in a read-only transaction of its own with limits "
                "local to it, not under session limits, because %s",
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
        # Its place under the connection limit frees once the server has ended the backend.
        await self.connections.close(self, postgres.close_and_wait(conn))

    async def scrape(
        self, budget: Budget, shedding: Shedding = NO_SHEDDING, ready: asyncio.Event | None = None
    ) -> ServerResult:
        """Walk this database's planned collectors, serving fresh caches (B6, B10) and
        leaving out what ``shedding`` sheds (D16); ``ready`` is set once the preflight has
        read the server's facts, before the first collector."""
        start = self.clock()
        result = ServerResult()
        spent = self.statement_seconds, self.preflight_seconds
        self.connections.busy(self, busy=True)  # its connection is not closed for another's
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
            self.connections.busy(self, busy=False)
        result.server_time = self.statement_seconds - spent[0]
        result.preflight_time = self.preflight_seconds - spent[1]
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
            left_out = set(result.tally.shed)
            for key, runtime in self.runtimes.items():
                runtime.shed = key in left_out

    def _needs_connection(self, shedding: Shedding) -> bool:
        """False for a discovered database that was up and has nothing to run: every
        collector is fresh in its cache, backing off or shed, so it is not connected at
        all and takes no place under the connection limit (issue 13). The main database is
        always asked: its preflight says whether the target is up and what it holds."""
        if self.is_main or self.plan is None or not self.up:
            return True
        now = self.clock()
        cut = shedding.cut(self.plan.planned)
        return any(
            self.runtime(c).held_back(now, shed=is_shed(c, cut)) is None for c in self.plan.planned
        )

    def runtime(self, collector: Collector) -> CollectorRuntime:
        """The collector's runtime on this database, made on its first use."""
        runtime = self.runtimes.get(collector.key)
        if runtime is None:
            runtime = self.runtimes[collector.key] = CollectorRuntime(collector, self.rules)
        return runtime

    @property
    def shed(self) -> tuple[str, ...]:
        """Branch keys the breaker left out at the last pass, in run order (D16)."""
        planned = self.plan.planned if self.plan is not None else ()
        return tuple(c.key for c in planned if (r := self.runtimes.get(c.key)) and r.shed)

    async def collect(
        self, collector: Collector, budget: Budget, tally: PassTally, *, shed: bool = False
    ) -> Entry:
        """The collector's fresh cached result, or a new one (raises FatalCollectorFailed).

        A failure is cached like a result (B14), so a fatal failure keeps the database
        down for the collector's TTL instead of being re-run by every scrape. A collector
        in back-off (D15) or shed (D16) runs nothing and publishes nothing.
        """
        runtime = self.runtime(collector)
        entry = runtime.hold(self.clock(), shed=shed)
        if entry is None:
            entry = await self.refresh(runtime, budget)
            self.statement_seconds += entry.duration  # the server-time budget's (issue 31)
            tally.executed += 1
            tally.timeouts += entry.outcome is Outcome.TIMEOUT
            lost = self.conn is None  # the connection died under this collector (D7, D8)
            runtime.settle(entry, lost=lost, datname=self.label)
            if lost:  # the collectors after this one have no connection: stop the pass
                raise psycopg.OperationalError(
                    f"connection to {self.label} lost during collector {collector.key}: "
                    f"{entry.error}"
                )
            # Cancelled means the request ended: logged at INFO above, not an error (B18).
            if entry.outcome.failed and collector.fatal and entry.outcome is not Outcome.CANCELLED:
                log.error(
                    "fatal collector failed: %s",
                    entry.error,
                    extra={"collector": collector.key, "datname": self.label},
                )
        elif entry.outcome is Outcome.SHED:
            tally.shed.append(collector.key)
        if entry.outcome.failed and collector.fatal:
            raise FatalCollectorFailed(
                f"fatal collector {collector.key} failed on {self.label}: {entry.error}"
            )
        return entry

    async def refresh(self, runtime: CollectorRuntime, budget: Budget) -> Entry:
        """Run one collector and build its families; never raises for collector failures.
        A connection the run left unusable is closed (D7)."""
        fenced = self.plan is not None and runtime.collector.key in self.plan.fenced
        place = Place(self.conn, self.facts, self.label, fenced, self.disconnect)
        return await self.session.run(place, runtime, budget)

    def use(self, definitions: Definitions) -> None:
        """Take reloaded definitions: plan again on the next pass, with fresh caches and
        statistics (a changed collector must not serve the old one's cached result)."""
        self.definitions = definitions
        self.plan = None
        self.runtimes.clear()
        self.session.reloaded()
