"""search.sessions / search.query through the gateway: acknowledged appends are searchable at once."""

from __future__ import annotations

import trio

from tests.hostkit import client_for, inprocess_host, msg


async def test_search_finds_acknowledged_messages_across_sessions(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            a = (await c.call("session.create", {"title": "alpha"}))["id"]
            b = (await c.call("session.create", {"title": "beta"}))["id"]
            await c.call("session.appendMessage", {"sessionId": a, "message": msg("a1", "我们的数据库很快")})
            await c.call("session.appendMessage", {"sessionId": b, "message": msg(
                "b1", "x", role="assistant", blocks=[{"type": "thinking", "text": "secret 数据库 plan"},
                                                     {"type": "text", "text": "final answer about SQLite"}])})
            await c.call("session.appendMessage", {"sessionId": b, "message": msg("b2", "数据库 again")})
            res = await c.call("search.sessions", {"query": "数据库"})
            assert {r["sessionId"] for r in res["results"]} == {a, b}
            counts = {r["sessionId"]: r["messageMatches"] for r in res["results"]}
            assert counts == {a: 1, b: 1}  # b1's thinking is never indexed
            hits = await c.call("search.query", {"query": "sqlite"})
            assert [h["messageId"] for h in hits["results"]] == ["b1"]
            none = await c.call("search.query", {"query": "secret"})
            assert none["results"] == []
            await c.call("session.delete", {"sessionId": b})
            res = await c.call("search.sessions", {"query": "数据库"})
            assert [r["sessionId"] for r in res["results"]] == [a]
