"""The fleet without PostgreSQL: members built without connecting, reloads that keep
what did not change, the probe ceiling, and the janitor that gives idle targets'
connections back. Probes here meet a refused port (nothing listens on port 1), so they
answer "down" at once; probing a live server is in tests/integration/test_fleet_*.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest

import exporter.fleet.members as fleet_module
from exporter.collect.exporter import Exporter
from exporter.config.definitions import Collector, Column, Definitions, Usage
from exporter.config.settings import Settings
from exporter.config.targetsfile import Declared, DeclaredTarget
from exporter.fleet.members import CONNECTIONS_IDLE, Fleet, Member
from exporter.health.probe import Status
from exporter.health.probeslots import ProbeSlots
from tests.fixtures.polling import poll

NOWHERE = "postgresql://monitor@127.0.0.1:1/{}?sslmode=disable"
WAIT = 30.0  # seconds: a deadline on what happens in milliseconds


def _target(name: str, database: str | None = None) -> DeclaredTarget:
    # The refusal comes at once; the timeout only bounds how long a first health
    # request may wait for it, so it is generous for a loaded machine.
    settings = Settings(url=NOWHERE.format(database or name), connect_timeout=5.0)
    return DeclaredTarget(name, settings)


def _declared(*targets: DeclaredTarget) -> Declared:
    return Declared("/etc/pg_exporter/targets.yml", targets)


def _definitions(key: str = "pg_one") -> Definitions:
    column = Column("one", Usage.GAUGE)
    return Definitions((Collector(key, key, "SELECT 1 AS one", (column,)),))


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    """A started fleet of targets a, b and c; closed after the test."""
    started = Fleet(
        Settings(url=NOWHERE.format("x")),
        _declared(_target("a"), _target("b"), _target("c")),
        _definitions(),
    )
    started.start()
    yield started
    await started.close()


def _member(fleet: Fleet, name: str) -> Member:
    member = fleet.member(name)
    assert member is not None, name
    return member


# --- members -------------------------------------------------------------------------------


async def test_start_builds_every_member_without_probing(fleet: Fleet) -> None:
    """Every declared target gets a member; none probes until asked about."""
    assert list(fleet.members) == ["a", "b", "c"]
    assert fleet.member("nobody") is None
    assert not any(member.probing for member in fleet.members.values())
    assert fleet.probes.alive == 0


async def test_a_member_shares_one_login_back_off_and_the_recovery_state(fleet: Fleet) -> None:
    """A member's passes and its probe share the login back-off, and a pass tells the
    probe the recovery state it read (issue 25)."""
    member = _member(fleet, "a")
    exporter = member.state.exporter
    assert member.probe.logins is exporter.connections.logins
    assert exporter.recovery_seen == member.probe.recovery_seen


async def test_members_share_the_fleets_gate_but_nothing_else(fleet: Fleet) -> None:
    """Passes of every member go through the fleet's one gate; each has its own
    exporter and admission."""
    a, b = _member(fleet, "a").state, _member(fleet, "b").state
    assert a.exporter.gate is b.exporter.gate is fleet.gate
    assert a.exporter is not b.exporter
    assert a.admission is not b.admission


async def test_every_member_and_its_probe_connect_within_the_fleets_bulkheads(
    fleet: Fleet,
) -> None:
    """One registry of per-server bulkheads for the process (issue 29): every member's
    passes and health probe open their connections within it, built from the flags."""
    for member in fleet.members.values():
        assert member.state.exporter.connections.servers is fleet.servers
        assert member.probe.logins.servers is fleet.servers
    assert fleet.servers.max_connections == 20


async def test_a_health_request_starts_the_probe_and_gets_its_first_answer(fleet: Fleet) -> None:
    """The first health request starts the member's probe and waits for its first
    answer (here: down, the port refuses), holding one probe place."""
    snapshot = await fleet.health(_member(fleet, "a"))
    assert snapshot is not None
    assert snapshot.status is Status.DOWN
    assert _member(fleet, "a").probing
    assert fleet.probes.holds("a")


async def test_at_the_probe_ceiling_a_new_name_is_not_probed(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    """Every place held by a target asked about recently: None ("not probed"), nothing
    starts, and the warning is logged once, not once per request."""
    fleet.probes = ProbeSlots(1, idle=3600.0)
    caplog.set_level(logging.WARNING, logger=fleet_module.__name__)
    assert await fleet.health(_member(fleet, "a")) is not None
    assert await fleet.health(_member(fleet, "b")) is None
    assert await fleet.health(_member(fleet, "c")) is None
    assert not _member(fleet, "b").probing
    assert _member(fleet, "a").probing  # a probe in use is never displaced
    assert fleet.probes.refused == 2
    assert [r.message for r in caplog.records if "ceiling" in r.message] == [
        "health probe ceiling reached: 1 targets are probed, each asked about within 3600s; "
        'health requests for other targets are answered 503 "not probed"'
    ]


async def test_a_probe_nobody_asks_about_gives_its_place_to_another(fleet: Fleet) -> None:
    """With the places full, a target not asked about for ``idle`` seconds is displaced:
    its probe stops and the new target's starts."""
    fleet.probes = ProbeSlots(1, idle=0.0)
    a, b = _member(fleet, "a"), _member(fleet, "b")
    await fleet.health(a)
    assert await fleet.health(b) is not None
    assert b.probing
    await poll(lambda: not a.probing)
    assert fleet.probes.displaced == 1
    assert not fleet.probes.holds("a")


