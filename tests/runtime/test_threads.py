"""``runtime.kernel.threads.run_in_thread``: the lean worker-thread hop of the hot paths."""

from __future__ import annotations

import threading
import time

import pytest
import trio

from runtime.kernel.threads import run_in_thread


async def test_runs_in_another_thread_and_returns_its_result() -> None:
    here = threading.get_ident()
    got = await run_in_thread(lambda a, b: (threading.get_ident(), a + b), 2, 3)
    assert got[0] != here and got[1] == 5


async def test_the_functions_exception_reaches_the_caller() -> None:
    def boom() -> None:
        raise KeyError("from the thread")

    with pytest.raises(KeyError, match="from the thread"):
        await run_in_thread(boom)


async def test_a_cancellation_waits_for_the_function_and_lands_after_it() -> None:
    done: list[str] = []

    def slow() -> str:
        time.sleep(0.2)
        done.append("ran")
        return "value"

    with trio.move_on_after(0.02) as scope:
        await run_in_thread(slow)
        await trio.lowlevel.checkpoint()  # the pending cancellation is raised here
        done.append("not reached")
    assert scope.cancelled_caught and done == ["ran"]


async def test_an_already_cancelled_caller_does_not_start_the_function() -> None:
    ran: list[int] = []
    with trio.CancelScope() as scope:
        scope.cancel()
        await run_in_thread(ran.append, 1)
    assert scope.cancelled_caught and ran == []


async def test_many_concurrent_hops_each_get_their_own_answer() -> None:
    results: dict[int, int] = {}

    async def one(i: int) -> None:
        results[i] = await run_in_thread(lambda: i * i)

    async with trio.open_nursery() as nursery:
        for i in range(200):
            nursery.start_soon(one, i)
    assert results == {i: i * i for i in range(200)}


async def test_on_cancel_asks_the_thread_to_end_and_its_outcome_still_returns() -> None:
    """The integrity sweep's check of a large table: a host stopping must not wait for it to end."""
    stop = threading.Event()
    ended: list[str] = []

    def long_check() -> str:
        if not stop.wait(30):
            raise AssertionError("never asked to stop")
        ended.append("asked")
        return "interrupted"

    with trio.move_on_after(0.2) as scope:
        assert await run_in_thread(long_check, on_cancel=stop.set) == "interrupted"  # its outcome comes back
        await trio.lowlevel.checkpoint()  # where the pending cancellation lands
    assert scope.cancelled_caught and ended == ["asked"]
