"""The host-wide work budget (actors.gateway_outbound.ByteBudget): FIFO, and never stuck."""

from __future__ import annotations

import trio
import trio.testing

from actors.gateway_outbound import ByteBudget


async def test_a_cancelled_waiter_at_the_head_lets_the_ones_behind_it_in(autojump_clock: trio.abc.Clock) -> None:
    """A big request waiting at the head of the queue holds the smaller ones behind it (FIFO). When it
    was cancelled (its connection closed as a slow consumer), those behind it stayed waiting until some
    other release, and with every holder already done none came: every later request of every
    connection waited for ever (a suite run hung in the memory test). They are let in at once."""
    budget = ByteBudget(100)
    await budget.acquire(80)
    granted: list[str] = []
    big = trio.CancelScope()

    async def want(name: str, n: int, scope: trio.CancelScope) -> None:
        with scope:
            await budget.acquire(n)
            granted.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(want, "big", 50, big)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(want, "small", 10, trio.CancelScope())
        await trio.testing.wait_all_tasks_blocked()
        assert granted == []  # behind the big one, though it would fit
        big.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert granted == ["small"] and budget.held == 90
    budget.release(90)
    assert budget.held == 0


async def test_release_grants_in_order_and_a_big_one_alone(autojump_clock: trio.abc.Clock) -> None:
    budget = ByteBudget(100)
    await budget.acquire(60)
    order: list[int] = []

    async def want(n: int) -> None:
        await budget.acquire(n)
        order.append(n)

    async with trio.open_nursery() as nursery:
        for n in (150, 30):  # 150 is over the capacity: admitted alone once nothing is held
            nursery.start_soon(want, n)
            await trio.testing.wait_all_tasks_blocked()
        budget.release(60)
        await trio.testing.wait_all_tasks_blocked()
        assert order == [150]
        budget.release(150)
    assert order == [150, 30] and budget.held == 30


async def test_a_caller_cancelled_as_it_is_granted_holds_nothing(autojump_clock: trio.abc.Clock) -> None:
    """acquire() took the bytes, then its checkpoint raised Cancelled: the caller saw the acquire fail and
    never released, so the bytes stayed held for good. Two connections closed as slow consumers that way
    leaked enough of the host-wide budget that a big request waited for ever at the head of the queue, and
    every request behind it (another client's) with it: a full-suite run hung in the memory test."""
    budget = ByteBudget(100)
    with trio.CancelScope() as scope:
        scope.cancel()
        await budget.acquire(60)
    assert scope.cancelled_caught and budget.held == 0
    await budget.acquire(100)  # the whole capacity is there
    assert budget.held == 100
