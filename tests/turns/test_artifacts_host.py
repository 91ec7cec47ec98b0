"""Artifacts + tool_execute audit rows through the real append path (seed §4.10, §4.13)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import trio

from tests.hostkit import client_for, index_caught_up, inprocess_host
from tests.turns.turnkit import new_session, rpc_error, start


def tool(mid: str, name: str, path: str, status: str = "ok") -> dict:
    return {"id": mid, "role": "tool", "toolName": name,
            "blocks": [{"type": "tool_call", "callId": f"c-{mid}", "name": name, "args": {"path": path},
                        "status": status, "result": "done"}]}


def counts(root: Path) -> tuple[int, int]:
    conn = sqlite3.connect(root / "pi.sqlite")
    try:
        return (conn.execute("SELECT COUNT(*) FROM artifacts").fetchone()[0],
                conn.execute("SELECT COUNT(*) FROM audit_log WHERE kind = 'tool_execute'").fetchone()[0])
    finally:
        conn.close()


async def test_write_and_edit_results_become_artifacts(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            other = await new_session(c)
            await start(c, sid, "t1")
            scratch = str(tmp_path / "scratch" / sid / "note.txt")
            for i, (name, path, status) in enumerate([("Write", "/w/a.py", "ok"), ("Edit", "/w/a.py", "success"),
                                                      ("Write", "/w/b.py", "error"), ("Read", "/w/c.py", "ok"),
                                                      ("Write", scratch, "ok")]):
                await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1",
                                                       "message": tool(f"m{i}", name, path, status)})
            await c.call("session.appendMessage", {"sessionId": other, "message": tool("o1", "Write", "/w/z.md")})
            mine = await c.call("artifacts.list", {"sessionId": sid})
            assert [(a["path"], a["op"], a.get("turnId")) for a in mine["artifacts"]] == [("/w/a.py", "edit", "t1")]
            everything = await c.call("artifacts.list", {"limit": 1})
            assert len(everything["artifacts"]) == 1 and everything["nextCursor"]
            rest = await c.call("artifacts.list", {"limit": 5, "cursor": everything["nextCursor"]})
            paths = {a["path"] for a in everything["artifacts"] + rest["artifacts"]}
            assert paths == {"/w/a.py", "/w/z.md"}
            await index_caught_up(host)
            assert counts(tmp_path) == (2, 4)  # Write, Edit, scratch Write (audited, not an artifact), other
            err = await rpc_error(c.call("artifacts.list", {"cursor": "bm90LWEtY3Vyc29y"}))
            assert err.data_code == "INVALID_CURSOR"  # a cursor this host never issued (issue 18)


async def test_fault_before_commit_leaves_neither_then_catch_up_restores_both_once(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            await index_caught_up(host)
            host.faults.add("index.before_commit", nth=1, action="raise")
            # acknowledged once the line is durable; its index commit (rows, artifact, audit) then fails
            first = await c.call("session.appendMessage", {"sessionId": sid, "message": tool("m1", "Write", "/w/a")})
            assert first["replayed"] is False
            # a failed index op is not covered until the repair of its session (from the transcript)
            # committed (issue 22): the barrier opens on both rows, made by that one repair
            await index_caught_up(host)
            host.faults.clear()
            assert counts(tmp_path) == (1, 1)
            assert host.services.index_log.statistics().failed_ops == 1
            # a retry is answered from the index and adds nothing
            again = await c.call("session.appendMessage", {"sessionId": sid, "message": tool("m1", "Write", "/w/a")})
            assert again["replayed"] is True
            await index_caught_up(host)
            assert counts(tmp_path) == (1, 1)
            listed = await c.call("artifacts.list", {"sessionId": sid})
            assert [a["path"] for a in listed["artifacts"]] == ["/w/a"]


async def test_artifacts_survive_restart_and_cascade_with_session(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            await c.call("session.appendMessage", {"sessionId": sid, "message": tool("m1", "Write", "/w/a")})
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            listed = await c.call("artifacts.list", {})
            assert [a["path"] for a in listed["artifacts"]] == ["/w/a"]
            await index_caught_up(host)
            assert counts(tmp_path) == (1, 1)
            await c.call("session.delete", {"sessionId": sid})
            assert (await c.call("artifacts.list", {}))["artifacts"] == []