async def test_a_closed_member_starts_no_probe_and_keeps_nobody_waiting(fleet: Fleet) -> None:
    """A member removed by a reload while a request for it was on its way starts no
    probe, and the request does not wait for a first answer that cannot come."""
    member = _member(fleet, "a")
    await member.close()
    started = time.monotonic()
    await member.health()
    assert not member.probing
    assert time.monotonic() - started < member.probe.connect_timeout / 2  # 5 s: wide margin


# --- reload --------------------------------------------------------------------------------


async def test_apply_keeps_unchanged_members_and_replaces_the_rest(fleet: Fleet) -> None:
    """A reload keeps the member of an unchanged target (caches, plans, connections),
    builds changed and new ones afresh, drops removed ones; the summary counts each."""
    kept, changed = _member(fleet, "a"), _member(fleet, "b")
    summary = await fleet.apply(
        _declared(_target("a"), _target("b", "elsewhere"), _target("d")), None
    )
    assert summary == "targets: 1 added, 1 changed, 1 removed, 3 in all"
    assert list(fleet.members) == ["a", "b", "d"]
    assert fleet.member("a") is kept
    assert fleet.member("b") is not changed
    assert fleet.member("c") is None


async def test_apply_closes_what_it_replaced_and_frees_removed_probe_places(fleet: Fleet) -> None:
    """Replaced and removed members are closed (no probe left running); a removed
    target's probe place is given back."""
    changed, removed = _member(fleet, "b"), _member(fleet, "c")
    await fleet.health(changed)
    await fleet.health(removed)
    await fleet.apply(_declared(_target("a"), _target("b", "elsewhere")), None)
    assert not changed.probing
    assert not removed.probing
    assert not fleet.probes.holds("c")


async def test_apply_schedules_new_definitions_for_every_member(fleet: Fleet) -> None:
    """Changed collector definitions reach every kept member for its next pass, and
    the members built from now on."""
    new = _definitions("pg_two")
    await fleet.apply(_declared(_target("a"), _target("z")), new)
    assert _member(fleet, "a").state.exporter.pending is new
    assert fleet.definitions is new
    assert _member(fleet, "z").state.exporter.definitions is new


async def test_apply_without_new_definitions_schedules_nothing(fleet: Fleet) -> None:
    """A reload of the targets file alone leaves every member's definitions alone."""
    await fleet.apply(_declared(_target("a")), None)
    assert _member(fleet, "a").state.exporter.pending is None


