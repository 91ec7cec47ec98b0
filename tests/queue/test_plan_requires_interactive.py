"""Seed 003 §4.11, §11.19: a prompt queued into a Plan/Goal session whose task run is running is refused.

``session.startTurn`` and ``plans.submit`` refused that work with
PLAN_REQUIRES_INTERACTIVE_SESSION, but ``session.queuePush`` accepted the prompt
(and a controller would then be handed contract work no one can approve).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient, RpcError
from runtime.host import RunningHost
from tests.hostkit import client_for, inprocess_host

REFUSED = "PLAN_REQUIRES_INTERACTIVE_SESSION"


def _push(sid: str, content: str, **extra: Any) -> dict[str, Any]:
    return {"sessionId": sid, "principal": "ui", "content": content, "permissionMode": "ask", **extra}


async def _entries(c: HostClient, sid: str) -> list[str]:
    return [e["content"] for e in (await c.call("session.queueList", {"sessionId": sid}))["entries"]]


async def _receipts(host: RunningHost) -> list[tuple[Any, ...]]:
    return list(await host.services.reads.run(lambda conn: conn.execute(
        "SELECT submission_id FROM command_receipts WHERE method = 'session.queuePush'").fetchall()))


@pytest.mark.parametrize("kind", ["plan", "goal"])
async def test_a_push_into_a_contract_session_of_a_running_run_is_refused(tmp_path: Path, kind: str) -> None:
    ws, data = tmp_path / "ws", tmp_path / "data"
    ws.mkdir()
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "s", "projectPath": str(ws)}))["id"]
            await c.call("session.queuePush", _push(sid, "before"))  # agent mode: queued
            task = await c.call("tasks.create", {"title": "agent", "prompt": "p"})
            run = await c.call("tasks.startRun", {"taskId": task["id"], "sessionId": sid})
            await c.call("session.queuePush", _push(sid, "agent run"))  # the run's own agent work: queued
            await c.call("session.update", {"sessionId": sid, "mode": kind})

            with pytest.raises(RpcError) as err:
                await c.call("session.queuePush", _push(sid, "contract", idempotencyKey="k1", submissionId="q-1"))
            assert err.value.data_code == REFUSED
            assert err.value.data["runId"] == run["id"] and err.value.data["mode"] == kind
            assert "queue a prompt" in err.value.message
            assert await _entries(c, sid) == ["before", "agent run"]  # nothing written
            assert await _receipts(host) == []

            # Ended, the run no longer holds the session: an interactive push is queued (same keys).
            await c.call("tasks.finishRun", {"runId": run["id"], "status": "error", "errorCode": REFUSED})
            pushed = await c.call("session.queuePush", _push(sid, "contract", idempotencyKey="k1",
                                                             submissionId="q-1"))
            assert pushed["replayed"] is False and pushed["entry"]["content"] == "contract"
            assert await _entries(c, sid) == ["before", "agent run", "contract"]


async def test_a_contract_session_without_a_running_run_queues(tmp_path: Path) -> None:
    ws, data = tmp_path / "ws", tmp_path / "data"
    ws.mkdir()
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "s", "mode": "plan", "projectPath": str(ws)}))["id"]
            await c.call("session.queuePush", _push(sid, "interactive"))
            assert await _entries(c, sid) == ["interactive"]
