"""Per-server bulkheads without a server (issue 29): places, who gives way, and logins.

The connector is a stand-in: what a bulkhead decides depends only on how a dial ends.
"""

from __future__ import annotations

import asyncio
import logging
from typing import cast

import psycopg
import pytest

from exporter.config.settings import Settings
from exporter.pg.addresses import LOCAL, ServerKey
from exporter.pg.bulkheads import (
    HELD_CONNECTIONS,
    HELD_LOGINS,
    HELD_PROBES,
    Bulkhead,
    Bulkheads,
    Conn,
    Lease,
    LoginsHeld,
    NotAdmitted,
    server_samples,
)
from tests.fixtures.clock import FakeClock
from tests.fixtures.polling import poll

KEY = ServerKey("10.0.0.5", 5432)


class Holder:
    """A pass's database holding one idle connection; closing it frees its place."""

    def __init__(self) -> None:
        self.lease: Lease | None = None
        self.closed = 0

    async def disconnect(self) -> None:
        self.closed += 1
        lease, self.lease = self.lease, None
        await asyncio.sleep(0)  # the backend ends a moment later
        if lease is not None:
            lease.release()


async def _idle(bulkhead: Bulkhead) -> Holder:
    """A pass connection that is open and idle (kept between two passes)."""
    holder = Holder()
    holder.lease = await bulkhead.take(probe=False)
    holder.lease.holder = holder
    holder.lease.use(busy=False)
    return holder


def _bulkhead(limit: int = 4, per_minute: float = 60, clock: FakeClock | None = None) -> Bulkhead:
    return Bulkhead(KEY, limit, per_minute, clock or FakeClock())


async def test_places_are_taken_up_to_the_limit_and_given_back() -> None:
    """Four places; each given back once (a second release changes nothing)."""
    bulkhead = _bulkhead()
    leases = [await bulkhead.take(probe=False) for _ in range(4)]
    assert (bulkhead.held, bulkhead.peak) == (4, 4)
    leases[0].release()
    leases[0].release()
    assert bulkhead.held == 3


async def test_a_pass_waits_for_a_place_until_one_is_given_back() -> None:
    """Every place busy: the pass waits (its request's budget bounds it), counted once."""
    bulkhead = _bulkhead(limit=2)
    leases = [await bulkhead.take(probe=False) for _ in range(2)]
    waiting = asyncio.create_task(bulkhead.take(probe=False))
    await asyncio.sleep(0)
    assert not waiting.done()
    assert (bulkhead.waiting, bulkhead.waits) == (1, 1)
    leases[1].release()
    lease = await asyncio.wait_for(waiting, 1)
    assert (bulkhead.held, bulkhead.waiting, bulkhead.waits) == (2, 0, 1)
    assert not lease.probe


async def test_a_probe_that_finds_no_place_does_not_wait() -> None:
    """Every place busy and none idle: the probe is held back at once, saying why."""
    bulkhead = _bulkhead(limit=2)
    for _ in range(2):
        await bulkhead.take(probe=False)
    with pytest.raises(NotAdmitted, match=HELD_CONNECTIONS):
        await bulkhead.take(probe=True)
    assert bulkhead.refused == 1


async def test_probes_hold_at_most_half_the_places() -> None:
    """Health probes take half; the other half stays the passes' whatever is asked."""
    bulkhead = _bulkhead(limit=4)
    for _ in range(2):
        await bulkhead.take(probe=True)
    with pytest.raises(NotAdmitted, match=HELD_PROBES):
        await bulkhead.take(probe=True)
    assert bulkhead.probes == 2
    for _ in range(2):
        await bulkhead.take(probe=False)
    assert bulkhead.held == 4


async def test_an_idle_pass_connection_gives_way_least_recently_used_first() -> None:
    """Room is made by closing the idle pass connection used longest ago, whichever
    target it serves; a busy one is never closed."""
    bulkhead = _bulkhead(limit=3)
    old, recent = await _idle(bulkhead), await _idle(bulkhead)
    busy = await _idle(bulkhead)
    assert busy.lease is not None
    assert old.lease is not None
    busy.lease.use(busy=True)
    old.lease.use(busy=True)  # used by a pass again, and idle after it: the most recent
    old.lease.use(busy=False)
    await bulkhead.take(probe=False)
    assert (old.closed, recent.closed, busy.closed) == (0, 1, 0)
    assert bulkhead.evictions == 1
    assert bulkhead.held == 3


