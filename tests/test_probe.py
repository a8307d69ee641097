"""The health probe without PostgreSQL: statuses, deadlines, pace and trust in its answers."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import cast

import psycopg
import pytest

from exporter.health.pace import FAST_INTERVAL, SLOW_ANSWER
from exporter.health.probe import (
    NO_UPSTREAM_HOLD,
    OUTAGE_HOLD,
    PROBE_SQL,
    Conn,
    HealthProbe,
    HealthSnapshot,
    Reading,
    Status,
    classify,
)
from exporter.pg.bulkheads import HELD_CONNECTIONS, Bulkheads
from tests.fixtures.clock import FakeClock
from tests.fixtures.polling import poll

URL = "postgresql://monitor@127.0.0.1:1/postgres?sslmode=disable"


class _Coded(Exception):
    sqlstate = "57P03"


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (_Coded("cannot connect now"), Status.STARTING),
        (psycopg.OperationalError("FATAL:  the database system is starting up"), Status.STARTING),
        (
            psycopg.OperationalError("FATAL:  the database system is in recovery mode"),
            Status.STARTING,
        ),
        (psycopg.OperationalError("FATAL:  sorry, too many clients already"), Status.DOWN),
        (psycopg.OperationalError("Connection refused"), Status.DOWN),
        (TimeoutError(), Status.DOWN),
        (RuntimeError("the database system is starting up"), Status.DOWN),
    ],
)
def test_classify_maps_57p03_to_starting(exc: BaseException, status: Status) -> None:
    """SQLSTATE 57P03, by code or by the server's message, is STARTING; the rest is DOWN."""
    assert classify(exc) == status


def test_a_role_expires_soon_after_the_probe_that_saw_it() -> None:
    """A primary is announced for at most the slow interval plus a second after the probe
    that saw it, however long the connect timeout: a hung server is not routed writes."""
    clock = FakeClock()
    probe = HealthProbe(URL, 5.0, interval=1.0, clock=clock)
    assert probe.trust_role_for == 2.0
    probe.snapshot = HealthSnapshot(Status.PRIMARY, clock.now)
    clock.advance(probe.trust_role_for)
    assert probe.current().status is Status.PRIMARY
    clock.advance(0.01)
    stale = probe.current()
    assert stale.status is Status.UNKNOWN
    assert stale.checked_at == probe.snapshot.checked_at
    assert "no answer for 2.0s" in stale.error


def test_a_failure_is_repeated_until_the_probe_has_clearly_stopped() -> None:
    """A down answer (503 either way) outlives a role: probes into a hang take the whole
    connect timeout, and the word stays 'down' between them; after a few periods without
    any probe it turns to unknown."""
    clock = FakeClock()
    probe = HealthProbe(URL, 5.0, interval=1.0, clock=clock)
    probe.snapshot = HealthSnapshot(Status.DOWN, clock.now, "no answer within 5s")
    clock.advance(probe.connect_timeout + probe.interval)
    assert probe.current().status is Status.DOWN
    clock.advance(probe.stale_after)
    assert probe.current().status is Status.UNKNOWN


def test_probe_rejects_nonpositive_timings() -> None:
    """A zero interval or timeout would spin or never bound the probe."""
    with pytest.raises(ValueError, match="positive"):
        HealthProbe(URL, 0.0)
    with pytest.raises(ValueError, match="positive"):
        HealthProbe(URL, 1.0, interval=0.0)
    with pytest.raises(ValueError, match="positive"):
        HealthProbe(URL, 1.0, fast_interval=0.0)


def _error_response(sqlstate: str, message: str) -> bytes:
    fields = [("S", "FATAL"), ("V", "FATAL"), ("C", sqlstate), ("M", message)]
    body = b"".join(k.encode() + v.encode() + b"\0" for k, v in fields) + b"\0"
    return b"E" + struct.pack("!I", len(body) + 4) + body


Reply = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def _listener(reply: Reply) -> AsyncIterator[str]:
    """A local TCP server running ``reply`` per connection; yields a URL that reaches it."""
    writers: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        await reply(reader, writer)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"postgresql://monitor@127.0.0.1:{port}/postgres?sslmode=disable"
    finally:
        server.close()
        for writer in writers:
            writer.close()
        await server.wait_closed()


