"""Seed 003 §4.11, §11.19: a delivery into a Plan/Goal session whose task run is running is refused.

A delivery is queue work (its admission in the target's queue, begun by the target's controller): like
``session.queuePush``, ``collab.deliver`` into a session that an unattended run holds in a contract mode
is PLAN_REQUIRES_INTERACTIVE_SESSION, and nothing is written (no ledger row, no admission).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import RpcError
from tests.hostkit import client_for, inprocess_host

REFUSED = "PLAN_REQUIRES_INTERACTIVE_SESSION"


def _deliver(src: str, tgt: str, key: str) -> dict[str, Any]:
    return {"pluginId": "team", "sourceSessionId": src, "targetSessionId": tgt, "kind": "task",
            "content": "review it", "idempotencyKey": key}


@pytest.mark.parametrize("kind", ["plan", "goal"])
async def test_a_delivery_into_a_contract_session_of_a_running_run_is_refused(tmp_path: Path, kind: str) -> None:
    ws, data = tmp_path / "ws", tmp_path / "data"
    ws.mkdir()
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host, "agent-1", kind="agent") as c:
            src = (await c.call("session.create", {"title": "src", "projectPath": str(ws)}))["id"]
            tgt = (await c.call("session.create", {"title": "tgt", "projectPath": str(ws)}))["id"]
            first = await c.call("collab.deliver", _deliver(src, tgt, "k1"))  # agent mode: queued
            task = await c.call("tasks.create", {"title": "agent", "prompt": "p"})
            run = await c.call("tasks.startRun", {"taskId": task["id"], "sessionId": tgt})
            await c.call("session.update", {"sessionId": tgt, "mode": kind})

            with pytest.raises(RpcError) as err:
                await c.call("collab.deliver", _deliver(src, tgt, "k2"))
            assert err.value.data_code == REFUSED and err.value.data["runId"] == run["id"]
            listed = await c.call("collab.list", {"sessionId": tgt, "direction": "incoming"})
            assert [d["id"] for d in listed["deliveries"]] == [first["delivery"]["id"]]  # nothing written
            queued = (await c.call("session.queueList", {"sessionId": tgt}))["entries"]
            assert [e["sessionMessageId"] for e in queued] == [first["delivery"]["id"]]
            # the retry of the delivery made before is still answered (nothing new is queued by it)
            again = await c.call("collab.deliver", _deliver(src, tgt, "k1"))
            assert again["delivery"]["id"] == first["delivery"]["id"]

            await c.call("tasks.finishRun", {"runId": run["id"], "status": "error", "errorCode": REFUSED})
            later = await c.call("collab.deliver", _deliver(src, tgt, "k2"))  # interactive again: queued
            assert later["delivery"]["status"] == "queued"
