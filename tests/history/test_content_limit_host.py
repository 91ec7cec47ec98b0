"""``contentLimit`` (seed 003 §5 windows; README §6): a message that was cut says so itself."""

from __future__ import annotations

from pathlib import Path

import trio

from tests.hostkit import client_for, inprocess_host, msg


async def test_a_cut_message_carries_truncated_and_its_blocks_say_which(tmp_path: Path) -> None:
    """README §6: "A message that was cut has truncated: true". Only the cut blocks said so."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "s1"})
            await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("long", "x" * 200)})
            await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("short", "fits")})
            got = await c.call("session.get", {"sessionId": "s1", "contentLimit": 50})
            long, short = got["messages"]
            assert long["truncated"] is True and long["blocks"][0]["truncated"] is True
            assert len(long["blocks"][0]["text"]) == 50 and long["blocks"][0]["fullLength"] == 200
            assert "truncated" not in short
            whole = await c.call("session.get", {"sessionId": "s1"})
            assert "truncated" not in whole["messages"][0] and len(whole["messages"][0]["blocks"][0]["text"]) == 200


async def test_a_tool_calls_args_and_structured_result_are_capped_too(tmp_path: Path) -> None:
    """A structured (non-string) tool result, and a tool call's args, went out whole whatever the cap:
    a read bounded by contentLimit returned a megabyte-sized object. Longer than the cap in compact
    JSON, such a value comes as the cut JSON text; values that fit keep their shape."""
    rows = [{"line": i, "text": "y" * 40} for i in range(50)]
    call = {"type": "tool_call", "callId": "c1", "name": "Grep", "args": {"pattern": "p" * 100},
            "status": "completed", "result": {"matches": rows}}
    small = {"type": "tool_call", "callId": "c2", "name": "Read", "args": {"path": "a.py"}, "status": "completed",
             "result": {"ok": True}}
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "s1"})
            await c.call("session.appendMessage", {"sessionId": "s1", "message": {
                "id": "a1", "role": "assistant", "blocks": [call, small]}})
            got = (await c.call("session.get", {"sessionId": "s1", "contentLimit": 60}))["messages"][0]
            cut, kept = got["blocks"]
            assert got["truncated"] is True and cut["truncated"] is True
            assert cut["result"] == '{"matches":[{"line":0,"text":"' + "y" * 30 and len(cut["result"]) == 60
            assert cut["args"] == '{"pattern":"' + "p" * 48
            assert kept["args"] == {"path": "a.py"} and kept["result"] == {"ok": True} and "truncated" not in kept
            whole = (await c.call("session.get", {"sessionId": "s1"}))["messages"][0]
            assert whole["blocks"][0]["result"] == {"matches": rows} and "truncated" not in whole


async def test_the_selected_message_shows_its_text_whole_and_the_rest_capped(tmp_path: Path) -> None:
    """Seed 003 §5: "Only the explicitly selected user/assistant text bypasses the display cap." The
    messageAround target went out whole: its thinking and its tool call's args and result too."""
    reply = {"id": "a1", "role": "assistant", "blocks": [
        {"type": "thinking", "text": "T" * 40}, {"type": "text", "text": "A" * 30},
        {"type": "tool_call", "callId": "c1", "name": "Read", "args": {"path": "/" + "p" * 40},
         "status": "completed", "result": "r" * 40}]}
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "s1"})
            await c.call("session.appendMessage", {"sessionId": "s1", "message": reply})
            await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("u2", "U" * 30)})
            got = await c.call("session.get", {"sessionId": "s1", "messageAround": "a1", "messageLimit": 2,
                                               "contentLimit": 10})
            a1, u2 = got["messages"]
            thinking, text, call = a1["blocks"]
            assert text["text"] == "A" * 30 and "truncated" not in text
            assert thinking["text"] == "T" * 10 and thinking["truncated"] is True
            assert call["result"] == "r" * 10 and call["args"] == '{"path":"/' and call["truncated"] is True
            assert a1["truncated"] is True
            assert u2["blocks"][0]["text"] == "U" * 10  # not selected: capped
