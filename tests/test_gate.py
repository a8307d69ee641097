"""The fleet's ceiling on targets collected at once (exporter/collect/gate.py)."""

from __future__ import annotations

import asyncio

from exporter.collect.gate import Gate


async def test_places_up_to_the_limit_are_taken_without_waiting() -> None:
    gate = Gate(2)
    assert await gate.enter(0.0)
    assert await gate.enter(0.0)
    assert (gate.active, gate.entered, gate.waited) == (2, 2, 0)


async def test_a_pass_over_the_limit_waits_for_a_place_within_its_time() -> None:
    gate = Gate(1)
    assert await gate.enter(0.0)
    waiter = asyncio.create_task(gate.enter(30.0))
    await asyncio.sleep(0)  # the waiter runs until it queues: every place is taken
    assert gate.waiting == 1
    assert not waiter.done()
    gate.leave()
    assert await asyncio.wait_for(waiter, 5.0)
    assert (gate.active, gate.entered, gate.waited, gate.refused) == (1, 2, 1, 0)


async def test_a_pass_whose_time_runs_out_is_refused_and_takes_no_place() -> None:
    gate = Gate(1)
    assert await gate.enter(0.0)
    assert not await gate.enter(0.01)
    assert (gate.active, gate.refused, gate.waiting) == (1, 1, 0)
    gate.leave()
    assert await gate.enter(0.0)  # the refused one left nothing behind


async def test_a_cancelled_wait_takes_no_place() -> None:
    gate = Gate(1)
    assert await gate.enter(0.0)
    waiter = asyncio.create_task(gate.enter(30.0))
    await asyncio.sleep(0)
    assert gate.waiting == 1
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert gate.waiting == 0
    gate.leave()
    assert await gate.enter(0.0)
    assert gate.active == 1


async def test_waiters_are_served_in_arrival_order() -> None:
    gate = Gate(1)
    assert await gate.enter(0.0)
    order: list[int] = []

    async def wait(number: int) -> None:
        assert await gate.enter(30.0)
        order.append(number)

    pending = set()
    for number in range(3):
        pending.add(asyncio.create_task(wait(number)))
        await asyncio.sleep(0)  # queued before the next one arrives
    assert gate.waiting == 3
    while pending:
        gate.leave()  # one place frees: the next waiter in line takes it
        done, pending = await asyncio.wait(pending, timeout=5.0, return_when="FIRST_COMPLETED")
        assert len(done) == 1
    assert order == [0, 1, 2]
