"""``runtime/ordering.py`` on its own: one connection's order, on trio's autojump clock.

Each request is a step that resolves its target, waits for its turn
(:meth:`Turn.ready`), then "posts" itself: it records when it started and, for
a mutation, settles (is answered) when its target finishes it. Targets here
are fake: an ordered mailbox runs its requests one after the other, ``None``
runs each at once in its own task.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable
from typing import Any

import pytest
import trio
import trio.testing

from runtime.ordering import Abandoned, Ordering, Turn


class Rig:
    """An ordering whose requests take ``seconds`` on their target; logs (event, name, time)."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.log: list[tuple[str, str, float]] = []
        self.idle = 0
        self.quiet = trio.Event()
        self.order = Ordering(self._spawn, on_idle=self._idle)
        self.mailboxes: dict[Hashable, trio.MemorySendChannel[Callable[[], Awaitable[None]]]] = {}
        self.dropped: list[str] = []
        self.abandoned: list[str] = []

    def _spawn(self, fn: Callable[[], Awaitable[None]]) -> None:
        self.nursery.start_soon(fn)

    def _idle(self) -> None:
        self.idle += 1
        self.quiet.set()

    def _mailbox(self, target: Hashable) -> trio.MemorySendChannel[Callable[[], Awaitable[None]]]:
        if target not in self.mailboxes:
            send, recv = trio.open_memory_channel[Callable[[], Awaitable[None]]](100)

            async def serve() -> None:
                async for job in recv:
                    await job()

            self.nursery.start_soon(serve)
            self.mailboxes[target] = send
        return self.mailboxes[target]

    def add(self, name: str, *, target: Hashable | None, mutating: bool, seconds: float = 1.0,
            before: float = 0.0) -> Turn:
        """``before``: how long the step takes before it knows its target (a lookup)."""
        turns: list[Turn] = []

        async def work() -> None:
            self.log.append(("start", name, trio.current_time()))
            await trio.sleep(seconds)
            self.log.append(("done", name, trio.current_time()))
            turns[0].settle()

        async def step(turn: Turn) -> None:
            if before:
                await trio.sleep(before)
            try:
                await turn.ready(target)
            except Abandoned:
                self.abandoned.append(name)
                return
            if target is None:
                self.nursery.start_soon(work)
            else:
                await self._mailbox(target).send(work)

        turn = self.order.add(step, lambda: self.dropped.append(name), mutating=mutating, tag=target)
        turns.append(turn)
        return turn

    def started(self, name: str) -> float:
        return next(t for event, n, t in self.log if event == "start" and n == name)

    def done(self, name: str) -> float:
        return next(t for event, n, t in self.log if event == "done" and n == name)


async def run(build: Callable[[Rig], None], *, stop_after: float | None = None) -> Rig:
    async with trio.open_nursery() as nursery:
        rig = Rig(nursery)
        build(rig)
        if stop_after is not None:
            await trio.sleep(stop_after)
            nursery.cancel_scope.cancel()
            return rig
        await rig.quiet.wait()
        for send in rig.mailboxes.values():
            await send.aclose()
    return rig


async def test_adding_never_waits_and_a_read_waits_for_an_earlier_write_elsewhere(
        autojump_clock: trio.testing.MockClock) -> None:
    """The reader only queues: a slow write does not hold it; the read after it sees it done."""
    added_at: list[float] = []

    def build(rig: Rig) -> None:
        rig.add("write", target=("writer",), mutating=True, seconds=5)
        added_at.append(trio.current_time())
        rig.add("read", target=None, mutating=False)
        added_at.append(trio.current_time())

    rig = await run(build)
    assert added_at == [0.0, 0.0]
    assert rig.started("read") >= rig.done("write") == 5.0
    assert rig.idle >= 1


async def test_writes_to_one_mailbox_are_pipelined_writes_to_two_are_not(
        autojump_clock: trio.testing.MockClock) -> None:
    """Same ordered target: the next one is posted at once (group commit kept); another target waits."""
    def build(rig: Rig) -> None:
        rig.add("a1", target=("session", "a"), mutating=True, seconds=2)
        rig.add("a2", target=("session", "a"), mutating=True, seconds=2)
        rig.add("b1", target=("session", "b"), mutating=True, seconds=2)
        rig.add("a3", target=("session", "a"), mutating=True, seconds=2)

    rig = await run(build)
    assert [n for e, n, _ in rig.log if e == "start"] == ["a1", "a2", "b1", "a3"]
    assert rig.started("a2") == rig.done("a1") == 2.0  # queued behind a1 in the mailbox, not held back
    assert rig.started("b1") == rig.done("a2") == 4.0  # waited for both writes to session a
    assert rig.started("a3") == rig.done("b1") == 6.0


async def test_reads_after_reads_run_concurrently_and_never_hold_a_write(
        autojump_clock: trio.testing.MockClock) -> None:
    def build(rig: Rig) -> None:
        rig.add("r1", target=None, mutating=False, seconds=3)
        rig.add("r2", target=None, mutating=False, seconds=3)
        rig.add("w", target=None, mutating=True, seconds=1)
        rig.add("r3", target=None, mutating=False, seconds=1)

    rig = await run(build)
    assert rig.started("r1") == rig.started("r2") == rig.started("w") == 0.0
    assert rig.started("r3") == rig.done("w") == 1.0