async def test_apply_lets_the_loop_run_while_it_builds(fleet: Fleet) -> None:
    """Building many members yields to the event loop between chunks, so the running
    members keep serving meanwhile (issue 25)."""
    turns = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal turns
        while not stop.is_set():
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    before = turns
    many = [_target(f"t{n}") for n in range(fleet_module.APPLY_CHUNK * 3)]
    await fleet.apply(_declared(*many), None)
    stop.set()
    await task
    assert len(fleet.members) == len(many)
    assert turns - before >= 3


async def test_close_closes_every_member(fleet: Fleet) -> None:
    """Shutdown stops the janitor and every probe, and empties the fleet."""
    member = _member(fleet, "a")
    await fleet.health(member)
    await fleet.close()
    assert fleet.members == {}
    assert not member.probing


# --- the janitor ---------------------------------------------------------------------------


class Releases:
    """Stands in for each member's ``Exporter.release`` (the janitor's choice is under
    test, not the closing, which needs a server), recording the names asked."""

    def __init__(self, fleet: Fleet, failing: str | None = None) -> None:
        self.asked: list[str] = []
        for name, member in fleet.members.items():
            member.state.exporter.release = self._for(name, failing == name)  # type: ignore[method-assign]

    def _for(self, name: str, fails: bool) -> Callable[[], Coroutine[Any, Any, bool]]:
        async def release() -> bool:
            self.asked.append(name)
            if fails:
                raise RuntimeError("cannot close")
            return True

        return release


def _collected(exporter: Exporter, seconds_ago: float | None, started_ago: float) -> None:
    """Make ``exporter`` look last collected ``seconds_ago`` (None: never), created
    ``started_ago`` seconds ago."""
    now = time.time()
    exporter.stats.started_at = now - started_ago
    exporter.stats.last_scrape_time = 0.0 if seconds_ago is None else now - seconds_ago


@pytest.fixture
async def janitor_fleet(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Fleet]:
    """A fleet of targets a to d whose janitor looks every millisecond; not started."""
    monkeypatch.setattr(fleet_module, "JANITOR_PERIOD", 0.001)
    built = Fleet(
        Settings(url=NOWHERE.format("x")),
        _declared(*(_target(name) for name in "abcd")),
        _definitions(),
    )
    yield built
    await built.close()


async def test_the_janitor_releases_targets_not_collected_for_a_while(janitor_fleet: Fleet) -> None:
    """Targets no pass collected for CONNECTIONS_IDLE give their connections back, a
    target connected at start (``--fail-fast``) and never collected since included;
    a target collected recently, or built recently and never collected, keeps them."""
    fleet, long_ago = janitor_fleet, CONNECTIONS_IDLE + 60
    fleet.start()  # the janitor's first look comes after this test's next await
    _collected(_member(fleet, "a").state.exporter, long_ago, long_ago + 60)
    _collected(_member(fleet, "b").state.exporter, None, long_ago)  # --fail-fast, never scraped
    _collected(_member(fleet, "c").state.exporter, 1.0, long_ago)
    _collected(_member(fleet, "d").state.exporter, None, 1.0)  # built by a reload just now
    releases = Releases(fleet)
    await poll(lambda: releases.asked.count("a") >= 3 and releases.asked.count("b") >= 3)
    assert "c" not in releases.asked
    assert "d" not in releases.asked


async def test_one_targets_failure_does_not_stop_the_janitor(
    janitor_fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    """A release that fails is logged with the target's name; the others are still
    released, and the janitor goes on."""
    fleet = janitor_fleet
    fleet.start()
    for member in fleet.members.values():
        _collected(member.state.exporter, CONNECTIONS_IDLE + 60, CONNECTIONS_IDLE + 120)
    releases = Releases(fleet, failing="a")
    caplog.set_level(logging.ERROR, logger=fleet_module.__name__)
    await poll(lambda: releases.asked.count("d") >= 2)
    assert releases.asked.count("a") >= 2
    failures = [r for r in caplog.records if "idle target" in r.message]
    assert failures
    assert failures[0].__dict__["target"] == "a"