async def test_a_probe_may_close_an_idle_pass_connection_within_its_share() -> None:
    """A kept pass connection is the cheapest place to give: a probe below its share
    takes it rather than answer "not probed"."""
    bulkhead = _bulkhead(limit=2)
    await bulkhead.take(probe=False)
    idle = await _idle(bulkhead)
    lease = await bulkhead.take(probe=True)
    assert (idle.closed, lease.probe, bulkhead.probes) == (1, True, 1)


async def test_a_waiting_pass_takes_a_connection_that_turns_idle() -> None:
    """A pass waiting behind busy ones proceeds as soon as one of them goes idle."""
    bulkhead = _bulkhead(limit=1)
    holder = await _idle(bulkhead)
    assert holder.lease is not None
    holder.lease.use(busy=True)
    waiting = asyncio.create_task(bulkhead.take(probe=False))
    await asyncio.sleep(0)
    assert not waiting.done()
    holder.lease.use(busy=False)
    await asyncio.wait_for(waiting, 1)
    assert holder.closed == 1


async def test_a_probe_leaves_half_the_logins_to_the_passes() -> None:
    """Once half the bucket is spent, only passes log in; a pass without a token fails
    at once, naming the server and the flag."""
    bulkhead = _bulkhead(limit=4)
    for _ in range(2):
        bulkhead.admit_login(probe=True)
        bulkhead.login_ended(failed=True)
    with pytest.raises(NotAdmitted, match=HELD_LOGINS):
        bulkhead.admit_login(probe=True)
    for _ in range(2):
        bulkhead.admit_login(probe=False)
        bulkhead.login_ended(failed=True)
    with pytest.raises(LoginsHeld, match=r"10\.0\.0\.5:5432.*--server\.max-failed-logins"):
        bulkhead.admit_login(probe=False)
    assert (bulkhead.logins.failed, bulkhead.logins.held, bulkhead.refused) == (4, 2, 1)


async def test_a_strain_is_logged_once_and_its_end_once(caplog: pytest.LogCaptureFixture) -> None:
    """A warning when the places first hold work back, nothing for the requests after
    it, one line when they are back to half."""
    caplog.set_level(logging.INFO, "exporter.pg.bulkheads")
    bulkhead = _bulkhead(limit=2)
    leases = [await bulkhead.take(probe=False) for _ in range(2)]
    for _ in range(5):
        with pytest.raises(NotAdmitted):
            await bulkhead.take(probe=True)
    leases[0].release()
    leases[1].release()
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0][0] == "WARNING"
    assert "server 10.0.0.5:5432: every connection" in lines[0][1]
    assert lines[1] == ("INFO", "connections at this server are back under its limit")


class _Connector:
    """Dials that end as given, in turn: None is a connection, an exception its failure."""

    def __init__(self, *outcomes: BaseException | None) -> None:
        self.outcomes = outcomes
        self.dialled: list[str] = []

    async def __call__(self, conninfo: str, connect_timeout: float) -> Conn:
        self.dialled.append(conninfo)
        outcome = self.outcomes[len(self.dialled) - 1]
        if outcome is not None:
            raise outcome
        return cast(Conn, object())


REFUSED = psycopg.OperationalError('FATAL:  password authentication failed for user "m"')
URL = "postgresql://m@10.0.0.5/postgres"


async def test_a_connection_holds_its_place_at_the_server_it_reached() -> None:
    """A success: a place at its server's key, its login token given back."""
    servers = Bulkheads(4, 60)
    _, lease = await servers.connect(URL, 1.0, probe=False, connector=_Connector(None))
    bulkhead = servers.of(KEY)
    assert (lease.bulkhead, bulkhead.held, bulkhead.logins.failed) == (bulkhead, 1, 0)
    assert bulkhead.logins.full


async def test_a_refused_login_spends_a_token_and_frees_its_place_at_once() -> None:
    """The server answered: its backend is over, its verdict counted."""
    servers = Bulkheads(4, 60)
    with pytest.raises(psycopg.OperationalError, match="authentication failed"):
        await servers.connect(URL, 1.0, probe=False, connector=_Connector(REFUSED))
    bulkhead = servers.of(KEY)
    assert (bulkhead.held, bulkhead.logins.failed) == (0, 1)


