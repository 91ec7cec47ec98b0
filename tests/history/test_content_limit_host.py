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
