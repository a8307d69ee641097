"""The connection budget's arithmetic: who is closed, and what is counted (issue 13)."""

from __future__ import annotations

import asyncio

import pytest

from exporter.connections import ConnectionBudget, lru_victims


class FakeHolder:
    """A database that holds one connection and gives it back to the budget."""

    def __init__(self, budget: ConnectionBudget, label: str) -> None:
        self.budget = budget
        self.label = label
        self.connected = False

    async def connect(self) -> None:
        await self.budget.make_room(self)
        self.connected = True
        self.budget.opened_for(self)

    async def disconnect(self) -> None:
        self.connected = False
        await self.budget.close(self, asyncio.sleep(0))


def test_no_victim_while_there_is_room() -> None:
    """Below the capacity nobody is closed."""
    assert lru_victims(["a", "b"], set(), 3) == []


def test_least_recently_used_goes_first_and_busy_never() -> None:
    """The oldest idle holders are chosen, as many as needed for one more."""
    assert lru_victims(["a", "b", "c"], set(), 3) == ["a"]
    assert lru_victims(["a", "b", "c"], {"a"}, 3) == ["b"]
    assert lru_victims(["a", "b", "c", "d"], set(), 3) == ["a", "b"]


def test_a_budget_must_leave_one_connection_for_a_database() -> None:
    """The probe's reserved connection and one database's: at least 2."""
    with pytest.raises(ValueError, match="leaves no connection"):
        ConnectionBudget(1)
    assert ConnectionBudget(2).capacity == 1


async def test_budget_closes_the_least_recently_used_and_counts() -> None:
    """With room for two, a third database closes the one used longest ago."""
    budget = ConnectionBudget(3)  # two for databases, one for the probe
    a, b, c = (FakeHolder(budget, name) for name in "abc")
    await a.connect()
    await b.connect()
    budget.used(a)  # a is now more recent than b
    await c.connect()
    assert (a.connected, b.connected, c.connected) == (True, False, True)
    assert (budget.open, budget.peak, budget.opened, budget.evictions) == (2, 2, 3, 1)
    assert budget.opened_by == {"a": 1, "b": 1, "c": 1}


async def test_unlimited_budget_never_closes() -> None:
    """Without a limit every database keeps its connection (D5 as before)."""
    budget = ConnectionBudget.unlimited()
    holders = [FakeHolder(budget, str(n)) for n in range(10)]
    for holder in holders:
        await holder.connect()
    assert all(h.connected for h in holders)
    assert budget.evictions == 0


async def test_a_database_that_goes_is_forgotten() -> None:
    """Its per-database count is dropped; the total stays monotonic."""
    budget = ConnectionBudget(4)
    holder = FakeHolder(budget, "gone")
    await holder.connect()
    await holder.disconnect()
    budget.forget("gone")
    assert (budget.opened_by, budget.opened, budget.open) == ({}, 1, 0)


async def test_a_walk_waits_while_every_connection_is_busy() -> None:
    """With room for one and that one busy, another database waits for it to finish,
    then takes its place: the budget is never exceeded."""
    budget = ConnectionBudget(2)  # one for a database
    a, b = FakeHolder(budget, "a"), FakeHolder(budget, "b")
    await a.connect()
    budget.busy(a, busy=True)
    waiting = asyncio.create_task(b.connect())
    await asyncio.sleep(0)
    assert not waiting.done()
    assert not b.connected
    budget.busy(a, busy=False)
    await waiting
    assert (a.connected, b.connected, budget.peak) == (False, True, 1)


async def test_a_reservation_given_back_frees_the_place() -> None:
    """A connection that could not be opened gives its reserved place back."""
    budget = ConnectionBudget(2)
    holder = FakeHolder(budget, "a")
    await budget.make_room(holder)
    budget.cancel()
    await holder.connect()  # would wait for ever if the place were still taken
    assert budget.open == 1
