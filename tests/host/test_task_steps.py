"""``serve --count-task-steps``: ``host.status.trio`` counts the trio thread's task steps and I/O waits
(a diagnostic ``scripts/bench`` reads around a workload); without the flag, nothing is counted and the
status has no ``trio`` key."""

from __future__ import annotations

from pathlib import Path

from protocol.models_host import StatusResult
from runtime.cli import _parser
from tests.hostkit import client_for, inprocess_host, msg


async def test_status_counts_the_trio_threads_hand_offs_when_asked(tmp_path: Path) -> None:
    async with inprocess_host(tmp_path, count_task_steps=True) as host, client_for(host) as c:
        sid = str((await c.call("session.create", {"title": "steps"}))["id"])
        before = StatusResult.model_validate(await c.call("host.status", {})).trio
        assert before is not None
        for i in range(20):
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}", f"text {i}")})
        after = StatusResult.model_validate(await c.call("host.status", {})).trio
        assert after is not None
        # every append is at least a step of the connection and one of the session actor, and its
        # worker-thread hop waits in the run loop's I/O wait for the thread's wake-up
        assert after.task_steps - before.task_steps >= 2 * 20
        assert after.io_waits - before.io_waits >= 20


async def test_status_has_no_trio_counters_by_default(tmp_path: Path) -> None:
    async with inprocess_host(tmp_path) as host, client_for(host) as c:
        status = await c.call("host.status", {})
        assert "trio" not in status
        assert StatusResult.model_validate(status).trio is None


def test_the_serve_flag() -> None:
    assert _parser().parse_args(["serve", "--count-task-steps"]).count_task_steps is True
    assert _parser().parse_args(["serve"]).count_task_steps is False
