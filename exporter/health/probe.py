"""The health probe: what the target is, asked on a connection of its own.

It asks within the connect timeout and publishes an immutable snapshot that the
routing handlers (:mod:`exporter.web.healthpages`) only read; a hung server costs the
probe its deadline, never a handler. It asks once a second while the target is
steady and every 100 ms while it may be changing role (:mod:`exporter.health.pace`);
between probes it watches its idle connection, which the server only writes to
when it ends it, so a shutdown or a crash wakes it at once. Its connection takes a
place in the bulkhead of the server it reaches (:mod:`exporter.pg.bulkheads`): when the
bulkhead holds it back, it has not looked, and says "not probed" (issue 29).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import psycopg

from exporter.health.pace import FAST_INTERVAL, SLOW_ANSWER, SLOW_INTERVAL, Pace
from exporter.pg import postgres
from exporter.pg.bulkheads import Lease, NotAdmitted
from exporter.pg.connections import Logins

log = logging.getLogger(__name__)

Conn = psycopg.AsyncConnection[tuple[object, ...]]
Connector = Callable[[str, float], Awaitable[Conn]]

PROBE_INTERVAL = SLOW_INTERVAL  # seconds between the starts of two probes, when steady
ABANDON_LIMIT = 1.0  # seconds spent at most unwinding a probe that missed its deadline
STALE_PERIODS = 3  # a failure older than this many probe periods is no longer repeated
# A role (primary, replica) is announced for at most this long after the probe that saw
# it, beyond the slow interval, whatever the connect timeout: a server that takes longer
# to say what it is reads as unknown (503), so a hung primary is not routed writes.
ROLE_TRUST_MARGIN = 1.0
# How long a reading the target cannot stay in keeps the probe quick. Down or starting:
# connection attempts, which cost the server little or nothing, long enough to see a
# restart that Patroni (its loop runs every 10 s by default) makes. A replica without
# upstream: queries, for as long as an HA manager takes to promote it after a planned
# switchover or a clean shutdown of the primary.
OUTAGE_HOLD = 10.0
NO_UPSTREAM_HOLD = 3.0
# On a replica the probe also asks whether its WAL receiver streams: a replica that lost
# its upstream is about to be promoted or to reconnect, so the probe quickens. coalesce:
# a role without pg_read_all_stats sees the receiver's row but not its status. Names
# qualified: the database's owner chooses the path it runs under (issue 29).
PROBE_SQL = (
    "SELECT pg_catalog.pg_is_in_recovery(), (SELECT coalesce(status OPERATOR(pg_catalog.=) "
    "'streaming', true) FROM pg_catalog.pg_stat_wal_receiver)"
)
# libpq reports no SQLSTATE when the server refuses a connection, so 57P03 is
# recognised by the server's (English) message; every 57P03 text starts like this.
CANNOT_CONNECT_NOW = "57P03"
# A deadline the event loop reached this much late is the loop's fault, not the server's:
# busy elsewhere, it may have left an answer unread (issue 25). Timers are on time to a
# millisecond or two on an idle loop.
LOOP_LATE = 0.05  # seconds
_UNHEARD = "the exporter was too busy to hear the answer in time"
_CANNOT_CONNECT_NOW_TEXT = "the database system is "


class Status(enum.Enum):
    """What the target is, as the health endpoints say it."""

    PRIMARY = "primary"
    REPLICA = "replica"
    STARTING = "starting"
    DOWN = "down"
    UNKNOWN = "unknown"

    @property
    def is_up(self) -> bool:
        """True when the target answers queries (pgBouncer counts as a primary)."""
        return self in (Status.PRIMARY, Status.REPLICA)


@dataclass(frozen=True, slots=True)
class Reading:
    """What one probe saw, as far as its pace cares."""

    status: Status
    streaming: bool | None = None  # a replica's WAL receiver streams; None for other roles

    @property
    def hold(self) -> float | None:
        """None for a state the target can stay in (a primary, a streaming replica), else
        how long this reading keeps the probe quick."""
        if self.status is Status.PRIMARY:
            return None
        if self.status is Status.REPLICA:
            return NO_UPSTREAM_HOLD if self.streaming is False else None
        return OUTAGE_HOLD

    def __str__(self) -> str:
        if self.status is Status.REPLICA and self.streaming is False:
            return "replica not streaming"
        return self.status.value


@dataclass(frozen=True, slots=True)
class HealthSnapshot:
    """The outcome of one probe."""

    status: Status
    checked_at: float  # the probe's clock when the outcome was known
    error: str = ""  # why the target is not up; empty when it is
    not_probed: bool = False  # the server's bulkhead held the probe back: error says why


def classify(exc: BaseException) -> Status:
    """STARTING for SQLSTATE 57P03 (starting, recovering, shutting down), else DOWN."""
    if getattr(exc, "sqlstate", None) == CANNOT_CONNECT_NOW:
        return Status.STARTING
    if isinstance(exc, psycopg.Error) and _CANNOT_CONNECT_NOW_TEXT in str(exc):
        return Status.STARTING
    return Status.DOWN


class HealthProbe:
    """Probes one target on one connection, at the pace's interval, and keeps the snapshot."""

    def __init__(
        self,
        url: str,
        connect_timeout: float,
        *,
        interval: float = PROBE_INTERVAL,
        fast_interval: float = FAST_INTERVAL,
        pgbouncer: bool = False,
        clock: Callable[[], float] = time.monotonic,
        connector: Connector = postgres.connect,
        connecting: asyncio.Semaphore | None = None,
    ) -> None:
        if connect_timeout <= 0 or interval <= 0 or fast_interval <= 0:
            raise ValueError("connect_timeout and the intervals must be positive")
        self.connect_timeout = connect_timeout
        self.interval = interval
        self.pace = Pace(interval, fast_interval)
        self.pgbouncer = pgbouncer
        # pgBouncer's console speaks only the simple protocol and has no functions.
        self.sql = "SHOW VERSION" if pgbouncer else PROBE_SQL
        self.trust_role_for = interval + ROLE_TRUST_MARGIN
        self.stale_after = STALE_PERIODS * (interval + connect_timeout) + ABANDON_LIMIT
        self._conninfo = postgres.conninfo_for(url, None, connect_timeout)
        self._clock = clock
        self._connector = connector
        self.connecting = connecting  # places for opening a connection, shared by a fleet
        self.late_streak = 0  # probes in a row whose deadline the loop reached late
        self.late_probes = 0  # such probes in all
        self._conn: Conn | None = None
        self._lease: Lease | None = None  # the connection's place at its server (issue 29)
        self._failure = ""  # why the last probe that dialled found the target not up
        self.logins = Logins()  # the target's, shared with its passes (and its bulkheads)
        self._wake = asyncio.Event()  # set when something suggests probing now
        self.snapshot = HealthSnapshot(Status.UNKNOWN, clock(), "not probed yet")
        self.reading = Reading(Status.UNKNOWN)  # what the last probe saw
        self.probed = asyncio.Event()  # set once the first probe has published its outcome

    def current(self) -> HealthSnapshot:
        """The snapshot, or UNKNOWN once it is too old to repeat.

        A role expires ``trust_role_for`` after the probe that saw it (2 s by default),
        so neither a hung server nor a stalled probe keeps a primary routed; a failure
        (503 anyway) is repeated for longer, until the probe has clearly stopped.
        """
        age = self._clock() - self.snapshot.checked_at
        limit = self.trust_role_for if self.snapshot.status.is_up else self.stale_after
        if age <= limit:
            return self.snapshot
        return HealthSnapshot(Status.UNKNOWN, self.snapshot.checked_at, f"no answer for {age:.1f}s")

    def suggest(self, reason: str) -> None:
        """Something outside the probe suggests a change: probe now, then quickly."""
        self.pace.suggest(reason, self._clock())
        self._wake.set()

    def recovery_seen(self, in_recovery: bool) -> None:
        """The collection pass read the target's recovery state; a different role wakes us."""
        seen = Status.REPLICA if in_recovery else Status.PRIMARY
        if self.snapshot.status is not seen:
            self.suggest(f"a scrape saw a {seen.value}")

    async def run(self, until: Callable[[], bool] | None = None) -> None:
        """Probe at the pace's interval until cancelled, or until ``until()`` says so
        after a probe; probes never overlap."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await self.probe_once()
            if until is not None and until():
                return
            await self._pause(self.next_interval() - (loop.time() - started))

    def next_interval(self) -> float:
        """Seconds from this probe's start to the next one's: the pace's, or the fast
        interval once after a probe the busy loop kept from hearing (only once: a loop
        that stays busy must not be given ten probes a second more)."""
        if self.late_streak == 1:
            return self.pace.fast
        return self.pace.interval(self._clock())

    async def probe_once(self) -> HealthSnapshot:
        """Ask the target once, within the connect timeout, and publish the outcome.

        A probe that must open a connection first takes a connecting place (a fleet
        bounds them), before its deadline starts: waiting is not the server's fault.
        """
        self._wake.clear()  # a suggestion from here on calls for another probe
        async with self._connecting_place():
            return await self._probe()

    def _connecting_place(self) -> contextlib.AbstractAsyncContextManager[object]:
        if self.connecting is None or self._idle_socket() is not None:
            return contextlib.nullcontext()
        return self.connecting

    async def _probe(self) -> HealthSnapshot:
        started = self._clock()
        task = asyncio.create_task(self._ask(), name="health probe query")
        try:
            heard = await self._await_answer(task)
            reading, error, looked = self._verdict(task)
            if reading.status is Status.DOWN and not heard:
                self._unheard()
            else:
                self.late_streak = 0
                self.reading = reading
                if looked:
                    self._failure = error
                not_probed = not looked and reading.status is Status.UNKNOWN
                self._publish(reading.status, error, not_probed=not_probed)
                took = self._clock() - started
                # Only for an answer: nothing may delay abandoning a probe past its deadline.
                if took > SLOW_ANSWER and task.done() and await _loop_busy():
                    took = 0.0  # the slowness was the loop's: no sign of the server's trouble
                self._pace(reading, took=took)
            self.probed.set()
        finally:
            if not task.done():
                await _abandon(task)
            elif not task.cancelled():
                task.exception()  # cancelled meanwhile: its outcome is dropped, not reported
        return self.snapshot

    def _verdict(self, task: asyncio.Task[Reading]) -> tuple[Reading, str, bool]:
        """What the probe saw, why, and whether it looked at all: its server's bulkhead may
        have held it back (issue 29). A server already failing us then stays so (nothing
        new was learnt of it); any other reads as not probed."""
        if not task.done():
            return Reading(Status.DOWN), f"no answer within {self.connect_timeout:g}s", True
        reading, error = _outcome(task)
        if not _held_back(task):
            return reading, error, True
        if self.reading.status in (Status.DOWN, Status.STARTING):
            return self.reading, f"{self._failure}; {error}", False
        return reading, error, False

    async def _await_answer(self, task: asyncio.Task[Reading]) -> bool:
        """Wait for the probe's answer within the connect timeout; False when the event
        loop reached the deadline late, so that a missing answer or a timeout proves
        nothing about the server (the loop, busy elsewhere, may not have read it).

        A deadline reached late is given once more: the answer may be waiting to be read.
        The second one, reached on time with still no answer, is the server's silence.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.connect_timeout
        await asyncio.wait({task}, timeout=self.connect_timeout)
        if loop.time() - deadline <= LOOP_LATE:
            return True
        if task.done():
            return False
        deadline = loop.time() + self.connect_timeout
        await asyncio.wait({task}, timeout=self.connect_timeout)
        return not task.done() and loop.time() - deadline <= LOOP_LATE

    def _unheard(self) -> None:
        """The loop was late at the deadline: no reading. The last snapshot stands
        (:meth:`current` turns it UNKNOWN once too old) and the next probe comes soon
        (:meth:`next_interval`)."""
        self.late_streak += 1
        self.late_probes += 1
        if self.late_streak == 1:
            log.warning(
                "health probe's deadline passed while the exporter was busy elsewhere; "
                "no reading taken, probing again (%gs)", self.pace.fast
            )  # fmt: skip
        if self.snapshot.status is Status.UNKNOWN:
            self.snapshot = HealthSnapshot(Status.UNKNOWN, self._clock(), _UNHEARD)

    async def _pause(self, seconds: float) -> None:
        """Wait ``seconds``, or less when a suggestion comes or the idle connection stirs.

        The server writes to an idle connection only to end it (shutdown, crash,
        termination), so its socket turning readable is the earliest sign of a change.
        """
        if seconds <= 0 or self._wake.is_set():
            return
        loop = asyncio.get_running_loop()
        fd = self._idle_socket()
        if fd is not None:
            loop.add_reader(fd, self._stirred)
        try:
            async with asyncio.timeout(seconds):
                await self._wake.wait()
        except TimeoutError:
            pass
        finally:
            if fd is not None:
                loop.remove_reader(fd)

    def _idle_socket(self) -> int | None:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            return None
        return conn.fileno()

    def _stirred(self) -> None:
        if not self._wake.is_set():
            self.suggest("the server wrote to the idle probe connection")

    async def close(self) -> None:
        """Close the probe's connection; its place at the server is free once its backend
        has ended."""
        conn, self._conn = self._conn, None
        lease, self._lease = self._lease, None
        try:
            await postgres.close_and_wait(conn)
        finally:
            if lease is not None:
                lease.release()

    async def _ask(self) -> Reading:
        """One question, on the kept connection or a new one; any failure drops it."""
        try:
            conn = self._conn
            if conn is not None and not conn.closed and not conn.broken:
                try:
                    return await self._query(conn)
                except psycopg.Error as exc:  # e.g. the server restarted: try a fresh one
                    log.debug("health probe connection failed, reconnecting: %s", exc)
                    await self.close()
            elif conn is not None:
                await self.close()  # lost meanwhile: its place goes back first
            # The target's passes and the probe heed one login back-off (issue 25), and
            # the connection takes a place in its server's bulkhead (issue 29).
            self._conn, self._lease = await self.logins.open(
                None, self._conninfo, self.connect_timeout, probe=True, connector=self._connector
            )
            return await self._query(self._conn)
        except BaseException:
            await self.close()
            raise

    async def _query(self, conn: Conn) -> Reading:
        if self.pgbouncer:
            await conn.execute(self.sql, prepare=False)
            return Reading(Status.PRIMARY)  # any answer from the console means it is up
        if postgres.logged_in_guarded(conn):  # bounded by the server from login (issue 36)
            cur = await conn.execute(self.sql, prepare=False)
        else:  # a pooler that refused the guards at login: bounded all the same
            cur = await conn.execute(postgres.bounded(self.sql, self.connect_timeout))
            for _ in range(3):  # BEGIN, SET, SET: the probe's rows come next
                cur.nextset()
        row = await cur.fetchone()
        if row is None or row[0] is not True:
            return Reading(Status.PRIMARY)
        return Reading(Status.REPLICA, streaming=row[1] is True)

    def _pace(self, reading: Reading, took: float) -> None:
        """Tell the pace what this probe saw; log the end of a fast spell with its cost."""
        up = reading.status.is_up
        spell = self.pace.observe(reading, self._clock(), hold=reading.hold, answered=up, took=took)
        if spell is None:
            return
        seconds = self._clock() - spell.started
        extra = spell.answered - seconds / self.interval  # beyond what the slow pace sends
        log.info(
            "health probe back to its %gs pace",
            self.interval,
            extra={
                "reason": spell.reason,
                "seconds": round(seconds, 2),
                "probes": spell.probes,
                "queries": spell.answered,
                "extra_queries": max(0, round(extra)),
            },
        )

    def _publish(self, status: Status, error: str, *, not_probed: bool = False) -> None:
        old = self.snapshot.status
        self.snapshot = HealthSnapshot(status, self._clock(), error, not_probed)
        if status is not old:
            level = logging.INFO if status.is_up or old is Status.UNKNOWN else logging.WARNING
            log.log(level, "health status changed", extra=_change(old, status, error))