async def _refuse_starting(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer a startup packet the way a starting server does (SQLSTATE 57P03)."""
    (length,) = struct.unpack("!I", await reader.readexactly(4))
    await reader.readexactly(length - 4)
    writer.write(_error_response("57P03", "the database system is starting up"))
    await writer.drain()
    writer.close()


async def _never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Accept and stay silent, like a hung server."""


async def test_a_starting_server_reads_as_starting() -> None:
    """A real libpq connection refused with 57P03 gives STARTING and keeps the reason."""
    async with _listener(_refuse_starting) as url:
        probe = HealthProbe(url, 2.0)
        snapshot = await probe.probe_once()
    assert snapshot.status is Status.STARTING
    assert "starting up" in snapshot.error


async def test_a_silent_server_is_down_after_the_connect_timeout() -> None:
    """A listener that never answers costs one connect timeout, then DOWN."""
    loop = asyncio.get_running_loop()
    async with _listener(_never_answer) as url:
        probe = HealthProbe(url, 0.3)
        started = loop.time()
        snapshot = await probe.probe_once()
        elapsed = loop.time() - started
    assert snapshot.status is Status.DOWN
    assert "0.3s" in snapshot.error
    assert 0.25 <= elapsed < 1.0


async def test_a_refused_connection_is_down_at_once() -> None:
    """Nothing listening: DOWN with the reason, well within the timeout."""
    loop = asyncio.get_running_loop()
    probe = HealthProbe(URL, 5.0)  # port 1: nothing listens there
    started = loop.time()
    snapshot = await probe.probe_once()
    assert snapshot.status is Status.DOWN
    assert snapshot.error
    assert loop.time() - started < 2.0


async def test_a_probe_that_resists_cancellation_is_still_abandoned() -> None:
    """A probe that waits again after the first cancellation (as psycopg does) is cut short."""
    loop = asyncio.get_running_loop()
    finished = asyncio.Event()

    async def stubborn(conninfo: str, seconds: float) -> Conn:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            try:
                await asyncio.sleep(30)  # psycopg's wait for the server-side cancel
            finally:
                finished.set()
        raise AssertionError("not reached")

    probe = HealthProbe(URL, 0.2, connector=stubborn)
    started = loop.time()
    snapshot = await probe.probe_once()
    assert snapshot.status is Status.DOWN
    assert finished.is_set()
    assert loop.time() - started < 0.2 + 0.5


async def test_an_unexpected_error_is_down_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    """A bug in the probe path reads as DOWN with the reason, and is logged, not raised."""

    async def broken(conninfo: str, seconds: float) -> Conn:
        raise RuntimeError("boom")

    probe = HealthProbe(URL, 1.0, connector=broken)
    snapshot = await probe.probe_once()
    assert (snapshot.status, snapshot.error) == (Status.DOWN, "boom")
    assert "failed unexpectedly" in caplog.text


@pytest.mark.parametrize(
    ("takes", "interval", "low", "high"),
    [
        # Longer than the interval: the next starts when it ends, never alongside.
        pytest.param(0.15, 0.1, 0.14, 0.5, id="probe-longer-than-interval"),
        # Shorter: starts are one interval apart, not probe + interval (0.8 s).
        pytest.param(0.3, 0.5, 0.49, 0.7, id="probe-within-interval"),
    ],
)
async def test_probes_never_overlap_and_keep_the_interval(
    takes: float, interval: float, low: float, high: float
) -> None:
    """run() starts one probe per interval, and a slow probe delays the next, never overlaps."""
    loop = asyncio.get_running_loop()
    starts: list[float] = []
    running = 0
    peak = 0
    enough = asyncio.Event()

    async def slow(conninfo: str, seconds: float) -> Conn:
        nonlocal running, peak
        starts.append(loop.time())
        running += 1
        peak = max(peak, running)
        try:
            await asyncio.sleep(takes)  # the probe's work
            raise psycopg.OperationalError("refused")
        finally:
            running -= 1
            if len(starts) >= 4:
                enough.set()

    # Failures would quicken the pace: one interval for both, to see it kept.
    probe = HealthProbe(URL, 1.0, interval=interval, fast_interval=interval, connector=slow)
    task = asyncio.create_task(probe.run())
    async with asyncio.timeout(10):
        await enough.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert peak == 1
    assert all(low <= gap < high for gap in gaps), gaps


@pytest.mark.parametrize(
    ("reading", "hold"),
    [
        (Reading(Status.PRIMARY), None),
        (Reading(Status.REPLICA, streaming=True), None),
        (Reading(Status.REPLICA, streaming=None), None),
        (Reading(Status.REPLICA, streaming=False), NO_UPSTREAM_HOLD),
        (Reading(Status.DOWN), OUTAGE_HOLD),
        (Reading(Status.STARTING), OUTAGE_HOLD),
    ],
)
def test_only_a_primary_or_a_streaming_replica_is_steady(reading: Reading, hold: float) -> None:
    """A replica that lost its upstream is about to be promoted or to reconnect, and a
    server down or starting about to come back: each keeps the probe quick a while."""
    assert reading.hold == hold


class _Info:
    """What psycopg says of a connection's login: with our guards in ``options`` or not."""

    def __init__(self, guarded: bool) -> None:
        self.options = "-c default_transaction_read_only=on" if guarded else ""

    def get_parameters(self) -> dict[str, str]:
        return {"options": self.options} if self.options else {}


class _FakeConn:
    """Answers the probe's query with the rows given, one per call (the last repeats)."""

    def __init__(
        self,
        rows: list[tuple[object, ...]],
        sock: socket.socket | None = None,
        guarded: bool = True,
    ) -> None:
        self.rows = rows
        self.sock = sock
        self.queries = 0
        self.sent: list[str] = []
        self.closed = False
        self.broken = False
        self.info = _Info(guarded)

    def nextset(self) -> bool:
        return True

    async def execute(self, sql: str, prepare: bool = False) -> _FakeConn:
        self.queries += 1
        self.sent.append(sql)
        if self.sock is not None:  # psycopg reads whatever the server sent meanwhile
            with contextlib.suppress(BlockingIOError):
                self.sock.recv(4096)
        return self

    async def fetchone(self) -> tuple[object, ...]:
        return self.rows.pop(0) if len(self.rows) > 1 else self.rows[0]

    def fileno(self) -> int:
        return self.sock.fileno() if self.sock is not None else -1

    async def close(self) -> None:
        self.closed = True


def _connector(conn: _FakeConn) -> Callable[[str, float], Awaitable[Conn]]:
    async def connect(conninfo: str, seconds: float) -> Conn:
        return cast(Conn, conn)

    return connect


async def test_a_replica_without_upstream_is_probed_quickly() -> None:
    """The probe reads the WAL receiver too: a replica that stops streaming quickens the
    pace for NO_UPSTREAM_HOLD, a streaming one settles to the slow pace."""
    clock = FakeClock()
    conn = _FakeConn([(True, True)] * 4 + [(True, None)])
    probe = HealthProbe(URL, 1.0, clock=clock, connector=_connector(conn))
    for _ in range(4):
        await probe.probe_once()
        clock.advance(probe.pace.interval(clock.now))
    assert probe.reading == Reading(Status.REPLICA, streaming=True)
    assert probe.pace.interval(clock.now) == probe.interval
    await probe.probe_once()
    assert probe.reading == Reading(Status.REPLICA, streaming=False)
    assert probe.snapshot.status is Status.REPLICA
    assert probe.pace.interval(clock.now) == FAST_INTERVAL
    clock.advance(NO_UPSTREAM_HOLD + 0.01)
    await probe.probe_once()
    assert probe.pace.interval(clock.now) == probe.interval


@pytest.mark.parametrize("guarded", [True, False])
async def test_the_probes_statement_is_bounded_by_the_server(guarded: bool) -> None:
    """Issue 36: on a connection that logged in with the guards the probe sends its one
    statement; on one that did not (a pooler refused them) it sends it inside a read-only
    transaction of its own with a statement limit of its connect timeout, rolled back,
    in the same round trip."""
    conn = _FakeConn([(False, None)], guarded=guarded)
    probe = HealthProbe(URL, 1.5, clock=FakeClock(), connector=_connector(conn))
    await probe.probe_once()
    assert probe.snapshot.status is Status.PRIMARY
    if guarded:
        assert conn.sent == [PROBE_SQL]
    else:
        assert conn.sent == [
            "BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY NOT DEFERRABLE; SET LOCAL jit = off; "
            f"SET LOCAL statement_timeout = 1500; {PROBE_SQL}; ROLLBACK"
        ]


async def test_a_scrape_that_saw_another_role_quickens_the_probe() -> None:
    """recovery_seen() from the collection pass wakes the probe only when it disagrees."""
    clock = FakeClock()
    probe = HealthProbe(URL, 1.0, clock=clock, connector=_connector(_FakeConn([(False, None)])))
    for _ in range(4):
        await probe.probe_once()
    assert probe.snapshot.status is Status.PRIMARY
    assert probe.pace.interval(clock.now) == probe.interval
    probe.recovery_seen(in_recovery=False)
    assert probe.pace.interval(clock.now) == probe.interval
    probe.recovery_seen(in_recovery=True)
    assert probe.pace.interval(clock.now) == FAST_INTERVAL
    assert probe.pace.spell is not None
    assert "scrape saw a replica" in probe.pace.spell.reason


async def test_the_server_writing_to_the_idle_connection_wakes_the_probe() -> None:
    """Between probes the idle connection is watched: the server only writes to it to end
    it, so the probe asks at once instead of a slow interval later."""
    ours, server = socket.socketpair()
    ours.setblocking(False)
    conn = _FakeConn([(False, None)], sock=ours)
    probe = HealthProbe(URL, 1.0, interval=30.0, connector=_connector(conn))
    task = asyncio.create_task(probe.run())
    try:
        await poll(lambda: not probe.pace.is_fast(time.monotonic()))
        asked = conn.queries
        server.send(b"E")  # e.g. "terminating connection due to administrator command"
        await poll(lambda: conn.queries > asked)
        assert probe.pace.is_fast(time.monotonic())
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        ours.close()
        server.close()


class _SlowReader(_FakeConn):
    """Answers after a short wait and a few more turns of the loop, as psycopg does when
    it reads an answer: each turn is a loop iteration a busy loop may not give in time."""

    async def execute(self, sql: str, prepare: bool = False) -> _FakeConn:
        self.queries += 1
        await asyncio.sleep(0.01)
        for _ in range(5):
            await asyncio.sleep(0)
        return self


async def test_a_deadline_the_busy_loop_reached_late_records_no_down() -> None:
    """The loop, blocked past the probe's deadline (a page built on it, say), leaves the
    answer unread: that is no evidence that the server is down. The probe gives the answer
    a second deadline and reads it; nothing says 'down' (issue 25)."""
    loop = asyncio.get_running_loop()
    conn = _SlowReader([(False, None)])
    probe = HealthProbe(URL, 0.1, connector=_connector(conn))
    assert (await probe.probe_once()).status is Status.PRIMARY
    loop.call_later(0.005, time.sleep, 0.3)  # blocks the loop across the deadline
    snapshot = await probe.probe_once()
    assert snapshot.status is Status.PRIMARY, snapshot
    assert probe.late_streak == 0


async def test_a_probe_the_loop_kept_from_hearing_keeps_the_last_reading(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """If the loop was late at both deadlines, the probe takes no reading: the last
    snapshot stands (current() turns it UNKNOWN once too old), a first probe stays
    UNKNOWN with the reason, and the next probe comes at the fast interval."""
    loop = asyncio.get_running_loop()

    async def hung(conninfo: str, seconds: float) -> Conn:
        await asyncio.sleep(30)
        raise AssertionError("not reached")

    def block_twice() -> None:
        time.sleep(0.3)  # late at the first deadline
        loop.call_later(0.02, time.sleep, 0.3)  # and at the second, which starts just now

    probe = HealthProbe(URL, 0.1, connector=hung)
    loop.call_later(0.005, block_twice)
    snapshot = await probe.probe_once()
    assert snapshot.status is Status.UNKNOWN
    assert "too busy" in snapshot.error
    assert probe.late_streak == 1
    assert "busy elsewhere" in caplog.text
    assert probe.next_interval() == probe.pace.fast  # asks again soon, once
    probe.late_streak = 2
    assert probe.next_interval() == probe.pace.interval(time.monotonic())


async def test_a_silent_server_is_down_once_the_loop_listens_on_time() -> None:
    """A probe of a silent server that the blocked loop made late reads nothing; the next
    one, with the loop listening for a whole connect timeout, reads DOWN."""
    loop = asyncio.get_running_loop()
    async with _listener(_never_answer) as url:
        probe = HealthProbe(url, 0.2)
        loop.call_later(0.05, time.sleep, 0.3)
        assert (await probe.probe_once()).status is Status.UNKNOWN
        snapshot = await probe.probe_once()
    assert snapshot.status is Status.DOWN
    assert "0.2s" in snapshot.error
    assert probe.late_streak == 0


async def test_a_first_reading_of_down_is_probed_at_the_slow_pace() -> None:
    """A probe that starts against a server already down saw nothing change: it asks at
    the slow pace, so naming unreachable targets costs one attempt a second each, not
    ten (issue 25); a change to down still quickens it."""
    probe = HealthProbe(URL, 1.0)  # port 1: refused
    await probe.probe_once()
    assert probe.snapshot.status is Status.DOWN
    assert probe.pace.interval(time.monotonic()) == probe.interval
    conn = _FakeConn([(False, None)])
    up_then_down = HealthProbe(URL, 1.0, connector=_connector(conn))
    for _ in range(4):
        await up_then_down.probe_once()
    conn.closed = True

    async def refused(conninfo: str, seconds: float) -> Conn:
        raise psycopg.OperationalError("Connection refused")

    up_then_down._connector = refused
    await up_then_down.probe_once()
    assert up_then_down.snapshot.status is Status.DOWN
    assert up_then_down.pace.interval(time.monotonic()) == FAST_INTERVAL


async def test_a_probe_that_must_connect_waits_for_a_place_outside_its_deadline() -> None:
    """With every connecting place taken, a probe that needs a connection waits for one
    before its deadline starts (the wait is not the server's silence); a probe on its
    kept connection needs no place."""
    places = asyncio.Semaphore(1)
    conn = _FakeConn([(False, None)])
    dialled = 0

    async def connect(conninfo: str, seconds: float) -> Conn:
        nonlocal dialled
        dialled += 1
        return cast(Conn, conn)

    probe = HealthProbe(URL, 0.1, connector=connect, connecting=places)
    await places.acquire()
    waiting = asyncio.create_task(probe.probe_once())
    await asyncio.sleep(0.3)  # three connect timeouts: the probe must still be waiting
    assert not waiting.done()
    assert (dialled, probe.snapshot.status) == (0, Status.UNKNOWN)
    places.release()
    assert (await asyncio.wait_for(waiting, 5.0)).status is Status.PRIMARY
    await places.acquire()  # every place taken again
    assert (await asyncio.wait_for(probe.probe_once(), 5.0)).status is Status.PRIMARY
    assert dialled == 1


class _Sluggish(_FakeConn):
    """Answers after ``seconds`` (the server takes its time)."""

    def __init__(self, rows: list[tuple[object, ...]], seconds: float) -> None:
        super().__init__(rows)
        self.seconds = seconds

    async def execute(self, sql: str, prepare: bool = False) -> _FakeConn:
        self.queries += 1
        await asyncio.sleep(self.seconds)
        return self


async def _steady_primary(probe: HealthProbe) -> None:
    for _ in range(4):
        await probe.probe_once()
    assert not probe.pace.is_fast(time.monotonic())


async def test_a_slow_answer_quickens_the_probe_only_when_the_loop_is_not_to_blame() -> None:
    """An answer slower than SLOW_ANSWER from a server on an idle loop starts a fast spell;
    the same slowness while the loop is busy at every turn does not: quickening every
    probe of an overloaded exporter would only load it more (issue 25)."""
    slow = _Sluggish([(False, None)], 0.0)
    probe = HealthProbe(URL, 2.0, connector=_connector(slow))
    await _steady_primary(probe)
    slow.seconds = SLOW_ANSWER * 1.5
    await probe.probe_once()
    assert probe.pace.is_fast(time.monotonic())

    busy = _SlowReader([(False, None)])
    probe = HealthProbe(URL, 2.0, connector=_connector(busy))
    await _steady_primary(probe)
    loop = asyncio.get_running_loop()
    done = False

    def hog() -> None:  # a turn of 0.1 s, again and again: the loop is busy elsewhere
        time.sleep(0.1)
        if not done:
            loop.call_soon(hog)

    loop.call_soon(hog)
    try:
        snapshot = await probe.probe_once()
    finally:
        done = True
    assert snapshot.status is Status.PRIMARY
    assert not probe.pace.is_fast(time.monotonic())


async def _fill(servers: Bulkheads, url: str, count: int) -> None:
    """Take ``count`` places at ``url``'s server, as busy passes would."""
    for _ in range(count):
        await servers.connect(url, 1.0, probe=False, connector=_connector(_FakeConn([(1,)])))


async def test_a_probe_held_back_by_its_servers_bulkhead_says_not_probed() -> None:
    """Every place at the server taken: the probe dials nothing and publishes "unknown",
    marked not probed, with why (issue 29); it answers at once, within its deadline."""
    conn = _FakeConn([(False, None)])
    probe = HealthProbe(URL, 1.0, connector=_connector(conn))
    await _fill(probe.logins.servers, URL, probe.logins.servers.max_connections)
    snapshot = await probe.probe_once()
    assert (snapshot.status, snapshot.not_probed) == (Status.UNKNOWN, True)
    assert snapshot.error == f"not probed: {HELD_CONNECTIONS}"
    assert conn.queries == 0


async def test_a_probe_held_back_keeps_a_server_down_as_down() -> None:
    """A target already seen down stays down when its server's bulkhead holds the next
    probe back: nothing new was learnt of it."""

    async def refused(conninfo: str, seconds: float) -> Conn:
        raise psycopg.OperationalError("Connection refused")

    probe = HealthProbe(URL, 1.0, connector=refused)
    assert (await probe.probe_once()).status is Status.DOWN
    await _fill(probe.logins.servers, URL, probe.logins.servers.max_connections)
    snapshot = await probe.probe_once()
    assert (snapshot.status, snapshot.not_probed) == (Status.DOWN, False)
    assert snapshot.error == f"Connection refused; not probed: {HELD_CONNECTIONS}"
    again = await probe.probe_once()
    assert again.error == snapshot.error  # the reasons do not pile up


async def test_a_probe_gives_its_place_back_when_it_closes() -> None:
    """The probe's connection holds a place at its server from its login until closed."""
    probe = HealthProbe(URL, 1.0, connector=_connector(_FakeConn([(False, None)])))
    await probe.probe_once()
    [bulkhead] = list(probe.logins.servers)
    assert (bulkhead.held, bulkhead.probes) == (1, 1)
    await probe.probe_once()  # on its kept connection: no second place
    assert bulkhead.held == 1
    await probe.close()
    assert (bulkhead.held, bulkhead.probes) == (0, 0)


async def test_a_lost_probe_connection_gives_its_place_back_before_the_next() -> None:
    """The server ended the probe's connection between two probes: the new one takes
    the old one's place, not one more."""
    first, second = _FakeConn([(False, None)]), _FakeConn([(False, None)])
    conns = iter([first, second])

    async def connect(conninfo: str, seconds: float) -> Conn:
        return cast(Conn, next(conns))

    probe = HealthProbe(URL, 1.0, connector=connect)
    await probe.probe_once()
    first.closed = True  # lost: the server went away
    assert (await probe.probe_once()).status is Status.PRIMARY
    [bulkhead] = list(probe.logins.servers)
    assert bulkhead.held == 1
