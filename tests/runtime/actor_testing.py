"""Shared helpers for the actor-kernel tests: a probe actor and a leak check."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from runtime.kernel.actor import Actor, Fatal
from runtime.kernel.supervisor import Supervisor

TASK_PREFIXES = ("actor:", "supervisor:")


def live_actor_tasks() -> list[str]:
    """Names of every live task (anywhere in this run) that runs an actor or supervisor."""
    found: list[str] = []
    stack = [trio.lowlevel.current_root_task()]
    while stack:
        task = stack.pop()
        if task.name.startswith(TASK_PREFIXES):
            found.append(task.name)
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return found


@pytest.fixture(autouse=True)
async def no_leaked_actor_tasks() -> AsyncIterator[None]:
    assert live_actor_tasks() == []
    yield
    assert live_actor_tasks() == [], "actor/supervisor tasks outlived the test"


class Probe(Actor):
    """Test actor. Messages:

    ``"ping"`` -> ``("pong", incarnation)``; ``"boom"`` raises ValueError;
    ``"fatal"`` raises Fatal; ``("block", event)`` waits for the event;
    ``("effect", x)`` counts one effect and returns x.
    """

    def __init__(self, name: str, *, log: list[Any] | None = None, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.log: list[Any] = log if log is not None else []
        self.effects = 0
        self.stop_gate: trio.Event | None = None

    async def on_start(self) -> None:
        self.log.append(("start", self.name, self.incarnation))

    async def on_stop(self) -> None:
        self.log.append(("stop", self.name, self.incarnation))
        if self.stop_gate is not None:
            await self.stop_gate.wait()
        self.log.append(("stopped", self.name, self.incarnation))

    async def handle(self, msg: Any) -> Any:
        if msg == "ping":
            return ("pong", self.incarnation)
        if msg == "boom":
            raise ValueError("boom")
        if msg == "fatal":
            raise Fatal("fatal on purpose")
        kind, arg = msg
        if kind == "block":
            await arg.wait()
            return "unblocked"
        if kind == "effect":
            self.effects += 1
            return arg
        raise TypeError(f"unknown test message {msg!r}")


@asynccontextmanager
async def actor_running(actor: Actor) -> AsyncIterator[trio.Nursery]:
    """Run ``actor`` in a fresh nursery; stops it when the block exits."""
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run, name=f"actor:{actor.name}")
        try:
            yield nursery
        finally:
            actor.stop()


@asynccontextmanager
async def supervisor_running(sup: Supervisor, *, grace: float = 1.0) -> AsyncIterator[trio.Nursery]:
    """Run ``sup`` in a fresh nursery; ``aclose``s it when the block exits."""
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run, name=f"supervisor:{sup.name}")
        try:
            yield nursery
        finally:
            with trio.CancelScope(shield=True):
                await sup.aclose(grace=grace)


def spawn(nursery: trio.Nursery, fn: Any, *args: Any) -> dict[str, Any]:
    """Start ``await fn(*args)`` in the background; the dict receives its outcome."""
    box: dict[str, Any] = {}

    async def runner() -> None:
        try:
            box["value"] = await fn(*args)
        except Exception as exc:  # recorded for the test to assert on
            box["error"] = exc

    nursery.start_soon(runner)
    return box
