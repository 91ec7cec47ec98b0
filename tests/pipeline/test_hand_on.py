"""A connection's session request goes from ``Pipeline.submit`` straight into its running actor's mailbox.

Issue 26 (host CPU per append over WebSocket): every request used to be dispatched by a task the
connection's order spawned for it (``Ordering.add`` on an idle order), one task spawn and one task
switch more per request. When none of the dispatching steps would wait (nothing of the connection
ahead of it, receipt key and message ids free, the actor running with room), ``submit`` now hands it
on itself; when one would, the order's task runs it as before (a duplicate waits for its first).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import outcome
import pytest
import trio
import trio.testing

from actors.gateway_types import PROTOCOL_VERSION, CallContext
from runtime.ordering import Ordering
from tests.eventkit import count_events
from tests.hostkit import inprocess_host, msg


class _Spawns(trio.abc.Instrument):
    def __init__(self) -> None:
        self.names: list[str] = []

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.names.append(task.name)


def _caller(connection: int) -> CallContext:
    return CallContext(connection_id=connection, client_id="hand-on", client_kind="test", protocol=PROTOCOL_VERSION)


async def test_an_append_to_a_running_session_enters_its_mailbox_from_submit_without_a_task(tmp_path: Path) -> None:
    answers: list[outcome.Outcome[Any]] = []
    got = trio.Event()

    def reply(result: outcome.Outcome[Any]) -> None:
        answers.append(result)
        got.set()

    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host:
            caller = _caller(9001)
            await host.pipeline.call("session.create", {"sessionId": "s1", "title": "t"}, caller)
            actor = host.sessions.ref("s1").current()
            assert actor is not None and actor.state == "running"
            spawns = _Spawns()
            trio.lowlevel.add_instrument(spawns)
            try:
                for n, extra in enumerate(({}, {"submissionId": "k1"})):
                    got = trio.Event()
                    await host.pipeline.submit("session.appendMessage",
                                               {"sessionId": "s1", "message": msg(f"m{n}", "hello"), **extra},
                                               caller, reply)
                    # handed to its target when submit returns (a pending mutation of the connection), and
                    # no task was started to do it
                    assert host.pipeline._orders[9001].statistics() == {"queued": 0, "pending": 1}
                    assert spawns.names == []
                    await got.wait()
                    assert answers[-1].unwrap()["message"]["id"] == f"m{n}"
            finally:
                trio.lowlevel.remove_instrument(spawns)


async def test_a_duplicate_of_a_request_in_flight_is_dispatched_by_the_order_and_answered_from_the_first(
        tmp_path: Path) -> None:
    """The receipt key is held: ``submit`` hands nothing on itself, the order's task waits for the first."""
    answers: list[Any] = []

    def reply(result: outcome.Outcome[Any]) -> None:
        answers.append(result.unwrap())

    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host:
            first, second = _caller(9101), _caller(9102)
            await host.pipeline.call("session.create", {"sessionId": "s1", "title": "t"}, first)
            params = {"sessionId": "s1", "submissionId": "dup", "message": msg("m1", "once")}
            spawns = _Spawns()
            trio.lowlevel.add_instrument(spawns)
            try:
                await host.pipeline.submit("session.appendMessage", params, first, reply)
                await host.pipeline.submit("session.appendMessage", params, second, reply)
                assert spawns.names == ["runtime.ordering.Ordering._dispatch"]  # the duplicate's only
            finally:
                trio.lowlevel.remove_instrument(spawns)
            await host.pipeline.drained()
            assert len(answers) == 2 and answers[0] == answers[1]
            window = await host.pipeline.call("session.get", {"sessionId": "s1"}, first)
            assert [m["id"] for m in window["messages"]] == ["m1"]  # one effect


async def test_an_order_builds_an_event_only_when_a_request_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """An order is built for each request of a connection that went idle (a client awaiting each answer):
    it builds no ``trio.Event`` then; one is built when a request must wait for an earlier mutation."""
    events = count_events(monkeypatch)
    idle: list[int] = []
    target = ("session", "s1")
    for n in range(5):
        order = Ordering(lambda fn: None, on_idle=lambda n=n: idle.append(n))
        assert order.may_hand_on(target)
        turn = order.turn(True, target)
        order.handed_on(turn, target)
        turn.settle()
    assert events.built == 0 and idle == [0, 1, 2, 3, 4]
    order = Ordering(lambda fn: None)
    first = order.turn(True, target)
    order.handed_on(first, target)
    later = order.turn(False)
    ran: list[str] = []

    async def read() -> None:
        await later.ready(None)  # a read elsewhere waits for the write before it
        ran.append("read")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        assert ran == [] and events.built == 1
        first.settle()
    assert ran == ["read"]