async def test_a_login_given_up_on_keeps_its_place_a_moment() -> None:
    """A timeout: its backend may still be authenticating, so its place stays taken for
    the linger, and it counts as failed (the server may have refused it)."""
    servers = Bulkheads(4, 60, linger=0.05)
    timed_out = psycopg.errors.ConnectionTimeout("connection timeout expired")
    with pytest.raises(psycopg.OperationalError):
        await servers.connect(URL, 1.0, probe=False, connector=_Connector(timed_out))
    bulkhead = servers.of(KEY)
    assert (bulkhead.held, bulkhead.logins.failed) == (1, 1)
    await poll(lambda: bulkhead.held == 0, "the place given back after the linger")


async def test_a_server_that_is_not_there_costs_no_token() -> None:
    """Connection refused: no backend, no login, nothing spent; the place is free."""
    servers = Bulkheads(4, 60)
    down = psycopg.OperationalError("connection failed: Connection refused")
    with pytest.raises(psycopg.OperationalError):
        await servers.connect(URL, 1.0, probe=True, connector=_Connector(down))
    bulkhead = servers.of(KEY)
    assert (bulkhead.held, bulkhead.logins.failed) == (0, 0)


async def test_each_host_of_a_multi_host_url_is_tried_at_its_own_server() -> None:
    """The first host refused the connection: the second is dialled, counted there."""
    servers = Bulkheads(4, 60)
    down = psycopg.OperationalError("Connection refused")
    connect = _Connector(down, None)
    _, lease = await servers.connect(
        "host=10.0.0.5,10.0.0.6 dbname=x", 1.0, probe=False, connector=connect
    )
    assert lease.bulkhead.key == ServerKey("10.0.0.6", 5432)
    assert (servers.of(KEY).held, lease.bulkhead.held) == (0, 1)
    assert len(connect.dialled) == 2


async def test_every_host_failing_says_each_reason() -> None:
    """Several attempts failed: the error lists them, the last first."""
    servers = Bulkheads(4, 60)
    connect = _Connector(psycopg.OperationalError("first"), REFUSED)
    with pytest.raises(psycopg.OperationalError) as raised:
        await servers.connect("host=10.0.0.5,10.0.0.6 dbname=x", 1.0, probe=False,
                              connector=connect)  # fmt: skip
    assert str(raised.value).startswith(str(REFUSED))
    assert "- first" in str(raised.value)


async def test_names_of_one_address_share_its_bulkhead() -> None:
    """127.0.0.1 and a Unix socket of the same port are one server: a second target's
    probe finds the first target's places taken."""
    servers = Bulkheads(2, 60)
    for url in ("postgresql://a@127.0.0.1/x", "host=/tmp dbname=y"):
        await servers.connect(url, 1.0, probe=False, connector=_Connector(None))
    with pytest.raises(NotAdmitted):
        await servers.connect("postgresql://b@[::1]/z", 1.0, probe=True, connector=_Connector(None))
    assert [b.key for b in servers] == [ServerKey(LOCAL, 5432)]


async def test_the_default_limit_never_cuts_a_single_targets_own_budget() -> None:
    """20 places, or --max-connections when it is larger; the flag, when given, wins."""
    assert Bulkheads.for_settings(Settings()).max_connections == 20
    assert Bulkheads.for_settings(Settings(max_connections=40)).max_connections == 40
    given = Settings(max_connections=40, server_max_connections=10)
    assert Bulkheads.for_settings(given).max_connections == 10


async def test_self_metrics_label_each_server() -> None:
    """One sample per server in each family, labelled with its key."""
    servers = Bulkheads(4, 60)
    await servers.connect(URL, 1.0, probe=True, connector=_Connector(None))
    families = {suffix: samples for suffix, _, _, samples in server_samples(servers)}
    labels = (("server", "10.0.0.5:5432"),)
    assert families["exporter_server_connections"] == [(labels, 1.0)]
    assert families["exporter_server_probe_connections"] == [(labels, 1.0)]
    assert families["exporter_server_connections_max"] == [(labels, 4.0)]
    assert families["exporter_server_failed_logins_max"] == [(labels, 60.0)]
