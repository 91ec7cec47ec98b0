"""A session row whose transcript file vanished: the index stops claiming messages, appends start a new file."""

from __future__ import annotations

import sqlite3

import trio

from tests.hostkit import client_for, index_caught_up, inprocess_host, msg


def _rows(root, sid):
    conn = sqlite3.connect(f"file:{root / 'pi.sqlite'}?mode=ro", uri=True)
    try:
        return [r[0] for r in conn.execute("SELECT id FROM messages WHERE session_id = ? ORDER BY seq", (sid,))]
    finally:
        conn.close()


async def test_vanished_transcript_is_reconciled_and_appends_recreate_it(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "keep me"}))["id"]
            for i in range(3):
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}", f"t{i}")})
            await index_caught_up(host)  # the rows are in the index before the file vanishes
        (tmp_path / "sessions" / f"{sid}.jsonl").unlink()
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            assert host.boot.report["indexRowsRemoved"] == 3
            assert _rows(tmp_path, sid) == []
            got = await c.call("session.get", {"sessionId": sid})
            assert got["totalMessages"] == 0 and got["session"]["title"] == "keep me"
            r = await c.call("session.appendMessage", {"sessionId": sid, "message": msg("n0", "again")})
            assert r["message"]["seq"] == 1
            got = await c.call("session.get", {"sessionId": sid})
            assert [m["id"] for m in got["messages"]] == ["n0"]
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            got = await c.call("session.get", {"sessionId": sid})
            assert [m["id"] for m in got["messages"]] == ["n0"] and got["session"]["title"] == "keep me"
            assert _rows(tmp_path, sid) == ["n0"]
