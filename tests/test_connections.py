"""The connection limit's arithmetic: who is closed, and what is counted (issue 13)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import cast

import psycopg
import pytest

from exporter.pg.bulkheads import Bulkheads, Conn, LoginsHeld
from exporter.pg.connections import ConnectionLimit, LoginHeld, Logins, lru_victims, refused_login
from tests.fixtures.clock import FakeClock


class FakeHolder:
    """A database that holds one connection and gives it back to the limit."""

    def __init__(self, limit: ConnectionLimit, label: str) -> None:
        self.limit = limit
        self.label = label
        self.connected = False

    async def connect(self) -> None:
        await self.limit.make_room(self)
        self.connected = True
        self.limit.opened_for(self)

    async def disconnect(self) -> None:
        self.connected = False
        await self.limit.close(self, asyncio.sleep(0))


def test_no_victim_while_there_is_room() -> None:
    """Below the capacity nobody is closed."""
    assert lru_victims(["a", "b"], set(), 3) == []


def test_least_recently_used_goes_first_and_busy_never() -> None:
    """The oldest idle holders are chosen, as many as needed for one more."""
    assert lru_victims(["a", "b", "c"], set(), 3) == ["a"]
    assert lru_victims(["a", "b", "c"], {"a"}, 3) == ["b"]
    assert lru_victims(["a", "b", "c", "d"], set(), 3) == ["a", "b"]


def test_a_limit_must_leave_one_connection_for_a_database() -> None:
    """The probe's reserved connection and one database's: at least 2."""
    with pytest.raises(ValueError, match="leaves no connection"):
        ConnectionLimit(1)
    assert ConnectionLimit(2).capacity == 1


async def test_limit_closes_the_least_recently_used_and_counts() -> None:
    """With room for two, a third database closes the one used longest ago."""
    limit = ConnectionLimit(3)  # two for databases, one for the probe
    a, b, c = (FakeHolder(limit, name) for name in "abc")
    await a.connect()
    await b.connect()
    limit.used(a)  # a is now more recent than b
    await c.connect()
    assert (a.connected, b.connected, c.connected) == (True, False, True)
    assert (limit.open, limit.peak, limit.opened, limit.evictions) == (2, 2, 3, 1)
    assert limit.opened_by == {"a": 1, "b": 1, "c": 1}


async def test_no_limit_never_closes() -> None:
    """Without a limit every database keeps its connection (D5 as before)."""
    limit = ConnectionLimit.unlimited()
    holders = [FakeHolder(limit, str(n)) for n in range(10)]
    for holder in holders:
        await holder.connect()
    assert all(h.connected for h in holders)
    assert limit.evictions == 0


async def test_a_database_that_goes_is_forgotten() -> None:
    """Its per-database count is dropped; the total stays monotonic."""
    limit = ConnectionLimit(4)
    holder = FakeHolder(limit, "gone")
    await holder.connect()
    await holder.disconnect()
    limit.forget("gone")
    assert (limit.opened_by, limit.opened, limit.open) == ({}, 1, 0)


async def test_a_walk_waits_while_every_connection_is_busy() -> None:
    """With room for one and that one busy, another database waits for it to finish,
    then takes its place: the limit is never exceeded."""
    limit = ConnectionLimit(2)  # one for a database
    a, b = FakeHolder(limit, "a"), FakeHolder(limit, "b")
    await a.connect()
    limit.busy(a, busy=True)
    waiting = asyncio.create_task(b.connect())
    await asyncio.sleep(0)
    assert not waiting.done()
    assert not b.connected
    limit.busy(a, busy=False)
    await waiting
    assert (a.connected, b.connected, limit.peak) == (False, True, 1)


async def test_a_reservation_given_back_frees_the_place() -> None:
    """A connection that could not be opened gives its reserved place back."""
    limit = ConnectionLimit(2)
    holder = FakeHolder(limit, "a")
    await limit.make_room(holder)
    limit.cancel()
    await holder.connect()  # would wait for ever if the place were still taken
    assert limit.open == 1


WRONG_PASSWORD = (
    'connection failed: connection to server at "127.0.0.1", port 5432 failed: '
    'FATAL:  password authentication failed for user "mon"'
)
REFUSED = 'connection to server at "127.0.0.1", port 1 failed: Connection refused'


class Dialler:
    """Counts dials; each fails with the next of ``errors`` (None: succeeds)."""

    def __init__(self, *errors: str | None) -> None:
        self.errors = list(errors)
        self.dials = 0

    async def __call__(self) -> str:
        self.dials += 1
        error = self.errors.pop(0)
        if error is not None:
            raise psycopg.OperationalError(error)
        return "conn"


async def _try(
    logins: Logins, dial: Callable[[], Awaitable[str]], database: str | None = None
) -> str:
    try:
        return await logins.connect(database, dial)
    except psycopg.OperationalError as exc:
        return f"{type(exc).__name__}: {exc}"


@pytest.mark.parametrize(
    ("message", "refused"),
    [
        (WRONG_PASSWORD, True),
        ('FATAL:  role "nouser" does not exist', True),
        ('FATAL:  pg_hba.conf rejects connection for host "127.0.0.1", user "u"', True),
        ('FATAL:  no pg_hba.conf entry for host "10.0.0.1", user "u", database "d"', True),
        ('FATAL:  role "u" is not permitted to log in', True),
        ("fe_sendauth: no password supplied", True),
        (REFUSED, False),
        ("FATAL:  the database system is starting up", False),
        ("FATAL:  sorry, too many clients already", False),
        ('FATAL:  database "gone" does not exist', False),
    ],
)
def test_refused_login_is_the_servers_refusal_to_log_in(message: str, refused: bool) -> None:
    """SQLSTATE class 28 by its message (libpq gives a failed connection no SQLSTATE);
    a down, starting or full server is not a refusal."""
    assert refused_login(psycopg.OperationalError(message)) is refused


async def test_a_refused_login_holds_the_next_until_its_wait_is_over() -> None:
    """After a refusal no connection is attempted for the wait (LoginHeld, with the last
    refusal), then one is; each refusal in a row doubles the wait; a success forgets."""
    clock = FakeClock()
    logins = Logins(clock=clock, random=lambda: 0.0)
    dial = Dialler(WRONG_PASSWORD, WRONG_PASSWORD, None)
    assert "password authentication failed" in await _try(logins, dial)
    held = await _try(logins, dial)
    assert held.startswith("LoginHeld:")
    assert "password authentication failed" in held
    assert "refused the last 1 login(s)" in held
    assert (dial.dials, logins.held, logins.wait()) == (1, 1, 1.0)
    clock.advance(1.0)
    assert "password authentication failed" in await _try(logins, dial)
    assert logins.wait() == 2.0
    clock.advance(1.9)
    assert (await _try(logins, dial)).startswith("LoginHeld:")
    clock.advance(0.1)
    assert await _try(logins, dial) == "conn"
    assert (dial.dials, logins.wait()) == (3, 0.0)


async def test_one_login_at_a_time_after_a_refusal() -> None:
    """While the retry after a refusal is under way, the probe and the pass do not add
    their own: they are held until its verdict."""
    clock = FakeClock()
    logins = Logins(clock=clock, random=lambda: 0.0)
    gate = asyncio.Event()

    async def slow() -> str:
        await gate.wait()
        return "conn"

    await _try(logins, Dialler(WRONG_PASSWORD))
    clock.advance(1.0)
    retry = asyncio.create_task(logins.connect(None, slow))
    await asyncio.sleep(0)
    assert (await _try(logins, Dialler(None))).startswith("LoginHeld:")
    gate.set()
    assert await retry == "conn"
    assert await _try(logins, Dialler(None)) == "conn"


async def test_refused_connections_and_other_databases_are_not_held() -> None:
    """A server that is down or restarting is tried at once, as before (health checks
    must see it back); one database's refusal holds only that database."""
    logins = Logins(clock=FakeClock(), random=lambda: 0.0)
    dial = Dialler(REFUSED, REFUSED, WRONG_PASSWORD, None)
    await _try(logins, dial)
    await _try(logins, dial)
    assert dial.dials == 2
    assert "password" in await _try(logins, dial, "other")
    assert await _try(logins, dial) == "conn"
    assert logins.wait("other") > 0


