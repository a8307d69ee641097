"""The fleet's ceilings on health probes (exporter/health/probeslots.py): pure bookkeeping."""

from __future__ import annotations

import asyncio

import pytest

from exporter.health.probeslots import CeilingReached, ConnectingPlaces, ProbeSlots

IDLE = 60.0


def test_targets_take_places_up_to_the_limit() -> None:
    """Each new name takes a place; asking again about one that holds a place is free."""
    slots = ProbeSlots(2, idle=IDLE)
    assert slots.ask("a", 0.0) is None
    assert slots.ask("b", 1.0) is None
    assert slots.ask("a", 2.0) is None
    assert (slots.alive, slots.refused, slots.displaced) == (2, 0, 0)


def test_a_newcomer_is_refused_while_every_place_is_in_use() -> None:
    """With every place asked about within ``idle``, a new name is refused and nobody's
    probe is touched: requests for other names cannot displace a routed target."""
    slots = ProbeSlots(2, idle=IDLE)
    slots.ask("a", 0.0)
    slots.ask("b", 0.0)
    with pytest.raises(CeilingReached, match="not probed"):
        slots.ask("c", IDLE - 1)
    assert slots.holds("a")
    assert slots.holds("b")
    assert not slots.holds("c")
    assert (slots.refused, slots.displaced) == (1, 0)


def test_the_least_recently_asked_idle_probe_gives_its_place() -> None:
    """The place that goes is the one asked about longest ago, once idle for ``idle``."""
    slots = ProbeSlots(2, idle=IDLE)
    slots.ask("a", 0.0)
    slots.ask("b", 10.0)
    slots.ask("a", 20.0)  # a asked again: b is now the least recently asked
    assert slots.ask("c", 10.0 + IDLE) == "b"
    assert slots.holds("a")
    assert slots.holds("c")
    assert not slots.holds("b")
    assert slots.displaced == 1


def test_a_place_given_back_is_free_at_once() -> None:
    """A probe that idled out leaves its place; leaving twice or unknown names is harmless."""
    slots = ProbeSlots(1, idle=IDLE)
    slots.ask("a", 0.0)
    slots.leave("a")
    slots.leave("a")
    slots.leave("never")
    assert slots.ask("b", 1.0) is None
    assert slots.alive == 1


def test_ceilings_must_be_positive() -> None:
    """A zero ceiling would refuse every probe."""
    with pytest.raises(ValueError, match="at least 1"):
        ProbeSlots(0)
    with pytest.raises(ValueError, match="at least 1"):
        ProbeSlots(1, connecting=0)


def test_refusals_and_displacements_are_counted_as_they_happen() -> None:
    """Each refused newcomer and each displaced idle probe adds one, for /metrics."""
    slots = ProbeSlots(1, idle=IDLE)
    slots.ask("a", 0.0)
    for name in ("b", "c", "b"):
        with pytest.raises(CeilingReached):
            slots.ask(name, 1.0)
    assert slots.ask("b", IDLE) == "a"
    assert slots.ask("c", 2 * IDLE) == "b"
    assert (slots.alive, slots.refused, slots.displaced) == (1, 3, 2)


async def test_connecting_places_say_how_many_are_held() -> None:
    """``held`` counts places taken and given back; a wait cancelled takes none."""
    places = ConnectingPlaces(1)
    assert (places.limit, places.held) == (1, 0)
    async with places:
        assert places.held == 1
        waiter = asyncio.create_task(places.acquire())
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert places.held == 1
    assert places.held == 0
    async with places:
        assert places.held == 1
