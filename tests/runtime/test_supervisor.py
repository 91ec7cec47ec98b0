"""Supervision: restarts, intensity, references across incarnations, shutdown, dynamic children."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from runtime.kernel.actor import Actor, ActorCrashed, ActorStopped, AskTimeout, Busy
from runtime.kernel.supervisor import ChildSpec, DynamicSupervisor, RestartIntensityExceeded, Supervisor
from tests.runtime.actor_testing import Probe, live_actor_tasks, no_leaked_actor_tasks, spawn, supervisor_running

__all__ = ["no_leaked_actor_tasks"]  # autouse fixture


class Factory:
    """Builds Probes sharing one log; remembers every instance it built."""

    def __init__(self, name: str, log: list[Any] | None = None, **kwargs: Any) -> None:
        self.name = name
        self.log: list[Any] = log if log is not None else []
        self.kwargs = kwargs
        self.built: list[Probe] = []

    def __call__(self) -> Actor:
        actor = Probe(self.name, log=self.log, **self.kwargs)
        self.built.append(actor)
        return actor


async def test_kill_fails_pending_asks_then_restarted_incarnation_answers() -> None:
    sup = Supervisor(intensity=3, period=10)
    make = Factory("a")
    never = trio.Event()
    async with supervisor_running(sup) as nursery:
        ref = await sup.start_child(ChildSpec("a", make))
        assert ref.incarnation == 1
        in_flight = spawn(nursery, ref.ask, ("block", never))
        await trio.testing.wait_all_tasks_blocked()
        queued = [spawn(nursery, ref.ask, ("effect", i)) for i in range(3)]
        await trio.testing.wait_all_tasks_blocked()

        assert sup.kill("a") is True
        await trio.testing.wait_all_tasks_blocked()

        for box in [in_flight, *queued]:
            assert isinstance(box["error"], ActorCrashed)
        assert make.built[0].state == "crashed"
        assert make.built[0].effects == 0
        assert ref.incarnation == 2
        assert await ref.ask("ping") == ("pong", 2)
        stats = sup.statistics()
        assert stats.restarts == 1
        assert stats.children["a"].restarts == 1
        assert stats.children["a"].incarnation == 2
        assert stats.children["a"].state == "running"
    assert sup.kill("unknown") is False


async def test_exception_from_handle_does_not_restart() -> None:
    sup = Supervisor(intensity=0, period=10)
    async with supervisor_running(sup):
        ref = await sup.start_child(ChildSpec("a", Factory("a")))
        with pytest.raises(ValueError):
            await ref.ask("boom")
        assert await ref.ask("ping") == ("pong", 1)
        assert sup.statistics().restarts == 0


async def test_fatal_crash_is_restarted() -> None:
    sup = Supervisor(intensity=1, period=10)
    async with supervisor_running(sup):
        ref = await sup.start_child(ChildSpec("a", Factory("a")))
        with pytest.raises(ActorCrashed):
            await ref.ask("fatal")
        assert await ref.ask("ping") == ("pong", 2)


async def test_more_crashes_than_intensity_within_period_gives_up(autojump_clock: trio.testing.MockClock) -> None:
    intensity = 3
    sup = Supervisor(intensity=intensity, period=10)
    make = Factory("a")
    other = Factory("b")
    with pytest.RaisesGroup(RestartIntensityExceeded):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run, name="supervisor:sup")
            ref = await sup.start_child(ChildSpec("a", make))
            bystander = await sup.start_child(ChildSpec("b", other))
            for crash in range(intensity):
                await trio.sleep(1)
                sup.kill("a")
                await trio.testing.wait_all_tasks_blocked()
                assert ref.incarnation == crash + 2
            await trio.sleep(1)
            sup.kill("a")  # crash number intensity + 1, all within 10 s
            await trio.sleep(100)
            pytest.fail("the supervisor kept restarting past its intensity")
    assert sup.state == "failed"
    assert [a.state for a in make.built] == ["crashed"] * (intensity + 1)
    assert other.built[0].state == "crashed"  # cancelled with the supervisor
    assert sup.children() == []
    with pytest.raises(ActorStopped):
        await bystander.ask("ping")
    await sup.aclose(grace=1)  # idempotent after failure, does not raise


async def test_crashes_spread_over_more_than_period_keep_restarting(autojump_clock: trio.testing.MockClock) -> None:
    sup = Supervisor(intensity=2, period=10)
    async with supervisor_running(sup):
        ref = await sup.start_child(ChildSpec("a", Factory("a")))
        for _ in range(6):
            await trio.sleep(6)  # at most 2 restarts in any 10 s window
            sup.kill("a")
            await trio.testing.wait_all_tasks_blocked()
        assert sup.state == "running"
        assert await ref.ask("ping") == ("pong", 7)
        assert sup.statistics().children["a"].restarts == 6


async def test_restart_types_on_normal_exit_and_crash() -> None:
    sup = Supervisor(intensity=5, period=10)
    perm, trans, temp = Factory("perm"), Factory("trans"), Factory("temp")
    async with supervisor_running(sup):
        perm_ref = await sup.start_child(ChildSpec("perm", perm, "permanent"))
        trans_ref = await sup.start_child(ChildSpec("trans", trans, "transient"))
        temp_ref = await sup.start_child(ChildSpec("temp", temp, "temporary"))

        sup.kill("trans")  # transient: a crash is restarted
        sup.kill("temp")  # temporary: never restarted
        perm.built[0].stop()  # permanent: even a normal exit is restarted
        await trio.testing.wait_all_tasks_blocked()
        assert sup.children() == ["perm", "trans"]
        assert await perm_ref.ask("ping") == ("pong", 2)
        assert await trans_ref.ask("ping") == ("pong", 2)
        with pytest.raises(ActorStopped):
            await temp_ref.ask("ping")

        trans.built[1].stop()  # transient: a normal exit ends it
        await trio.testing.wait_all_tasks_blocked()
        assert sup.children() == ["perm"]
        with pytest.raises(ActorStopped):
            await trans_ref.ask("ping")


async def test_ref_ask_during_a_slow_stop_goes_to_the_next_incarnation() -> None:
    sup = Supervisor(intensity=5, period=10)
    make = Factory("a")
    async with supervisor_running(sup) as nursery:
        ref = await sup.start_child(ChildSpec("a", make))
        old = make.built[0]
        old.stop_gate = trio.Event()
        old.stop()  # permanent: will be restarted once on_stop finishes
        await trio.testing.wait_all_tasks_blocked()
        assert old.state == "stopping"
        box = spawn(nursery, ref.ask, "ping")
        await trio.testing.wait_all_tasks_blocked()
        assert box == {}  # parked, not failed
        old.stop_gate.set()
        await trio.testing.wait_all_tasks_blocked()
        assert box == {"value": ("pong", 2)}
        assert make.log.index(("stopped", "a", 1)) < make.log.index(("start", "a", 2))


async def test_ref_ask_timeout_bounds_the_wait_for_an_incarnation(autojump_clock: trio.testing.MockClock) -> None:
    sup = Supervisor(intensity=5, period=10)
    make = Factory("a")
    async with supervisor_running(sup, grace=0):
        ref = await sup.start_child(ChildSpec("a", make))
        make.built[0].stop_gate = trio.Event()  # never set: hard-cancelled by aclose
        make.built[0].stop()
        with pytest.raises(AskTimeout):
            await ref.ask("ping", timeout=3)


async def test_stop_child_is_not_restarted_and_fails_queued_asks() -> None:
    sup = Supervisor(intensity=5, period=10)
    make = Factory("a")
    gate = trio.Event()
    async with supervisor_running(sup) as nursery:
        ref = await sup.start_child(ChildSpec("a", make))
        current = spawn(nursery, ref.ask, ("block", gate))
        await trio.testing.wait_all_tasks_blocked()
        queued = spawn(nursery, ref.ask, ("effect", 1))
        await trio.testing.wait_all_tasks_blocked()
        stopping = spawn(nursery, sup.stop_child, "a")
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
        await trio.testing.wait_all_tasks_blocked()
        assert stopping == {"value": None}
        assert current == {"value": "unblocked"}
        assert isinstance(queued["error"], ActorStopped)
        assert sup.children() == []
        assert len(make.built) == 1
        with pytest.raises(ActorStopped):
            await ref.ask("ping")
        with pytest.raises(LookupError):
            await sup.stop_child("a")


class FailsToStart(Actor):
    async def on_start(self) -> None:
        raise OSError("cannot open")


async def test_first_start_failure_propagates_from_start_child() -> None:
    sup = Supervisor(intensity=5, period=10)
    async with supervisor_running(sup):
        with pytest.raises(OSError, match="cannot open"):
            await sup.start_child(ChildSpec("bad", lambda: FailsToStart("bad")))
        assert sup.children() == []
        ref = await sup.start_child(ChildSpec("a", Factory("a")))
        with pytest.raises(ValueError):
            await sup.start_child(ChildSpec("a", Factory("a")))  # duplicate name
        assert await ref.ask("ping") == ("pong", 1)


async def test_aclose_stops_children_in_reverse_order_within_grace(autojump_clock: trio.testing.MockClock) -> None:
    sup = Supervisor(intensity=5, period=10)
    log: list[Any] = []
    makers = {name: Factory(name, log) for name in ("a", "b", "c")}
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run, name="supervisor:sup")
        refs = {name: await sup.start_child(ChildSpec(name, make)) for name, make in makers.items()}
        makers["a"].built[0].stop_gate = trio.Event()  # "a" never finishes on_stop
        log.clear()
        start = trio.current_time()
        await sup.aclose(grace=4)
        assert trio.current_time() - start == pytest.approx(4)
        assert live_actor_tasks() == []  # checked while the test's nursery is still open
    assert [entry[:2] for entry in log] == [
        ("stop", "c"),
        ("stopped", "c"),
        ("stop", "b"),
        ("stopped", "b"),
        ("stop", "a"),  # hard-cancelled at the deadline: never "stopped"
    ]
    assert {name: make.built[0].state for name, make in makers.items()} == {
        "a": "stopped",
        "b": "stopped",
        "c": "stopped",
    }
    assert sup.state == "closed"
    with pytest.raises(ActorStopped):
        await refs["c"].ask("ping")
    with pytest.raises(ActorStopped):
        await sup.start_child(ChildSpec("d", Factory("d")))
    await sup.aclose(grace=1)  # idempotent


async def test_aclose_of_prompt_children_takes_no_time(autojump_clock: trio.testing.MockClock) -> None:
    sup = Supervisor(intensity=5, period=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run, name="supervisor:sup")
        for name in ("a", "b"):
            await sup.start_child(ChildSpec(name, Factory(name)))
        start = trio.current_time()
        await sup.aclose(grace=30)
        assert trio.current_time() == start
    assert sup.statistics().children == {}


# ---------------------------------------------------------------------- dynamic


async def test_dynamic_get_or_start_reuses_running_child_and_bounds_children() -> None:
    sup = DynamicSupervisor(intensity=5, period=10, max_children=2)
    makers = {key: Factory(key) for key in ("s1", "s2", "s3")}
    async with supervisor_running(sup):
        first = await sup.get_or_start("s1", makers["s1"])
        again = await sup.get_or_start("s1", makers["s1"])
        assert await first.ask("ping") == await again.ask("ping") == ("pong", 1)
        assert len(makers["s1"].built) == 1
        await sup.get_or_start("s2", makers["s2"])
        with pytest.raises(Busy):
            await sup.get_or_start("s3", makers["s3"])
        assert makers["s3"].built == []
        await sup.stop_child("s2")
        s3 = await sup.get_or_start("s3", makers["s3"])
        assert await s3.ask("ping") == ("pong", 1)
        assert sup.children() == ["s1", "s3"]


async def test_dynamic_evict_idle_passivates_the_longest_idle_child_at_the_bound() -> None:
    """With ``evict_idle`` a full supervisor stops the child idle longest for a new key; a child that
    is working is never chosen, and a bound of working children is still ``Busy``."""
    sup = DynamicSupervisor(intensity=5, period=10, max_children=2, evict_idle=True)
    makers = {key: Factory(key) for key in ("s1", "s2", "s3", "s4")}
    async with supervisor_running(sup) as nursery:
        s1 = await sup.get_or_start("s1", makers["s1"])
        await trio.sleep(0.01)
        s2 = await sup.get_or_start("s2", makers["s2"])
        assert await s2.ask("ping") == ("pong", 1)  # s2 was used last: s1 is idle longest
        s3 = await sup.get_or_start("s3", makers["s3"])
        assert sup.children() == ["s2", "s3"]
        assert makers["s1"].built[0].state == "stopped"
        assert await s3.ask("ping") == ("pong", 1)
        assert await s1.ask(("effect", "back")) == "back"  # its next use starts it again (s2 goes)
        assert sorted(sup.children()) == ["s1", "s3"]
        gates = [trio.Event(), trio.Event()]
        held = [spawn(nursery, s1.ask, ("block", gates[0])), spawn(nursery, s3.ask, ("block", gates[1]))]
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(Busy):
            await sup.get_or_start("s4", makers["s4"])
        for gate in gates:
            gate.set()
        await trio.testing.wait_all_tasks_blocked()
        assert held == [{"value": "unblocked"}, {"value": "unblocked"}]


async def test_dynamic_evict_idle_waits_for_a_slot_being_freed_instead_of_busy() -> None:
    """At the bound with no idle child but one on its way out (an eviction or a passivation in
    progress), a new key waits for that slot instead of answering ``Busy``."""
    sup = DynamicSupervisor(intensity=5, period=10, max_children=2, evict_idle=True)
    makers = {key: Factory(key) for key in ("s1", "s2", "s3")}
    async with supervisor_running(sup) as nursery:
        s1 = await sup.get_or_start("s1", makers["s1"])
        await sup.get_or_start("s2", makers["s2"])
        gate = trio.Event()
        held = spawn(nursery, s1.ask, ("block", gate))
        leaving = makers["s2"].built[0]
        leaving.stop_gate = trio.Event()
        leaving.stop()
        await trio.testing.wait_all_tasks_blocked()
        assert leaving.state == "stopping"
        started = spawn(nursery, sup.get_or_start, "s3", makers["s3"])
        await trio.testing.wait_all_tasks_blocked()
        assert started == {}  # waiting for s2's slot, not refused
        leaving.stop_gate.set()
        await trio.testing.wait_all_tasks_blocked()
        assert await started["value"].ask(("effect", "s3")) == "s3"
        gate.set()
        await trio.testing.wait_all_tasks_blocked()
        assert held == {"value": "unblocked"}


class SlowIdle(Probe):
    """Idle work that outlasts the idle timeout (a prefetch that reads a page from disk)."""

    idle_work_after = 1.0

    async def on_idle(self) -> bool:
        await trio.sleep(3)
        return False


async def test_dynamic_message_that_arrives_as_the_idle_timer_fires_is_handled_not_failed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Race audit (h44): an ask enqueued while idle work ran past the idle timeout (or in the instant
    the timer fired) sat in the mailbox when the actor decided to passivate: it was failed as
    enqueued, so the caller got ACTOR_RESTARTED for a request that was never run. The actor now takes
    it and stays."""
    sup = DynamicSupervisor(intensity=5, period=10, max_children=4)
    built: list[Probe] = []

    def make() -> Actor:
        built.append(SlowIdle("s1", idle_timeout=2))
        return built[-1]

    async with supervisor_running(sup) as nursery:
        ref = await sup.get_or_start("s1", make)
        await trio.sleep(1.5)  # idle work started at 1 s and runs until 4 s; the timer fires at 2 s
        answer = spawn(nursery, ref.ask, ("effect", "a"))
        await trio.sleep(5)
        assert answer == {"value": "a"}
        assert built[0].effects == 1 and len(built) == 1


