"""Every event topic is published by a real host and its payload validated against its model.

The test host's bus validates each payload (``runtime/host.validate_event``);
this test records which topics went through it and fails when a topic of the
protocol was never exercised, so a new topic cannot skip validation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

import runtime.host
from actors.scheduler import Tick
from protocol.methods import EVENTS
from tests.hostkit import client_for, msg
from tests.scheduler.hostclock import SetClock, host_at
from tests.scheduler.schedkit import BASE, HOUR


async def test_every_topic_is_published_and_validated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: set[str] = set()
    real = runtime.host.validate_event

    due = trio.Event()

    def recording(topic: str, data: dict[str, Any]) -> None:
        real(topic, data)  # raises on a payload that does not match
        seen.add(topic)
        if topic == "task.due":
            due.set()

    monkeypatch.setattr(runtime.host, "validate_event", recording)
    ws = tmp_path / "ws"
    ws.mkdir()
    clock = SetClock(BASE)
    with trio.fail_after(60):
        async with host_at(tmp_path / "data", clock) as host, client_for(host, "ui", kind="ui") as ui, \
                client_for(host, "sidecar", kind="agent") as c:
            sid = (await c.call("session.create", {"title": "topics", "projectPath": str(ws), "mode": "plan"}))["id"]
            other = (await c.call("session.create", {"title": "other"}))["id"]
            await c.call("session.update", {"sessionId": other, "thinkingLevel": "high"})
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1", "message": msg("u1", "go")})
            await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": "t1",
                                                         "message": msg("a1", "partial", role="assistant")})
            await c.call("session.queuePush", {"sessionId": sid, "principal": "p", "content": "x",
                                               "permissionMode": "ask"})
            asked = await c.call("approvals.request", {"sessionId": sid, "turnId": "t1", "tool": "Bash",
                                                       "risk": "low"})
            await ui.call("approvals.respond", {"sessionId": sid, "requestId": asked["request"]["requestId"],
                                                "optionId": "allow_once"})
            q = await c.call("interactions.request", {"sessionId": sid, "turnId": "t1", "question": "?",
                                                      "allowFreeText": True})
            await ui.call("interactions.respond", {"sessionId": sid, "requestId": q["request"]["requestId"],
                                                   "answer": {"text": "yes"}})
            submitted = await c.call("plans.submit", {"sessionId": sid, "turnId": "t1", "toolCallId": "c1",
                                                      "kind": "plan", "markdown": "# P\n", "workspaceRoot": str(ws)})
            approved = await ui.call("plans.respond", {"requestId": submitted["requestId"], "action": "approve"})
            await c.call("plans.startExecution", {"sessionId": sid, "executionId": approved["approval"]["executionId"],
                                                  "turnId": "t1"})
            await c.call("collab.deliver", {"pluginId": "p", "sourceSessionId": other, "targetSessionId": sid,
                                            "kind": "message", "content": "hi", "idempotencyKey": "k"})
            await c.call("session.endTurn", {"sessionId": sid, "turnId": "t1", "status": "completed"})
            await ui.call("settings.set", {"ns": "ui", "key": "sidebarWidth", "value": 280})
            await ui.call("providers.create", {"id": "openrouter", "name": "OpenRouter",
                                               "baseUrl": "https://openrouter.ai/api/v1"})
            await ui.call("models.add", {"providerId": "openrouter", "modelId": "my/finetune",
                                         "displayName": "My finetune"})
            empty = tmp_path / "nothing-to-import"
            empty.mkdir()
            await ui.call("import.sessions", {"source": "claude-code", "root": str(empty)})
            await c.call("tasks.create", {"taskId": "t", "title": "T", "prompt": "p", "cadence": "hourly",
                                          "schedule": {"hour": 0, "minute": 0}})  # §4.11: armed by it
            clock.ms = BASE + HOUR
            assert host.scheduler is not None
            await host.scheduler.tell(Tick())
            await c.call("session.delete", {"sessionId": other})
            with trio.fail_after(10):
                await due.wait()
    assert seen == set(EVENTS), f"never published: {sorted(set(EVENTS) - seen)}"
