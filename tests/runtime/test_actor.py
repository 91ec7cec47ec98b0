"""The actor kernel: ask/tell, bounded mailbox, stop/kill semantics, batching, passivation."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from runtime.kernel.actor import (
    Actor,
    ActorCrashed,
    ActorError,
    ActorStopped,
    AskTimeout,
    Busy,
    Envelope,
    Fatal,
    InternalBug,
    ReplySlot,
)
from tests.eventkit import count_events
from tests.runtime.actor_testing import Probe, actor_running, no_leaked_actor_tasks, spawn

__all__ = ["no_leaked_actor_tasks"]  # autouse fixture


async def test_error_codes() -> None:
    assert ActorStopped("x").code == "ACTOR_RESTARTED"
    assert ActorCrashed("x").code == "ACTOR_RESTARTED"
    assert Busy("x").code == "BUSY"
    assert AskTimeout("x").code == "TIMEOUT"
    assert InternalBug("x").code == "INTERNAL"
    assert all(issubclass(e, ActorError) for e in (ActorStopped, ActorCrashed, Busy, AskTimeout, InternalBug))
    assert ActorStopped("x").retriable and ActorCrashed("x").retriable


async def test_reply_slot_first_wins_and_late_reply_on_abandoned_slot_is_dropped() -> None:
    slot = ReplySlot()
    assert slot.set_result(1) is True
    assert slot.set_result(2) is False
    assert slot.set_exception(ValueError()) is False
    await slot.wait()
    assert slot.unwrap() == 1

    failed = ReplySlot()
    assert failed.set_exception(KeyError("k")) is True
    with pytest.raises(KeyError):
        failed.unwrap()

    gone = ReplySlot()
    gone.abandon()
    assert gone.set_result("late") is False
    assert not gone.done
    with pytest.raises(InternalBug):
        gone.unwrap()


async def test_ask_reply_and_orderly_exit() -> None:
    actor = Probe("a")
    async with actor_running(actor):
        assert actor.state == "running"
        assert await actor.ask("ping") == ("pong", 1)
        assert await actor.ask(("effect", 7)) == 7
    stats = actor.statistics()
    assert stats.state == "stopped"
    assert stats.handled == 2
    assert actor.log == [("start", "a", 1), ("stop", "a", 1), ("stopped", "a", 1)]


async def test_exception_in_handle_goes_to_asker_and_actor_keeps_running() -> None:
    actor = Probe("a")
    async with actor_running(actor):
        with pytest.raises(ValueError, match="boom"):
            await actor.ask("boom")
        assert actor.state == "running"
        assert await actor.ask("ping") == ("pong", 1)
        assert actor.statistics().handled == 2


async def test_full_mailbox_makes_tell_wait_and_nowait_calls_busy() -> None:
    actor = Probe("a", mailbox_size=2)
    gate = trio.Event()
    async with actor_running(actor) as nursery:
        first = spawn(nursery, actor.ask, ("block", gate))
        await trio.testing.wait_all_tasks_blocked()  # the actor is inside handle()
        actor.tell_nowait(("effect", 1))
        actor.tell_nowait(("effect", 2))
        assert actor.statistics().mailbox_depth == 2
        with pytest.raises(Busy):
            actor.tell_nowait(("effect", 3))
        with pytest.raises(Busy):
            await actor.ask_or_busy(("effect", 3))

        parked = spawn(nursery, actor.tell, ("effect", 4))
        await trio.testing.wait_all_tasks_blocked()
        assert parked == {}  # still waiting for room: backpressure
        assert actor.statistics().senders_waiting == 1

        gate.set()
        await trio.testing.wait_all_tasks_blocked()
        assert parked == {"value": None}
        assert first == {"value": "unblocked"}
        assert await actor.ask("ping") == ("pong", 1)
        assert actor.effects == 3  # 1, 2 and the parked 4; the Busy ones never entered
        stats = actor.statistics()
        assert stats.peak_depth == 2
        assert stats.mailbox_depth == 0


async def test_orderly_stop_finishes_current_message_and_fails_queued_asks() -> None:
    actor = Probe("a", mailbox_size=2)
    gate = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run, name="actor:a")
        current = spawn(nursery, actor.ask, ("block", gate))
        await trio.testing.wait_all_tasks_blocked()
        queued = [spawn(nursery, actor.ask, ("effect", i)) for i in range(2)]
        await trio.testing.wait_all_tasks_blocked()
        parked = spawn(nursery, actor.ask, ("effect", 99))  # mailbox full: waits for room
        await trio.testing.wait_all_tasks_blocked()

        actor.stop()
        await trio.testing.wait_all_tasks_blocked()
        assert actor.state == "stopping"
        assert isinstance(parked["error"], ActorStopped)
        assert parked["error"].enqueued is False
        with pytest.raises(ActorStopped) as refused:
            await actor.ask("ping")
        assert refused.value.enqueued is False

        gate.set()
        await actor.wait_exited()
    assert current == {"value": "unblocked"}
    for box in queued:
        assert isinstance(box["error"], ActorStopped)
        assert box["error"].enqueued is True
    assert actor.effects == 0
    assert actor.state == "stopped"
    assert ("stopped", "a", 1) in actor.log


async def test_kill_at_await_point_fails_in_flight_and_queued_asks_with_crashed() -> None:
    actor = Probe("a")
    never = trio.Event()
    with pytest.RaisesGroup(ActorCrashed):
        async with trio.open_nursery() as nursery:
            await nursery.start(actor.run, name="actor:a")
            in_flight = spawn(nursery, actor.ask, ("block", never))
            await trio.testing.wait_all_tasks_blocked()
            queued = spawn(nursery, actor.ask, ("effect", 1))
            told = spawn(nursery, actor.tell, ("effect", 2))
            await trio.testing.wait_all_tasks_blocked()
            actor.kill()
            await actor.wait_exited()
    assert isinstance(in_flight["error"], ActorCrashed)
    assert isinstance(queued["error"], ActorCrashed)
    assert queued["error"].enqueued is True
    assert told == {"value": None}
    stats = actor.statistics()
    assert stats.state == "crashed"
    assert stats.dropped_tells == 1
    assert ("stop", "a", 1) not in actor.log  # a kill skips on_stop
    with pytest.raises(ActorCrashed) as late:
        await actor.ask("ping")
    assert late.value.enqueued is False


async def test_fatal_crashes_actor_and_asker_gets_actor_crashed() -> None:
    actor = Probe("a")
    async with trio.open_nursery() as askers:  # not cancelled by the actor's crash
        with pytest.RaisesGroup(Fatal):
            async with trio.open_nursery() as nursery:
                await nursery.start(actor.run, name="actor:a")
                box = spawn(askers, actor.ask, "fatal")
                await actor.wait_exited()
    assert isinstance(box["error"], ActorCrashed)
    assert isinstance(box["error"].__cause__, Fatal)
    assert actor.state == "crashed"


async def test_failing_tell_crashes_actor() -> None:
    actor = Probe("a")
    with pytest.RaisesGroup(ValueError):
        async with trio.open_nursery() as nursery:
            await nursery.start(actor.run, name="actor:a")
            await actor.tell("boom")
            await actor.wait_exited()
    assert actor.state == "crashed"


async def test_cancelled_asker_parked_for_room_has_no_effect(autojump_clock: trio.testing.MockClock) -> None:
    actor = Probe("a", mailbox_size=1)
    gate = trio.Event()
    async with actor_running(actor) as nursery:
        spawn(nursery, actor.ask, ("block", gate))
        await trio.testing.wait_all_tasks_blocked()
        actor.tell_nowait(("effect", "filler"))
        with trio.CancelScope() as cs:
            cs.deadline = trio.current_time() + 1  # parks in send, then gets cancelled
            await actor.ask(("effect", "cancelled"))
        assert cs.cancelled_caught
        gate.set()
        assert await actor.ask("ping") == ("pong", 1)
        assert actor.effects == 1  # only the filler


async def test_cancelled_asker_waiting_for_reply_takes_effect_once_and_reply_is_dropped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    actor = Probe("a")
    gate = trio.Event()
    async with actor_running(actor) as nursery:
        spawn(nursery, actor.ask, ("block", gate))
        await trio.testing.wait_all_tasks_blocked()
        with trio.move_on_after(1) as cs:
            await actor.ask(("effect", "enqueued"))  # enqueued, then waits for its reply
        assert cs.cancelled_caught
        gate.set()
        assert await actor.ask("ping") == ("pong", 1)
        assert actor.effects == 1
        assert actor.statistics().dropped_replies == 1


class SlowEffect(Actor):
    """Counts an effect after a few checkpoints, so cancellation can land anywhere."""

    def __init__(self) -> None:
        super().__init__("slow", mailbox_size=1)
        self.effects = 0

    async def handle(self, msg: Any) -> Any:
        for _ in range(3):
            await trio.lowlevel.checkpoint()
        self.effects += 1
        return msg


@pytest.mark.parametrize("ticks", range(12))
async def test_cancelling_an_asker_at_any_point_gives_zero_or_one_effect(ticks: int) -> None:
    actor = SlowEffect()
    async with actor_running(actor) as nursery:
        actor.tell_nowait("occupy")  # so the ask may have to wait for room
        box: dict[str, Any] = {}

        async def asker(cs: trio.CancelScope) -> None:
            with cs:
                box["value"] = await actor.ask("x")

        cs = trio.CancelScope()
        nursery.start_soon(asker, cs)
        for _ in range(ticks):
            await trio.lowlevel.checkpoint()
        cs.cancel()
        await trio.testing.wait_all_tasks_blocked()
        await actor.ask("barrier")  # everything enqueued before has been handled
        effects_of_x = actor.effects - 2  # minus "occupy" and "barrier"
        assert effects_of_x in (0, 1)
        if "value" in box:
            assert effects_of_x == 1


class Batcher(Probe):
    def __init__(self) -> None:
        super().__init__("batcher", mailbox_size=64, batch_limit=64)
        self.batch_sizes: list[int] = []

    async def handle_batch(self, batch: list[Envelope]) -> None:
        self.batch_sizes.append(len(batch))
        await super().handle_batch(batch)


async def test_asks_waiting_while_busy_are_handed_to_one_handle_batch() -> None:
    actor = Batcher()
    gate = trio.Event()
    async with actor_running(actor) as nursery:
        spawn(nursery, actor.ask, ("block", gate))
        await trio.testing.wait_all_tasks_blocked()
        boxes = [spawn(nursery, actor.ask, ("effect", i)) for i in range(10)]
        await trio.testing.wait_all_tasks_blocked()
        assert actor.statistics().mailbox_depth == 10
        gate.set()
        await trio.testing.wait_all_tasks_blocked()
        assert actor.batch_sizes == [1, 10]
        assert [box["value"] for box in boxes] == list(range(10))
        stats = actor.statistics()
        assert (stats.batches, stats.largest_batch, stats.handled) == (2, 10, 11)


class ForgetfulBatch(Actor):
    batch_limit = 8

    async def handle_batch(self, batch: list[Envelope]) -> None:
        first = batch[0]
        assert first.reply is not None
        if isinstance(first.msg, trio.Event):
            await first.msg.wait()
        first.reply.set_result(("only the first", len(batch)))


async def test_handle_batch_that_forgets_a_reply_yields_internal_bug_not_a_hang() -> None:
    actor = ForgetfulBatch("forgetful")
    gate = trio.Event()
    async with actor_running(actor) as nursery:
        blocker = spawn(nursery, actor.ask, gate)
        await trio.testing.wait_all_tasks_blocked()
        boxes = [spawn(nursery, actor.ask, i) for i in range(3)]
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
        await trio.testing.wait_all_tasks_blocked()
    assert blocker == {"value": ("only the first", 1)}
    replied = [box for box in boxes if "value" in box]
    assert replied == [{"value": ("only the first", 3)}]
    failed = [box["error"] for box in boxes if "error" in box]
    assert len(failed) == 2 and all(isinstance(err, InternalBug) for err in failed)


async def test_ask_timeout_in_virtual_time(autojump_clock: trio.testing.MockClock) -> None:
    actor = Probe("a")
    gate = trio.Event()
    async with actor_running(actor):
        start = trio.current_time()
        with pytest.raises(AskTimeout):
            await actor.ask(("block", gate), timeout=5)
        assert trio.current_time() - start == pytest.approx(5)
        gate.set()
        assert await actor.ask("ping", timeout=5) == ("pong", 1)
        assert actor.statistics().dropped_replies == 1


async def test_idle_passivation_only_inbound_messages_reset_timer(autojump_clock: trio.testing.MockClock) -> None:
    actor = Probe("a", idle_timeout=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run, name="actor:a")
        await trio.sleep(9)
        assert await actor.ask("ping") == ("pong", 1)  # resets the idle timer
        last_message = trio.current_time()
        await trio.sleep(9)
        assert actor.state == "running"
        await actor.wait_exited()
        assert trio.current_time() - last_message == pytest.approx(10)
    assert actor.state == "passivated"
    assert actor.log[-2:] == [("stop", "a", 1), ("stopped", "a", 1)]
    with pytest.raises(ActorStopped) as refused:
        await actor.ask("ping")
    assert refused.value.enqueued is False


async def test_idle_passivation_after_messages_just_under_the_timeout(autojump_clock: trio.testing.MockClock) -> None:
    # Each message restarts the idle period; the timer set for an earlier wait must neither
    # passivate the actor early nor be lost: it passivates exactly 10 s after the last message.
    actor = Probe("a", idle_timeout=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run, name="actor:a")
        for _ in range(6):
            await trio.sleep(9.9)
            assert actor.state == "running"
            assert await actor.ask("ping") == ("pong", 1)
        last_message = trio.current_time()
        await actor.wait_exited()
        assert trio.current_time() - last_message == pytest.approx(10)
    assert actor.state == "passivated"
    stats = actor.statistics()
    assert (stats.handled, stats.batches) == (6, 6)  # wake-ups are not messages


async def test_idle_timer_due_while_busy_takes_no_mailbox_slot(autojump_clock: trio.testing.MockClock) -> None:
    # The idle timer comes due while a message is being handled and the one-slot mailbox is full:
    # that must not take a slot nor passivate; the queued message is handled, then the actor
    # passivates a full timeout after its last wait began.
    actor = Probe("a", idle_timeout=10, mailbox_size=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run, name="actor:a")
        await trio.sleep(5)
        gate = trio.Event()
        blocked = spawn(nursery, actor.ask, ("block", gate))
        await trio.sleep(1)
        actor.tell_nowait(("effect", 1))  # fills the mailbox
        with pytest.raises(Busy):
            actor.tell_nowait(("effect", 2))
        await trio.sleep(30)  # the first wait's timer (at 10 s) came due meanwhile
        assert actor.state == "running"
        assert actor.statistics().mailbox_depth == 1
        gate.set()
        released = trio.current_time()
        await actor.wait_exited()
        assert trio.current_time() - released == pytest.approx(10)
    assert blocked == {"value": "unblocked"}
    assert actor.effects == 1
    assert actor.state == "passivated"
    assert actor.statistics().handled == 2


async def test_a_message_sent_as_the_idle_timer_fires_is_handled(autojump_clock: trio.testing.MockClock) -> None:
    # Each ask lands at the very moment the idle timer comes due (the same scheduler pass, in
    # either order): the actor must take it as a message, not passivate, and wake-ups must never
    # end up in the mailbox as messages.
    actor = Probe("a", idle_timeout=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run, name="actor:a")
        assert await actor.ask("ping") == ("pong", 1)
        for _ in range(40):
            await trio.sleep(10)
            assert await actor.ask("ping") == ("pong", 1)
            assert actor.state == "running"
        last_message = trio.current_time()
        await actor.wait_exited()
        assert trio.current_time() - last_message == pytest.approx(10)
    assert actor.state == "passivated"
    assert actor.statistics().handled == 41


async def test_an_ask_meeting_passivation_is_answered_or_refused_never_failed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Asks sent a few scheduler passes after the idle timer fired: each is either handled or
    # refused before it entered the mailbox (enqueued=False: safe to send to the next incarnation),
    # never accepted and then failed by the passivation.
    outcomes: set[str] = set()
    for passes in range(8):
        actor = Probe("a", idle_timeout=10)
        async with trio.open_nursery() as nursery:
            await nursery.start(actor.run, name="actor:a")
            await trio.sleep(10)
            for _ in range(passes):
                await trio.lowlevel.checkpoint()
            try:
                assert await actor.ask("ping") == ("pong", 1)
                outcomes.add("answered")
            except ActorStopped as exc:
                assert exc.enqueued is False, f"accepted, then failed after {passes} passes"
                outcomes.add("refused")
            actor.stop()
    assert "refused" in outcomes


async def test_run_twice_is_a_bug() -> None:
    actor = Probe("a")
    async with actor_running(actor):
        with pytest.raises(InternalBug):
            await actor.run()


async def test_mailbox_must_be_bounded() -> None:
    with pytest.raises(ValueError):
        Probe("a", mailbox_size=0)


class IdleWorker(Probe):
    """A probe whose ``on_idle`` records when it ran and does ``work`` more steps."""

    def __init__(self, name: str, *, work: int, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.work = work
        self.idle_calls: list[float] = []

    async def on_idle(self) -> bool:
        self.idle_calls.append(trio.current_time())
        self.work = max(0, self.work - 1)
        return self.work > 0


async def test_idle_work_runs_after_a_quiet_mailbox_until_done(autojump_clock: trio.testing.MockClock) -> None:
    actor = IdleWorker("a", work=3)
    actor.idle_work_after = 5.0
    actor.idle_work_interval = 1.0
    async with actor_running(actor):
        start = trio.current_time()
        await trio.sleep(4)
        assert actor.idle_calls == []  # not yet quiet for 5 s
        await trio.sleep(100)
        # once after 5 s of quiet, then every 1 s while it reports more work, then never again
        assert [t - start for t in actor.idle_calls] == pytest.approx([5.0, 6.0, 7.0])
        assert actor.state == "running"


async def test_idle_work_resumes_only_after_a_batch_and_never_interrupts_messages(
    autojump_clock: trio.testing.MockClock,
) -> None:
    actor = IdleWorker("a", work=1)
    actor.idle_work_after = 5.0
    async with actor_running(actor):
        await trio.sleep(50)
        assert len(actor.idle_calls) == 1  # nothing to do after the first call
        for _ in range(10):  # a message every 2 s keeps the mailbox from being quiet for 5 s
            assert await actor.ask("ping") == ("pong", 1)
            await trio.sleep(2)
        assert len(actor.idle_calls) == 1
        last = trio.current_time()
        await trio.sleep(50)
        # the batches re-armed it: one more call, 5 s after the last message
        assert len(actor.idle_calls) == 2
        assert actor.idle_calls[1] - last == pytest.approx(3.0)  # last ask was 2 s before `last`


async def test_idle_work_does_not_postpone_passivation(autojump_clock: trio.testing.MockClock) -> None:
    actor = IdleWorker("a", work=1_000, idle_timeout=10)
    actor.idle_work_after = 1.0
    actor.idle_work_interval = 1.0
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        await nursery.start(actor.run, name="actor:a")
        await actor.wait_exited()
    assert actor.state == "passivated"
    assert trio.current_time() - start == pytest.approx(10)
    assert 8 <= len(actor.idle_calls) <= 10


async def test_idle_work_failure_crashes_the_actor(autojump_clock: trio.testing.MockClock) -> None:
    class Broken(Probe):
        async def on_idle(self) -> bool:
            raise RuntimeError("idle work failed")

    actor = Broken("a")
    actor.idle_work_after = 1.0
    with pytest.raises(RuntimeError, match="idle work failed"):
        await actor.run()
    assert actor.state == "crashed"


class Holder(Batcher):
    """Holds batches of ``("effect", x)`` for 1 s; ``("urgent", x)`` ends a hold."""

    hold_seconds = 1.0

    def __init__(self, batch_limit: int = 64) -> None:
        super().__init__()
        self.batch_limit = batch_limit
        self.handled_at: list[float] = []

    def may_hold(self, batch: list[Envelope]) -> bool:
        return all(env.msg[0] == "effect" for env in batch)

    def ends_hold(self, msg: Any) -> bool:
        return bool(msg[0] != "effect")

    async def handle(self, msg: Any) -> Any:
        self.handled_at.append(trio.current_time())
        return msg[1] if msg[0] == "urgent" else await super().handle(msg)


async def test_a_held_batch_waits_for_company_then_runs_as_one(autojump_clock: trio.abc.Clock) -> None:
    actor = Holder()
    async with actor_running(actor) as nursery:
        start = trio.current_time()
        first = spawn(nursery, actor.ask, ("effect", 0))
        await trio.sleep(0.3)
        assert "value" not in first  # held, not lost
        later = [spawn(nursery, actor.ask, ("effect", i)) for i in (1, 2)]
        await trio.sleep(1.0)
        assert actor.batch_sizes == [3]
        assert actor.handled_at[0] - start == pytest.approx(1.0)
        assert [first["value"], *(b["value"] for b in later)] == [0, 1, 2]


async def test_a_hold_ends_on_wake_on_an_urgent_message_on_a_full_batch_and_on_stop(
        autojump_clock: trio.abc.Clock) -> None:
    actor = Holder(batch_limit=4)
    async with actor_running(actor) as nursery:
        t0 = trio.current_time()
        spawn(nursery, actor.ask, ("effect", 0))
        await trio.sleep(0.1)
        actor.wake()  # a reader now waits for it
        await trio.testing.wait_all_tasks_blocked()
        assert actor.batch_sizes == [1] and actor.handled_at[-1] - t0 == pytest.approx(0.1)

        spawn(nursery, actor.ask, ("effect", 1))
        await trio.sleep(0.1)
        urgent = spawn(nursery, actor.ask, ("urgent", "now"))
        await trio.testing.wait_all_tasks_blocked()
        assert actor.batch_sizes == [1, 2] and urgent["value"] == "now"

        boxes = [spawn(nursery, actor.ask, ("effect", i)) for i in range(4)]
        await trio.testing.wait_all_tasks_blocked()
        assert actor.batch_sizes == [1, 2, 4]  # a full batch does not wait
        assert [b["value"] for b in boxes] == [0, 1, 2, 3]

        t1 = trio.current_time()
        last = spawn(nursery, actor.ask, ("effect", 9))
        await trio.sleep(0.1)
        actor.stop()
        await trio.testing.wait_all_tasks_blocked()
        assert last["value"] == 9 and trio.current_time() - t1 == pytest.approx(0.1)


async def test_sends_read_no_channel_statistics_and_the_peak_depth_is_still_noted(
        monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.abc.Clock) -> None:
    """A send builds no channel statistics object (about 4 us each on the trio thread, two sends per
    append): the loop notes the peak depth where it takes messages out, and a hold bounds the depth by
    what entered since it began (exact statistics only once that bound reaches the batch limit)."""
    reads = 0
    real = trio.MemoryReceiveChannel.statistics

    def counted(self: trio.MemoryReceiveChannel[Any]) -> Any:
        nonlocal reads
        reads += 1
        return real(self)

    monkeypatch.setattr(trio.MemoryReceiveChannel, "statistics", counted)
    actor = Probe("a", mailbox_size=8)  # batch_limit 1: one message taken at a time
    gate = trio.Event()
    async with actor_running(actor) as nursery:
        first = spawn(nursery, actor.ask, ("block", gate))
        await trio.testing.wait_all_tasks_blocked()
        reads = 0
        for i in range(5):
            actor.tell_nowait(("effect", i))
        assert reads == 0
        assert actor.statistics().peak_depth == 5 and actor.statistics().mailbox_depth == 5
        gate.set()
        await trio.testing.wait_all_tasks_blocked()
        assert first == {"value": "unblocked"} and actor.effects == 5
        stats = actor.statistics()
        assert (stats.peak_depth, stats.mailbox_depth) == (5, 0)

    holder = Holder(batch_limit=4)
    async with actor_running(holder) as nursery:
        spawn(nursery, holder.ask, ("effect", 0))
        await trio.sleep(0.1)  # held
        reads = 0
        spawn(nursery, holder.ask, ("effect", 1))
        spawn(nursery, holder.ask, ("effect", 2))
        await trio.testing.wait_all_tasks_blocked()
        assert reads == 0 and holder.batch_sizes == []  # two entered, the batch holds one: 3 < 4, still held
        spawn(nursery, holder.ask, ("effect", 3))
        await trio.testing.wait_all_tasks_blocked()
        assert holder.batch_sizes == [4]  # the fourth fills the batch: the hold ends at once
        assert holder.statistics().peak_depth == 3


async def test_wait_room_wakes_when_the_loop_takes_messages_and_no_event_is_built_per_batch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The room event is set (and a new one built) only when a ``wait_room`` waits on it, not at every batch."""
    actor = Probe("a", mailbox_size=1)
    gate = trio.Event()
    async with actor_running(actor) as nursery:
        events = count_events(monkeypatch)
        for i in range(20):
            actor.tell_nowait(("effect", i))
            await trio.testing.wait_all_tasks_blocked()
        assert actor.effects == 20 and events.built == 0
        spawn(nursery, actor.ask, ("block", gate))
        await trio.testing.wait_all_tasks_blocked()
        actor.tell_nowait(("effect", 20))  # the mailbox (one message) is full
        waiter = spawn(nursery, actor.wait_room)
        await trio.testing.wait_all_tasks_blocked()
        assert waiter == {}
        gate.set()
        await trio.testing.wait_all_tasks_blocked()
        assert waiter == {"value": None} and actor.effects == 21
