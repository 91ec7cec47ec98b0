"""Issue 6 item 3: from a search hit to its place in the transcript.

``session.get`` with ``messageAround`` centers a bounded window on the message
(clamped at both ends), a subagent-attributed target also returns its owning
Task tool call row as ``navigationParent``, and a target that is not in the
session is MESSAGE_NOT_FOUND, never a different message. Checked on a running
session actor and again on a fresh host (cold window read).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import RpcError
from runtime.handlers import sessions as sessions_handler
from tests.hostkit import client_for, inprocess_host, msg
from tests.threadkit import on_trio_thread

N = 200
TASK_AT = 50  # seq of the assistant message holding the Task tool call
SUB_AT = 120  # seq of the subagent-attributed message


def _message(seq: int) -> dict[str, Any]:
    if seq == TASK_AT:
        return {"id": f"m{seq}", "role": "assistant", "blocks": [
            {"type": "text", "text": "delegating to a reviewer"},
            {"type": "tool_call", "callId": "task-1", "name": "Task", "args": {"prompt": "review"},
             "result": "review done"}]}
    if seq == SUB_AT:
        return msg(f"m{seq}", "subagent found the wombat", role="assistant",
                   meta={"parentToolCallId": "task-1", "agentName": "reviewer"})
    return msg(f"m{seq}", f"message {seq} about ordinary things", role="user" if seq % 2 else "assistant")


async def _around(c: Any, sid: str, target: str, limit: int) -> dict[str, Any]:
    return await c.call("session.get", {"sessionId": sid, "messageAround": target, "messageLimit": limit})


async def _check(c: Any, sid: str, other: str) -> None:
    hit = (await c.call("search.query", {"query": "wombat"}))["results"]
    assert [(h["sessionId"], h["messageId"]) for h in hit] == [(sid, f"m{SUB_AT}")]

    win = await _around(c, sid, hit[0]["messageId"], 21)
    seqs = [m["seq"] for m in win["messages"]]
    assert seqs == list(range(SUB_AT - 10, SUB_AT + 11))  # centered: 10 before, 10 after
    assert (win["messageStart"], win["messageEnd"], win["totalMessages"]) == (SUB_AT - 11, SUB_AT + 10, N)
    assert win["hasMoreBefore"] and win["hasMoreAfter"]
    parent = win["navigationParent"]
    assert parent["id"] == f"m{TASK_AT}"
    assert parent["seq"] == TASK_AT  # a stored message carries its seq (UiMessage.seq is required)
    assert [b["callId"] for b in parent["blocks"] if b["type"] == "tool_call"] == ["task-1"]

    plain = await _around(c, sid, "m100", 21)
    assert [m["seq"] for m in plain["messages"]] == list(range(90, 111))
    assert "navigationParent" not in plain  # not subagent-attributed

    first = await _around(c, sid, "m1", 21)
    assert [m["seq"] for m in first["messages"]] == list(range(1, 22)) and not first["hasMoreBefore"]
    last = await _around(c, sid, f"m{N}", 21)
    assert [m["seq"] for m in last["messages"]] == list(range(N - 20, N + 1)) and not last["hasMoreAfter"]

    for missing in ("nope", "o1"):  # unknown id; an id that lives in another session
        with pytest.raises(RpcError) as err:
            await _around(c, sid, missing, 21)
        assert err.value.data_code == "MESSAGE_NOT_FOUND"
    assert (await _around(c, other, "o1", 5))["messages"][0]["id"] == "o1"


async def test_message_around_centers_on_the_hit_with_its_task_parent(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "navigation"}))["id"]
            other = (await c.call("session.create", {"title": "other"}))["id"]
            await c.call("session.appendMessage", {"sessionId": other, "message": msg("o1", "elsewhere")})
            for seq in range(1, N + 1):
                await c.call("session.appendMessage", {"sessionId": sid, "message": _message(seq)})
            await _check(c, sid, other)  # warm: the session actor is running
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await _check(c, sid, other)  # fresh host: the first get reads the window cold


async def test_fields_are_added_to_a_window_off_the_trio_thread(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-flight reply and the navigation parent are added to an encoded window by copying it whole (up
    to 16 MiB): in the session's worker thread, never on the trio loop (every other request of the host
    waits while it runs there)."""
    seen: list[tuple[str, bool]] = []
    added = sessions_handler.with_field

    def added_seen(reply: bytes, key: str, value: Any) -> bytes:
        seen.append((key, on_trio_thread()))
        return added(reply, key, value)

    monkeypatch.setattr(sessions_handler, "with_field", added_seen)
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, kind="agent") as c:
            sid = (await c.call("session.create", {"title": "nav"}))["id"]
            for seq in (TASK_AT, SUB_AT):
                await c.call("session.appendMessage", {"sessionId": sid, "message": _message(seq)})
            got = await _around(c, sid, f"m{SUB_AT}", 1)
            assert got["navigationParent"]["id"] == f"m{TASK_AT}"
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            reply = {"id": "a1", "role": "assistant", "turnId": "t1", "blocks": [{"type": "text", "text": "so far"}]}
            await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": "t1", "message": reply})
            assert (await c.call("session.get", {"sessionId": sid}))["inflight"]["message"]["id"] == "a1"
    assert seen == [("navigationParent", False), ("inflight", False)]