async def test_an_unordered_write_holds_everything_behind_it(autojump_clock: trio.testing.MockClock) -> None:
    """A host task orders nothing: even a request to its own kind of target waits for it."""
    def build(rig: Rig) -> None:
        rig.add("host1", target=None, mutating=True, seconds=4)
        rig.add("host2", target=None, mutating=True, seconds=1)
        rig.add("append", target=("session", "a"), mutating=True, seconds=1)

    rig = await run(build)
    assert rig.started("host2") == 4.0
    assert rig.started("append") == 5.0


async def test_a_step_that_waits_before_its_target_holds_the_ones_behind(
        autojump_clock: trio.testing.MockClock) -> None:
    """A lookup (or a receipt wait) delays the requests behind it, which keep frame order."""
    def build(rig: Rig) -> None:
        rig.add("slow", target=("session", "a"), mutating=True, seconds=1, before=3)
        rig.add("read", target=("session", "a"), mutating=False, seconds=1)

    rig = await run(build)
    assert rig.started("slow") == 3.0
    assert rig.started("read") == 4.0  # same mailbox: behind the write, which took effect first
    assert [n for e, n, _ in rig.log if e == "start"] == ["slow", "read"]


async def test_an_answer_before_the_step_ends_leaves_nothing_pending(autojump_clock: trio.testing.MockClock) -> None:
    """A request answered at once (a replay, a refusal) is no earlier write for the next."""
    order_log: list[str] = []

    async def run_it() -> Ordering:
        async with trio.open_nursery() as nursery:
            order = Ordering(nursery.start_soon)

            async def answered(turn: Turn) -> None:
                turn.settle()
                order_log.append("answered")

            async def after(turn: Turn) -> None:
                with trio.move_on_after(1):
                    await turn.ready(None)
                    order_log.append(f"ready at {trio.current_time()}")
                turn.settle()

            order.add(answered, lambda: None, mutating=True)
            order.add(after, lambda: None, mutating=True)
        return order

    order = await run_it()
    assert order_log == ["answered", "ready at 0.0"]
    assert order.idle


async def test_cancelling_the_dispatcher_drops_what_it_had_not_dispatched(
        autojump_clock: trio.testing.MockClock) -> None:
    """Shutdown: queued requests are answered through ``drop``, none is lost."""
    def build(rig: Rig) -> None:
        rig.add("w", target=None, mutating=True, seconds=10)
        rig.add("r1", target=None, mutating=False)
        rig.add("r2", target=None, mutating=False)

    rig = await run(build, stop_after=2)
    assert rig.dropped == ["r2"]  # r1 was waiting for its turn (its own step answers a cancellation)
    assert [n for e, n, _ in rig.log if e == "start"] == ["w"]


async def test_a_step_that_raises_does_not_stop_the_order(autojump_clock: trio.testing.MockClock,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    ran: list[str] = []

    async with trio.open_nursery() as nursery:
        order = Ordering(nursery.start_soon)

        async def bad(turn: Turn) -> None:
            turn.settle()
            raise ValueError("a bug")

        async def good(turn: Turn) -> None:
            await turn.ready(None)
            ran.append("good")
            turn.settle()

        order.add(bad, lambda: None, mutating=True)
        order.add(good, lambda: None, mutating=False)
    assert ran == ["good"]
    assert "a request's step raised" in caplog.text


async def test_following_names_the_next_queued_request(autojump_clock: trio.testing.MockClock) -> None:
    """The group-commit hint: a request knows whether the next one goes to the same mailbox."""
    seen: list[Any] = []

    async with trio.open_nursery() as nursery:
        order = Ordering(nursery.start_soon)

        async def step(turn: Turn) -> None:
            seen.append(turn.following())
            turn.settle()

        order.add(step, lambda: None, mutating=True, tag="a")
        order.add(step, lambda: None, mutating=True, tag="a")
        order.add(step, lambda: None, mutating=True, tag="b")
    assert seen == ["a", "b", None]


async def test_a_closed_connection_drops_what_it_had_not_dispatched(autojump_clock: trio.testing.MockClock) -> None:
    """The connection closed: the queued requests are answered through ``drop``, the one waiting
    for its turn gets ``Abandoned``; none of them runs. The one dispatched already runs on."""
    def build(rig: Rig) -> None:
        rig.add("w", target=None, mutating=True, seconds=10)
        rig.add("r1", target=None, mutating=False)
        rig.add("r2", target=None, mutating=False)

    async with trio.open_nursery() as nursery:
        rig = Rig(nursery)
        build(rig)
        await trio.sleep(1)  # w runs; r1 waits for it (its step is being dispatched); r2 is queued
        rig.order.abandon()
        await rig.quiet.wait()
    assert rig.dropped == ["r2"]
    assert [n for e, n, _ in rig.log if e == "start"] == ["w"]
    assert rig.done("w") == 10.0
    assert rig.abandoned == ["r1"]
