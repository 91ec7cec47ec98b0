"""End-to-end through the real gateway, in-process host (fast path of the black-box tests)."""

from __future__ import annotations

import trio

from tests.hostkit import client_for, inprocess_host, msg


async def test_create_append_get(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            s = await c.call("session.create", {"title": "hello"})
            sid = s["id"]
            for i in range(5):
                r = await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}", f"text {i}")})
                assert r["message"]["seq"] == i + 1
                assert r["replayed"] is False
            got = await c.call("session.get", {"sessionId": sid, "messageLimit": 3})
            assert [m["id"] for m in got["messages"]] == ["m2", "m3", "m4"]
            assert got["messageStart"] == 2 and got["hasMoreBefore"] is True and got["totalMessages"] == 5
            again = await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m1", "other")})
            assert again["replayed"] is True and again["message"]["seq"] == 2