def _change(old: Status, new: Status, error: str) -> dict[str, str]:
    fields = {"from": old.value, "to": new.value}
    return fields | {"reason": error} if error else fields


def _outcome(task: asyncio.Task[Reading]) -> tuple[Reading, str]:
    exc = task.exception()
    if exc is None:
        return task.result(), ""
    if isinstance(exc, NotAdmitted):  # the exporter did not look: nothing is known
        return Reading(Status.UNKNOWN), f"not probed: {exc}"
    if not isinstance(exc, psycopg.Error):
        log.warning("health probe failed unexpectedly", exc_info=exc)
    return Reading(classify(exc)), _first_line(exc)


def _held_back(task: asyncio.Task[Reading]) -> bool:
    """True when the server's bulkhead held the probe back (it dialled nothing)."""
    return task.done() and not task.cancelled() and isinstance(task.exception(), NotAdmitted)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


async def _loop_busy() -> bool:
    """True when a whole turn of the event loop takes longer than LOOP_LATE: it is busy
    elsewhere, so a slow answer says more about the exporter than about the server (and
    quickening every probe of a fleet would only load it more). Two yields: the second
    waits behind everything the loop had ready when the first came back."""
    loop = asyncio.get_running_loop()
    before = loop.time()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    return loop.time() - before > LOOP_LATE


async def _abandon(task: asyncio.Task[Reading]) -> None:
    """Unwind a probe that missed its deadline without waiting on the server.

    psycopg answers the first cancellation of a running query by asking the
    server to cancel it and waiting for that, which against a hung server takes
    seconds; a further cancellation makes it close the connection at once.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ABANDON_LIMIT
    while not task.done() and loop.time() < deadline:
        task.cancel()
        await asyncio.wait({task}, timeout=0.01)
    if not task.done():  # pragma: no cover - psycopg always yields to a repeated cancel
        log.warning("health probe did not stop within %gs; leaving it behind", ABANDON_LIMIT)
