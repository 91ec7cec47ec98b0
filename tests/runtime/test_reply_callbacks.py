"""A reply callback that raises: the request is answered ``INTERNAL`` (never left unanswered),
and in test mode the host fails when it stops."""

from __future__ import annotations

import dataclasses
from functools import partial
from pathlib import Path
from typing import Any

import outcome
import pytest
import trio

from runtime.client import RpcError
from runtime.context import WriterContext
from runtime.host import RunningHost, run_host
from runtime.kernel.actor import CallbackReply, InternalBug, reply_callback_failed
from runtime.routes import ROUTES
from tests import hostkit
from tests.hostkit import client_for
from tests.runtime.actor_testing import Probe, actor_running, no_leaked_actor_tasks

__all__ = ["no_leaked_actor_tasks"]  # autouse fixture


class _FailsOnValue:
    """A callback with the bug: it raises on a value, but answers an error."""

    def __init__(self) -> None:
        self.calls: list[outcome.Outcome[Any]] = []
        self.answered: list[outcome.Outcome[Any]] = []

    def __call__(self, result: outcome.Outcome[Any]) -> None:
        self.calls.append(result)
        if isinstance(result, outcome.Value):
            raise KeyError("the callback's bug")
        self.answered.append(result)


async def test_a_raising_callback_gets_an_internal_answer_instead_of_none() -> None:
    """Reproduces issue 22: ``CallbackReply`` swallowed an exception raised by its callback, so a
    request answered through it (the pipeline's) never got an answer."""
    fn = _FailsOnValue()
    probe = Probe("b")
    async with actor_running(probe):
        await probe.post("ping", CallbackReply(fn))
        with trio.fail_after(5):
            while not fn.answered:  # noqa: ASYNC110 - the actor answers in its own task
                await trio.sleep(0.001)
        assert probe.state == "running"  # the answering actor did not crash
        assert await probe.ask("ping") == ("pong", 1)
    assert [type(c) for c in fn.calls] == [outcome.Value, outcome.Error]
    error = fn.answered[0].error
    assert isinstance(error, InternalBug) and error.code == "INTERNAL"
    assert isinstance(error.__cause__, KeyError)


async def test_the_failure_is_reported_where_the_reply_was_made() -> None:
    """The hook in force when the reply was created hears of it (a host in test mode records it)."""
    heard: list[BaseException] = []
    token = reply_callback_failed.set(heard.append)
    try:
        reply = CallbackReply(_FailsOnValue())
    finally:
        reply_callback_failed.reset(token)
    assert reply.set_result("x") is True
    assert reply.set_result("again") is False  # still one-shot
    assert len(heard) == 1 and isinstance(heard[0], KeyError)
    silent = CallbackReply(_FailsOnValue())  # no hook: logged only
    assert silent.set_result("x") is True


def _boom() -> None:
    raise RuntimeError("an after-commit hook with a bug")


def _routes_with_failing_after_commit() -> dict[str, Any]:
    real = ROUTES["settings.set"]

    def handler(ctx: WriterContext, params: Any, key: Any) -> Any:
        value = real.handler(ctx, params, key)
        ctx.after_commit(_boom)
        return value

    return {**ROUTES, "settings.set": dataclasses.replace(real, handler=handler)}


async def test_a_request_whose_reply_callback_raises_is_answered_internal(tmp_path: Path) -> None:
    """Reproduces issue 22 end to end: ``settings.set`` whose after-commit work raises inside the
    writer's reply callback hung its client; now it gets ``INTERNAL`` and the host keeps serving."""
    config = hostkit.test_config(tmp_path / "data", validate_results=False)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            start = partial(run_host, config, routes=_routes_with_failing_after_commit())
            host: RunningHost = await nursery.start(start)
            async with client_for(host) as c:
                with pytest.raises(RpcError) as failed:
                    await c.call("settings.set", {"key": "k", "value": 1})
                assert failed.value.data_code == "INTERNAL"
                assert (await c.call("host.status", {}))["bootId"] == host.boot.boot_id
            host.shutdown.request()


async def test_in_test_mode_a_raising_reply_callback_fails_the_host(tmp_path: Path) -> None:
    """Test mode (``validate_results``): the client still gets ``INTERNAL``, and the host raises
    ``InternalBug`` when it stops, so the test that ran into the bug fails."""
    config = hostkit.test_config(tmp_path / "data")
    assert config.validate_results
    codes: list[str] = []
    with trio.fail_after(30), pytest.RaisesGroup(pytest.RaisesExc(InternalBug, match="reply callback"),
                                                 flatten_subgroups=True):
        async with trio.open_nursery() as nursery:
            start = partial(run_host, config, routes=_routes_with_failing_after_commit())
            host: RunningHost = await nursery.start(start)
            async with client_for(host) as c:
                try:
                    await c.call("settings.set", {"key": "k", "value": 1})
                except RpcError as exc:
                    codes.append(exc.data_code)
            host.shutdown.request()
    assert codes == ["INTERNAL"]