async def test_reset_and_a_cancelled_retry_let_the_next_login_go() -> None:
    """A reload forgets the refusals; a retry cancelled with its request is no verdict."""
    clock = FakeClock()
    logins = Logins(clock=clock, random=lambda: 0.0)
    await _try(logins, Dialler(WRONG_PASSWORD))
    logins.reset()
    assert await _try(logins, Dialler(None)) == "conn"
    await _try(logins, Dialler(WRONG_PASSWORD))
    clock.advance(1.0)

    async def cancelled() -> str:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await logins.connect(None, cancelled)
    assert await _try(logins, Dialler(None)) == "conn"


def test_login_held_is_an_operational_error() -> None:
    """Passes and the probe handle a held login as the connection failure it stands for."""
    assert issubclass(LoginHeld, psycopg.OperationalError)


async def test_a_login_the_servers_bulkhead_held_back_is_no_verdict() -> None:
    """Held back by the server's bound on failed logins (issue 29), the login reached no
    server: the target's refusals stand, so its next refusal doubles the wait."""
    clock = FakeClock()
    logins = Logins(clock=clock, random=lambda: 0.0)
    await _try(logins, Dialler(WRONG_PASSWORD))
    clock.advance(1.0)

    async def held() -> str:
        raise LoginsHeld("not tried: too many failed logins at the server")

    assert (await _try(logins, held)).startswith("LoginsHeld:")
    await _try(logins, Dialler(WRONG_PASSWORD))
    assert logins.wait() == 2.0  # the second refusal in a row, not a first again


class ServerHolder:
    """A database of one target, connecting through the limit and the server's bulkhead."""

    def __init__(self, limit: ConnectionLimit, label: str) -> None:
        self.limit = limit
        self.label = label
        self.connected = False

    async def connect(self) -> None:
        async def dial(conninfo: str, connect_timeout: float) -> Conn:
            return cast(Conn, object())

        await self.limit.make_room(self)
        await self.limit.dial(self, None, "host=10.0.0.5 dbname=x", 1.0, connector=dial)
        self.connected = True
        self.limit.opened_for(self)

    async def disconnect(self) -> None:
        self.connected = False
        await self.limit.close(self, asyncio.sleep(0))


async def test_targets_on_one_server_share_its_places() -> None:
    """Two targets' limits within one process's bulkheads of two places: the second
    target's third connection closes the first target's idle one, never a busy one; a
    closed connection's place is free again."""
    servers = Bulkheads(2, 60)
    first, second = ConnectionLimit(4, servers=servers), ConnectionLimit(4, servers=servers)
    a, b, c = ServerHolder(first, "a"), ServerHolder(second, "b"), ServerHolder(second, "c")
    await a.connect()  # outside a pass: idle at once
    second.busy(b, busy=True)
    await b.connect()
    [bulkhead] = list(servers)
    assert bulkhead.held == 2
    await c.connect()
    assert (a.connected, b.connected, c.connected) == (False, True, True)
    assert (bulkhead.held, bulkhead.evictions, first.open) == (2, 1, 0)
    await c.disconnect()
    assert bulkhead.held == 1