async def test_dynamic_crash_restarts_child() -> None:
    sup = DynamicSupervisor(intensity=5, period=10, max_children=4)
    make = Factory("s1")
    async with supervisor_running(sup):
        ref = await sup.get_or_start("s1", make)
        sup.kill("s1")
        await trio.testing.wait_all_tasks_blocked()
        assert await ref.ask("ping") == ("pong", 2)


async def test_dynamic_idle_child_passivates_and_message_during_stop_reaches_next_incarnation(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sup = DynamicSupervisor(intensity=5, period=10, max_children=4)
    make = Factory("s1", idle_timeout=10)
    async with supervisor_running(sup) as nursery:
        ref = await sup.get_or_start("s1", make)
        await trio.sleep(9)
        assert await ref.ask(("effect", "a")) == "a"  # inbound message: timer restarts
        await trio.sleep(9)
        assert make.built[0].state == "running"

        make.built[0].stop_gate = trio.Event()  # hold it inside on_stop once it passivates
        await trio.sleep(1.5)
        old = make.built[0]
        assert old.state == "stopping"
        during_stop = spawn(nursery, ref.ask, ("effect", "b"))
        fresh_ref = spawn(nursery, sup.get_or_start, "s1", make)
        await trio.testing.wait_all_tasks_blocked()
        assert during_stop == {} and fresh_ref == {}  # held, not failed, not started twice
        assert len(make.built) == 1

        old.stop_gate.set()
        await trio.testing.wait_all_tasks_blocked()
        assert old.state == "passivated"
        assert during_stop == {"value": "b"}
        assert len(make.built) == 2
        new = make.built[1]
        assert new.effects == 1 and old.effects == 1
        assert make.log.index(("stopped", "s1", 1)) < make.log.index(("start", "s1", 1), 1)
        assert await fresh_ref["value"].ask("ping") == ("pong", 1)  # a fresh child, not a restart

        await trio.sleep(11)
        assert new.state == "passivated"
        assert sup.children() == []  # forgotten
        assert sup.statistics().restarts == 0


class StartsAtOnce(Probe):
    """A probe whose start is not waited for (``start_waits = False``); ``fail_start`` makes ``on_start`` raise."""

    start_waits = False

    def __init__(self, name: str, *, fail_start: bool = False, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.fail_start = fail_start

    async def on_start(self) -> None:
        await super().on_start()
        if self.fail_start:
            raise OSError("cannot open")


async def test_dynamic_child_that_does_not_wait_for_its_start_answers_what_was_sent_before_it_ran() -> None:
    sup = DynamicSupervisor(intensity=5, period=10, max_children=4)
    built: list[StartsAtOnce] = []

    def make() -> Actor:
        built.append(StartsAtOnce("s1"))
        return built[-1]

    async with supervisor_running(sup):
        ref = await sup.get_or_start("s1", make)
        assert built[0].state == "starting" and not built[0].ready  # its task has not run yet
        got = await ref.ask(("effect", "first"))
        assert got == "first" and built[0].ready and built[0].log == [("start", "s1", 1)]
        assert await (await sup.get_or_start("s1", make)).ask("ping") == ("pong", 1)
        assert len(built) == 1


async def test_a_failed_start_that_nobody_waited_for_is_a_crash_and_restarted() -> None:
    """Without the wait nobody is handed the exception as the starter: it is the first incarnation's
    crash (what was in its mailbox fails with it, as in any crash), restarted and counted against the
    supervisor's intensity; the next message reaches the second incarnation."""
    sup = DynamicSupervisor(intensity=5, period=10, max_children=4)
    built: list[StartsAtOnce] = []

    def make() -> Actor:
        built.append(StartsAtOnce("s1", fail_start=not built))  # only the first incarnation fails
        return built[-1]

    async with supervisor_running(sup):
        ref = await sup.get_or_start("s1", make)
        with pytest.raises(ActorCrashed) as crashed:
            await ref.ask("ping")
        assert isinstance(crashed.value.__cause__, OSError)
        assert await ref.ask("ping") == ("pong", 2)
        assert [a.incarnation for a in built] == [1, 2] and built[0].state == "crashed"
        assert sup.statistics().restarts == 1
